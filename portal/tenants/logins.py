"""Login throttling: too many failed logins for one username, or from one client address,
lock further attempts for a while.

The check sits in the authentication backend, so every password form (the portal's login
page and the admin's) goes through it. A locked attempt is refused before the password is
checked and is not counted, so a lockout ends on time even while someone keeps trying.
A success clears the username's failures (not the address's: one valid account must not
let an address go on guessing others).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils import timezone

from portal.tenants.counters import (
    counter_clear,
    counter_forget_stale,
    counter_get,
    counter_hit,
    counter_lock,
)

USERNAME_SCOPE = "login-user"
ADDRESS_SCOPE = "login-ip"


class LoginLocked(PermissionDenied):
    """Too many failed logins: `retry_after_s` until the next attempt is looked at."""

    def __init__(self, retry_after_s: int) -> None:
        minutes = max(1, math.ceil(retry_after_s / 60))
        super().__init__(
            "Too many failed logins for this account or from this address; "
            f"try again in {minutes} minute{'s' if minutes != 1 else ''}."
        )
        self.retry_after_s = retry_after_s


def client_address(request: HttpRequest | None) -> str:
    """The client's address as the web server saw it (REMOTE_ADDR). Behind a reverse proxy
    this is the proxy, unless the proxy rewrites it; X-Forwarded-For is not trusted, since
    any client can send it."""
    if request is None:
        return ""
    return str(request.META.get("REMOTE_ADDR", ""))


def login_lockout_left_s(*, username: str, address: str) -> int:
    """Seconds until a login for `username` from `address` is looked at again (0: now)."""
    now = timezone.now()
    left = 0.0
    for scope, key in _keys(username=username, address=address):
        window = counter_get(scope=scope, key=key)
        if window is not None and window.locked_until is not None and window.locked_until > now:
            left = max(left, (window.locked_until - now).total_seconds())
    return math.ceil(left)


def login_failed(*, username: str, address: str) -> None:
    now = timezone.now()
    lockout_s = settings.LOGIN_LOCKOUT_S
    limits = {
        USERNAME_SCOPE: settings.LOGIN_MAX_FAILURES,
        ADDRESS_SCOPE: settings.LOGIN_MAX_FAILURES_PER_ADDRESS,
    }
    for scope, key in _keys(username=username, address=address):
        window = counter_hit(scope=scope, key=key, now=now, window_s=lockout_s)
        if window.count >= limits[scope]:
            counter_lock(scope=scope, key=key, until=now + timedelta(seconds=lockout_s))
        if window.count == 1:
            # A new window: a good moment to drop the rows of names and addresses long gone.
            counter_forget_stale(scopes=(USERNAME_SCOPE, ADDRESS_SCOPE), now=now)


def login_succeeded(*, username: str) -> None:
    counter_clear(scope=USERNAME_SCOPE, key=_username_key(username))


def _keys(*, username: str, address: str) -> list[tuple[str, str]]:
    keys = [(USERNAME_SCOPE, _username_key(username))]
    if address:
        keys.append((ADDRESS_SCOPE, address))
    return keys


def _username_key(username: str) -> str:
    # Usernames are matched case-sensitively by Django, but "Alice" and "alice" are the same
    # target for a guesser: count them together.
    return username.strip().lower()[:200]


class ThrottledModelBackend(ModelBackend):
    """Django's username/password backend behind the login throttle."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if username is None:
            username = kwargs.get(self._username_field())
        if username is None or password is None:
            return None
        address = client_address(request)
        left = login_lockout_left_s(username=username, address=address)
        if left:
            # PermissionDenied stops Django from asking any other backend.
            raise LoginLocked(left)
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failed(username=username, address=address)
        else:
            login_succeeded(username=username)
        return user

    @staticmethod
    def _username_field() -> str:
        from django.contrib.auth import get_user_model

        return str(get_user_model().USERNAME_FIELD)

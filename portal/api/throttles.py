"""API rate limits per user and per token, counted in the database so that every web
process shares them (portal/tenants/counters.py). Over a limit: 429 with Retry-After.

The rates come from PORTAL_API_THROTTLE_USER and PORTAL_API_THROTTLE_TOKEN (validated at
start by portal.env.env_rate); a window is fixed (it starts at its first request), so a
client may send up to twice the rate across a window's edge, never more. Both counters of a
request are counted in one statement; on PostgreSQL, a token's request counts them in the
token's own statement (``portal.tenants.tokens.token_use``; ``Counted`` below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.throttling import BaseThrottle

from portal.tenants.counters import Hit, Window, counter_hits
from portal.tenants.models import ApiToken
from portal.tenants.tokens import TokenHit

USER_SCOPE = "api-user"  # every request of one user, whichever token or session it came with
TOKEN_SCOPE = "api-token"  # every request made with one token (a runaway notebook loop stops alone)

# The request attribute that carries ``Counted`` from authentication to ApiThrottle.
COUNTED = "portal_api_counted"


def api_limits(*, user_authenticated: bool, with_token: bool) -> list[tuple[TokenHit, int]]:
    """The counters ApiThrottle counts a request in, each with its limit."""
    limits: list[tuple[TokenHit, int]] = []
    user_rate, token_rate = settings.API_THROTTLE_USER, settings.API_THROTTLE_TOKEN
    if user_rate is not None and user_authenticated:
        limit, window_s = user_rate
        limits.append((TokenHit(scope=USER_SCOPE, window_s=window_s, per_token=False), limit))
    if token_rate is not None and with_token:
        limit, window_s = token_rate
        limits.append((TokenHit(scope=TOKEN_SCOPE, window_s=window_s, per_token=True), limit))
    return limits


@dataclass(frozen=True)
class CountPlan:
    """What authentication counts with the token's statement: the hits ApiThrottle would
    count, if the token holds ``scope`` (None: any token)."""

    limits: list[tuple[TokenHit, int]]
    scope: str | None


@dataclass(frozen=True)
class Counted:
    """ApiThrottle's counters as the token's statement counted them, for that token."""

    token: ApiToken
    limits: list[tuple[TokenHit, int]]
    windows: list[Window]
    now: datetime


class ApiThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        user, token = request.user, request.auth
        counted = getattr(request, COUNTED, None)
        if isinstance(counted, Counted) and counted.token is token:
            limits, windows, now = counted.limits, counted.windows, counted.now
        else:
            limits = api_limits(
                user_authenticated=user is not None and user.is_authenticated,
                with_token=isinstance(token, ApiToken),
            )
            if not limits:
                return True
            now = timezone.now()
            hits = [
                Hit(
                    scope=hit.scope,
                    key=str(token.pk if hit.per_token else user.pk),
                    window_s=hit.window_s,
                )
                for hit, _ in limits
            ]
            windows = counter_hits(hits, now=now)
        waits = [
            max(1.0, math.ceil(hit.window_s - (now - window.started_at).total_seconds()))
            for (hit, limit), window in zip(limits, windows, strict=True)
            if window.count > limit
        ]
        if not waits:
            return True
        self._wait = max(waits)
        return False

    def wait(self) -> float | None:
        return self._wait

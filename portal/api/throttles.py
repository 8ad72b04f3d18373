"""API rate limits per user and per token, counted in the database so that every web
process shares them (portal/tenants/counters.py). Over the limit: 429 with Retry-After.

The rates come from PORTAL_API_THROTTLE_USER and PORTAL_API_THROTTLE_TOKEN (validated at
start by portal.env.env_rate); a window is fixed (it starts at its first request), so a
client may send up to twice the rate across a window's edge, never more.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.throttling import BaseThrottle

from portal.tenants.counters import counter_hit
from portal.tenants.models import ApiToken


class _WindowThrottle(BaseThrottle):
    scope = ""
    setting = ""

    def __init__(self) -> None:
        self._wait: float | None = None

    def key_for(self, request: Any) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Any, view: Any) -> bool:
        rate = getattr(settings, self.setting)
        key = self.key_for(request)
        if rate is None or key is None:
            return True
        limit, window_s = rate
        now = timezone.now()
        window = counter_hit(scope=self.scope, key=key, now=now, window_s=window_s)
        if window.count <= limit:
            return True
        elapsed = (now - window.started_at).total_seconds()
        self._wait = max(1.0, math.ceil(window_s - elapsed))
        return False

    def wait(self) -> float | None:
        return self._wait


class UserThrottle(_WindowThrottle):
    """Every request of one user, whichever token or session it came with."""

    scope = "api-user"
    setting = "API_THROTTLE_USER"

    def key_for(self, request: Any) -> str | None:
        user = request.user
        return str(user.pk) if user is not None and user.is_authenticated else None


class TokenThrottle(_WindowThrottle):
    """Every request made with one token (a runaway notebook loop stops alone)."""

    scope = "api-token"
    setting = "API_THROTTLE_TOKEN"

    def key_for(self, request: Any) -> str | None:
        return str(request.auth.pk) if isinstance(request.auth, ApiToken) else None

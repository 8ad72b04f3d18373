"""API rate limits per user and per token, counted in the database so that every web
process shares them (portal/tenants/counters.py). Over a limit: 429 with Retry-After.

The rates come from PORTAL_API_THROTTLE_USER and PORTAL_API_THROTTLE_TOKEN (validated at
start by portal.env.env_rate); a window is fixed (it starts at its first request), so a
client may send up to twice the rate across a window's edge, never more. Both counters of a
request are counted in one statement.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.throttling import BaseThrottle

from portal.tenants.counters import Hit, counter_hits
from portal.tenants.models import ApiToken

USER_SCOPE = "api-user"  # every request of one user, whichever token or session it came with
TOKEN_SCOPE = "api-token"  # every request made with one token (a runaway notebook loop stops alone)


class ApiThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        hits: list[tuple[Hit, int]] = []
        user, token = request.user, request.auth
        user_rate, token_rate = settings.API_THROTTLE_USER, settings.API_THROTTLE_TOKEN
        if user_rate is not None and user is not None and user.is_authenticated:
            limit, window_s = user_rate
            hits.append((Hit(scope=USER_SCOPE, key=str(user.pk), window_s=window_s), limit))
        if token_rate is not None and isinstance(token, ApiToken):
            limit, window_s = token_rate
            hits.append((Hit(scope=TOKEN_SCOPE, key=str(token.pk), window_s=window_s), limit))
        if not hits:
            return True
        now = timezone.now()
        windows = counter_hits([hit for hit, _ in hits], now=now)
        waits = [
            max(1.0, math.ceil(hit.window_s - (now - window.started_at).total_seconds()))
            for (hit, limit), window in zip(hits, windows, strict=True)
            if window.count > limit
        ]
        if not waits:
            return True
        self._wait = max(waits)
        return False

    def wait(self) -> float | None:
        return self._wait

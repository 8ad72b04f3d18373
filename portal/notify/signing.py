"""The webhook signature: ``X-Portal-Signature: t=<unix seconds>,v1=<hex>``, where ``<hex>`` is
HMAC-SHA256 with the webhook's secret over ``<t>.`` followed by the exact body bytes.

The time is part of what is signed, so a receiver that refuses signatures older than a few
minutes cannot be fed an old delivery again. ``verify`` is what a receiver written in Python
does (docs/api.md shows it); the tests check real deliveries with it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "X-Portal-Signature"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, now: float, tolerance_s: float = 300) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` and is at most ``tolerance_s`` old."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(secret, body, timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))

"""API tokens: issued once in plaintext, stored as a SHA-256 digest, looked up by digest."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import transaction

from portal.tenants.models import ApiToken

# 20 random bytes as 40 hex characters: the shape DRF's tokens had, so old keys still fit.
KEY_BYTES = 20
PREFIX_CHARS = 8


def token_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def token_issue(*, user: Any, revoke_others: bool = False) -> str:
    """Create a token for `user` and return its key: the only time the key exists in clear.

    A user may hold several tokens (one per notebook or machine); `revoke_others` deletes
    the ones they had, for a rotation.
    """
    if revoke_others:
        ApiToken.objects.filter(user=user).delete()
    key = secrets.token_hex(KEY_BYTES)
    ApiToken.objects.create(user=user, digest=token_digest(key), prefix=key[:PREFIX_CHARS])
    return key


def token_find(*, key: str) -> ApiToken | None:
    """The token whose key this is (its user joined), or None."""
    return ApiToken.objects.select_related("user").filter(digest=token_digest(key)).first()

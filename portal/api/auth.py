"""Token authentication with messages that tell a notebook user what to send, and the
scopes a token needs for each request."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.permissions import SAFE_METHODS, BasePermission

from portal.tenants.models import TOKEN_SCOPES, ApiToken
from portal.tenants.tokens import token_find, token_touch

READ, SUBMIT, ADMIN = TOKEN_SCOPES
# What each scope lets a token do, for the 403 that names the missing one.
SCOPE_USES = {
    READ: "reading jobs, logs, teams, tokens and the cluster",
    SUBMIT: "submitting, cancelling, holding, releasing and resubmitting jobs",
    ADMIN: "creating and revoking tokens, changing teams and cordoning or draining nodes",
}

HOW_TO = (
    "send the header 'Authorization: Token <key>'; "
    "get a key with `python manage.py issue_token <username>`"
)


class PortalTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>`` (``Bearer <key>`` is accepted too, as notebooks often send).

    Any other Authorization header is refused with a message rather than ignored, so a typo
    in the scheme reads as "malformed" instead of "not logged in".
    """

    keyword = "Token"
    accepted_keywords = (b"token", b"bearer")

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts:
            return None
        if parts[0].lower() not in self.accepted_keywords:
            raise exceptions.AuthenticationFailed(
                f"Authorization header: unknown scheme {parts[0].decode(errors='replace')!r}; "
                + HOW_TO
            )
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Authorization header: malformed, expected exactly 'Token <key>' "
                "(one key, no spaces in it); " + HOW_TO
            )
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed(
                "Authorization header: the key has characters a key never has; " + HOW_TO
            ) from None
        return self.authenticate_credentials(key)

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        # Only the key's digest is stored (portal/tenants/tokens.py).
        token = token_find(key=key)
        if token is None:
            raise exceptions.AuthenticationFailed(
                "Authorization header: unknown or revoked token; " + HOW_TO
            )
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(
                "Authorization header: the token's user is inactive"
            )
        now = timezone.now()
        if token.expired(now):
            raise exceptions.AuthenticationFailed(
                f"Authorization header: the token {token.prefix}... ({token.name!r}) expired "
                f"at {token.expires_at.isoformat() if token.expires_at else ''}; create a new "
                "one on the Tokens page (/tokens/) or with `python manage.py issue_token`"
            )
        token_touch(token=token, now=now)
        return (token.user, token)


class ScopeDenied(exceptions.PermissionDenied):
    """A valid token without the scope this request needs (a 403 under ``scope``)."""


class TokenScopes(BasePermission):
    """A token needs ``read`` for reads and the view's ``write_scope`` for writes. A browser
    session (``request.auth`` not a token) is the person themself: every scope."""

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True
        if not hasattr(view, request.method.lower()):
            return True  # a method the endpoint does not have: its 405, not a scope's 403
        needed = READ if request.method in SAFE_METHODS else view.write_scope
        if token.has_scope(needed):
            return True
        held = ", ".join(token.scopes) if isinstance(token.scopes, list) else ""
        raise ScopeDenied(
            f"this token lacks the {needed!r} scope, which {SCOPE_USES[needed]} needs; "
            f"its scopes: {held or 'none'}. Create a token with {needed!r} on the Tokens page "
            "(/tokens/) or through POST /api/v1/tokens/"
        )

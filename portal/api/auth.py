"""Token authentication with messages that tell a notebook user what to send."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header

from portal.tenants.tokens import token_find

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
        return (token.user, token)

"""Token authentication with messages that tell a notebook user what to send, and the
scopes a token needs for each request."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated

from portal.api.throttles import COUNTED, ApiThrottle, Counted, CountPlan, api_limits
from portal.tenants.models import TOKEN_SCOPES, ApiToken
from portal.tenants.tokens import token_find, token_touch, token_use

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
        return self.authenticate_credentials(key, request=request)

    def authenticate_credentials(self, key: str, request: Any = None) -> tuple[Any, Any]:
        # Only the key's digest is stored (portal/tenants/tokens.py).
        now = timezone.now()
        plan = getattr(request, COUNT_PLAN, None)
        if connection.vendor == "postgresql":
            # Lookup, last use and rate-limit counters: one round trip (token_use).
            limits = plan.limits if isinstance(plan, CountPlan) else []
            scope = plan.scope if isinstance(plan, CountPlan) else None
            use = token_use(key=key, now=now, hits=[hit for hit, _ in limits], scope=scope)
            token = None if use is None else use.token
        else:
            use, token = None, token_find(key=key)
        if token is None:
            raise exceptions.AuthenticationFailed(
                "Authorization header: unknown or revoked token; " + HOW_TO
            )
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(
                "Authorization header: the token's user is inactive"
            )
        if token.expired(now):
            raise exceptions.AuthenticationFailed(
                f"Authorization header: the token {token.prefix}... ({token.name!r}) expired "
                f"at {token.expires_at.isoformat() if token.expires_at else ''}; create a new "
                "one on the Tokens page (/tokens/) or with `python manage.py issue_token`"
            )
        if use is None:
            token_touch(token=token, now=now)
        elif use.windows:
            setattr(request, COUNTED, Counted(token, limits, use.windows, now))
        return (token.user, token)


# The request attribute that carries a CountPlan from the view to authentication.
COUNT_PLAN = "portal_api_count_plan"


def plan_counting(request: Any, view: Any) -> None:
    """Let authentication count the request in ApiThrottle's counters with the token's own
    statement (PostgreSQL), when the view's checks are the ones this module and ApiThrottle
    make: then the statement can tell exactly the requests ApiThrottle would count (a
    usable token holding ``needed_scope``). Call it just before authenticating, as DRF's
    ``perform_authentication`` does, so that a request authenticated elsewhere (an error
    page reading its user) never counts."""
    if view.permission_classes == [IsAuthenticated, TokenScopes] and view.throttle_classes == [
        ApiThrottle
    ]:
        limits = api_limits(user_authenticated=True, with_token=True)
        setattr(request, COUNT_PLAN, CountPlan(limits, needed_scope(request, view)))


def needed_scope(request: Any, view: Any) -> str | None:
    """The scope a token needs for this request; None for a method the view does not have
    (its 405, not a scope's 403)."""
    if not hasattr(view, request.method.lower()):
        return None
    return READ if request.method in SAFE_METHODS else str(view.write_scope)


class ScopeDenied(exceptions.PermissionDenied):
    """A valid token without the scope this request needs (a 403 under ``scope``)."""


class TokenScopes(BasePermission):
    """A token needs ``read`` for reads and the view's ``write_scope`` for writes. A browser
    session (``request.auth`` not a token) is the person themself: every scope."""

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True
        needed = needed_scope(request, view)
        if needed is None or token.has_scope(needed):
            return True
        held = ", ".join(token.scopes) if isinstance(token.scopes, list) else ""
        raise ScopeDenied(
            f"this token lacks the {needed!r} scope, which {SCOPE_USES[needed]} needs; "
            f"its scopes: {held or 'none'}. Create a token with {needed!r} on the Tokens page "
            "(/tokens/) or through POST /api/v1/tokens/"
        )

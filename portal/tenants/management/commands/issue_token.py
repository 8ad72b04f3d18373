"""Issue an API token for a user and print it: the only time the key is shown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from portal.tenants.models import TOKEN_SCOPES
from portal.tenants.tokens import ALLOWED_SCOPES, TokenError, token_issue

# The option that sets each field the token service may refuse.
OPTION_OF = {"name": "--name", "scopes": "--scopes", "expires_at": "--expires-days"}
MAX_EXPIRES_DAYS = 36500


class Command(BaseCommand):
    help = (
        "Issue a new API token for USERNAME and print its key (shown only now: the portal "
        "keeps a digest). --rotate revokes the user's other tokens first. Without options "
        "the token has every scope and never expires."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="revoke the user's current tokens and issue a new one",
        )
        parser.add_argument(
            "--name", default="issue_token", help="what the token is for (default: issue_token)"
        )
        parser.add_argument(
            "--scopes",
            default=",".join(TOKEN_SCOPES),
            help=f"comma-separated, from {ALLOWED_SCOPES} (default: all of them)",
        )
        parser.add_argument(
            "--expires-days",
            type=int,
            default=None,
            help="the token stops working after this many days (default: never)",
        )

    def handle(
        self,
        *args: Any,
        username: str,
        rotate: bool,
        name: str,
        scopes: str,
        expires_days: int | None,
        **options: Any,
    ) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            known = list(User.objects.order_by("username").values_list("username", flat=True)[:20])
            hint = f"known users: {', '.join(known)}" if known else "there are no users yet"
            raise CommandError(f"unknown user {username!r}; {hint}") from None
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive; activate them first")
        if expires_days is not None and not 1 <= expires_days <= MAX_EXPIRES_DAYS:
            raise CommandError(
                f"--expires-days {expires_days}: allowed: a whole number from 1 to "
                f"{MAX_EXPIRES_DAYS}, or leave it out for no expiry"
            )
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        wanted = [scope.strip() for scope in scopes.split(",") if scope.strip()]
        try:
            key = token_issue(
                user=user, revoke_others=rotate, name=name, scopes=wanted, expires_at=expires_at
            )
        except TokenError as error:
            raise CommandError(
                "; ".join(
                    f"{OPTION_OF[field]}: {message}" if field in OPTION_OF else message
                    for field, message in error.errors.items()
                )
            ) from None
        # Only the key on stdout, so `TOKEN=$(python manage.py issue_token alice)` works; the
        # note goes to stderr.
        self.stdout.write(key)
        self.stderr.write(
            "Keep this token now: the portal stores only its digest and cannot show it again."
        )

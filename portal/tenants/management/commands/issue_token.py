"""Issue an API token for a user and print it: the only time the key is shown."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.tenants.tokens import token_issue


class Command(BaseCommand):
    help = (
        "Issue a new API token for USERNAME and print its key (shown only now: the portal "
        "keeps a digest). --rotate revokes the user's other tokens first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="revoke the user's current tokens and issue a new one",
        )

    def handle(self, *args: Any, username: str, rotate: bool, **options: Any) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            known = list(User.objects.order_by("username").values_list("username", flat=True)[:20])
            hint = f"known users: {', '.join(known)}" if known else "there are no users yet"
            raise CommandError(f"unknown user {username!r}; {hint}") from None
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive; activate them first")
        key = token_issue(user=user, revoke_others=rotate)
        # Only the key on stdout, so `TOKEN=$(python manage.py issue_token alice)` works; the
        # note goes to stderr.
        self.stdout.write(key)
        self.stderr.write(
            "Keep this token now: the portal stores only its digest and cannot show it again."
        )

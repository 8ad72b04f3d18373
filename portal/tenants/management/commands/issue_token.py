"""Print a user's API token, creating it on first use."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print the API token of USERNAME (created if missing; --rotate replaces it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="revoke the user's current token and issue a new one",
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
        if rotate:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        # Only the key on stdout, so `TOKEN=$(python manage.py issue_token alice)` works.
        self.stdout.write(token.key)

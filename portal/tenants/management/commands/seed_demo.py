"""Create the demo teams and users (idempotent) and print the logins."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.tenants.models import Membership, Team

DEFAULT_PASSWORD = "demo-password-change-me"

# The default described inventory holds 4 GPU units (2 whole GPUs, one MIG GPU, one MPS GPU):
# the guarantees add up to 3 of them, and each team may borrow up to 3.
TEAMS = (
    {
        "name": "vision",
        "description": "Computer vision",
        "weight": 2.0,
        "guaranteed_units": 2.0,
        "limit_units": 3.0,
        "max_priority": "high",
    },
    {
        "name": "nlp",
        "description": "Language models",
        "weight": 1.0,
        "guaranteed_units": 1.0,
        "limit_units": 3.0,
        "max_priority": "normal",
    },
)
# username, team, role (None: no team), site admin
USERS = (
    ("alice", "vision", Membership.Role.MEMBER, False),
    ("vera", "vision", Membership.Role.ADMIN, False),
    ("bob", "nlp", Membership.Role.MEMBER, False),
    ("nick", "nlp", Membership.Role.ADMIN, False),
    ("admin", None, None, True),
)


class Command(BaseCommand):
    help = (
        "Create the demo teams (vision, nlp) and users (alice, vera, bob, nick, admin). "
        "Safe to run again: existing teams keep their quotas and users their passwords."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        password = os.environ.get("PORTAL_DEMO_PASSWORD", "").strip() or DEFAULT_PASSWORD
        created_users = self._seed(password)
        self.stdout.write("Demo logins:")
        for username, team, role, site_admin in USERS:
            what = "site admin" if site_admin else f"{role.label if role else ''} of {team}"
            note = (
                f"password {password}"
                if username in created_users
                else "existing user, password unchanged"
            )
            self.stdout.write(f"  {username:<6} {what:<22} {note}")
        if password == DEFAULT_PASSWORD:
            self.stdout.write("Set PORTAL_DEMO_PASSWORD to choose another demo password.")

    @transaction.atomic
    def _seed(self, password: str) -> set[str]:
        User = get_user_model()
        teams = {}
        for spec in TEAMS:
            defaults = {key: value for key, value in spec.items() if key != "name"}
            teams[spec["name"]], _ = Team.objects.get_or_create(
                name=spec["name"], defaults=defaults
            )
        created: set[str] = set()
        for username, team, role, site_admin in USERS:
            user, was_created = User.objects.get_or_create(
                username=username, defaults={"email": f"{username}@example.org"}
            )
            if was_created:
                user.set_password(password)
                created.add(username)
            if site_admin and not (user.is_staff and user.is_superuser):
                user.is_staff = user.is_superuser = True
            user.save()
            if team is not None:
                Membership.objects.update_or_create(
                    team=teams[team], user=user, defaults={"role": role}
                )
        return created

"""Create a GPU node and print its key: the only time the key is shown."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.agents.keys import NodeKeyError, node_add


class Command(BaseCommand):
    help = (
        "Create node NAME with its own key and print the key (shown only now: the portal keeps "
        "a salt and a digest). Give it to the node's agent as PORTAL_AGENT_KEY (or in a file, "
        "PORTAL_AGENT_KEY_FILE). --rotate gives an existing node a new key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="replace the key of an existing node (its agent must get the new one)",
        )

    def handle(self, *args: Any, name: str, rotate: bool, **options: Any) -> None:
        try:
            key = node_add(name=name, rotate=rotate)
        except NodeKeyError as error:
            raise CommandError(str(error)) from None
        # Only the key on stdout, so `KEY=$(python manage.py node_add gpu-1)` works.
        self.stdout.write(key)
        self.stderr.write(
            f"node {name}: give this key to its agent as PORTAL_AGENT_KEY; it is not shown again"
        )

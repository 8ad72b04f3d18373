"""Node keys: one credential per GPU host, made with the node, never stored in the clear.

`manage.py node_add <name>` creates the node and prints its key once. The key is derived
(HMAC-SHA256) from the portal's node-key secret, the node's name and a random salt; the
database keeps the salt and a SHA-256 digest of the key. So a copy of the database alone
cannot sign a message, and the portal can still compute each node's key when it signs a
launch or verifies a report. A new salt (`node_add --rotate`) replaces the key; changing
PORTAL_NODE_KEY_SECRET invalidates every key (the digest check says so plainly).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.agents.models import NodeCredential
from portal.cluster.models import Node
from portal.compiled_queries import compiled_rows
from workers.protocol import NODE_NAME_PATTERN
from workers.signing import derive_node_key, key_digest, key_to_text, new_salt

_NODE_NAME = re.compile(NODE_NAME_PATTERN)


class NodeKeyError(ValueError):
    """A node key operation that cannot be done as asked; the message says why."""


def _secret() -> bytes:
    return settings.NODE_KEY_SECRET.encode("utf-8")


def _check_name(name: str) -> None:
    if not _NODE_NAME.match(name):
        raise NodeKeyError(
            f"node name {name!r}: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )


def node_add(*, name: str, rotate: bool = False) -> str:
    """Create node `name` with a new key (or give an existing node a new one with `rotate`);
    returns the key's text, which is shown once and never stored."""
    _check_name(name)
    salt = new_salt()
    key = derive_node_key(_secret(), node=name, salt=salt)
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            try:
                with transaction.atomic():
                    # No heartbeat yet: the node is not schedulable until its agent registers.
                    node = Node.objects.create(name=name, state=Node.State.LOST)
            except IntegrityError:
                node = Node.objects.select_for_update().get(name=name)
        credential = NodeCredential.objects.filter(node=node).first()
        if credential is not None and not rotate:
            raise NodeKeyError(
                f"node {name!r} already has a key; `manage.py node_add {name} --rotate` "
                "replaces it (its agent must then be given the new one)"
            )
        NodeCredential.objects.update_or_create(
            node=node,
            defaults={"salt": salt, "digest": key_digest(key), "created_at": now, "boot": ""},
        )
    return key_to_text(key)


def node_key_text(*, name: str) -> str:
    """The key of a node that has one, for the embedded default and tests that start the
    node's agent themselves (`runportal`): creates the node and its key when missing."""
    keys = node_keys([name])
    if name in keys:
        return key_to_text(keys[name])
    try:
        return node_add(name=name)
    except NodeKeyError:
        # Made meanwhile by another process, or a key that no longer verifies (made with
        # another PORTAL_NODE_KEY_SECRET): say which, never a bare KeyError.
        keys = node_keys([name])
        if name not in keys:
            raise NodeKeyError(key_problem(name=name)) from None
        return key_to_text(keys[name])


def node_keys(names: Iterable[str]) -> dict[str, bytes]:
    """Node name -> key, for the nodes among `names` that have a valid key (one query)."""
    wanted = list(dict.fromkeys(names))
    # Asked for every message an agent sends: SQL compiled once per number of names.
    rows = compiled_rows(
        key=("node_keys", len(wanted)),
        build=lambda values: NodeCredential.objects.filter(node__name__in=values).values(
            "node__name", "salt", "digest"
        ),
        values=wanted,
    )
    keys: dict[str, bytes] = {}
    for row in rows:
        name, salt, digest = row["node__name"], row["salt"], row["digest"]
        key = derive_node_key(_secret(), node=name, salt=salt)
        if key_digest(key) == digest:
            keys[name] = key
    return keys


def key_problem(*, name: str) -> str:
    """Why a node has no usable key, in words (for refusal records)."""
    row = NodeCredential.objects.filter(node__name=name).values_list("salt", "digest").first()
    if row is None:
        return f"node {name!r} has no key (run `manage.py node_add {name}`)"
    salt, digest = row
    if key_digest(derive_node_key(_secret(), node=name, salt=salt)) != digest:
        return (
            f"node {name!r}'s key was made with another PORTAL_NODE_KEY_SECRET; "
            f"rotate it with `manage.py node_add {name} --rotate`"
        )
    return ""

"""Node keys: `manage.py node_add` makes a node and its key, shows the key once and keeps only
a salt and a digest; rotating or changing the portal's secret makes the old key useless."""

from __future__ import annotations

import base64
import hashlib
import io
import time

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from portal.agents.keys import NodeKeyError, node_key_text
from portal.agents.models import NodeCredential, RefusedMessage
from portal.agents.tasks import agent_report
from portal.agents.testing import heartbeat
from portal.cluster.models import Node
from portal.jobs.models import JobEvent
from workers.protocol import parse
from workers.signing import key_from_text, seal

pytestmark = pytest.mark.django_db

NODE = "gpu-7"


def _node_add(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("node_add", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue()


def _heartbeat_with(key_text: str, *, node: str = NODE) -> str:
    """What the report task says to a heartbeat signed with ``key_text``."""
    envelope = seal(parse(heartbeat(node)), node=node, key=key_from_text(key_text), now=time.time())
    return agent_report(envelope)


def test_node_add_creates_the_node_and_prints_its_key_once_on_stdout():
    key, note = _node_add(NODE)

    assert len(key_from_text(key)) == 32 and len(key) == 43
    assert note.strip() == (
        f"node {NODE}: give this key to its agent as PORTAL_AGENT_KEY; it is not shown again"
    )
    node = Node.objects.get(name=NODE)
    # Not schedulable until its agent registers with the key.
    assert node.state == Node.State.LOST
    assert _heartbeat_with(key) == "heartbeat"
    assert Node.objects.get(name=NODE).state == Node.State.READY


def test_the_database_keeps_a_salt_and_a_digest_never_the_key():
    key, _ = _node_add(NODE)
    raw = key_from_text(key)
    forms = {key, raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}

    credential = NodeCredential.objects.get(node__name=NODE)
    assert credential.digest == hashlib.sha256(raw).hexdigest()
    assert len(credential.salt) == 32
    for field in NodeCredential._meta.concrete_fields:
        value = str(field.value_from_object(credential))
        assert not any(form in value for form in forms), field.name
    # Nor anywhere else: every column of every table.
    with connection.cursor() as cursor:
        for model in apps.get_models():
            table = connection.ops.quote_name(model._meta.db_table)
            cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - names from Django's models
            for row in cursor.fetchall():
                text = " ".join(str(value) for value in row)
                assert not any(form in text for form in forms), model._meta.db_table


def test_node_add_refuses_a_node_that_has_a_key_unless_asked_to_rotate():
    key, _ = _node_add(NODE)
    salt = NodeCredential.objects.get(node__name=NODE).salt

    with pytest.raises(CommandError) as refused:
        _node_add(NODE)

    assert str(refused.value) == (
        f"node {NODE!r} already has a key; `manage.py node_add {NODE} --rotate` replaces it "
        "(its agent must then be given the new one)"
    )
    assert NodeCredential.objects.get(node__name=NODE).salt == salt
    assert _heartbeat_with(key) == "heartbeat"


def test_a_rotated_key_replaces_the_old_one():
    old, _ = _node_add(NODE)
    assert _heartbeat_with(old) == "heartbeat"

    new, _ = _node_add(NODE, "--rotate")

    assert new != old
    assert _heartbeat_with(old) == "refused: bad_signature"
    assert _heartbeat_with(new) == "heartbeat"
    assert Node.objects.filter(name=NODE).count() == 1


def test_node_add_refuses_a_name_an_agent_cannot_have():
    with pytest.raises(CommandError) as refused:
        _node_add("no spaces")

    assert "node name 'no spaces': use letters, digits, '.', '_' and '-'" in str(refused.value)
    assert not Node.objects.exists()


def test_a_changed_portal_secret_makes_every_key_fail_and_says_why(settings):
    key, _ = _node_add(NODE)
    settings.NODE_KEY_SECRET = "another secret"
    events = JobEvent.objects.count()

    assert _heartbeat_with(key) == "refused: unknown_node"

    (record,) = RefusedMessage.objects.all()
    assert (record.node, record.kind) == (NODE, "heartbeat")
    assert record.detail == (
        f"node {NODE!r}'s key was made with another PORTAL_NODE_KEY_SECRET; "
        f"rotate it with `manage.py node_add {NODE} --rotate`"
    )
    assert JobEvent.objects.count() == events
    # The embedded default asks for the node's key the same way: it says so too.
    with pytest.raises(NodeKeyError, match="made with another PORTAL_NODE_KEY_SECRET"):
        node_key_text(name=NODE)
    # Rotating under the new secret mends it.
    fresh, _ = _node_add(NODE, "--rotate")
    assert _heartbeat_with(fresh) == "heartbeat"

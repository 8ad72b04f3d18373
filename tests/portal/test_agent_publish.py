"""The lean publish of messages to the agents (``PortalCelery.send_to_queue``): on a real
Redis it writes what ``send_task`` writes, and the agent's own Celery app reads it and
verifies its signature."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from celery.worker.request import Request
from kombu import Connection, Consumer
from kombu.entity import Queue

from portal.agents.dispatch import MESSAGE_EXPIRES_S
from portal.celery import app
from workers.agent import make_celery_app
from workers.protocol import TASK_ACK, TO_AGENT_TYPES, Ack, ReportKey, node_queue
from workers.signing import message_of, open_envelope, seal, verify_signature

KEY = bytes(range(32))


@pytest.fixture
def node(redis_url: str) -> Iterator[str]:
    """A node name of its own, so its queue holds only this test's messages."""
    name = f"publish-{uuid.uuid4().hex[:8]}"
    yield name
    with Connection(redis_url) as connection:
        connection.default_channel.client.delete(node_queue(name))


def _sealed_ack(node: str) -> dict:
    ack = Ack(node=node, reports=(ReportKey(kind="started", job_id=7, attempt=1, seq=0),))
    return seal(ack, node=node, key=KEY, now=time.time())


def _raw_messages(redis_url: str, queue: str) -> list[bytes]:
    with Connection(redis_url) as connection:
        return list(reversed(connection.default_channel.client.lrange(queue, 0, -1)))


def _without_ids(raw: bytes) -> str:
    """The message's text with its task id, delivery tag and expiry time (new for every
    message) replaced by fixed words."""
    message = json.loads(raw)
    text = raw.decode()
    for value, word in (
        (message["headers"]["id"], "TASK-ID"),
        (message["properties"]["delivery_tag"], "DELIVERY-TAG"),
        (message["headers"]["expires"], "EXPIRES"),
    ):
        text = text.replace(value, word)
    return text


def test_it_writes_what_send_task_writes_but_for_ids_and_times(redis_url, node):
    envelope = _sealed_ack(node)
    queue = node_queue(node)

    app.send_task(TASK_ACK, args=[envelope], queue=queue, expires=MESSAGE_EXPIRES_S, declare=())
    app.send_to_queue(TASK_ACK, envelope, queue=queue, expires_s=MESSAGE_EXPIRES_S)

    by_send_task, lean = _raw_messages(redis_url, queue)
    assert _without_ids(lean) == _without_ids(by_send_task)
    assert json.loads(lean)["headers"]["id"] != json.loads(by_send_task)["headers"]["id"]


def test_the_agents_celery_app_reads_and_verifies_what_it_sends(redis_url, node):
    envelope = _sealed_ack(node)
    app.send_to_queue(TASK_ACK, envelope, queue=node_queue(node), expires_s=MESSAGE_EXPIRES_S)

    agent_app = make_celery_app(redis_url, node)
    handled: list[object] = []

    @agent_app.task(name=TASK_ACK, ignore_result=True)
    def handle(payload: object) -> None:
        # What the agent's handler checks first (workers.agent.Agent._verified).
        opened = open_envelope(payload)
        verify_signature(opened, KEY)
        handled.append(message_of(opened, allowed_types=TO_AGENT_TYPES))

    received = []
    with (
        Connection(redis_url) as connection,
        Consumer(
            connection,
            queues=[Queue(node_queue(node), routing_key=node_queue(node))],
            callbacks=[lambda body, message: received.append(message)],
            accept=["json"],
        ),
    ):
        connection.drain_events(timeout=5)
    (message,) = received
    # The worker's own path from a broker message to the task: protocol 2 decoded by a
    # Request, run by the task's tracer.
    request = Request(message, app=agent_app, task=handle)
    assert request.task_name == TASK_ACK
    assert request.expires > datetime.now(UTC)  # read as a time: the agent drops it later
    request.execute()

    (ack,) = handled
    assert isinstance(ack, Ack)
    assert ack.node == node
    assert ack.reports == (ReportKey(kind="started", job_id=7, attempt=1, seq=0),)

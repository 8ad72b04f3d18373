"""Builders for tests of the control plane: agent reports as an agent would send them, and a
thread-safe recorder of the messages the portal sends. Imported by tests only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from portal.agents.keys import node_key_text
from portal.agents.tasks import agent_report
from portal.celery import app
from portal.cluster.models import Node
from workers.inventory import DEFAULT_DESCRIPTION, described_inventory
from workers.protocol import (
    Finished,
    Heartbeat,
    Inventory,
    LogChunk,
    Reports,
    RunningAttempt,
    Started,
    parse,
)
from workers.signing import key_from_text, seal

AGENT_VERSION = "test-agent"


BOOT = "test-boot"
_heartbeat_seq = iter(range(1, 10**9))


def heartbeat(
    node: str = "node-1",
    *,
    description: Mapping[str, Any] | None = None,
    running: Iterable[tuple[int, int] | RunningAttempt] = (),
    finished: Iterable[dict[str, Any]] = (),
    sent_at: float | None = None,
    boot: str = BOOT,
    previous_boot: str = "",
    address: str = "",
    inventory: Inventory | None = None,
    launch_batches: bool = False,
) -> dict[str, Any]:
    """A heartbeat dict with the described inventory (the default: 2 whole GPUs, one MIG GPU
    3g.40gb + 2g.20gb + 2 x 1g.10gb, one MPS GPU with 4 shares), or ``inventory`` as given
    (one with lost GPUs, as an NVML agent reports it). ``running`` takes
    (job, attempt) pairs (not started yet) or RunningAttempt records; ``finished`` takes
    dicts made by ``finished()``; ``address`` is where the node is reached (empty: what an
    agent older than the field sends); ``launch_batches``: the agent takes ``launches``
    messages (false: what an agent older than the field sends)."""
    return Heartbeat(
        node=node,
        boot=boot,
        address=address,
        previous_boot=previous_boot,
        seq=next(_heartbeat_seq),
        agent_version=AGENT_VERSION,
        sent_at=time.time() if sent_at is None else sent_at,
        inventory=inventory or described_inventory(node, description or DEFAULT_DESCRIPTION),
        running=tuple(
            r if isinstance(r, RunningAttempt) else RunningAttempt(job_id=r[0], attempt=r[1])
            for r in running
        ),
        finished=tuple(parse(f) for f in finished),  # type: ignore[misc]
        launch_batches=launch_batches,
    ).to_dict()


def signed(message: Mapping[str, Any], *, at: float | None = None) -> dict[str, str]:
    """``message`` in the envelope its node's agent would send, signed with the node's key
    (made now when the node has none)."""
    node = str(message["node"])
    key = key_from_text(node_key_text(name=node))
    return seal(parse(dict(message)), node=node, key=key, now=time.time() if at is None else at)


def deliver(message: Mapping[str, Any], *, at: float | None = None) -> str:
    """Run the control plane's report task on ``message``, signed: what a report from the
    node's agent does. Returns the task's verdict ("heartbeat", "refused: replay", ...)."""
    return agent_report(signed(message, at=at))


def register_node(
    node: str = "node-1",
    *,
    description: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    address: str = "",
    launch_batches: bool = False,
) -> Node:
    """Register (or refresh) a node the way its agent does: a key, then a heartbeat."""
    when = now or timezone.now()
    verdict = deliver(
        heartbeat(
            node,
            description=description,
            sent_at=when.timestamp(),
            address=address,
            launch_batches=launch_batches,
        )
    )
    if verdict != "heartbeat":
        raise AssertionError(f"the heartbeat of {node} was not accepted: {verdict}")
    return Node.objects.get(name=node)


def started(job_id: int, attempt: int, *, node: str = "node-1", at: float | None = None) -> dict:
    return Started(
        node=node,
        job_id=job_id,
        attempt=attempt,
        started_at=time.time() if at is None else at,
        pid=4242,
    ).to_dict()


def finished(
    job_id: int,
    attempt: int,
    *,
    outcome: str = "succeeded",
    exit_code: int | None = 0,
    node: str = "node-1",
    at: float | None = None,
    error: str = "",
    started_at: float | None = None,
) -> dict:
    return Finished(
        node=node,
        job_id=job_id,
        attempt=attempt,
        exit_code=exit_code,
        outcome=outcome,  # type: ignore[arg-type]
        finished_at=time.time() if at is None else at,
        error=error,
        started_at=started_at,
    ).to_dict()


def log_chunk(job_id: int, attempt: int, seq: int, data: str, *, node: str = "node-1") -> dict:
    return LogChunk(node=node, job_id=job_id, attempt=attempt, seq=seq, data=data).to_dict()


def reports(*items: Mapping[str, Any], node: str = "node-1") -> dict:
    """The ``reports`` batch of ``items`` (dicts made by ``started()``, ``log_chunk()``,
    ``finished()``), as an agent sends what waited in its outbox."""
    return Reports(node=node, reports=tuple(parse(dict(i)) for i in items)).to_dict()  # type: ignore[misc]


@dataclass
class SentMessages:
    """What the portal sent through Celery: (task name, message dict, queue), in order."""

    sent: list[tuple[str, Any, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        message = args[0] if args else kwargs
        with self.lock:
            self.sent.append((name, message, options.get("queue")))

    def record_to_queue(self, name: str, envelope: Any, *, queue: str, **_: Any) -> None:
        self.record(name, args=[envelope], queue=queue)

    def of(self, task: str) -> list[tuple[Any, str | None]]:
        """The messages sent to ``task`` (unwrapped from their signed envelopes), with queues."""
        with self.lock:
            return [(_unwrap(message), queue) for name, message, queue in self.sent if name == task]

    def queries(self) -> list[tuple[dict, str]]:
        return self.of("agent.query")  # type: ignore[return-value]

    def acks(self) -> list[tuple[dict, str]]:
        return self.of("agent.ack")  # type: ignore[return-value]

    def launches(self) -> list[tuple[dict, str]]:
        return self.of("agent.launch")  # type: ignore[return-value]

    def stops(self) -> list[tuple[dict, str]]:
        return self.of("agent.stop")  # type: ignore[return-value]


def _unwrap(message: Any) -> Any:
    if isinstance(message, dict) and set(message) == {"signed", "sig"}:
        return json.loads(message["signed"])["msg"]
    return message


@contextmanager
def capture_sent_messages() -> Iterator[SentMessages]:
    """Replace the Celery app's ``send_task`` and ``send_to_queue`` (the agents' messages)
    with a recorder (thread-safe) for the block."""
    recorder = SentMessages()
    original, original_to_queue = app.send_task, app.send_to_queue
    app.send_task = recorder.record  # type: ignore[method-assign]
    app.send_to_queue = recorder.record_to_queue  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        app.send_task = original  # type: ignore[method-assign]
        app.send_to_queue = original_to_queue  # type: ignore[method-assign]

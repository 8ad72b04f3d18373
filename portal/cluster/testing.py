"""Builders for tests of the control plane: agent reports as an agent would send them, and a
thread-safe recorder of the messages the portal sends. Imported by tests only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from portal.cluster.models import Node
from workers.inventory import DEFAULT_DESCRIPTION, described_inventory
from workers.protocol import Finished, Heartbeat, JobRef, LogChunk, Started, parse

AGENT_VERSION = "test-agent"


def heartbeat(
    node: str = "node-1",
    *,
    description: Mapping[str, Any] | None = None,
    running: Iterable[tuple[int, int]] = (),
    sent_at: float | None = None,
) -> dict[str, Any]:
    """A heartbeat dict with the described inventory (the default: 2 whole GPUs, one MIG GPU
    3g.40gb + 2g.20gb + 2 x 1g.10gb, one MPS GPU with 4 shares)."""
    return Heartbeat(
        node=node,
        agent_version=AGENT_VERSION,
        sent_at=time.time() if sent_at is None else sent_at,
        inventory=described_inventory(node, description or DEFAULT_DESCRIPTION),
        running=tuple(JobRef(job_id=j, attempt=a) for j, a in running),
    ).to_dict()


def register_node(
    node: str = "node-1",
    *,
    description: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Node:
    """Register (or refresh) a node the way its agent does: through a heartbeat report."""
    from portal.cluster.services import handle_report

    when = now or timezone.now()
    handle_report(
        parse(heartbeat(node, description=description, sent_at=when.timestamp())), now=when
    )
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


@dataclass
class SentMessages:
    """What the portal sent through Celery: (task name, message dict, queue), in order."""

    sent: list[tuple[str, Any, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        message = args[0] if args else kwargs
        with self.lock:
            self.sent.append((name, message, options.get("queue")))

    def of(self, task: str) -> list[tuple[Any, str | None]]:
        with self.lock:
            return [(message, queue) for name, message, queue in self.sent if name == task]

    def launches(self) -> list[tuple[dict, str]]:
        return self.of("agent.launch")  # type: ignore[return-value]

    def stops(self) -> list[tuple[dict, str]]:
        return self.of("agent.stop")  # type: ignore[return-value]


@contextmanager
def capture_sent_messages() -> Iterator[SentMessages]:
    """Replace the Celery app's ``send_task`` with a recorder (thread-safe) for the block."""
    from portal.celery import app

    recorder = SentMessages()
    original = app.send_task
    app.send_task = recorder.record  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        app.send_task = original  # type: ignore[method-assign]

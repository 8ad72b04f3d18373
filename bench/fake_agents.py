"""Agents that answer at once: for `bench.api`'s admissions figure.

A few threads, each with its own broker connection, consume the queues of many nodes
(``node.<name>``, as the real agent does, with the same kombu queue declaration; each thread
a share of the nodes) and answer every launch the portal sends, once its
signature is checked with the node's key, with a signed ``started`` report sent the way the
real agent sends it: in ``reports`` batches (``workers.protocol.report_batches``), signed and
sent by ``workers.agent.CelerySender`` on the ``control`` queue. A ``launches`` message (the
portal sends one per node and pass to agents that take them, as these say they do when they
register: ``launch_batches``) is answered with one batch of its ``started`` reports, as the
real agent's reports pile up into one batch while it starts a node's attempts. Nothing is
run; acknowledgements and other messages are taken off the queue and dropped. It records
when the first and the last launch arrived and when the last report went out, so the benchmark can say
where the time went (the pass, dispatch, or the portal's handling of the reports).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from types import TracebackType

from kombu import Connection, Consumer
from kombu.entity import Queue

from workers.agent import CelerySender, make_celery_app
from workers.protocol import (
    TASK_LAUNCH,
    Launch,
    Launches,
    Started,
    node_queue,
    report_batches,
)
from workers.signing import (
    Envelope,
    SignatureError,
    message_of,
    open_envelope,
    verify_signature,
)


class FakeAgents:
    """``with FakeAgents(broker_url, keys): ...`` where ``keys`` maps node names to their keys."""

    def __init__(self, broker_url: str, keys: Mapping[str, bytes], *, threads: int = 4) -> None:
        self.broker_url = broker_url
        self.keys = dict(keys)
        self.launches = 0
        self.started_sent = 0
        self.refused = 0
        self.consumed = 0
        self.first_launch_at: float | None = None  # time.monotonic()
        self.last_launch_at: float | None = None
        self.last_started_at: float | None = None
        self._count = threading.Lock()
        self._stop = threading.Event()
        nodes = sorted(self.keys)
        shares = [nodes[index::threads] for index in range(threads) if nodes[index::threads]]
        self._ready = threading.Barrier(len(shares) + 1, timeout=30)
        self._threads = [
            threading.Thread(target=self._run, args=(share,), name=f"fake-agents-{n}", daemon=True)
            for n, share in enumerate(shares)
        ]

    def __enter__(self) -> FakeAgents:
        for thread in self._threads:
            thread.start()
        try:
            self._ready.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError("fake agents: could not start consuming within 30 s") from None
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self, nodes: list[str]) -> None:
        app = make_celery_app(self.broker_url, "bench-fake-agents")
        senders = {node: CelerySender(app, node=node, key=self.keys[node]) for node in nodes}
        queues = [Queue(node_queue(node), routing_key=node_queue(node)) for node in nodes]

        def on_message(body: object, message: object) -> None:
            self._on_message(body, message, senders)

        with (
            Connection(self.broker_url) as connection,
            Consumer(connection, queues=queues, callbacks=[on_message], accept=["json"]),
        ):
            self._ready.wait()
            while not self._stop.is_set():
                try:
                    connection.drain_events(timeout=0.2)
                except TimeoutError:
                    continue

    def _on_message(
        self, body: object, message: object, senders: Mapping[str, CelerySender]
    ) -> None:
        task = message.headers.get("task")  # type: ignore[attr-defined]
        message.ack()  # type: ignore[attr-defined]
        with self._count:
            self.consumed += 1
        if task != TASK_LAUNCH or not isinstance(body, list | tuple) or not body[0]:
            return  # acks, queries: nothing to answer
        try:
            envelope = open_envelope(body[0][0])
        except SignatureError:
            with self._count:
                self.refused += 1
            return
        key = self.keys.get(envelope.node)
        if key is None:
            with self._count:
                self.refused += 1
            return
        launches, started = answer_launches(envelope, key)
        with self._count:
            self.launches += launches
            self.last_launch_at = time.monotonic()
            if self.first_launch_at is None:
                self.first_launch_at = self.last_launch_at
        for batch in report_batches(envelope.node, started):
            senders[envelope.node](batch)
        with self._count:
            self.started_sent += len(started)
            self.last_started_at = time.monotonic()


def answer_launches(envelope: Envelope, key: bytes) -> tuple[int, list[Started]]:
    """What a fake agent answers a signed ``launch`` or ``launches`` message with: the number
    of launches in it, and a ``started`` report for each, as if every job started at once."""
    verify_signature(envelope, key)
    message = message_of(envelope, allowed_types={Launch.TYPE, Launches.TYPE})
    launches = message.launches if isinstance(message, Launches) else (message,)
    started = [
        Started(
            node=envelope.node,
            job_id=launch.job_id,
            attempt=launch.attempt,
            started_at=time.time(),
            pid=os.getpid(),
        )
        for launch in launches
        if isinstance(launch, Launch)
    ]
    return len(launches), started

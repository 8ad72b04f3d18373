"""The container watchdog's process life: one per work directory, detached from the agent,
reused or replaced by a restarted agent. Real processes; the engine is one that cannot be
reached (its fencing against a real engine is in test_docker_engine.py), so these watchdogs
never know that nothing is left to guard and keep running until the test kills them."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from workers.watchdog import agent_alive, ensure_watchdog, process_identity

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

NODE = "wd-1"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """An agent work directory; every watchdog it ends up with is killed afterwards."""
    workdir = tmp_path / "agent"
    started: list[int] = []
    yield workdir
    started += [int(p.read_text()) for p in [workdir / "watchdog.pid"] if p.exists()]
    for pid in started:
        if process_identity(pid) is not None:
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def no_engine(tmp_path: Path) -> str:
    return f"unix://{tmp_path / 'no-engine.sock'}"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def lock_is_held(path: Path) -> bool:
    """Whether some process holds the flock on `path` (this test process never does)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_restarted_agent_keeps_the_running_watchdog(workdir: Path, no_engine: str) -> None:
    first = ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine)
    again = ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine)
    assert again == first
    assert process_identity(first) is not None
    assert lock_is_held(workdir / "watchdog.lock")
    assert (workdir / "watchdog.pid").read_text() == str(first)


def test_the_watchdog_outlives_an_agent_killed_with_its_whole_process_group(
    workdir: Path, no_engine: str
) -> None:
    code = (
        "import sys, time; from pathlib import Path; from workers.watchdog import ensure_watchdog;"
        f"print(ensure_watchdog(workdir=Path({str(workdir)!r}), node={NODE!r},"
        f" docker_host={no_engine!r}), flush=True); time.sleep(60)"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert agent.stdout is not None
    watchdog = int(agent.stdout.readline())
    assert agent_alive(workdir)

    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    time.sleep(1.0)  # two ticks of the watchdog

    assert not agent_alive(workdir)
    assert process_identity(watchdog) is not None  # still guarding the node
    # A restarted agent finds it and registers itself with it.
    assert ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine) == watchdog
    assert agent_alive(workdir)
    log = workdir / "watchdog.log"
    wait_until(lambda: "engine check failed" in log.read_text())  # it keeps trying
    assert "guarding node wd-1" in log.read_text()


def test_a_restarted_agent_replaces_a_watchdog_that_died(workdir: Path, no_engine: str) -> None:
    first = ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: process_identity(first) is None)
    # Its pid file is stale now, but its lock died with it.
    second = ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine)
    assert second != first
    assert lock_is_held(workdir / "watchdog.lock")
    assert (workdir / "watchdog.pid").read_text() == str(second)


def test_a_second_watchdog_started_by_hand_leaves_the_running_one_alone(
    workdir: Path, no_engine: str
) -> None:
    first = ensure_watchdog(workdir=workdir, node=NODE, docker_host=no_engine)
    second = subprocess.run(
        [sys.executable, "-m", "workers.watchdog", f"--workdir={workdir}", f"--node={NODE}"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert second.returncode == 0
    assert "another watchdog guards" in second.stderr
    assert (workdir / "watchdog.pid").read_text() == str(first)


def test_a_zombie_or_a_reused_pid_is_not_taken_for_the_agent(workdir: Path) -> None:
    workdir.mkdir()
    exited = subprocess.Popen(["true"])  # not waited for: a zombie until reaped
    wait_until(lambda: process_identity(exited.pid) is None)
    (workdir / "agent.pid").write_text(f"{exited.pid}")
    assert not agent_alive(workdir)
    exited.wait()

    me = process_identity(os.getpid())
    assert me is not None
    (workdir / "agent.pid").write_text(me)
    assert agent_alive(workdir)
    # The same pid, started at another time: a new process that reuses the agent's pid.
    (workdir / "agent.pid").write_text(f"{os.getpid()}:1")
    assert not agent_alive(workdir)

"""Driving the FAKE nvidia-cuda-mps-control (tests/bin/) the way real MPS daemons fail.

The fake is a small stand-in for NVIDIA's program (its docstring says what it does and does
not do); the agent runs it through its real code path, by path instead of from PATH. These
helpers kill a daemon as a crash would (SIGKILL: its pipe stays behind), hang it (SIGSTOP),
read what it was told (its control.log) and clean up every daemon a test left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

FAKE_MPS_CONTROL = str(Path(__file__).parent / "bin" / "nvidia-cuda-mps-control")
PID_FILE = "nvidia-cuda-mps-control.pid"


def daemon_pid(pipe: Path) -> int:
    return int((pipe / PID_FILE).read_text().strip())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_daemon(pipe: Path) -> int:
    """Crash the daemon of `pipe`: SIGKILL, so its `control` and pid file stay behind."""
    pid = daemon_pid(pipe)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pid):
        assert time.monotonic() < deadline, f"daemon {pid} did not die"
        time.sleep(0.01)
    return pid


def freeze_daemon(pipe: Path) -> int:
    """Hang the daemon of `pipe` (SIGSTOP): it is alive and answers nobody."""
    pid = daemon_pid(pipe)
    os.kill(pid, signal.SIGSTOP)
    return pid


def commands(logs: Path) -> list[str]:
    """The commands the daemon(s) of a GPU received, in order (from `control.log`)."""
    path = logs / "control.log"
    if not path.exists():
        return []
    return [
        line.split("command: ", 1)[1]
        for line in path.read_text().splitlines()
        if "command: " in line
    ]


def starts(logs: Path) -> list[str]:
    """One line per daemon started on a GPU: `started pid <n> CUDA_VISIBLE_DEVICES=<uuid>`."""
    path = logs / "control.log"
    if not path.exists():
        return []
    return [
        line.split(" ", 2)[2] for line in path.read_text().splitlines() if " started pid " in line
    ]


@contextlib.contextmanager
def mps_root() -> Iterator[Path]:
    """A short MPS root (a Unix socket path is at most 107 bytes), and afterwards no daemon
    left running from it."""
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    try:
        yield root
    finally:
        for pid_file in root.glob(f"*/pipe/{PID_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().strip())
                # Only a fake daemon: a dead one's pid may belong to someone else by now.
                if b"nvidia-cuda-mps-control" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)

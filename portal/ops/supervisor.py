"""Start a few long-running child processes, show their output, and stop them together.

Used by `manage.py runportal` (the embedded default) and by `tests/stack.py` (the end-to-end
and browser tests), so both run the portal the same way. No Django here.

- Each child runs in its own session, so a Ctrl-C in the terminal reaches only the
  supervisor, which then stops the children in order (the broker last, so the others can
  still talk to it while they shut down).
- On Linux each child also gets PR_SET_PDEATHSIG: if the supervisor itself is killed
  (SIGKILL, OOM), its children get SIGTERM instead of living on as orphans.
- Every line a child prints is written as `name | line`, and the last lines of each child
  are kept for a failure report.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildSpec:
    """One process to run: a short name for its output, its argv and its whole environment."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    # Stopped after every other child has exited (the broker the others talk to).
    stop_last: bool = False


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    reader: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def exit_code(self) -> int | None:
        return self.process.poll()


class ChildExited(RuntimeError):
    """A child stopped while it was expected to run."""

    def __init__(self, child: Child) -> None:
        code = child.exit_code()
        super().__init__(f"{child.name} exited unexpectedly with code {code}")
        self.child = child
        self.code = code


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM it when the supervisor dies."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Supervisor:
    """Owns the children it started; `stop_all()` is safe to call more than once."""

    def __init__(
        self, *, output: TextIO | None = None, stop_timeout_s: float = 10.0, colour: bool = False
    ) -> None:
        self._output = output if output is not None else sys.stdout
        self._stop_timeout_s = stop_timeout_s
        self._colour = colour
        self._lock = threading.Lock()
        # Names are padded to line up; "broker" and "worker" are the usual longest.
        self._width = 6
        self.children: list[Child] = []
        self.stopping = False

    # --- starting ------------------------------------------------------------------------------

    def start(self, spec: ChildSpec) -> Child:
        self._width = max(self._width, len(spec.name))
        process = subprocess.Popen(  # noqa: S603 - argv built by our own code, no shell
            list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        child = Child(spec=spec, process=process)
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"output-{spec.name}", daemon=True
        )
        child.reader.start()
        self.children.append(child)
        return child

    def _pump(self, child: Child) -> None:
        assert child.process.stdout is not None
        colour = _COLOURS[len(self.children) % len(_COLOURS)] if self._colour else ""
        reset = "\033[0m" if self._colour else ""
        for raw in iter(child.process.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            child.lines.append(line)
            self.say(f"{colour}{child.name:<{self._width}} |{reset} {line}")
        child.process.stdout.close()

    def say(self, text: str) -> None:
        """Write one line to the shared output without tearing a child's line in two."""
        with self._lock:
            try:
                self._output.write(text + "\n")
                self._output.flush()
            except (ValueError, OSError):
                # The output was closed under us (a test finished); the line is still kept.
                pass

    # --- watching ------------------------------------------------------------------------------

    def exited(self) -> Child | None:
        """The first child that is no longer running, if any."""
        for child in self.children:
            if child.exit_code() is not None:
                return child
        return None

    def check_running(self) -> None:
        """Raise ChildExited when a child has stopped (unless we are stopping them)."""
        child = self.exited()
        if child is not None and not self.stopping:
            raise ChildExited(child)

    def wait_until(
        self, ready: Callable[[], bool], *, timeout_s: float, what: str, poll_s: float = 0.1
    ) -> None:
        """Poll `ready` until it is true; fail early when a child dies, or after the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_running()
            if ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def tail(self, lines: int = 60) -> str:
        """The last lines of every child, for a failure report."""
        parts = []
        for child in self.children:
            kept = list(child.lines)[-lines:]
            parts.append(f"----- {child.name} (exit code {child.exit_code()}) -----")
            parts.extend(kept or ["(no output)"])
        return "\n".join(parts)

    # --- stopping ------------------------------------------------------------------------------

    def stop_all(self) -> None:
        """SIGTERM every child, wait, SIGKILL what is left; the `stop_last` ones go last."""
        self.stopping = True
        first = [c for c in reversed(self.children) if not c.spec.stop_last]
        last = [c for c in reversed(self.children) if c.spec.stop_last]
        for wave in (first, last):
            self._stop_wave(wave)
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=2)

    def _stop_wave(self, children: list[Child]) -> None:
        running = [c for c in children if c.exit_code() is None]
        for child in running:
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout_s
        for child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in {self._stop_timeout_s:.0f} s: killing it")
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
        # Whatever a child left behind in its process group goes too (gunicorn workers, etc.).
        for child in children:
            _signal_group(child.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the child's whole process group (it is its own session leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


_COLOURS = ("\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[31m")

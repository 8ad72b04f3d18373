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
- `tend()` (runportal's loop) restarts a child that crashed, after a delay that doubles with
  each crash; a child that crashes too often in a short window stops everything
  (`CrashLoop`). The tests' stack uses `check_running()` instead: there a death is a failure.
- A child may need longer than the others to stop (the agent stops its jobs first): its
  spec's `stop_timeout_s` is how long it gets between SIGTERM and SIGKILL.
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
    # Seconds between SIGTERM and SIGKILL; None: the supervisor's default.
    stop_timeout_s: float | None = None


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


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a crashed child after `first_delay_s`, doubling up to `max_delay_s`; more than
    `max_crashes` crashes of one child within `window_s` stop everything instead."""

    max_crashes: int = 5
    window_s: float = 60.0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0


class CrashLoop(RuntimeError):
    """A child crashed too often in a short window: restarting it again would only hide it."""

    def __init__(self, child: Child, crashes: int, window_s: float) -> None:
        code = child.exit_code()
        super().__init__(
            f"{child.name} crashed {crashes} times in {window_s:g} s "
            f"(last exit code {code}); not restarting it again"
        )
        self.child = child
        self.code = code


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
        # Per child name: when it crashed (monotonic), and when it is due to start again.
        self._crashes: dict[str, list[float]] = {}
        self._restart_at: dict[str, float] = {}

    # --- starting ------------------------------------------------------------------------------

    def start(self, spec: ChildSpec) -> Child:
        child = self._spawn(spec)
        self.children.append(child)
        return child

    def _spawn(self, spec: ChildSpec) -> Child:
        self._width = max(self._width, len(spec.name))
        process = subprocess.Popen(  # noqa: S603 - argv built by our own code, no shell
            list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # What the portal writes (the SQLite database, beat's schedule, the broker's
            # socket) is its own: jobs run as other users and must not open any of it.
            umask=0o077,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        child = Child(spec=spec, process=process)
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"output-{spec.name}", daemon=True
        )
        child.reader.start()
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

    def tend(self, *, policy: RestartPolicy, now: float | None = None) -> None:
        """Restart what crashed, each after its backoff delay; raise CrashLoop when a child
        crashed more than the policy allows. Call it every fraction of a second."""
        if self.stopping:
            return
        now = time.monotonic() if now is None else now
        for index, child in enumerate(self.children):
            name = child.name
            if child.exit_code() is None:
                continue
            if name not in self._restart_at:
                recent = [t for t in self._crashes.get(name, []) if now - t <= policy.window_s]
                recent.append(now)
                self._crashes[name] = recent
                if len(recent) > policy.max_crashes:
                    raise CrashLoop(child, len(recent), policy.window_s)
                delay = min(policy.max_delay_s, policy.first_delay_s * 2 ** (len(recent) - 1))
                self._restart_at[name] = now + delay
                self.say(
                    f"runportal: {name} exited with code {child.exit_code()}; restarting it in "
                    f"{delay:g} s (crash {len(recent)} of {policy.max_crashes} allowed "
                    f"in {policy.window_s:g} s)"
                )
            elif now >= self._restart_at[name]:
                del self._restart_at[name]
                if child.reader is not None:
                    child.reader.join(timeout=2)
                # Whatever the crashed child left in its process group goes with it.
                _signal_group(child.process, signal.SIGKILL)
                replacement = self._spawn(child.spec)
                # The buffered last lines stay, for a failure report after a crash loop.
                replacement.lines.extend(child.lines)
                self.children[index] = replacement
                self.say(f"runportal: {name} restarted (pid {replacement.process.pid})")

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
        started = time.monotonic()
        for child in running:
            grace = child.spec.stop_timeout_s
            grace = self._stop_timeout_s if grace is None else grace
            try:
                child.process.wait(timeout=max(0.0, started + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in {grace:g} s: killing it")
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

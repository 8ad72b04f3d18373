"""Launchers start one attempt and hand back a `Run` that the supervisor drives.

`ProcessLauncher` (embedded default, tests) runs the command as a local process;
`DockerLauncher` (production) runs it in a container with the NVIDIA device request. Both
take the job's environment from `workers.launch.job_environment`, so a job sees the same
slice variables either way.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Protocol

from workers.protocol import Launch


class Run(Protocol):
    """One started attempt. `pid` is set for a process, `container_id` for a container.

    Optional members a launcher's run may have, read by the supervisor when present:
    `notes` (lines for the top of the job's log), `fenced()` (why a watcher stopped it when the
    lease lapsed), `stop_reached()` (whether a stop signal reached it while it ran; absent:
    assumed), `end_note` (text added to its result, e.g. an OOM kill) and `lost()` (why what
    it ran on failed under it, e.g. its GPU's MPS daemon died: reported `lost`, not its exit;
    `workers.mps.MpsRun`)."""

    pid: int | None
    container_id: str | None

    def output(self, offset: int = 0) -> Iterator[bytes]:
        """stdout and stderr together, in chunks, from byte `offset` of the attempt's output
        (which outlives the agent: a restarted agent goes on where the last one stopped)
        until it ends. The same bytes every time it is read."""
        ...

    def wait(self) -> int:
        """Block until the attempt exits; its exit code (128 + n when killed by signal n)."""
        ...

    def has_exited(self) -> bool: ...

    def terminate(self, grace_s: float) -> None:
        """Ask it to stop now (SIGTERM) and kill it after `grace_s`; returns at once."""
        ...

    def reap(self) -> None:
        """Right after exit: kill what the attempt left running (its output then ends)."""
        ...

    def release(self) -> None:
        """After its output was read: free what the launcher holds (e.g. the container)."""
        ...


class Launcher(Protocol):
    name: str

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> Run:
        """Start the attempt or raise (LaunchError, OSError, an engine error): the caller
        reports any exception as outcome 'launch_error'. ``lease_epoch``: the agent's lease
        epoch the launch was accepted in (workers.lease); a launcher whose watcher reads the
        lease refuses to start it in another epoch (LeaseLapsed)."""
        ...


def exit_code_from_returncode(returncode: int) -> int:
    """Popen reports death by signal n as -n; shells and Docker report 128 + n."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(code: int) -> str:
    if code > 128:
        try:
            return f"exit code {code} (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit code {code}"

"""A job that runs until it is stopped: a real process (`sleep`), as a CUDA client would be,
without the process launcher's isolation. For end-to-end tests of the agent and the portal
that are about what happens around the job (its MPS daemon died, its GPU fell off the bus)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

from workers.launchers import exit_code_from_returncode


class SleepingLauncher:
    """Starts `sleep 600` for every launch."""

    name = "sleeping"

    def start(self, launch: object, *, lease_epoch: int | None = None) -> SleepRun:
        return SleepRun(subprocess.Popen(["sleep", "600"]))


class SleepRun:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.pid: int | None = process.pid
        self.container_id: str | None = None

    def output(self, offset: int = 0) -> Iterator[bytes]:
        self.process.wait()
        return iter(())

    def wait(self) -> int:
        return exit_code_from_returncode(self.process.wait())

    def has_exited(self) -> bool:
        return self.process.poll() is not None

    def terminate(self, grace_s: float) -> None:
        self.process.terminate()

    def reap(self) -> None:
        pass

    def release(self) -> None:
        pass

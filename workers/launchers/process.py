"""Run an attempt as a local process: the embedded default and the tests.

The process gets the job environment (slice variables included), its own process group
(so a stop reaches everything it spawned), a work directory of its own under
`<workdir>/jobs/<job_id>-<attempt>` (also its HOME), and stdout+stderr on one pipe. A `pid`
file there lets a restarted agent refuse a launch whose attempt still runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from workers.launch import LaunchError, job_environment
from workers.launchers import exit_code_from_returncode
from workers.protocol import Launch

# Only these are passed through from the agent's own environment; everything else a job
# sees comes from the launch message or the slice.
PASS_THROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH")
READ_SIZE = 64 * 1024
PID_FILE = "pid"


class ProcessRun:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self.pid: int | None = process.pid
        self.container_id: str | None = None
        self._kill_timer: threading.Timer | None = None

    def output(self) -> Iterator[bytes]:
        stream = self._process.stdout
        assert stream is not None
        try:
            while data := os.read(stream.fileno(), READ_SIZE):
                yield data
        finally:
            stream.close()

    def wait(self) -> int:
        return exit_code_from_returncode(self._process.wait())

    def has_exited(self) -> bool:
        return self._process.poll() is not None

    def terminate(self, grace_s: float) -> None:
        self._signal_group(signal.SIGTERM)
        if self._kill_timer is None:
            self._kill_timer = threading.Timer(grace_s, self._signal_group, (signal.SIGKILL,))
            self._kill_timer.daemon = True
            self._kill_timer.start()

    def reap(self) -> None:
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        # Children the command left running would hold the GPU (and our pipe) open.
        self._signal_group(signal.SIGKILL)

    def release(self) -> None:
        """Nothing to free: the work directory stays for the user's files."""

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # group gone already
            os.killpg(self._process.pid, sig)


class ProcessLauncher:
    name = "process"

    def __init__(
        self, *, workdir: Path, mps_root: Path, environ: Mapping[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.mps_root = mps_root
        self._environ = os.environ if environ is None else environ

    def job_dir(self, launch: Launch) -> Path:
        return self.workdir / "jobs" / f"{launch.job_id}-{launch.attempt}"

    def start(self, launch: Launch) -> ProcessRun:
        job_dir = self._fresh_job_dir(launch)
        base = {k: self._environ[k] for k in PASS_THROUGH_ENV if k in self._environ}
        base["HOME"] = str(job_dir)
        env = job_environment(launch, mps_root=self.mps_root, base=base)
        try:
            process = subprocess.Popen(
                list(launch.command),
                env=env,
                cwd=job_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session and process group: stop reaches all
            )
        except FileNotFoundError:
            raise LaunchError(f"command not found: {launch.command[0]}") from None
        except PermissionError:
            raise LaunchError(f"command is not executable: {launch.command[0]}") from None
        (job_dir / PID_FILE).write_text(f"{process.pid}\n")
        return ProcessRun(process)

    def _fresh_job_dir(self, launch: Launch) -> Path:
        """The attempt's work directory, new. One left by an earlier agent run is refused
        while its process group still runs (the attempt must not run twice) and moved aside
        otherwise (for example after the portal's database was reset)."""
        job_dir = self.job_dir(launch)
        if job_dir.exists():
            pid = _recorded_pid(job_dir / PID_FILE)
            if pid is not None and _group_alive(pid):
                raise LaunchError(
                    f"attempt already running on this node, started by an earlier agent run "
                    f"(process group {pid})"
                )
            job_dir.rename(job_dir.with_name(f"{job_dir.name}.replaced-{time.time_ns()}"))
        job_dir.mkdir(parents=True)
        return job_dir


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _group_alive(pid: int) -> bool:
    """True while `pid` still leads its own process group (what the launcher started)."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False

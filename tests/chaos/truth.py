"""Ground truth: what the jobs themselves recorded, and when the harness saw them alive.

Each job appends `start` / `tick` / `term` / `end` lines to `<truth>/<job id>.log`
(tests/chaos/chaos_job.py). A `ProcessWatcher` thread reads those files as they grow and
looks at every recorded pid four times a second, so an execution that was killed without a
word (SIGKILL) still has a bounded end: it was alive at its last line or sighting, and dead
by the first time the watcher found its pid gone.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

JOB_SCRIPT = Path(__file__).with_name("chaos_job.py")
WATCH_INTERVAL_S = 0.25


@dataclass
class Execution:
    """One run of one job's command, as its own lines and the watcher tell it."""

    job_id: int
    attempt: int
    pid: int
    started: float
    cwd: str = ""
    last_line: float = 0.0  # time of its latest line of any kind
    ticks: int = 0
    term: float | None = None
    end: float | None = None
    seen_alive: float | None = None  # latest time the watcher found the pid running
    seen_dead: float | None = None  # first time the watcher found it gone

    @property
    def alive_until(self) -> float:
        """It certainly ran until at least this time."""
        return max(self.last_line, self.seen_alive or 0.0)

    @property
    def dead_by(self) -> float | None:
        """It had certainly stopped by this time (None: not seen stopped)."""
        if self.end is not None:
            return self.end
        if self.term is not None:
            return self.term
        return self.seen_dead

    @property
    def how_it_ended(self) -> str:
        if self.end is not None:
            return "end"
        if self.term is not None:
            return "SIGTERM"
        if self.seen_dead is not None:
            return "killed"
        return "still running"

    def node(self, workdirs: dict[str, str]) -> str:
        """The agent that started it, from its working directory `<workdir>/jobs/...`."""
        for node, workdir in workdirs.items():
            if self.cwd.startswith(workdir.rstrip("/") + "/"):
                return node
        return "?"


@dataclass
class Truth:
    executions: list[Execution] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)

    def by_job(self) -> dict[int, list[Execution]]:
        jobs: dict[int, list[Execution]] = {}
        for execution in self.executions:
            jobs.setdefault(execution.job_id, []).append(execution)
        for runs in jobs.values():
            runs.sort(key=lambda run: run.started)
        return jobs


class ProcessWatcher:
    """Reads the truth files as they grow and watches the pids they name."""

    def __init__(self, truth_dir: Path) -> None:
        self.truth_dir = truth_dir
        self.truth = Truth()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        # Key: (job, attempt, pid). Two `start`s of one attempt make two executions.
        self._open: dict[tuple[int, int, int], Execution] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="truth-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.scan()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            self.scan()

    def scan(self) -> None:
        with self._lock:
            self._read_new_lines()
            now = time.time()
            for execution in self.truth.executions:
                if execution.seen_dead is not None or execution.end is not None:
                    continue
                if _job_process_alive(execution.pid):
                    execution.seen_alive = now
                else:
                    execution.seen_dead = now

    def running(self) -> list[Execution]:
        """Executions whose process the watcher still finds alive."""
        with self._lock:
            return [e for e in self.truth.executions if e.seen_dead is None and e.end is None]

    def _read_new_lines(self) -> None:
        for path in sorted(self.truth_dir.glob("*.log")):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                continue
            if not data:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for raw in lines:
                self._take(raw.decode("utf-8", errors="replace"))

    def _take(self, line: str) -> None:
        parts = line.split()
        try:
            kind, job_id, attempt, at = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
        except (IndexError, ValueError):
            self.truth.malformed.append(line)
            return
        if kind == "start" and len(parts) >= 5:
            execution = Execution(
                job_id=job_id,
                attempt=attempt,
                pid=int(parts[4]),
                started=at,
                cwd=parts[5] if len(parts) > 5 else "",
                last_line=at,
            )
            self.truth.executions.append(execution)
            self._open[(job_id, attempt, execution.pid)] = execution
            return
        try:
            execution = self._open.get((job_id, attempt, int(parts[4])))
        except (IndexError, ValueError):
            execution = None
        if execution is None:
            self.truth.malformed.append(line)
            return
        execution.last_line = max(execution.last_line, at)
        if kind == "tick":
            execution.ticks += 1
        elif kind == "term":
            execution.term = at
        elif kind == "end":
            execution.end = at
        else:
            self.truth.malformed.append(line)


def _job_process_alive(pid: int) -> bool:
    """True while `pid` is a running (not zombie) chaos job process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and JOB_SCRIPT.name.encode() in cmdline


def kill_job_processes(executions: list[Execution]) -> list[int]:
    """SIGKILL what is left of these executions (their process groups); returns the pids."""
    import signal

    killed = []
    for execution in executions:
        if not _job_process_alive(execution.pid):
            continue
        for kill, target in ((os.killpg, execution.pid), (os.kill, execution.pid)):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        killed.append(execution.pid)
    return killed

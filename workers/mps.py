"""MPS, supervised: one control daemon per GPU in MPS mode, started, watched and restarted by
the agent, and the agent's own check that one daemon never serves two teams.

Jobs on an MPS share find their GPU's daemon through CUDA_MPS_PIPE_DIRECTORY (see
`workers.launch`): each GPU has its own pipe and log directory, `<mps root>/<uuid>/pipe` and
`/log`. With a described inventory there is no daemon: the directories are made so the paths
a job sees exist, and only the team rule below applies.

With a driver and `nvidia-cuda-mps-control` on PATH, `MpsSupervisor`:

1. **Starts** one daemon per MPS GPU (`nvidia-cuda-mps-control -d`, CUDA_VISIBLE_DEVICES =
   that GPU's UUID) unless one already answers in its pipe directory (adopted).
2. **Checks** each one every heartbeat: `echo get_server_list | nvidia-cuda-mps-control` with
   that GPU's CUDA_MPS_PIPE_DIRECTORY, within a timeout. A daemon is dead when its control
   pipe is gone, the process its pid file names is gone, or the command fails or answers
   something other than server PIDs; a live daemon that times out UNANSWERED_LIMIT times in a
   row counts as dead too (hung), and is killed.
3. **Loses** that GPU's jobs when it dies: each is stopped and reported `finished` with
   outcome `lost` and error `MPS_SERVER_DIED: ...`; the portal requeues it within its retry
   bound. A job that exits with an error first (its CUDA calls failed when the server went)
   makes the agent check its daemon at once, so it is not reported `failed` for it.
4. **Restarts** it: the first time at once, then after 1, 2, 4 ... s (at most 60 s) while it
   keeps dying or failing to start; the count resets once it has stayed up for 60 s. Before
   each start, what a dead daemon left in the pipe directory (`control`, the pid file: a
   stale pipe that would block the start) is removed, and a hung daemon is killed first.
5. **Limits memory on the server side** where the driver takes it: before a launch, the
   daemon's `set_default_device_pinned_mem_limit 0 <MB>M` (and `set_device_pinned_mem_limit`
   for each running server) is set to the largest limit of the GPU's jobs. A client's own
   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower the daemon's limit, so no job can lift its
   own past that. A driver that refuses the command keeps the client-side limit only.

`MpsLauncher` wraps the agent's launcher: an MPS launch is refused (`launch_error`,
`MPS_TEAM_MIX: ...`) when the GPU's daemon serves another team's job, waits up to
LAUNCH_WAIT_S for a daemon that is restarting (else `MPS_SERVER_DOWN: ...`), and its run
(`MpsRun`) tells the supervisor `lost()` when its daemon died under it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from workers.launch import LaunchError, mps_log_dir, mps_pipe_dir
from workers.launchers import Launcher, Run
from workers.outbox import AttemptJournal
from workers.protocol import Inventory, Launch
from workers.shim import start_time

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
CONTROL_PIPE = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
# What `-d` printed, in the GPU's log directory (a file: a daemon that kept the pipes of the
# command that started it open would otherwise hold the agent until the timeout).
START_OUTPUT = "agent-start.out"

# The reasons the agent gives, first in the error text (like OOM_KILLED).
MPS_SERVER_DIED = "MPS_SERVER_DIED"
MPS_SERVER_DOWN = "MPS_SERVER_DOWN"
MPS_TEAM_MIX = "MPS_TEAM_MIX"

CHECK_TIMEOUT_S = 5.0
START_WAIT_S = 5.0  # how long a daemon just started has to answer
START_TIMEOUT_S = 30.0  # for `-d` itself, which returns once the daemon has forked
UNANSWERED_LIMIT = 3  # time-outs in a row, with the daemon's process alive: it is hung
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_AFTER_S = 60.0  # up this long: the restart count starts again from zero
LAUNCH_WAIT_S = 10.0

Key = tuple[int, int]
Health = Literal["ok", "dead", "unanswered"]


@dataclass(eq=False)
class Daemon:
    """One GPU's control daemon, as the agent knows it. Guarded by the supervisor's lock."""

    gpu_uuid: str
    pipe: Path
    logs: Path
    env: dict[str, str]
    up: bool = False
    generation: int = 0  # counts the daemons this agent saw on this GPU
    started_here: bool = False  # quit when the agent stops (an adopted one is left alone)
    attempts: int = 0  # starts tried since it was last stable (the backoff's count)
    unanswered: int = 0
    up_since: float = 0.0
    next_check: float = 0.0
    restart_at: float | None = None
    last_death: str = ""
    limit_mb: int | None = None  # the server-side pinned memory limit last set
    limit_taken: bool = True  # False once the driver refused the command
    runs: dict[Key, MpsRun] = field(default_factory=dict)
    commands: threading.Lock = field(default_factory=threading.Lock)


def daemon_environment(mps_root: Path, gpu_uuid: str) -> dict[str, str]:
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps_pipe_dir(mps_root, gpu_uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps_log_dir(mps_root, gpu_uuid)),
    }


def mps_gpu_of(launch: Launch) -> str | None:
    """The GPU of a launch made of MPS shares (workers.launch refuses shares on two GPUs)."""
    if not launch.devices or any(d.kind != "mps" for d in launch.devices):
        return None
    return launch.devices[0].gpu_uuid


def pinned_limit_mb(launch: Launch) -> int | None:
    """The job's pinned device memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), if known."""
    memories = [d.memory_mb for d in launch.devices]
    if any(m is None for m in memories):
        return None
    return sum(m or 0 for m in memories)


class MpsSupervisor:
    """The MPS daemons of one node. `binary` None: no driver, nothing to start or watch."""

    def __init__(
        self,
        inventory: Inventory,
        mps_root: Path,
        *,
        binary: str | None,
        check_every_s: float = 2.0,
        check_timeout_s: float = CHECK_TIMEOUT_S,
        start_wait_s: float = START_WAIT_S,
        unanswered_limit: int = UNANSWERED_LIMIT,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        stable_after_s: float = STABLE_AFTER_S,
        launch_wait_s: float = LAUNCH_WAIT_S,
        kill_grace_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.binary = binary
        self.check_every_s = check_every_s
        self.check_timeout_s = check_timeout_s
        self.start_wait_s = start_wait_s
        self.unanswered_limit = unanswered_limit
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.launch_wait_s = launch_wait_s
        self.kill_grace_s = kill_grace_s
        self._clock = clock
        self._cond = threading.Condition()
        self.daemons: dict[str, Daemon] = {
            gpu.uuid: Daemon(
                gpu_uuid=gpu.uuid,
                pipe=mps_pipe_dir(mps_root, gpu.uuid),
                logs=mps_log_dir(mps_root, gpu.uuid),
                env=daemon_environment(mps_root, gpu.uuid),
            )
            for gpu in inventory.gpus
            if gpu.mode == "mps"
        }

    @property
    def supervised(self) -> bool:
        """Whether there are daemons to start and watch (a driver and MPS GPUs)."""
        return self.binary is not None and bool(self.daemons)

    # --- start and stop -----------------------------------------------------------------------

    def prepare(self) -> None:
        """Make every MPS GPU's directories; with a driver, adopt the daemon that answers in
        its pipe directory or start one (a failed start is retried with backoff)."""
        for daemon in self.daemons.values():
            daemon.pipe.mkdir(parents=True, exist_ok=True)
            daemon.logs.mkdir(parents=True, exist_ok=True)
            if self.binary is None:
                continue
            if (daemon.pipe / CONTROL_PIPE).exists() and self._health(daemon)[0] == "ok":
                log.info("MPS daemon for %s already running in %s", daemon.gpu_uuid, daemon.pipe)
                self._mark_up(daemon, started_here=False)
                continue
            self._restart(daemon)

    def stop(self) -> None:
        """Ask the daemons this agent started to quit (`echo quit | nvidia-cuda-mps-control`)."""
        with self._cond:
            mine = [d for d in self.daemons.values() if d.started_here]
            for daemon in self.daemons.values():
                daemon.up = False
                daemon.restart_at = None
        for daemon in mine:
            try:
                self._control(daemon, "quit", timeout=30.0)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("stopping MPS daemon for %s: %s", daemon.gpu_uuid, exc)
            daemon.started_here = False

    # --- watching -----------------------------------------------------------------------------

    def run_forever(self, stopping: threading.Event) -> None:
        """The agent's `mps` thread: checks and restarts as they fall due, until `stopping`."""
        while not stopping.is_set():
            try:
                wait = self.tick()
            except Exception:
                log.exception("MPS supervision round failed")
                wait = self.check_every_s
            stopping.wait(min(max(wait, 0.05), self.check_every_s))

    def tick(self) -> float:
        """Run the health checks and restarts that are due; seconds until the next one."""
        if not self.supervised:
            return self.check_every_s
        now = self._clock()
        with self._cond:
            checks = [
                (d, d.generation) for d in self.daemons.values() if d.up and now >= d.next_check
            ]
            restarts = [
                d
                for d in self.daemons.values()
                if not d.up and d.restart_at is not None and now >= d.restart_at
            ]
        work = [partial(self._check, d, g) for d, g in checks]
        work += [partial(self._restart, d) for d in restarts]
        if len(work) == 1:
            work[0]()
        elif work:
            # A hung daemon costs its timeout; the other GPUs' checks do not wait for it.
            with ThreadPoolExecutor(len(work), thread_name_prefix="mps-check") as pool:
                for done in [pool.submit(job) for job in work]:
                    done.result()
        now = self._clock()
        with self._cond:
            due = [d.next_check for d in self.daemons.values() if d.up]
            due += [d.restart_at for d in self.daemons.values() if d.restart_at is not None]
        return max(0.0, min(due, default=now + self.check_every_s) - now)

    def _check(self, daemon: Daemon, generation: int) -> None:
        health, why = self._health(daemon)
        now = self._clock()
        with self._cond:
            if daemon.generation != generation or not daemon.up:
                return
            daemon.next_check = now + self.check_every_s
            if health == "ok":
                daemon.unanswered = 0
                if daemon.attempts and now - daemon.up_since >= self.stable_after_s:
                    daemon.attempts = 0
                return
            if health == "unanswered":
                daemon.unanswered += 1
                log.warning("MPS daemon for %s: %s", daemon.gpu_uuid, why)
                if daemon.unanswered < self.unanswered_limit:
                    return
                why = f"{why}, {daemon.unanswered} times in a row"
        self._declare_dead(daemon, generation, why)

    def confirm(self, run: MpsRun) -> None:
        """A job on this daemon exited with an error: look at its daemon now, so a job whose
        server died under it is reported lost, not failed, even before the next check."""
        daemon = run.daemon
        with self._cond:
            if not self.supervised or not daemon.up or daemon.generation != run.generation:
                return
        health, why = self._health(daemon)
        if health == "dead":
            self._declare_dead(daemon, run.generation, why)

    def _declare_dead(self, daemon: Daemon, generation: int, why: str) -> None:
        """Once per daemon: mark it down, schedule its restart and lose the jobs it served."""
        with self._cond:
            if daemon.generation != generation or not daemon.up:
                return
            daemon.up = False
            daemon.last_death = why
            daemon.restart_at = self._clock() + self._backoff(daemon.attempts + 1)
            victims = list(daemon.runs.values())
            self._cond.notify_all()
        reason = f"{MPS_SERVER_DIED}: the MPS control daemon of {daemon.gpu_uuid} died ({why})"
        log.error("%s; %d job(s) on it are lost", reason, len(victims))
        for run in victims:
            run.lose(reason, self.kill_grace_s)

    def _backoff(self, attempt: int) -> float:
        """The wait before the n-th start in a row: 0 (at once), then 1, 2, 4 ... s, at most
        backoff_max_s. A daemon that stayed up stable_after_s starts the count again."""
        if attempt <= 1:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_s * 2.0 ** (attempt - 2)))

    def _health(self, daemon: Daemon, timeout: float | None = None) -> tuple[Health, str]:
        """The daemon's health: its pipe, its process, then its answer to get_server_list
        within ``timeout`` (the check timeout unless given)."""
        timeout = self.check_timeout_s if timeout is None else timeout
        if not (daemon.pipe / CONTROL_PIPE).exists():
            return "dead", f"its control pipe {daemon.pipe / CONTROL_PIPE} is gone"
        recorded = _recorded_pid(daemon.pipe)
        if recorded is not None and _daemon_pid(daemon.pipe) is None:
            # Whatever the control command would say (a client may wait on a pipe nobody
            # reads, or answer nothing), a daemon whose process is gone is dead.
            return "dead", f"its process {recorded} is gone"
        try:
            result = self._control(daemon, "get_server_list", timeout=timeout)
        except subprocess.TimeoutExpired:
            if _daemon_pid(daemon.pipe) is None and recorded is not None:
                return "dead", f"its process {recorded} is gone"
            return "unanswered", f"get_server_list got no answer within {timeout:g} s"
        except OSError as exc:
            return "dead", f"{self.binary} could not run: {exc}"
        answer = result.stdout.strip()
        if result.returncode != 0:
            if recorded is not None and _daemon_pid(daemon.pipe) is None:
                # It died while the check ran: its process being gone is the cause to report.
                return "dead", f"its process {recorded} is gone"
            said = (result.stderr.strip() or answer).splitlines()
            return "dead", f"get_server_list failed (exit {result.returncode})" + (
                f": {said[0]}" if said else ""
            )
        if not all(word.isdigit() for word in answer.split()):
            return "dead", f"get_server_list answered {answer[:200]!r}"
        return "ok", ""

    # --- restarting ---------------------------------------------------------------------------

    def _restart(self, daemon: Daemon) -> None:
        started, why = self._start(daemon)
        if started:
            if daemon.generation:
                log.warning("MPS daemon for %s restarted", daemon.gpu_uuid)
            self._mark_up(daemon, started_here=True)
            return
        with self._cond:
            delay = self._backoff(daemon.attempts + 1)
            daemon.restart_at = self._clock() + delay
        log.error(
            "MPS daemon for %s did not start (%s); next try in %.0f s", daemon.gpu_uuid, why, delay
        )

    def _start(self, daemon: Daemon) -> tuple[bool, str]:
        with self._cond:
            daemon.attempts += 1
        leftover = _daemon_pid(daemon.pipe)
        if leftover is not None:
            # Hung: it holds the pipe directory and answers nobody.
            log.warning("killing hung MPS daemon %d for %s", leftover, daemon.gpu_uuid)
            if not _kill(leftover):
                return False, f"its old daemon (pid {leftover}) would not die"
        stale = clean_pipe_dir(daemon.pipe)
        if stale:
            log.warning(
                "removed a stale pipe left by a dead MPS daemon for %s: %s",
                daemon.gpu_uuid,
                ", ".join(stale),
            )
        assert self.binary is not None
        output = daemon.logs / START_OUTPUT
        daemon.logs.mkdir(parents=True, exist_ok=True)
        try:
            with open(output, "w+") as out:
                result = subprocess.run(
                    [self.binary, "-d"],
                    env=daemon.env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=START_TIMEOUT_S,
                    check=False,
                )
                out.seek(0)
                said = out.read().strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{self.binary} -d: {exc}"
        if result.returncode != 0:
            return False, f"{self.binary} -d exited {result.returncode}" + (
                f": {said.splitlines()[0]}" if said else ""
            )
        deadline = time.monotonic() + self.start_wait_s
        pause = 0.02
        while True:
            # A daemon just started may be slow to give its first answer (a loaded host):
            # each probe may take what is left of the start wait, not only the check timeout,
            # or probes that each give up too soon would never see it answer.
            left = max(deadline - time.monotonic(), 0.0)
            health, why = self._health(daemon, timeout=max(self.check_timeout_s, left))
            if health == "ok":
                return True, ""
            if time.monotonic() >= deadline:
                return False, f"started but does not answer: {why}"
            time.sleep(pause)
            pause = min(0.2, pause * 2)

    def _mark_up(self, daemon: Daemon, *, started_here: bool) -> None:
        now = self._clock()
        with self._cond:
            daemon.up = True
            daemon.generation += 1
            daemon.started_here = started_here
            daemon.up_since = now
            daemon.next_check = now + self.check_every_s
            daemon.unanswered = 0
            daemon.restart_at = None
            daemon.limit_mb = None
            daemon.limit_taken = True
            self._cond.notify_all()

    # --- launches -----------------------------------------------------------------------------

    def watch(self, launcher: Launcher) -> MpsLauncher:
        return MpsLauncher(launcher, self)

    def admit(self, launch: Launch) -> MpsRun | None:
        """Before an MPS launch starts: refuse it if its GPU's daemon serves another team or
        stays down, else register it (None for a launch that is not on MPS shares)."""
        gpu = mps_gpu_of(launch)
        if gpu is None:
            return None
        daemon = self.daemons.get(gpu)
        if daemon is None:
            raise LaunchError(f"MPS shares on {gpu}, which this node does not run in MPS mode")
        key = (launch.job_id, launch.attempt)
        with self._cond:
            _refuse_team_mix(daemon, launch)
            if self.supervised and not self._cond.wait_for(
                lambda: daemon.up, timeout=self.launch_wait_s
            ):
                raise LaunchError(
                    f"{MPS_SERVER_DOWN}: the MPS control daemon of {gpu} is not running "
                    f"(last: {daemon.last_death or 'never started'}); it is being restarted"
                )
            _refuse_team_mix(daemon, launch)  # again: the wait let go of the lock
            run = MpsRun(self, daemon, launch, generation=daemon.generation)
            daemon.runs[key] = run
            limits = [pinned_limit_mb(r.launch) for r in daemon.runs.values()]
        if self.supervised and all(limit is not None for limit in limits):
            self._limit_memory(daemon, max(limit or 0 for limit in limits))
        return run

    def adopted(self, runs: Mapping[Key, Run], journal: AttemptJournal) -> dict[Key, Run]:
        """The runs that survived the agent's restart (workers.agent.adopt_runs): those on
        MPS shares are watched like the ones it launches."""
        watched: dict[Key, Run] = {}
        for key, run in runs.items():
            entry = journal.get(key)
            gpu = mps_gpu_of(entry.launch) if entry is not None and entry.launch else None
            daemon = self.daemons.get(gpu) if gpu is not None else None
            if entry is None or entry.launch is None or daemon is None:
                watched[key] = run
                continue
            with self._cond:
                mine = MpsRun(self, daemon, entry.launch, generation=daemon.generation)
                daemon.runs[key] = mine
            mine.started(run)
            watched[key] = mine
        return watched

    def forget(self, run: MpsRun) -> None:
        with self._cond:
            if run.daemon.runs.get(run.key) is run:
                del run.daemon.runs[run.key]

    def _limit_memory(self, daemon: Daemon, limit_mb: int) -> None:
        """The daemon's pinned device memory limit for its clients (device 0: the daemon sees
        only its GPU), for servers started from now on and those running."""
        with daemon.commands:
            if not daemon.limit_taken or daemon.limit_mb == limit_mb:
                return
            value = f"{limit_mb}M"
            try:
                refused = self._refused(daemon, f"set_default_device_pinned_mem_limit 0 {value}")
                if refused is None:
                    servers = self._control(daemon, "get_server_list", self.check_timeout_s)
                    for pid in servers.stdout.split():
                        command = f"set_device_pinned_mem_limit {pid} 0 {value}"
                        refused = self._refused(daemon, command)
                        if refused is not None:
                            break
            except (OSError, subprocess.SubprocessError) as exc:
                refused = str(exc)
            if refused is not None:
                daemon.limit_taken = False
                log.warning(
                    "MPS daemon for %s did not take a pinned memory limit (%s): its clients keep "
                    "only CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                    daemon.gpu_uuid,
                    refused,
                )
                return
            daemon.limit_mb = limit_mb
            log.info("MPS daemon for %s: pinned memory limit %s", daemon.gpu_uuid, value)

    def _refused(self, daemon: Daemon, command: str) -> str | None:
        """None when the daemon took the command (it answers nothing), else what it said."""
        result = self._control(daemon, command, self.check_timeout_s)
        said = (result.stdout + result.stderr).strip()
        if result.returncode == 0 and not said:
            return None
        return f"{command}: {said or f'exit {result.returncode}'}"

    def server_list(self, gpu_uuid: str) -> str:
        """What `get_server_list` answers for this GPU's daemon (the server pids, one a line;
        empty before the first client): the health check's own question, for an operator."""
        result = self._control(self.daemons[gpu_uuid], "get_server_list", self.check_timeout_s)
        said = (result.stdout + result.stderr).strip()
        return said if result.returncode == 0 else f"exit {result.returncode}: {said}"

    def _control(
        self, daemon: Daemon, command: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """`echo <command> | nvidia-cuda-mps-control` for this GPU's daemon."""
        assert self.binary is not None
        return subprocess.run(
            [self.binary],
            input=command + "\n",
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


class MpsRun:
    """A run on MPS shares, as the supervisor sees it: the launcher's run, plus `lost()`."""

    def __init__(
        self, supervisor: MpsSupervisor, daemon: Daemon, launch: Launch, *, generation: int
    ) -> None:
        self.inner: Run | None = None
        self.pid: int | None = None
        self.container_id: str | None = None
        self.daemon = daemon
        self.launch = launch
        self.key: Key = (launch.job_id, launch.attempt)
        self.team = launch.team
        self.generation = generation
        self.exit_code: int | None = None
        self._supervisor = supervisor
        self._lost: str | None = None
        self._lock = threading.Lock()

    def started(self, run: Run) -> None:
        with self._lock:
            self.inner = run
            self.pid, self.container_id = run.pid, run.container_id
            lost = self._lost
        if lost is not None:  # its daemon died while it was starting
            run.terminate(self._supervisor.kill_grace_s)

    def lose(self, why: str, grace_s: float) -> None:
        """Its daemon died: stop it, and report it lost unless it had already succeeded."""
        with self._lock:
            if self.exit_code == 0 or self._lost is not None:
                return
            self._lost = why
            inner = self.inner
        if inner is not None and not inner.has_exited():
            inner.terminate(grace_s)

    def lost(self) -> str | None:
        return self._lost

    def output(self, offset: int = 0) -> Iterator[bytes]:
        return self._run.output(offset)

    def wait(self) -> int:
        code = self._run.wait()
        with self._lock:
            self.exit_code = code
        if code != 0 and self._lost is None:
            self._supervisor.confirm(self)
        return code

    def has_exited(self) -> bool:
        return self._run.has_exited()

    def terminate(self, grace_s: float) -> None:
        self._run.terminate(grace_s)

    def reap(self) -> None:
        self._run.reap()

    def release(self) -> None:
        try:
            self._run.release()
        finally:
            self._supervisor.forget(self)

    def __getattr__(self, name: str) -> Any:
        # The launcher's optional members (fenced, stop_reached, end_note, notes).
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def _run(self) -> Run:
        assert self.inner is not None, "the run has not started"
        return self.inner


class MpsLauncher:
    """The agent's launcher with the MPS rules in front of it (see the module docstring)."""

    def __init__(self, inner: Launcher, supervisor: MpsSupervisor) -> None:
        self.inner = inner
        self.supervisor = supervisor
        self.name = inner.name

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> Run:
        watched = self.supervisor.admit(launch)
        if watched is None:
            return self.inner.start(launch, lease_epoch=lease_epoch)
        try:
            run = self.inner.start(launch, lease_epoch=lease_epoch)
        except BaseException:
            self.supervisor.forget(watched)
            raise
        watched.started(run)
        return watched

    def __getattr__(self, name: str) -> Any:
        # What the agent looks up on its launcher (adopt, reap_leftovers, ended_runs).
        return getattr(self.__dict__["inner"], name)


def _refuse_team_mix(daemon: Daemon, launch: Launch) -> None:
    """LaunchError when the daemon serves a job of another team (the caller holds the lock)."""
    key = (launch.job_id, launch.attempt)
    for other in daemon.runs.values():
        if other.key != key and other.team != launch.team:
            raise LaunchError(
                f"{MPS_TEAM_MIX}: the MPS daemon of {daemon.gpu_uuid} serves team "
                f"{other.team!r} (job {other.key[0]}); a job of team {launch.team!r} may not "
                "share it"
            )


def clean_pipe_dir(pipe: Path) -> list[str]:
    """Remove what a dead daemon left in its pipe directory; the names removed."""
    removed: list[str] = []
    if not pipe.is_dir():
        return removed
    for entry in sorted(pipe.iterdir()):
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed


def _recorded_pid(pipe: Path) -> int | None:
    """The pid the daemon wrote in its pipe directory (NVIDIA's daemons do), if any."""
    try:
        return int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _daemon_pid(pipe: Path) -> int | None:
    """The pid in the pipe directory's pid file, if that process is alive and is a control
    daemon (a pid file can outlive its process, and the pid be taken by another)."""
    pid = _recorded_pid(pipe)
    if pid is None:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if CONTROL_BINARY.encode() not in cmdline or start_time(pid) is None:
        return None  # another program, or a zombie
    return pid


def _kill(pid: int, wait_s: float = 5.0) -> bool:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if start_time(pid) is None:  # gone, or a zombie: it runs nothing
            return True
        time.sleep(0.02)
    return False

"""Run an attempt as a local process: the embedded default and the tests.

Each attempt is started through its own shim (`workers/shim.py`), which starts the command
and stays its parent: it kills the job when the agent dies (lifeline) and stops it when the
agent's lease lapses (fencing), even while the agent is frozen. The command gets the job
environment (slice variables included), its own session and process group, stdin from
/dev/null and stdout+stderr in one output file that the agent reads as it grows (a file, not a
pipe: what the job wrote before an agent died is still there for the next one).

Layout, one directory per attempt: `<workdir>/jobs/<job_id>-<attempt>/` belongs to the agent
and holds `pid` (the shim's and the job's process group, so a restarted agent can find and
kill what an earlier run left), `output` (the job's stdout and stderr), `exit` (how the job
ended, written by the shim) and `fenced` (why the shim stopped the job, when it did); the
job's own `work/` inside it is its working directory and HOME. The job cannot touch the
records: with job uids it does not own their directory.

Isolation, when the agent runs as root (see `isolation_summary`): each running attempt gets a
uid and gid of its own from `PORTAL_AGENT_JOB_UIDS`, no supplementary groups, a private work
directory (0700), and its own network namespace (a loopback that is down: no TCP service of
the host is reachable, Redis and PostgreSQL included). When the attempt ends every process of
its uid is killed (a `setsid` does not escape) and its directory is closed to other uids.
Without root, jobs run as the agent's user, in a user + network namespace when the kernel
allows one.

A uid is claimed host-wide (see `JobUids`) from before its job starts until its shim has swept
it; a sweep of a uid left by an ended attempt first claims it too, so it never reaches a job
another attempt, on this agent or another one on the host, now runs as that uid.

Limits (see `plan_limits` and `workers/limits.py`): each attempt gets a cgroup v2 of its own
with memory.max, pids.max and cpu.max where the host has a usable cgroup2 hierarchy, and
RLIMIT_AS / RLIMIT_NPROC; where no cgroup can be had, the rlimits alone, and the startup banner
says which is in force.

Images: this launcher runs the command on the host's own filesystem and cannot honour a job's
image. Unless the image is one the operator declared to mean the host
(PORTAL_AGENT_PROCESS_HOST_IMAGES), the job's log says so in its first line, or with
PORTAL_AGENT_PROCESS_IMAGES=refuse the launch is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import workers
from workers.launch import LEASE_LAPSED_TEXT, LaunchError, LeaseLapsed, job_environment
from workers.launchers import exit_code_from_returncode
from workers.limits import (
    NO_LIMITS,
    AddressSpace,
    Cgroups,
    CgroupUnavailable,
    JobLimits,
    capped,
    cgroup2_mount,
    cgroup_values,
    kill_cgroup,
    populated,
    remove_cgroup,
    size_text,
)
from workers.protocol import Launch
from workers.settings import (
    CGROUP_CHOICES,
    PROCESS_IMAGE_CHOICES,
    AgentSettings,
    SettingsError,
)
from workers.shim import (
    FENCED_FILE,
    OUTPUT_FILE,
    group_alive,
    kill_group,
    kill_uid,
    process_is,
    processes,
    read_exit,
    read_record,
)

log = logging.getLogger(__name__)

# Only these are passed through from the agent's own environment; everything else a job
# sees comes from the launch message or the slice.
PASS_THROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH")
READ_SIZE = 64 * 1024
# How often a reader looks for more output once the file has none: first, then at most.
OUTPUT_POLL_S = (0.05, 0.5)
WORK_DIR = "work"
ATTEMPT_DIR_NAME = re.compile(r"^(\d+)-(\d+)$")
SHIM_REPLY_TIMEOUT_S = 30.0
# The shim runs from the project root with `-E -s`: a job's PYTHON* variables or a file in
# its directory must never change the code that runs with the agent's privileges.
PROJECT_ROOT = Path(workers.__file__).resolve().parent.parent
NETWORK_CHOICES = ("auto", "none", "host")
# How long a sweep waits for a shim it killed to be gone (and its uid claim with it).
SHIM_GONE_S = 2.0
# The agents' cgroup subtree when PORTAL_AGENT_JOB_CGROUP_ROOT does not name one.
CGROUP_ROOT_NAME = "portal-agent"


# --- isolation plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    """What this host can give each job, decided once when the launcher is built."""

    uids: tuple[int, int] | None  # the pool, or None: jobs run as the agent's user
    network: str  # "isolate" or "host"
    agent_uid: int
    why_host_network: str  # when network is "host": why
    limits: LimitPlan | None = None  # None: no resource limits at all

    def summary(self) -> str:
        if self.uids is not None:
            first, last = self.uids
            who = f"jobs run as uid {first}-{last} (one per running attempt, no groups)"
        else:
            who = f"jobs run as the agent's user (uid {self.agent_uid})"
        if self.network == "isolate":
            net = "in their own network namespace (no network)"
        else:
            net = f"with the host network ({self.why_host_network})"
        unlimited = self.limits.unlimited() if self.limits is not None else ["CPU", "memory"]
        shared = ", ".join([*unlimited, "GPU memory, /tmp, /dev/shm, world-readable host files"])
        limits = f"; {self.limits.summary()}" if self.limits is not None else ""
        if self.uids is not None and self.network == "isolate":
            return f"{who} {net}; files: private job directories; not isolated: {shared}{limits}"
        exposed = ["the network"] if self.network == "host" else []
        if self.uids is None:
            exposed.append("the agent's files and processes")
        hint = "; run the agent as root to isolate" if self.agent_uid != 0 else ""
        return f"{who} {net}; NOT isolated: {', '.join(exposed)}, {shared}{limits}{hint}"


def plan_isolation(
    *, job_uids: tuple[int, int] | None, network: str, limits: LimitPlan | None = None
) -> Isolation:
    """`job_uids` applies to a root agent only; `network` is auto, none or host (see
    PORTAL_AGENT_JOB_NETWORK in docs/agent.md). `none` that cannot be had is a SettingsError.
    `limits`: what bounds each job's resources (`plan_limits`), said in the summary."""
    if network not in NETWORK_CHOICES:
        raise SettingsError(
            f"PORTAL_AGENT_JOB_NETWORK: must be one of auto, none, host; got {network!r}"
        )
    agent_uid = os.geteuid()
    uids = job_uids if agent_uid == 0 else None
    if network == "host":
        return Isolation(uids, "host", agent_uid, "PORTAL_AGENT_JOB_NETWORK=host", limits)
    refused = _network_isolation_refused()
    if not refused:
        return Isolation(uids, "isolate", agent_uid, "", limits)
    if network == "none":
        raise SettingsError(
            "PORTAL_AGENT_JOB_NETWORK: none was asked for but this host cannot give a job its "
            f"own network namespace ({refused}); run the agent as root, allow unprivileged "
            "user namespaces, or set host"
        )
    return Isolation(uids, "host", agent_uid, f"no network namespace here: {refused}", limits)


# --- limits plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitPlan:
    """What bounds each job here, decided once when the launcher is built: a cgroup v2 per
    attempt (`cgroups`) with the rlimits beside it, or the rlimits alone."""

    maximum: JobLimits  # the agent's own limits: the most any job gets
    address_space: AddressSpace
    cgroups: Cgroups | None  # None: rlimits only
    controllers: frozenset[str]  # those a job's cgroup gets
    why_no_cgroup: str  # when cgroups is None: why
    nproc_per: str  # "uid" (each job its own), "shared" (the agent's uid) or "root" (exempt)

    def address_space_bytes(self, limits: JobLimits) -> int | None:
        """RLIMIT_AS for a job with `limits`: with "auto", its memory limit only where no cgroup
        counts memory (CUDA reserves far more address space than it uses)."""
        if self.address_space == "max":
            return None
        if self.address_space == "auto":
            return None if self.cgroups is not None else limits.memory_bytes
        return self.address_space

    def unlimited(self) -> list[str]:
        """Of CPU and memory, what no limit here bounds (for the summary)."""
        cpu = self.cgroups is None or "cpu" not in self.controllers
        memory = self.maximum.memory_bytes is None or (
            self.cgroups is None and self.address_space_bytes(self.maximum) is None
        )
        return [name for name, free in (("CPU", cpu), ("memory", memory)) if free]

    def summary(self) -> str:
        top = self.maximum
        nproc = {
            "uid": f"RLIMIT_NPROC {top.nproc} tasks of the job's own uid",
            "shared": f"RLIMIT_NPROC {top.nproc} tasks more than the agent's user runs (shared "
            "with the agent's processes: no job uids without root)",
            "root": "RLIMIT_NPROC not applied (jobs run as root, which it does not bind)",
        }[self.nproc_per if top.nproc is not None else "uid"]
        if top.nproc is None:
            nproc = "RLIMIT_NPROC no limit"
        address_space = self.address_space_bytes(top)
        rlimit_as = (
            f"RLIMIT_AS {size_text(address_space)} (address space, not memory used)"
            if address_space is not None
            else ""
        )
        if self.cgroups is not None:
            cpus = "all CPUs" if top.cpus is None else f"{top.cpus:g} CPUs"
            cpu = f", cpu.max {cpus}" if "cpu" in self.controllers else ", CPU not limited"
            return (
                f"limits per job: cgroup v2 under {self.cgroups.root} (memory.max "
                f"{size_text(top.memory_bytes)}, pids.max {top.nproc or 'no limit'}{cpu}), "
                + ", ".join(filter(None, [rlimit_as, nproc]))
            )
        return (
            f"limits per job: rlimits only, no cgroup ({self.why_no_cgroup}): "
            + ", ".join(filter(None, [rlimit_as or "RLIMIT_AS no limit", nproc]))
            + "; CPU not limited"
        )


def plan_limits(
    *,
    maximum: JobLimits,
    address_space: AddressSpace = "auto",
    cgroup: str = "auto",
    cgroup_root: Path | None = None,
    cgroup_mount: Path | None = None,
    job_uids: bool,
) -> LimitPlan:
    """`cgroup`: auto (a cgroup v2 per job where one can be made, else rlimits only), require
    (a SettingsError where none can be made) or off. `cgroup_root`: the subtree the agent
    keeps its jobs' cgroups in (default `<cgroup2 mount>/portal-agent`); `cgroup_mount`: where
    cgroup2 is mounted (default: found in /proc/self/mountinfo). `job_uids`: each job runs as
    a uid of its own (the root agent's pool)."""
    if cgroup not in CGROUP_CHOICES:
        raise SettingsError(
            f"PORTAL_AGENT_JOB_CGROUP: must be one of {', '.join(CGROUP_CHOICES)}; got {cgroup!r}"
        )
    nproc_per = "uid" if job_uids else "root" if os.geteuid() == 0 else "shared"

    def plan(cgroups: Cgroups | None, controllers: frozenset[str], why: str) -> LimitPlan:
        return LimitPlan(maximum, address_space, cgroups, controllers, why, nproc_per)

    if cgroup == "off":
        return plan(None, frozenset(), "PORTAL_AGENT_JOB_CGROUP=off")
    mount = cgroup_mount or cgroup2_mount()
    try:
        if mount is None:
            raise CgroupUnavailable("no cgroup v2 file system is mounted")
        cgroups = Cgroups(mount=mount, root=cgroup_root or mount / CGROUP_ROOT_NAME)
        controllers = cgroups.probe(maximum)
    except CgroupUnavailable as exc:
        if cgroup == "require":
            raise SettingsError(
                f"PORTAL_AGENT_JOB_CGROUP: require was asked for but no cgroup v2 can limit "
                f"jobs here: {exc}; give the agent a cgroup v2 subtree with the memory and pids "
                "controllers (PORTAL_AGENT_JOB_CGROUP_ROOT), or set auto"
            ) from None
        return plan(None, frozenset(), str(exc))
    return plan(cgroups, frozenset(controllers), "")


def _number_text(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g}"


def launch_limits(launch: Launch, maximum: JobLimits) -> tuple[JobLimits, tuple[str, ...]]:
    """The limits of one attempt, and the notes for its log: what the portal's policy asks for
    the job (memory, CPUs, processes; unset: the agent's own), never above the agent's own
    (`maximum`, the operator's settings, which win). A job asking more gets the agent's
    maximum, and its log says so: a process job has no container policy to refuse on, and
    this node's operator set these maximums for every job it runs."""
    policy = launch.policy
    asked = JobLimits(
        memory_bytes=None if policy.memory_mb is None else policy.memory_mb * 1024 * 1024,
        nproc=policy.pids_limit,
        cpus=policy.cpus,
    )
    limits = capped(asked, maximum)
    over = [
        (what, shown(ask), shown(got), variable)
        for what, ask, got, variable, shown in (
            ("memory", asked.memory_bytes, limits.memory_bytes, "MEMORY_MB", size_text),
            ("processes", asked.nproc, limits.nproc, "NPROC", _number_text),
            ("CPUs", asked.cpus, limits.cpus, "CPUS", _number_text),
        )
        if ask is not None and ask != got
    ]
    notes = tuple(
        f"[agent] the job asked for {what} {ask}; process jobs on this node get at most {got} "
        f"(PORTAL_AGENT_JOB_{variable})\n"
        for what, ask, got, variable in over
    )
    return limits, notes


@functools.cache
def _network_isolation_refused() -> str:
    """'' when a shim may unshare its network namespace here, else the kernel's reason. Tried
    in a child: the change cannot be undone."""
    probe = subprocess.run(
        [*_shim_argv(), "--probe"],
        cwd=PROJECT_ROOT,
        env=_shim_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    answer = probe.stdout.strip() or probe.stderr.strip()[-200:] or f"exit code {probe.returncode}"
    return "" if answer == "ok" else answer


def isolation_summary(settings: AgentSettings) -> str:
    """One line for the startup banner: what is isolated and what is not on this host, and
    which limits are in force (a cgroup per job, or rlimits only)."""
    if settings.launcher != "process":
        return "jobs run in containers (docker launcher)"
    try:
        isolation = plan_isolation(job_uids=settings.job_uids, network=settings.job_network)
        limits = plan_limits(
            maximum=settings.job_limits,
            address_space=settings.job_address_space,
            cgroup=settings.job_cgroup,
            cgroup_root=settings.job_cgroup_root,
            job_uids=isolation.uids is not None,
        )
    except SettingsError as exc:
        return f"jobs cannot start: {exc}"
    return dataclasses.replace(isolation, limits=limits).summary()


def process_launcher(settings: AgentSettings) -> ProcessLauncher:
    """The launcher the agent uses, configured from its settings."""
    from workers.lease import lease_path

    return ProcessLauncher(
        workdir=settings.workdir,
        mps_root=settings.mps_root,
        lease_path=lease_path(settings.workdir),
        fence_grace_s=settings.fence_grace_s,
        job_uids=settings.job_uids,
        network=settings.job_network,
        private_dir=settings.var_dir,
        limits=settings.job_limits,
        address_space=settings.job_address_space,
        cgroup=settings.job_cgroup,
        cgroup_root=settings.job_cgroup_root,
        images=settings.process_images,
        host_images=settings.process_host_images,
    )


class JobUids:
    """Hands each running attempt a uid of its own: never one another attempt holds, never one
    that still runs a process (left over from an earlier agent run, say). The cursor turns, so
    a uid is reused as late as possible.

    Several agents may share a host (tests, `runportal --agents 2`, a host split into nodes),
    each with its own pool over the same range: a uid is also claimed host-wide, by an flock
    on a file in a root-only directory, held while the attempt runs. The attempt's shim
    inherits the claim and holds it until it exits, after its last sweep of the uid: an agent
    that dies frees the uid only once its shims have killed what ran as it. Without that, two
    agents could hand one uid to two jobs at once, and the end of one would kill the other (a
    job's end kills every process of its uid).
    """

    CLAIMS = Path("/run/portal-agent/job-uids")

    def __init__(self, first: int, last: int, *, claims: Path | None = None) -> None:
        self.first, self.last = first, last
        self._held: dict[int, int] = {}  # uid -> the fd holding its host-wide claim
        self._next = first
        self._lock = threading.Lock()
        self.claims = claims or self.CLAIMS

    def acquire(self) -> int:
        size = self.last - self.first + 1
        with self._lock:
            running = {p.uid for p in processes()}
            for step in range(size):
                uid = self.first + (self._next - self.first + step) % size
                if uid in self._held or uid in running:
                    continue
                fd = claim_uid(self.claims, uid)
                if fd is None:
                    continue  # another agent on this host holds it
                self._held[uid] = fd
                self._next = uid + 1
                return uid
        raise LaunchError(
            f"all {size} job uids ({self.first}-{self.last}) are in use; "
            "widen PORTAL_AGENT_JOB_UIDS"
        )

    def claim_fd(self, uid: int) -> int:
        """The descriptor holding `uid`'s claim, for the attempt's shim to inherit."""
        with self._lock:
            return self._held[uid]

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # drops the flock

    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)


def claim_uid(claims: Path, uid: int) -> int | None:
    """Claim `uid` host-wide: the descriptor holding the flock, or None while any other holder
    (another agent, a shim, or this agent by another descriptor) has it."""
    claims.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(claims / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def unclaimed_uid(claims: Path, uid: int) -> Iterator[bool]:
    """Whether nobody holds `uid` (True: this claims it until the block ends, so no attempt
    can start as it meanwhile). Processes of a uid someone holds are that attempt's, not
    leftovers: with agents sharing a host the uid an ended attempt had may be another
    attempt's now. A claim that cannot be checked counts as held: better a leftover than a
    killed job."""
    try:
        fd = claim_uid(claims, uid)
    except OSError as exc:
        log.warning("cannot check the claim on job uid %s in %s: %s", uid, claims, exc)
        fd = None
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


# --- one run ----------------------------------------------------------------------------------


class ProcessRun:
    def __init__(
        self,
        *,
        shim: subprocess.Popen[bytes],
        control: socket.socket,
        pid: int,
        attempt_dir: Path,
        on_release: Callable[[], None],
        notes: tuple[str, ...] = (),
        cgroup: Path | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self._shim = shim
        self._control = control  # dropping it would close the lifeline: the shim kills the job
        self.pid: int | None = pid  # the job's pid, which is also its process group
        self.container_id: str | None = None
        self.attempt_dir = attempt_dir
        self._on_release = on_release
        self._released = False
        # Lines for the top of the job's log (the supervisor writes them): what the launcher
        # did not do as asked, such as the image it could not use.
        self.notes = notes
        self.cgroup = cgroup  # the job's cgroup, while the shim keeps it
        self._memory_limit = memory_limit

    @property
    def end_note(self) -> str:
        """Read after the exit: why the kernel ended the job, when it was over its memory."""
        record = read_exit(self.attempt_dir)
        kills = record.oom_kills if record is not None else 0
        if not kills:
            return ""
        return (
            f"over its memory limit ({size_text(self._memory_limit)}, cgroup memory.max): the "
            f"kernel's OOM killer ended {kills} process{'es' if kills > 1 else ''} of the job"
        )

    def output(self, offset: int = 0) -> Iterator[bytes]:
        """The output file from `offset`, as it grows, until the shim has exited and all of
        it is read (the shim kills what the job left before it exits)."""
        return read_output(self.attempt_dir, offset, ended=self.has_exited)

    def wait(self) -> int:
        return exit_code_from_returncode(self._shim.wait())

    def has_exited(self) -> bool:
        return self._shim.poll() is not None

    def terminate(self, grace_s: float) -> None:
        """The shim, the job's parent, signals the group: SIGTERM now, SIGKILL after grace."""
        self._tell(f"stop {grace_s}")

    def reap(self) -> None:
        """The shim kills what the job left when it ends; this covers a shim that was killed
        itself (its job would otherwise run on unwatched). Call before `release`: until then
        the job's uid is still this attempt's."""
        if self._shim.poll() is None:
            self._tell("kill")
        else:
            kill_leftovers(self.attempt_dir, claims=None, cgroup=self.cgroup)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._control.close()
        self._on_release()

    def fenced(self) -> str | None:
        """Why the shim stopped the job because the agent's lease lapsed; None if it did not."""
        try:
            return (self.attempt_dir / FENCED_FILE).read_text().strip() or "fenced"
        except FileNotFoundError:
            return None

    def stop_reached(self) -> bool:
        """Whether a stop signal reached the job while it ran (read after the exit). A shim
        that left no exit record (it was killed itself) counts as stopped."""
        record = read_exit(self.attempt_dir)
        return record is None or record.stopped

    def _tell(self, line: str) -> None:
        with contextlib.suppress(OSError):  # the shim has gone: nothing left to stop
            self._control.sendall(line.encode() + b"\n")


class EndedRun:
    """An attempt that ended on its own while no agent watched it: its shim recorded the exit
    code after the agent died (or before the agent had read it). Handed to the restarted
    agent's supervisor like an adopted run, so the job's own result is reported, not a loss,
    and the rest of its output file is shipped."""

    end_note = ""

    def __init__(self, exit_code: int, *, pid: int | None, attempt_dir: Path) -> None:
        self._exit_code = exit_code
        self.pid = pid
        self.container_id: str | None = None
        self.attempt_dir = attempt_dir

    def output(self, offset: int = 0) -> Iterator[bytes]:
        return read_output(self.attempt_dir, offset, ended=lambda: True)

    def wait(self) -> int:
        return self._exit_code

    def has_exited(self) -> bool:
        return True

    def terminate(self, grace_s: float) -> None:
        """It has ended."""

    def reap(self) -> None:
        """Its leftovers were killed with the earlier agent's (`reap_leftovers`)."""

    def release(self) -> None:
        """Nothing is held."""

    def stop_reached(self) -> bool:
        return False


# --- the launcher -----------------------------------------------------------------------------


class ProcessLauncher:
    name = "process"

    def __init__(
        self,
        *,
        workdir: Path,
        mps_root: Path,
        environ: Mapping[str, str] | None = None,
        lease_path: Path | None = None,
        fence_grace_s: float = 2.0,
        job_uids: tuple[int, int] | None = None,
        network: str = "host",
        private_dir: Path | None = None,
        limits: JobLimits = NO_LIMITS,
        address_space: AddressSpace = "auto",
        cgroup: str = "off",
        cgroup_root: Path | None = None,
        cgroup_mount: Path | None = None,
        images: str = "note",
        host_images: Iterable[str] = (),
    ) -> None:
        """`lease_path`: the agent's lease file, watched by every shim (None: not watched,
        for tests). `job_uids`: the uid pool for a root agent (None: the agent's user).
        `network`: auto, none or host. `private_dir`: a directory (the portal's var dir) none
        of whose contents a job uid may open, apart from the launcher's own tree; a launch is
        refused while something there is open to them. `limits`, `address_space`, `cgroup`,
        `cgroup_root`, `cgroup_mount`: see `plan_limits`. `images`: note or refuse, for a job
        whose image is not one of `host_images` (names that stand for the host itself)."""
        if images not in PROCESS_IMAGE_CHOICES:
            raise SettingsError(
                f"PORTAL_AGENT_PROCESS_IMAGES: must be one of {', '.join(PROCESS_IMAGE_CHOICES)};"
                f" got {images!r}"
            )
        self.workdir = workdir
        self.mps_root = mps_root
        self._environ = os.environ if environ is None else environ
        self.lease_path = lease_path
        self.fence_grace_s = fence_grace_s
        self.private_dir = private_dir
        self.images = images
        self.host_images = frozenset(host_images)
        isolation = plan_isolation(job_uids=job_uids, network=network)
        self.limits = plan_limits(
            maximum=limits,
            address_space=address_space,
            cgroup=cgroup,
            cgroup_root=cgroup_root,
            cgroup_mount=cgroup_mount,
            job_uids=isolation.uids is not None,
        )
        self.isolation = dataclasses.replace(isolation, limits=self.limits)
        self._uids = JobUids(*self.isolation.uids) if self.isolation.uids else None
        # Where uids are claimed host-wide; also read with the pool off (a root agent's earlier
        # run may have had one).
        self._claims = self._uids.claims if self._uids is not None else JobUids.CLAIMS
        # Job cgroups are named after the agent's work directory too: agents sharing a host
        # (and its cgroup root) may run the same job and attempt numbers for other portals.
        digest = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:8]
        self._cgroup_prefix = f"{re.sub(r'[^A-Za-z0-9._-]', '_', workdir.name)[:40]}.{digest}"
        log.info("process launcher: %s", self.isolation.summary())

    def job_dir(self, launch: Launch) -> Path:
        """The attempt's directory (the agent's); the job works in its `work/`."""
        return self.attempt_dir(launch.job_id, launch.attempt)

    def attempt_dir(self, job_id: int, attempt: int) -> Path:
        return self.workdir / "jobs" / f"{job_id}-{attempt}"

    def work_dir(self, launch: Launch) -> Path:
        return self.job_dir(launch) / WORK_DIR

    def cgroup_of(self, key: tuple[int, int]) -> Path | None:
        """The attempt's cgroup (None: no cgroups here)."""
        if self.limits.cgroups is None:
            return None
        return self.limits.cgroups.root / f"{self._cgroup_prefix}-{key[0]}-{key[1]}"

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> ProcessRun:
        notes = self._image_notes(launch)
        uid = self._uids.acquire() if self._uids is not None else None
        try:
            return self._start(launch, uid, notes, lease_epoch)
        except BaseException:
            if uid is not None and self._uids is not None:
                self._uids.release(uid)
            raise

    def _image_notes(self, launch: Launch) -> tuple[str, ...]:
        """What the job's log says about its image; a LaunchError where the operator refuses
        jobs whose image this launcher cannot honour."""
        if launch.image in self.host_images:
            return ()
        if self.images == "refuse":
            instead = (
                f", or use the image {' or '.join(repr(i) for i in sorted(self.host_images))} "
                "(this host's own filesystem)"
                if self.host_images
                else ""
            )
            raise LaunchError(
                f"the process launcher cannot run the image {launch.image!r} (it runs jobs on "
                "the host's filesystem) and this node refuses such jobs "
                f"(PORTAL_AGENT_PROCESS_IMAGES=refuse); run the job on a node with the docker "
                f"launcher{instead}"
            )
        return (
            f"[agent] the process launcher ignores the image {launch.image!r}: the job runs "
            "on the host's filesystem\n",
        )

    def reap_leftovers(self, keep: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """Kill what an earlier agent run left running (its shim, the job's process group and
        every process of its uid) for every attempt not in `keep`; the keys of those killed,
        in order. Call before launching anything."""
        killed: list[tuple[int, int]] = []
        jobs = self.workdir / "jobs"
        if not jobs.is_dir():
            return killed
        for attempt_dir in sorted(jobs.iterdir()):
            match = ATTEMPT_DIR_NAME.match(attempt_dir.name)
            if match is None or not attempt_dir.is_dir():
                continue
            key = (int(match[1]), int(match[2]))
            if key in keep:
                continue
            if kill_leftovers(attempt_dir, claims=self._claims, cgroup=self.cgroup_of(key)):
                log.warning("killed job %s attempt %s, left running by an earlier agent", *key)
                killed.append(key)
        return killed

    def ended_runs(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], EndedRun]:
        """Of `keys` (attempts an earlier agent run started and never saw end), those whose
        job ended on its own, as its shim recorded: their results are still to be reported.
        Call after `reap_leftovers`, which leaves every shim gone and its record written."""
        ended: dict[tuple[int, int], EndedRun] = {}
        for job_id, attempt in keys:
            attempt_dir = self.attempt_dir(job_id, attempt)
            record = read_exit(attempt_dir)
            if record is not None and not record.stopped:
                pid = read_record(attempt_dir).get("pgid")
                ended[(job_id, attempt)] = EndedRun(record.code, pid=pid, attempt_dir=attempt_dir)
        return ended

    # Start ------------------------------------------------------------------------------------

    def _start(
        self, launch: Launch, uid: int | None, notes: tuple[str, ...], lease_epoch: int | None
    ) -> ProcessRun:
        if uid is not None:
            self._refuse_exposed_private_files()
        attempt_dir = self._fresh_attempt_dir(launch)
        work_dir = attempt_dir / WORK_DIR
        work_dir.mkdir(mode=0o700)
        if uid is not None:
            os.chown(work_dir, uid, uid)
            _check_reachable(work_dir, uid)
        base = {k: self._environ[k] for k in PASS_THROUGH_ENV if k in self._environ}
        base["HOME"] = str(work_dir)
        env = job_environment(launch, mps_root=self.mps_root, base=base)
        limits, capped_notes = launch_limits(launch, self.limits.maximum)
        notes += capped_notes
        cgroup = self.cgroup_of((launch.job_id, launch.attempt))
        agent_end, shim_end = socket.socketpair()
        out_write = os.open(
            attempt_dir / OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600
        )
        argv = [
            *_shim_argv(),
            f"--fd={shim_end.fileno()}",
            f"--parent={os.getpid()}",
            f"--attempt-dir={attempt_dir}",
            f"--work-dir={work_dir}",
            f"--fence-grace={self.fence_grace_s}",
            f"--network={self.isolation.network}",
        ]
        if self.lease_path is not None:
            argv.append(f"--lease={self.lease_path}")
            if lease_epoch is not None:  # the shim starts it only in that epoch
                argv.append(f"--lease-epoch={lease_epoch}")
        inherited = [shim_end.fileno()]
        if uid is not None:
            argv += [f"--uid={uid}", f"--gid={uid}"]
            if self._uids is not None:
                claim = self._uids.claim_fd(uid)
                argv.append(f"--uid-claim-fd={claim}")
                inherited.append(claim)
        try:
            shim = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                env=_shim_env(),
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=out_write,
                pass_fds=tuple(inherited),
                start_new_session=True,  # a Ctrl-C meant for the agent must not reach it
            )
        except BaseException:
            agent_end.close()
            raise
        finally:
            shim_end.close()
            os.close(out_write)
        try:
            pid = self._handshake(
                agent_end, shim, attempt_dir, launch, env, self._limits_request(limits, cgroup)
            )
        except BaseException:
            agent_end.close()  # the lifeline: a shim still running kills what it started
            shim.wait()
            raise

        def on_release() -> None:
            if uid is not None and self._uids is not None:
                self._uids.release(uid)

        return ProcessRun(
            shim=shim,
            control=agent_end,
            pid=pid,
            attempt_dir=attempt_dir,
            on_release=on_release,
            notes=notes,
            cgroup=cgroup,
            memory_limit=limits.memory_bytes,
        )

    def _limits_request(self, limits: JobLimits, cgroup: Path | None) -> dict[str, Any]:
        """The limits part of the shim's request (the shim applies them: see its docstring)."""
        request: dict[str, Any] = {
            "address_space": self.limits.address_space_bytes(limits),
            "nproc": limits.nproc,
            "cgroup": None,
        }
        if cgroup is not None and self.limits.cgroups is not None:
            request["cgroup"] = {
                "path": str(cgroup),
                "mount": str(self.limits.cgroups.mount),
                "values": cgroup_values(limits, controllers=set(self.limits.controllers)),
            }
        return request

    def _handshake(
        self,
        control: socket.socket,
        shim: subprocess.Popen[bytes],
        attempt_dir: Path,
        launch: Launch,
        env: Mapping[str, str],
        limits: Mapping[str, Any],
    ) -> int:
        control.settimeout(SHIM_REPLY_TIMEOUT_S)
        try:
            request = {"command": list(launch.command), "env": dict(env), **limits}
            control.sendall(json.dumps(request).encode() + b"\n")
            reply = b""
            while b"\n" not in reply:
                data = control.recv(4096)
                if not data:
                    break
                reply += data
        except OSError as exc:
            raise LaunchError(f"the job's shim did not answer: {exc}") from None
        control.settimeout(None)
        word, _, rest = reply.decode(errors="replace").strip().partition(" ")
        if word == "started":
            return int(rest)
        if word == "error":
            raise (LeaseLapsed if rest.startswith(LEASE_LAPSED_TEXT) else LaunchError)(rest)
        shim.wait()
        output = b"".join(read_output(attempt_dir, 0, ended=lambda: True))
        said = output.decode(errors="replace").strip().splitlines()
        raise LaunchError(
            f"the job's shim exited before starting the job (exit code {shim.returncode})"
            + (f": {said[-1]}" if said else "")
        )

    def _fresh_attempt_dir(self, launch: Launch) -> Path:
        """The attempt's directory, new. One left by an earlier agent run is refused while
        anything of it still runs (the attempt must not run twice) and moved aside otherwise
        (for example after the portal's database was reset)."""
        attempt_dir = self.job_dir(launch)
        jobs = attempt_dir.parent
        if attempt_dir.exists():
            cgroup = self.cgroup_of((launch.job_id, launch.attempt))
            if attempt_alive(attempt_dir, claims=self._claims, cgroup=cgroup):
                pgid = read_record(attempt_dir).get("pgid")
                raise LaunchError(
                    f"attempt already running on this node, started by an earlier agent run "
                    f"(process group {pgid})"
                )
            attempt_dir.rename(jobs / f"{attempt_dir.name}.replaced-{time.time_ns()}")
        jobs.mkdir(parents=True, exist_ok=True)
        # With job uids, each must be able to pass through to its own directory (search
        # permission only: no listing, no reading of anything else).
        mode = 0o711 if self._uids is not None else 0o700
        if self._uids is not None:
            for traversed in self._dirs_down_to_jobs():
                traversed.chmod(traversed.stat().st_mode & 0o7777 | 0o001)
        attempt_dir.mkdir(mode=mode)
        attempt_dir.chmod(mode)  # mkdir's mode is masked by the umask
        return attempt_dir

    def _dirs_down_to_jobs(self) -> list[Path]:
        """`<workdir>/jobs`, the workdir and, when it lies in the private dir, every directory
        from there down to it: job uids must pass through them (and only pass)."""
        dirs = [self.workdir / "jobs", self.workdir]
        if self.private_dir is not None and self.workdir.is_relative_to(self.private_dir):
            dirs += [d for d in self.workdir.parents if d.is_relative_to(self.private_dir)]
        return dirs

    def _refuse_exposed_private_files(self) -> None:
        if self.private_dir is None:
            return
        exposed = exposed_paths(self.private_dir, managed=self.workdir)
        if exposed:
            shown = " ".join(str(p) for p in exposed[:5])
            more = f" and {len(exposed) - 5} more" if len(exposed) > 5 else ""
            raise LaunchError(
                f"jobs could open the portal's files: {shown}{more}; close them to other "
                f"users (chmod o-rwx ...) before jobs can run"
            )


# --- what an attempt left behind ----------------------------------------------------------------


def attempt_alive(attempt_dir: Path, *, claims: Path, cgroup: Path | None = None) -> bool:
    """Whether anything of this attempt still runs: its shim, its process group, a process in
    its cgroup, or a process of its uid while nobody holds the uid's claim (`claims`, see
    `unclaimed_uid`)."""
    record = read_record(attempt_dir)
    if process_is(record.get("shim"), record.get("shim_start")):
        return True
    if cgroup is not None and populated(cgroup):
        return True
    pgid = record.get("pgid")
    if pgid and group_alive(pgid, record.get("pgid_start")):
        return True
    uid = record.get("uid", -1)
    if uid <= 0 or not _runs_as(uid):
        return False
    with unclaimed_uid(claims, uid) as unclaimed:
        return unclaimed


def kill_leftovers(attempt_dir: Path, *, claims: Path | None, cgroup: Path | None = None) -> bool:
    """Kill whatever of this attempt still runs; whether anything did. `claims`: where uids
    are claimed host-wide; the processes of the attempt's uid are killed only while nobody
    holds it (they may be another attempt's now). None: the caller still holds the uid for
    this attempt (`ProcessRun.reap`), so every process of it is this attempt's. `cgroup`: the
    attempt's cgroup, killed whole and removed (its shim, killed itself, could not)."""
    record = read_record(attempt_dir)
    killed = False
    shim = record.get("shim")
    if shim is not None and process_is(shim, record.get("shim_start")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(shim, signal.SIGKILL)
        # The shim holds the uid's claim until it is gone: wait, or the uid looks taken.
        _wait_gone(shim, record.get("shim_start"), within=SHIM_GONE_S)
        killed = True
    if cgroup is not None and cgroup.exists():
        if populated(cgroup):
            with contextlib.suppress(OSError):
                kill_cgroup(cgroup)
            killed = True
        remove_cgroup(cgroup)
    pgid = record.get("pgid")
    if pgid and group_alive(pgid, record.get("pgid_start")):
        kill_group(pgid, signal.SIGKILL)
        killed = True
    uid = record.get("uid", -1)
    if uid > 0 and uid != os.getuid() and _runs_as(uid):
        if claims is None:
            kill_uid(uid)
            killed = True
        else:
            with unclaimed_uid(claims, uid) as unclaimed:
                if unclaimed and _runs_as(uid):
                    kill_uid(uid)
                    killed = True
    if killed and uid > 0:
        with contextlib.suppress(OSError):
            attempt_dir.chmod(0o700)
    return killed


def _runs_as(uid: int) -> bool:
    return any(p.uid == uid for p in processes())


def _wait_gone(pid: int, started: int | None, *, within: float) -> None:
    deadline = time.monotonic() + within
    while process_is(pid, started) and time.monotonic() < deadline:
        time.sleep(0.01)


def exposed_paths(root: Path, *, managed: Path) -> list[Path]:
    """Paths under `root` that another user (a job uid) could read or write, following only
    directories it may enter; the launcher's own tree `managed` is left out."""
    found: list[Path] = []

    def visit(directory: Path) -> None:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                path = Path(entry.path)
                if path == managed:
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    continue  # its target is judged where it lives
                if stat.S_ISDIR(mode):
                    if mode & stat.S_IWOTH:
                        found.append(path)
                    if mode & stat.S_IXOTH:
                        visit(path)
                elif stat.S_ISSOCK(mode):
                    if mode & stat.S_IWOTH:  # connecting needs write permission
                        found.append(path)
                elif mode & (stat.S_IROTH | stat.S_IWOTH):
                    found.append(path)

    if root.is_dir() and root.stat().st_mode & stat.S_IXOTH:
        visit(root)
    return sorted(found)


def _check_reachable(work_dir: Path, uid: int) -> None:
    """Every directory above the work directory must let the job's uid pass through."""
    for directory in reversed(work_dir.parents):
        st = directory.stat()
        if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
            raise LaunchError(
                f"job uid {uid} cannot reach its work directory: {directory} is mode "
                f"{st.st_mode & 0o7777:04o}; let others pass through it (chmod o+x) or set "
                "PORTAL_AGENT_WORKDIR elsewhere"
            )


def _shim_argv() -> list[str]:
    return [sys.executable, "-E", "-s", "-m", "workers.shim"]


def _shim_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}


def read_output(attempt_dir: Path, offset: int, *, ended: Callable[[], bool]) -> Iterator[bytes]:
    """An attempt's output file from byte `offset` as it grows, until `ended()` held before a
    read that found nothing more."""
    try:
        out = (attempt_dir / OUTPUT_FILE).open("rb")
    except FileNotFoundError:
        return  # an attempt directory from before output files: nothing to read
    with out:
        out.seek(offset)
        wait = OUTPUT_POLL_S[0]
        while True:
            over = ended()
            data = out.read(READ_SIZE)
            if data:
                wait = OUTPUT_POLL_S[0]
                yield data
            elif over:
                return
            else:
                time.sleep(wait)
                wait = min(wait * 2, OUTPUT_POLL_S[1])

"""Resource limits of a process job: rlimits, and a cgroup v2 of its own where the host has one.

Two mechanisms, decided once per launcher (`workers.launchers.process.plan_limits`):

- **cgroup v2** (where a cgroup2 file system has the memory and pids controllers and the agent
  may write to it): every attempt gets `<root>/<agent>-<job>-<attempt>` with `memory.max`,
  `memory.swap.max` 0 (where swap is accounted: the limit is not dodged into swap),
  `memory.oom.group` 1 (an OOM kill takes the whole job, not one worker of it), `pids.max`
  and `cpu.max`. The job is born inside it (see `spawn_limits`), and when the attempt ends the
  shim kills the whole cgroup (`cgroup.kill`) and removes it. The cgroup counts what the job
  really uses, whatever uid its processes run as, and it is what an operator reads in
  `systemd-cgtop`.
- **rlimits**: `RLIMIT_AS` (address space) and `RLIMIT_NPROC` (tasks of the job's real uid),
  inherited by everything the job starts. They are the fallback where no cgroup can be had.
  `RLIMIT_AS` bounds address space, not memory used: CUDA alone reserves far more address
  space than any host has memory, so with a cgroup in force the agent leaves it unset by
  default. `RLIMIT_NPROC` counts every task of a real uid, so it bounds one job exactly only
  when each job has a uid of its own (the root agent's pool); jobs that share the agent's uid
  share one count with the agent's own processes (see `nproc_limit`), and jobs of uid 0 are
  not bound by it at all.

This module is used by both the launcher (plans, probes) and the shim (applies, cleans up).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MOUNTINFO = Path("/proc/self/mountinfo")
# What a job's cgroup needs (memory, pids) and what it uses when the host has it (cpu).
REQUIRED_CONTROLLERS = ("memory", "pids")
OPTIONAL_CONTROLLERS = ("cpu",)
CPU_PERIOD_US = 100_000
# How long a cgroup may take to empty after `cgroup.kill`.
CGROUP_EMPTY_S = 5.0
# Below this the shim itself, which applies the limits to itself around the job's fork
# (`spawn_limits`), could not run; no job can either.
MIN_MEMORY_BYTES = 64 * 1024 * 1024
RLIMITS = {"AS": resource.RLIMIT_AS, "NPROC": resource.RLIMIT_NPROC}
# RLIMIT_AS: "auto" (the memory limit where no cgroup bounds memory, else none), "max" (never),
# or bytes (always).
AddressSpace = int | Literal["auto", "max"]


class CgroupUnavailable(Exception):
    """cgroup v2 cannot limit jobs here; the message says why (for the startup banner)."""


@dataclass(frozen=True)
class JobLimits:
    """What one attempt may use; None means no limit."""

    memory_bytes: int | None = None
    nproc: int | None = None
    cpus: float | None = None


NO_LIMITS = JobLimits()


def capped(asked: JobLimits, maximum: JobLimits) -> JobLimits:
    """Each of `asked`'s limits, never above the agent's own (`maximum`): an operator's host
    settings win over anything a launch asks for."""

    def low(a: int | float | None, m: int | float | None) -> int | float | None:
        return m if a is None else a if m is None else min(a, m)

    memory, nproc = low(asked.memory_bytes, maximum.memory_bytes), low(asked.nproc, maximum.nproc)
    return JobLimits(
        memory_bytes=None if memory is None else int(memory),
        nproc=None if nproc is None else int(nproc),
        cpus=low(asked.cpus, maximum.cpus),
    )


def size_text(size: float | None) -> str:
    if size is None:
        return "no limit"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


# --- cgroup v2: the file system --------------------------------------------------------------


def cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where a cgroup2 file system is mounted (/sys/fs/cgroup on a unified host,
    /sys/fs/cgroup/unified on a hybrid one), or None."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        head, _, tail = line.partition(" - ")
        if tail.split(" ", 1)[0] == "cgroup2":
            return Path(head.split()[4])
    return None


def cgroup_values(limits: JobLimits, *, controllers: set[str]) -> dict[str, str]:
    """The interface files of a job's cgroup and what goes in them, in the order written."""
    values = {
        "memory.max": str(limits.memory_bytes or "max"),
        "pids.max": str(limits.nproc or "max"),
    }
    if "cpu" in controllers:
        quota = "max" if limits.cpus is None else str(max(1000, round(limits.cpus * CPU_PERIOD_US)))
        values["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
    return values


# Written only where the kernel offers them (memory.swap.max needs swap accounting).
OPTIONAL_VALUES = {"memory.swap.max": "0", "memory.oom.group": "1"}


@dataclass(frozen=True)
class Cgroups:
    """The subtree the agent keeps its jobs' cgroups in: `root` under the cgroup2 `mount`."""

    mount: Path
    root: Path

    def prepare(self) -> set[str]:
        """Make `root` a cgroup whose children get the controllers; the controllers it hands
        down. Each cgroup from the mount down must hand them on; the kernel refuses that
        (EBUSY) to a cgroup that has processes of its own, other than the mount's root."""
        try:
            available = set((self.mount / "cgroup.controllers").read_text().split())
        except OSError as exc:
            raise CgroupUnavailable(f"no cgroup v2 at {self.mount}: {exc.strerror}") from None
        missing = [c for c in REQUIRED_CONTROLLERS if c not in available]
        if missing:
            raise CgroupUnavailable(
                f"the cgroup v2 at {self.mount} has no {', '.join(missing)} controller (on this "
                "host it is bound to cgroup v1)"
            )
        if not self.root.is_relative_to(self.mount) or self.root == self.mount:
            raise CgroupUnavailable(f"{self.root} is not a cgroup below {self.mount}")
        wanted = [c for c in (*REQUIRED_CONTROLLERS, *OPTIONAL_CONTROLLERS) if c in available]
        chain = [*reversed(self.root.relative_to(self.mount).parents)][1:]
        for cgroup in [self.mount, *(self.mount / p for p in chain), self.root]:
            try:
                cgroup.mkdir(exist_ok=True)
                wanted = _hand_down(cgroup, wanted)
            except OSError as exc:
                raise CgroupUnavailable(f"cannot set up {cgroup}: {exc.strerror}") from None
        return set(wanted)

    def probe(self, limits: JobLimits) -> set[str]:
        """`prepare`, then make and remove a cgroup with `limits`: the controllers a job's
        cgroup gets, or CgroupUnavailable saying why none can be made."""
        controllers = self.prepare()
        probe = self.root / f"probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            create_cgroup(probe, cgroup_values(limits, controllers=controllers))
        except OSError as exc:
            raise CgroupUnavailable(f"cannot make a job cgroup in {self.root}: {exc}") from None
        finally:
            remove_cgroup(probe)
        return controllers


def _hand_down(cgroup: Path, controllers: list[str]) -> list[str]:
    """Enable `controllers` for the children of `cgroup`; those they get. An optional one the
    kernel refuses is left out (cpu, while a realtime task runs in a non-root cgroup)."""
    control = cgroup / "cgroup.subtree_control"
    given = (
        {word.lstrip("+") for word in control.read_text().split()} if control.exists() else set()
    )
    missing = [c for c in controllers if c not in given]
    if not missing:
        return controllers
    try:
        control.write_text(" ".join(f"+{c}" for c in missing) + "\n")
    except OSError:
        required = [c for c in missing if c in REQUIRED_CONTROLLERS]
        if required:
            control.write_text(" ".join(f"+{c}" for c in required) + "\n")
        return [c for c in controllers if c in given or c in REQUIRED_CONTROLLERS]
    return controllers


def create_cgroup(path: Path, values: Mapping[str, str]) -> None:
    """A fresh cgroup at `path` with `values` written; one left over (an earlier agent run
    that was killed with its shim) is killed and replaced."""
    if path.exists():
        kill_cgroup(path)
        path.rmdir()
    path.mkdir()
    try:
        for name, value in values.items():
            (path / name).write_text(f"{value}\n")
        for name, value in OPTIONAL_VALUES.items():
            if (path / name).exists():
                (path / name).write_text(f"{value}\n")
    except OSError:
        remove_cgroup(path)
        raise


def own_cgroup(mount: Path) -> Path:
    """This process's cgroup in the cgroup2 hierarchy mounted at `mount`."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return mount / line[3:].lstrip("/")
    raise OSError(f"this process is in no cgroup v2 ({mount})")


def move_into(cgroup: Path) -> None:
    """Move this process (all its threads) into `cgroup`."""
    (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")


def populated(cgroup: Path) -> bool:
    """Whether a process is still in the cgroup (or below it)."""
    try:
        events = (cgroup / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    return "populated 1" in events.splitlines()


def kill_cgroup(cgroup: Path, *, within: float = CGROUP_EMPTY_S) -> None:
    """SIGKILL every process in the cgroup at once (`cgroup.kill`, Linux 5.14+; before that
    one by one) and wait until it is empty: no fork outruns it."""
    kill_file = cgroup / "cgroup.kill"
    deadline = time.monotonic() + within
    if kill_file.exists():
        kill_file.write_text("1\n")
    while populated(cgroup) and time.monotonic() < deadline:
        if not kill_file.exists():
            for pid in _members(cgroup):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _members(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_cgroup(cgroup: Path) -> bool:
    """Remove an emptied cgroup; whether it is gone."""
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def oom_kills(cgroup: Path) -> int:
    """How many of the cgroup's processes the kernel's OOM killer ended (memory.events)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (cgroup / "memory.events").read_text().splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill":
                return int(count)
    return 0


# --- the job's birth under its limits --------------------------------------------------------


@contextlib.contextmanager
def spawn_limits(
    *, rlimits: Mapping[str, int], cgroup: Path | None, home: Path | None
) -> Iterator[None]:
    """Put this process (the shim) under the job's limits while it forks the job, so the job
    is born under them: a child starts in its parent's cgroup with its parent's rlimits, and
    both survive the job's setuid and exec.

    Why this way: `resource.prlimit` or a move into the cgroup after `Popen` returns leaves a
    window in which the job runs, forks and allocates unlimited; a `preexec_fn` runs after
    Popen's setuid, as the job's uid, which may no longer move itself into a root-owned cgroup
    (and it is unsafe in threaded programs); CLONE_INTO_CGROUP is not reachable from
    subprocess. The shim is single-threaded and forks nothing else meanwhile, so the window in
    which the limits are its own harms nothing: it needs far less than `MIN_MEMORY_BYTES`.

    Afterwards the shim moves back to `home` and takes its own rlimits back where it may:
    raising a hard limit needs CAP_SYS_RESOURCE, which a non-root shim, and a root one in
    many containers, lacks. Then it keeps the job's, which costs nothing: it forks nothing
    more (and RLIMIT_NPROC does not bind root with CAP_SYS_ADMIN anyway) and stays far below
    the memory limit."""
    saved = {name: resource.getrlimit(RLIMITS[name]) for name in rlimits}
    if cgroup is not None:
        move_into(cgroup)
    try:
        for name, value in rlimits.items():
            hard = saved[name][1]  # never above what this process has: it may not raise that
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(RLIMITS[name], (value, value))
        yield
    finally:
        for name, previous in saved.items():
            with contextlib.suppress(ValueError, OSError):  # no CAP_SYS_RESOURCE: keep it
                resource.setrlimit(RLIMITS[name], previous)
        if cgroup is not None and home is not None:
            move_into(home)


def nproc_limit(nproc: int, *, own_uid: bool, tasks_of: Callable[[int], int]) -> int | None:
    """The RLIMIT_NPROC that lets a job start `nproc` tasks. A job with a uid of its own
    (`own_uid`) gets exactly that. A job that shares the shim's uid shares the kernel's count
    with every other process of that uid (the agent's, other jobs'): it gets `nproc` on top of
    what the uid runs now, so a fork loop stops there without stopping the agent (whose own
    limit is untouched). A job of uid 0 is not bound by RLIMIT_NPROC at all: None."""
    if own_uid:
        return nproc
    uid = os.getuid()
    if uid == 0:
        return None
    return tasks_of(uid) + nproc


def tasks_of(uid: int) -> int:
    """How many tasks (threads count: RLIMIT_NPROC counts them) run with real uid `uid`."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(entry.path, "status").read_text().splitlines()
            real_uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
            if real_uid == uid:
                count += int(
                    next(line for line in status if line.startswith("Threads:")).split()[1]
                )
    return count

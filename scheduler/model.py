"""The data the scheduling core takes and returns.

Everything here is a frozen dataclass of plain values: the portal builds a ``Snapshot`` from
its database, the simulator builds one from a trace, and both call the same
``scheduler.schedule(snapshot, now=..., config=...)``. Nothing in this package reads a clock,
a database or a random source of its own.

Identifiers (job ids, slice ids, node names, team and user names) are strings, so the core
never depends on how the caller numbers things.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.standing import Standing

# A MIG instance is worth its compute slices / 7 of a whole GPU.
MIG_COMPUTE_SLICES_PER_GPU = 7


class SliceKind(enum.StrEnum):
    """What a slice of a physical GPU is."""

    WHOLE = "whole"
    MIG = "mig"
    MPS = "mps"


@dataclass(frozen=True, slots=True)
class Slice:
    """One allocatable thing: a whole GPU, a MIG instance or an MPS share of a GPU.

    ``units`` is what the slice counts for in quotas and fair share (whole = 1.0, MIG =
    compute slices / 7, MPS = its fraction of the GPU).
    """

    id: str
    node: str
    gpu: str
    kind: SliceKind
    units: float
    model: str = ""
    profile: str = ""  # MIG profile such as "1g.10gb"; empty for whole GPUs and MPS shares


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    slices: tuple[Slice, ...]
    schedulable: bool = True  # False when the node is drained or its agent is lost


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a job asks for: ``count`` slices of one kind.

    An elastic gang has ``min_count`` < ``count``: it starts with at least ``min_count`` and
    takes up to ``count``. A rigid request has ``min_count == count`` (or ``min_count`` 0,
    read as equal to ``count``).
    """

    kind: SliceKind
    count: int = 1
    profile: str = ""  # required for MIG
    model: str = ""  # optional GPU model constraint
    min_count: int = 0
    multi_node: bool = False

    @property
    def minimum(self) -> int:
        return self.min_count if 0 < self.min_count <= self.count else self.count


class DependencyKind(enum.StrEnum):
    AFTER_OK = "after_ok"  # start only after the other job succeeded
    AFTER_ANY = "after_any"  # start after the other job ended, whatever its end


@dataclass(frozen=True, slots=True)
class Dependency:
    job_id: str
    kind: DependencyKind = DependencyKind.AFTER_OK


class DependencyState(enum.StrEnum):
    """How a job that others depend on stands, as far as dependencies care."""

    WAITING = "waiting"  # not ended yet (pending, running, ...)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ended without success (failed, cancelled, timed out)


@dataclass(frozen=True, slots=True)
class Job:
    """A job waiting to be placed (or, inside ``RunningJob``, one that holds slices)."""

    id: str
    team: str
    user: str
    request: GpuRequest
    submitted_at: float
    priority: str = "normal"
    time_limit_s: float | None = None
    preemptible: bool = True  # the user allows preemption; False makes it a never-victim
    depends_on: tuple[Dependency, ...] = ()
    # When the job first became eligible to queue (requeued jobs keep their first value so a
    # preempted job keeps its place in the order).
    queued_since: float | None = None
    # The job array it belongs to ("" = none): ``Snapshot.array_limits`` may cap how many of
    # an array's members hold slices at once.
    array: str = ""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds slices now (assigned or running)."""

    job: Job
    node: str
    slice_ids: tuple[str, ...]
    started_at: float
    borrowed: bool = False  # placed above the team's guarantee: reclaimable
    # Set when a preemption was already decided and the job is in its grace period.
    preempting_since: float | None = None


def _empty_limits() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    weight: float = 1.0
    guaranteed: float = 0.0  # GPU units the team always gets back (nominal quota)
    limit: float | None = None  # GPU units it may hold at most; None = no limit
    max_priority: str = "normal"
    # Decayed GPU-unit-seconds charged to the team, as of the snapshot's ``now``.
    usage: float = 0.0
    member_limit: float | None = None  # GPU units one member may hold at most
    budget_gpu_hours: float | None = None  # per period; None = no budget
    used_gpu_hours: float = 0.0  # in the current budget period
    # Members with a limit of their own (user -> GPU units); it only ever tightens
    # ``member_limit``: a member may hold the smaller of the two (``limit_of``).
    member_limits: Mapping[str, float] = field(default_factory=_empty_limits)

    def limit_of(self, user: str) -> float | None:
        """The GPU units ``user`` may hold in this team at most; None = no limit."""
        own = self.member_limits.get(user)
        if own is None:
            return self.member_limit
        return own if self.member_limit is None else min(own, self.member_limit)

    def limits_members(self) -> bool:
        """Whether any member of this team has a limit (so each member's verdict differs)."""
        return self.member_limit is not None or bool(self.member_limits)


@dataclass(frozen=True, slots=True)
class RunTime:
    """How long past jobs of one shape ran (seconds): count, 10th, 50th, 90th percentile,
    and the distribution as ``quantiles`` (equally spaced levels from 0 to 1, so a running
    job's remaining time can be estimated from what it has run; ``scheduler.runtimes``).
    Empty ``quantiles``: the three percentiles are all that is known."""

    samples: int
    p10_s: float
    median_s: float
    p90_s: float
    quantiles: tuple[float, ...] = ()


def _empty_run_times() -> Mapping[str, RunTime]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RunTimes:
    """Past run times by job shape (``scheduler.runtimes``), at three levels: the same user
    and shape, the same team and shape, and the shape across teams. Estimates only: no
    decision reads them."""

    by_user: Mapping[str, RunTime] = field(default_factory=_empty_run_times)
    by_team: Mapping[str, RunTime] = field(default_factory=_empty_run_times)
    by_shape: Mapping[str, RunTime] = field(default_factory=_empty_run_times)


NO_RUN_TIMES = RunTimes()


def _empty_usage() -> Mapping[tuple[str, str], float]:
    return MappingProxyType({})


def _empty_states() -> Mapping[str, DependencyState]:
    return MappingProxyType({})


def _empty_array_limits() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the core may look at for one pass."""

    nodes: tuple[Node, ...]
    teams: Mapping[str, Team]
    pending: tuple[Job, ...]
    running: tuple[RunningJob, ...] = ()
    # Decayed usage of each (team, user), as of ``now``.
    user_usage: Mapping[tuple[str, str], float] = field(default_factory=_empty_usage)
    # States of the jobs that pending jobs depend on.
    dependency_states: Mapping[str, DependencyState] = field(default_factory=_empty_states)
    # Job arrays with a throttle: array -> the most of its members that may hold slices at
    # once (``max_running``). The members holding slices now are the running jobs whose
    # ``Job.array`` is that array; an array missing here has no throttle.
    array_limits: Mapping[str, int] = field(default_factory=_empty_array_limits)
    # How long past jobs of each shape ran (``scheduler.runtimes``): for start estimates of
    # jobs behind running jobs without a time limit, or whose limits overestimate. Estimates
    # only; no decision depends on it.
    run_times: RunTimes = NO_RUN_TIMES
    # The shell's promise that ``pending`` is in submit order already (``order.age_key``
    # ascending): the FIFO baselines then take the queue as it comes instead of keying and
    # sorting it each pass, and fair share finds the jobs past the maximum wait at its head
    # instead of testing every job and takes each user's jobs as they come. Off, the core
    # sorts and tests; a false promise changes the order FIFO sees, which jobs fair share
    # counts as past the maximum wait and the order of a user's own jobs (never a limit or a
    # placement's validity).
    pending_in_submit_order: bool = False
    # The shell's index of ``pending``: the (team, user, priority) of its jobs, each once.
    # When every pending job is a candidate (none parked or failed), the core takes each
    # team's users with pending work and the classes present from it instead of walking the
    # queue for them (the simulator keeps it as jobs come and go). None: the core walks. A
    # false index changes the order fair share gives the jobs (whose users it counts, which
    # teams' jobs a round keeps, the classes' rounds), never a limit or a placement's
    # validity.
    pending_groups: Collection[tuple[str, str, str]] | None = None


# --- decisions -------------------------------------------------------------------------


class PendingCode(enum.StrEnum):
    QUOTA_LIMIT = "QUOTA_LIMIT"
    MEMBER_LIMIT = "MEMBER_LIMIT"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    NO_FIT = "NO_FIT"
    NO_MATCHING_SLICES = "NO_MATCHING_SLICES"  # the cluster has no such slice at all
    WAITING_FOR_RESERVATION = "WAITING_FOR_RESERVATION"
    RESERVED = "RESERVED"  # this job holds the reservation; it starts when slices free up
    DEPENDENCY = "DEPENDENCY"
    FAIR_SHARE = "FAIR_SHARE"  # others come first in the fair-share order
    PRIORITY_NOT_ALLOWED = "PRIORITY_NOT_ALLOWED"
    WAITING_FOR_PREEMPTION = "WAITING_FOR_PREEMPTION"  # victims are in their grace period
    ARRAY_THROTTLE = "ARRAY_THROTTLE"  # its job array runs its max_running members already
    NOT_EXPLAINED = "NOT_EXPLAINED"  # explanations switched off (simulator replays)


@dataclass(frozen=True, slots=True)
class Reason:
    code: PendingCode
    message: str  # for people: "team uses 6.0 of 8.0 units, job needs 4.0"
    numbers: Mapping[str, float | str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Assign:
    job_id: str
    node: str
    slice_ids: tuple[str, ...]
    borrowed: bool = False  # above the team's guarantee, so preemptible by reclaim
    # Every node a multi-node gang spans, ``node`` first; empty for a single-node job (then
    # all ``slice_ids`` are on ``node``).
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str
    reason: str
    for_job_id: str = ""


@dataclass(frozen=True, slots=True)
class Pending:
    job_id: str
    reason: Reason
    position: int  # 1-based place in the order of pending jobs
    eta: float | None = None  # estimated start, same clock as ``now``; None when unknown
    # The band around ``eta``: the earliest and latest it is expected to start (None when
    # unknown; the latest is unknown when some end it waits for is).
    eta_earliest: float | None = None
    eta_latest: float | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """A pending job that can never run (its ``after_ok`` dependency failed)."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Decisions:
    assign: tuple[Assign, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    pending: tuple[Pending, ...] = ()
    fail: tuple[Fail, ...] = ()
    # The fair-share numbers the pass used (``scheduler.standing``): per team, per member,
    # and per job the queues considered. None when the pass does not explain or has no fair
    # share (the FIFO baselines). A report, not a decision: left out of comparisons.
    standing: Standing | None = field(default=None, compare=False, repr=False)

"""What would happen to a job if it were submitted now: the scheduling core's own answer.

``what_if(request=..., user=...)`` takes a checked ``JobRequest`` (the submit's validation,
``validate_job_request``) and answers with the real pass, not a second copy of its rules:

1. Snapshot  - ``load_snapshot``, the pass's own loader (kept a few seconds, see below).
2. Candidate - the request as a pending core job with the id ``CANDIDATE_ID`` ("-1": database
               ids are positive), submitted now, added to the snapshot's queue with the states
               of the jobs it depends on.
3. Decide    - ``scheduler.schedule(snapshot, now=..., config=...)``, as a pass would.
4. Read      - the candidate's own decision (placed now, waiting with a reason, position and
               estimated start, or failed), the running jobs preempted for it, and, from the
               core's indexes of the same snapshot (``shape_of``, ``hold``, ``FreeIndex``),
               how many matching slices exist and are free and what the team holds.

Nothing is written and no lock is taken: the decisions are thrown away, the scheduler lock
is never asked for, and on PostgreSQL the snapshot is read in a READ ONLY, REPEATABLE READ
transaction (one consistent view, and the database itself refuses any write). On SQLite the
reads run in autocommit, because a transaction there takes the write lock up front
(``transaction_mode`` IMMEDIATE) and would hold up the real pass; a write that lands between
two of the loader's reads can then tilt one answer, never a stored row.

A form asks again on every change, so the loaded snapshot is kept for ``SNAPSHOT_TTL_S``
seconds per process, for as long as no pass has run (``SchedulerState.passes``: a pass
changes what is free) and no job was submitted (the newest job id) since. Other changes
(a cancel, a node cordoned) are seen at the latest ``SNAPSHOT_TTL_S`` later.

The core gives the estimated start as a band (``scheduler.eta``: earliest, likely, latest,
from the running jobs' time limits and the run times of finished jobs of the same shape);
each ``None`` when it cannot tell.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, transaction
from django.utils import timezone

from portal.jobs.models import Job
from portal.jobs.validation import JobRequest
from portal.policy import scheduler_config
from portal.scheduling.apply import Explanation, explanation_of
from portal.scheduling.models import SchedulerState
from portal.scheduling.snapshot import LoadedSnapshot, dependency_state, load_snapshot
from portal.tenants.selectors import teams_for_user
from scheduler import schedule
from scheduler.cluster import FreeIndex, shape_of
from scheduler.config import Cache, SchedulerConfig
from scheduler.model import (
    Assign,
    Decisions,
    Dependency,
    DependencyKind,
    DependencyState,
    Fail,
    GpuRequest,
    Pending,
    Slice,
    Snapshot,
)
from scheduler.model import Job as CoreJob
from scheduler.quota import EPS, hold

# The candidate's id in the core: never a database id (those start at 1).
CANDIDATE_ID = "-1"
# How long one process reuses a loaded snapshot while no pass has run.
SNAPSHOT_TTL_S = 3.0

_D = TypeVar("_D", Assign, Pending, Fail)


@dataclass(frozen=True, slots=True)
class SliceCounts:
    """Slices matching the request (kind, MIG profile, model if named)."""

    exist: int  # on the nodes the scheduler sees (ready and drained ones)
    free: int  # free now on nodes that take work (MPS: shares of GPUs the team may use or open)
    largest_free_on_one_node: int  # what a gang on one node could get now


@dataclass(frozen=True, slots=True)
class GuaranteeUse:
    """What the job would take from its team's guarantee, with the team's holdings then."""

    team: str
    guaranteed: float
    limit: float | None
    holds: float  # units the team holds before this job (running, plus placed ahead of it)
    job_units: float
    from_guarantee: float
    borrowed: float  # above the guarantee: reclaimable when the job is preemptible
    # Placed now: the core's ``Assign.borrowed``; waiting: whether it would borrow if it
    # started with the holdings above.
    would_borrow: bool


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job the pass would preempt for the candidate. ``name`` and ``user`` are
    empty unless the asker may see the victim's team (a member, or a site admin)."""

    job_id: int
    team: str
    name: str
    user: str
    units: float
    reason: str


@dataclass(frozen=True, slots=True)
class WhatIf:
    snapshot_at: datetime  # the state the answer is about (now, or up to SNAPSHOT_TTL_S ago)
    request: GpuRequest  # as checked (a GPU model resolved to the inventory's name)
    preemptible: bool
    slices: SliceCounts
    guarantee: GuaranteeUse
    starts_now: bool
    node: str  # where it starts now; empty otherwise
    slice_ids: tuple[str, ...]  # the slices it gets now
    position: int | None  # 1 when it starts now; the core's place in the queue when it waits
    start_at: datetime | None  # now when it starts now; the core's estimate; None: unknown
    # (earliest, latest) around ``start_at`` (scheduler.eta); None when nothing is known.
    start_band: tuple[datetime | None, datetime | None] | None
    reason_code: str  # why it waits (a PendingCode); empty when it starts now or fails
    reason_message: str
    reason_numbers: dict[str, Any]
    fails: str  # why it would fail at once (an after_ok dependency failed); else empty
    preempts: tuple[Victim, ...]
    cached: bool  # the snapshot was reused (see SNAPSHOT_TTL_S)
    load_ms: float
    decide_ms: float

    @property
    def reclaimable(self) -> bool:
        """Would it run on borrowed capacity that reclaim may take back?"""
        return self.guarantee.would_borrow and self.preemptible


def what_if(*, request: JobRequest, user: Any, now: datetime | None = None) -> WhatIf:
    """The pass's answer for ``request`` from ``user`` if it were submitted now (or at
    ``now``: then the snapshot is loaded afresh at that time). Reads only."""
    config = scheduler_config()
    began = time.perf_counter()
    loaded, cached = _snapshot(now, config)
    at = loaded.now.timestamp()
    candidate = _candidate(request, user, at)
    snapshot = replace(
        loaded.snapshot,
        pending=(*loaded.snapshot.pending, candidate),
        dependency_states=_dependency_states(loaded.snapshot, request),
    )
    loaded_at = time.perf_counter()
    decisions = schedule(snapshot, now=at, config=config)
    decided_at = time.perf_counter()
    return _answer(
        snapshot,
        decisions,
        config,
        request=request,
        user=user,
        snapshot_at=loaded.now,
        cached=cached,
        load_ms=(loaded_at - began) * 1000,
        decide_ms=(decided_at - loaded_at) * 1000,
    )


def clear_snapshot_cache() -> None:
    """Forget the kept snapshot (tests that change the database between two questions)."""
    global _kept
    _kept = None


# --- 1. snapshot ---------------------------------------------------------------------------

# ((passes, newest job id), monotonic time it was loaded, the snapshot); one per process.
_kept: tuple[tuple[int, int], float, LoadedSnapshot] | None = None


def _snapshot(now: datetime | None, config: SchedulerConfig) -> tuple[LoadedSnapshot, bool]:
    global _kept
    if now is not None:
        return _read_only_load(now, config), False
    passes = SchedulerState.objects.filter(pk=1).values_list("passes", flat=True).first()
    newest = Job.objects.order_by("-pk").values_list("pk", flat=True).first()
    key = (passes or 0, newest or 0)
    kept = _kept
    if kept is not None and kept[0] == key and time.monotonic() - kept[1] < SNAPSHOT_TTL_S:
        return kept[2], True
    loaded = _read_only_load(timezone.now(), config)
    _kept = (key, time.monotonic(), loaded)
    return loaded, False


def _read_only_load(now: datetime, config: SchedulerConfig) -> LoadedSnapshot:
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return load_snapshot(now=now, config=config)
    return load_snapshot(now=now, config=config)


# --- 2. candidate --------------------------------------------------------------------------


def _candidate(request: JobRequest, user: Any, at: float) -> CoreJob:
    """The request as the snapshot loader would build it once stored (``_core_job``)."""
    return CoreJob(
        id=CANDIDATE_ID,
        team=request.team.name,
        user=user.get_username(),
        request=request.gpu,
        submitted_at=at,
        priority=request.priority,
        time_limit_s=float(request.time_limit_s) if request.time_limit_s else None,
        preemptible=request.preemptible,
        depends_on=tuple(
            Dependency(job_id=str(d.job_id), kind=DependencyKind(d.kind))
            for d in request.depends_on
        ),
        queued_since=at,
    )


def _dependency_states(snapshot: Snapshot, request: JobRequest) -> dict[str, DependencyState]:
    """The snapshot's dependency states plus those of the candidate's dependencies (one query,
    only when it has some the snapshot does not know)."""
    states = dict(snapshot.dependency_states)
    missing = [d.job_id for d in request.depends_on if str(d.job_id) not in states]
    if missing:
        for pk, state in Job.objects.filter(pk__in=missing).values_list("pk", "state"):
            states[str(pk)] = dependency_state(state)
    return states


# --- 4. read the answer --------------------------------------------------------------------


def _answer(
    snapshot: Snapshot,
    decisions: Decisions,
    config: SchedulerConfig,
    *,
    request: JobRequest,
    user: Any,
    snapshot_at: datetime,
    cached: bool,
    load_ms: float,
    decide_ms: float,
) -> WhatIf:
    team = request.team.name
    gpu = request.gpu
    # The core's own indexes of this snapshot: the same cluster shape (cached by the node
    # tuple's identity), the same holdings, the same free index a pass starts from.
    shape = shape_of(snapshot.nodes, remember=Cache.NODE_LIST in config.caches)
    ledger, held, holders = hold(
        snapshot.running,
        shape.slice_by_id,
        grace_period_s=config.grace_period_s,
        weights=config.model_weights,
    )
    index = FreeIndex(shape, holders)
    info = shape.request_info(gpu)
    slices = SliceCounts(
        exist=sum(sum(shape.pool_capacity[pool].values()) for pool in info.pools),
        free=index.total_free(info.pools),
        largest_free_on_one_node=index.largest_free(info.pools, team),
    )

    assign = _find(decisions.assign, CANDIDATE_ID)
    pending = _find(decisions.pending, CANDIDATE_ID)
    fail = _find(decisions.fail, CANDIDATE_ID)
    # What the team holds before this job: now, plus what the pass places for it ahead.
    ahead = _team_assigned(snapshot, decisions, shape.slice_by_id, team=team)
    holds = ledger.team.get(team, 0.0) + ahead
    if assign is not None:
        job_units = sum(shape.slice_by_id[s].units for s in assign.slice_ids)
    else:
        job_units = info.minimum * info.unit
    quota = snapshot.teams.get(team)
    guaranteed = quota.guaranteed if quota is not None else 0.0
    from_guarantee = min(job_units, max(0.0, guaranteed - holds))
    borrowed = max(0.0, job_units - from_guarantee)
    guarantee = GuaranteeUse(
        team=team,
        guaranteed=guaranteed,
        limit=quota.limit if quota is not None else None,
        holds=holds,
        job_units=job_units,
        from_guarantee=from_guarantee,
        borrowed=borrowed,
        would_borrow=assign.borrowed if assign is not None else borrowed > EPS,
    )

    victims = [p for p in decisions.preempt if p.for_job_id == CANDIDATE_ID]
    units_of = {run.job.id: units for run, _, units, _ in held}
    code, message, numbers, position, start_at, earliest, latest = _waiting(
        pending, assign, snapshot_at
    )
    return WhatIf(
        snapshot_at=snapshot_at,
        request=gpu,
        preemptible=request.preemptible,
        slices=slices,
        guarantee=guarantee,
        starts_now=assign is not None,
        node=assign.node if assign is not None else "",
        slice_ids=assign.slice_ids if assign is not None else (),
        position=position,
        start_at=start_at,
        start_band=(earliest, latest) if start_at is not None or earliest is not None else None,
        reason_code=code,
        reason_message=message,
        reason_numbers=numbers,
        fails=fail.reason if fail is not None else "",
        preempts=_victims(victims, units_of, user),
        cached=cached,
        load_ms=load_ms,
        decide_ms=decide_ms,
    )


def _find(decided: Sequence[_D], job_id: str) -> _D | None:
    return next((d for d in decided if d.job_id == job_id), None)


def _team_assigned(
    snapshot: Snapshot, decisions: Decisions, slice_by_id: Mapping[str, Slice], *, team: str
) -> float:
    """Units the pass places for ``team``'s other jobs before the candidate (all of them
    when the candidate is not placed)."""
    team_of = {job.id: job.team for job in snapshot.pending}
    total = 0.0
    for assign in decisions.assign:
        if assign.job_id == CANDIDATE_ID:
            break
        if team_of.get(assign.job_id) == team:
            total += sum(slice_by_id[s].units for s in assign.slice_ids)
    return total


def _waiting(pending: Pending | None, assign: Assign | None, snapshot_at: datetime) -> Explanation:
    """The reason's code, message and numbers, the position and the start."""
    if assign is not None:
        return "", "", {}, 1, snapshot_at, snapshot_at, snapshot_at
    if pending is None:
        return "", "", {}, None, None, None, None
    # The stored form of a Pending decision, exactly as a pass would write it.
    return explanation_of(pending)


def _victims(victims: list[Any], units_of: dict[str, float], user: Any) -> tuple[Victim, ...]:
    if not victims:
        return ()
    ids = [int(v.job_id) for v in victims]
    rows = {
        pk: (name, username, team_name, team_id)
        for pk, name, username, team_name, team_id in Job.objects.filter(pk__in=ids).values_list(
            "pk", "name", "user__username", "team__name", "team_id"
        )
    }
    visible = set(
        teams_for_user(user=user)
        .filter(pk__in={r[3] for r in rows.values()})
        .values_list("pk", flat=True)
    )
    out = []
    for victim in victims:
        pk = int(victim.job_id)
        name, username, team_name, team_id = rows.get(pk, ("", "", "", None))
        seen = team_id in visible
        out.append(
            Victim(
                job_id=pk,
                team=team_name,
                name=name if seen else "",
                user=username if seen else "",
                units=units_of.get(victim.job_id, 0.0),
                reason=victim.reason,
            )
        )
    return tuple(out)

"""Apply one pass's decisions to the database, inside the pass's transaction.

Every write is guarded by the state the snapshot saw, so a job that changed since (a cancel
that committed between the snapshot and now) is left alone instead of overwritten:

1. Fail     - PENDING -> FAILED with the core's reason (a dependency failed).
2. Preempt  - ask a holding attempt to stop (``attempt_request_stops``, reason ``preempt``).
              The agent stops it; its ``finished`` report frees the slices and requeues it.
3. Assign   - PENDING -> ASSIGNED (attempt + 1, node, borrowed, assigned_at) + one Allocation
              per slice, for all placed jobs in a few statements. The partial unique index on
              active allocations makes double booking impossible: if the batch hits it, the
              batch is rolled back and retried job by job, each in its own savepoint, and a
              job that still conflicts stays pending.
4. Pending  - reason, numbers, queue position and estimated start of every job left waiting,
              written only where they changed.
5. Standing - the fair-share numbers the pass used, per team, member and pending job
              (``portal.scheduling.fairshare``), replacing the last pass's.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import TextField
from django.db.models.functions import Cast

from portal.bulk import insert_rows, update_rows
from portal.jobs.attempts import StopAsked, StopWanted, attempt_request_stops
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.transitions import Move, transition, transition_many
from portal.scheduling.fairshare import store_standing
from portal.scheduling.snapshot import LoadedSnapshot
from scheduler.model import Assign, Decisions, Pending, Preempt

log = logging.getLogger("portal.scheduling")

# Rows locked per SELECT ... FOR UPDATE (keeps the IN list short).
_LOCK_CHUNK = 2_000

# The columns a pass writes on every job it leaves pending: code, message, numbers, queue
# position, estimated start.
# code, message, numbers, position, and the estimated start: likely, earliest, latest.
Explanation = tuple[
    str, str, dict[str, Any], int | None, datetime | None, datetime | None, datetime | None
]
_CLEARED_EXPLANATION: Explanation = ("", "", {}, None, None, None, None)
_EXPLANATION_COLUMNS = (
    "pending_code",
    "pending_message",
    "pending_numbers",
    "queue_position",
    "estimated_start_at",
    "estimated_start_earliest_at",
    "estimated_start_latest_at",
)
# Where the numbers are in a row of (pk, *explanation), and the columns beside them.
_NUMBERS = 1 + _EXPLANATION_COLUMNS.index("pending_numbers")
_OTHER_COLUMNS = tuple(c for c in _EXPLANATION_COLUMNS if c != "pending_numbers")
_ASSIGN_COLUMNS = ("attempt", "node", "borrowed", "assigned_at", *_EXPLANATION_COLUMNS)


@dataclass(slots=True)
class Applied:
    assigned: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    # Placed by the core but left pending: the job changed since the snapshot, or one of
    # its slices turned out to be held (the unique index said no).
    conflicts: list[int] = field(default_factory=list)
    pending: int = 0  # jobs left pending
    explanations_written: int = 0  # of those, rows whose explanation changed
    priorities_written: int = 0  # pending jobs with their priority parts (fair share)


@dataclass(frozen=True, slots=True)
class _Plan:
    job_id: int
    attempt: int  # the new attempt
    node_id: int
    borrowed: bool
    slice_ids: tuple[int, ...]
    message: str


class _LostRace(IntegrityError):
    """Fewer rows matched than planned: a job left PENDING after we read it."""


def apply_decisions(
    decisions: Decisions, *, loaded: LoadedSnapshot, at: datetime | None = None
) -> Applied:
    """Write the pass's decisions, dated ``at`` (default: the snapshot's time).

    A running portal passes the clock read after the snapshot was loaded: the pass reads the
    time before its snapshot, so a slice released by a report that committed in between is
    free in the snapshot, and an allocation dated with the pass's earlier time would begin
    before the release that freed its slice (as if the slice were booked twice for that
    moment). Dated when written, every hold on a slice begins after the one before it ended.
    """
    applied = Applied()
    now = at or loaded.now
    applied.failed = _fail(decisions, loaded, now)
    applied.preempted = _preempt(decisions, loaded, now)
    applied.assigned, applied.conflicts = _assign(decisions.assign, loaded, now)
    applied.pending = len(decisions.pending)
    applied.explanations_written = _explain(decisions.pending, loaded)
    applied.priorities_written = store_standing(
        decisions.standing, decisions.pending, loaded=loaded
    )
    return applied


# --- 1. fail ------------------------------------------------------------------------------


def _fail(decisions: Decisions, loaded: LoadedSnapshot, now: datetime) -> list[int]:
    failed = []
    for decision in decisions.fail:
        job_id = int(decision.job_id)
        row = loaded.pending.get(job_id)
        if row is None:
            continue
        left = transition(
            job_id,
            to=JobState.FAILED,
            from_states=[JobState.PENDING],
            attempt=row.attempt,
            message=decision.reason,
            at=now,
            reason=decision.reason,
            finished_at=now,
            **_explanation_fields(_CLEARED_EXPLANATION),
        )
        if left is not None:
            failed.append(job_id)
    return failed


# --- 2. preempt ---------------------------------------------------------------------------


def _preempt(decisions: Decisions, loaded: LoadedSnapshot, now: datetime) -> list[int]:
    """Ask each victim to stop, once: only a job still holding the attempt the snapshot saw
    and not already stopping. Its slices stay allocated until its agent reports the stop."""
    wanted: dict[int, StopWanted] = {}
    for decision in decisions.preempt:
        job_id = int(decision.job_id)
        row = loaded.holding.get(job_id)
        if row is not None and not row.stop_requested:
            wanted[job_id] = StopWanted(
                job_id=job_id,
                message=f"preemption requested: {_why(decision)}",
                attempt=row.attempt,
            )
    if not wanted:
        return []
    asked = attempt_request_stops(wanted=list(wanted.values()), reason="preempt", at=now)
    return [job_id for job_id, found in asked.items() if found == StopAsked.REQUESTED]


def _why(decision: Preempt) -> str:
    if decision.for_job_id:
        return f"{decision.reason} (for job {decision.for_job_id})"
    return decision.reason


# --- 3. assign ----------------------------------------------------------------------------


def _assign(
    decisions: Sequence[Assign], loaded: LoadedSnapshot, now: datetime
) -> tuple[list[int], list[int]]:
    if not decisions:
        return [], []
    attempts = _lock_pending([int(d.job_id) for d in decisions])
    plans: list[_Plan] = []
    conflicts: list[int] = []
    for decision in decisions:
        job_id = int(decision.job_id)
        plan = _plan(decision, attempts.get(job_id), loaded)
        if plan is None:
            conflicts.append(job_id)
        else:
            plans.append(plan)
    try:
        with transaction.atomic():
            _write_assignments(plans, now)
        return [p.job_id for p in plans], conflicts
    except IntegrityError as error:
        # Someone holds one of these slices (or a job moved on): find out which, one by one.
        log.warning("assigning %d jobs at once failed (%s); retrying one by one", len(plans), error)
    assigned = []
    for plan in plans:
        try:
            with transaction.atomic():
                _write_assignments([plan], now)
            assigned.append(plan.job_id)
        except IntegrityError as error:
            log.warning("job %s left pending: %s", plan.job_id, error)
            conflicts.append(plan.job_id)
    return assigned, conflicts


def _lock_pending(job_ids: list[int]) -> dict[int, int]:
    """job id -> attempt, for the jobs still PENDING; on PostgreSQL their rows are locked
    until the pass commits, so a concurrent cancel waits instead of racing the assignment."""
    attempts: dict[int, int] = {}
    for start in range(0, len(job_ids), _LOCK_CHUNK):
        chunk = job_ids[start : start + _LOCK_CHUNK]
        rows = Job.objects.filter(pk__in=chunk, state=JobState.PENDING)
        if connection.features.has_select_for_update:
            rows = rows.select_for_update()
        attempts.update(rows.values_list("pk", "attempt"))
    return attempts


def _plan(decision: Assign, attempt: int | None, loaded: LoadedSnapshot) -> _Plan | None:
    expected = loaded.pending.get(int(decision.job_id))
    if attempt is None or expected is None or expected.attempt != attempt:
        return None
    node_id = loaded.node_pks.get(decision.node)
    slice_ids = [loaded.slice_pks.get(s) for s in decision.slice_ids]
    if node_id is None or not slice_ids or None in slice_ids:
        return None
    nodes = ", ".join(decision.nodes) if decision.nodes else decision.node
    message = f"assigned to {nodes}: {', '.join(decision.slice_ids)}"
    if decision.borrowed:
        # Reclaim never stops a job its user made non-preemptible (``scheduler.preempt``).
        if expected.preemptible:
            message += " (borrowed capacity: preemptible by reclaim)"
        else:
            message += " (borrowed capacity; not preemptible, so reclaim leaves it running)"
    return _Plan(
        job_id=int(decision.job_id),
        attempt=attempt + 1,
        node_id=node_id,
        borrowed=decision.borrowed,
        slice_ids=tuple(s for s in slice_ids if s is not None),
        message=message,
    )


def _write_assignments(plans: Sequence[_Plan], now: datetime) -> None:
    if not plans:
        return
    moves = [
        Move(
            job_id=p.job_id,
            attempt=p.attempt,
            message=p.message,
            values=(p.attempt, p.node_id, p.borrowed, now, *_CLEARED_EXPLANATION),
        )
        for p in plans
    ]
    if not transition_many(
        moves,
        to=JobState.ASSIGNED,
        from_state=JobState.PENDING,
        columns=_ASSIGN_COLUMNS,
        at=now,
    ):
        raise _LostRace("a job left PENDING while the pass applied its decisions")
    insert_rows(
        Allocation,
        ("job", "attempt", "slice", "created_at", "released_at"),
        [(p.job_id, p.attempt, slice_id, now, None) for p in plans for slice_id in p.slice_ids],
    )


# --- 4. explain ---------------------------------------------------------------------------


def _explain(decisions: Iterable[Pending], loaded: LoadedSnapshot) -> int:
    rows = [
        (int(d.job_id), *explanation_of(d)) for d in decisions if int(d.job_id) in loaded.pending
    ]
    # Only rows whose explanation changed are sent: most of a queue is explained as it was
    # by the pass before. Sending them all for the database to compare cost a pass at 4,400
    # pending jobs about 100 ms (encoding them, then the server joining and comparing); the
    # stored explanations read back cost about a fifth of that. The UPDATE still compares,
    # for a row that changed between that read and this write.
    # The numbers are read as the text the database holds and decoded only for a row whose
    # other columns are the same (a row that changed elsewhere is sent whatever its numbers).
    stored = {
        pk: (tuple(explanation), numbers)
        for pk, numbers, *explanation in Job.objects.filter(state=JobState.PENDING)
        .annotate(numbers_text=Cast("pending_numbers", TextField()))
        .values_list("pk", "numbers_text", *_OTHER_COLUMNS)
    }
    changed = []
    for row in rows:
        found = stored.get(row[0])
        if (
            found is None
            or found[0] != row[1:_NUMBERS] + row[_NUMBERS + 1 :]
            or json.loads(found[1]) != row[_NUMBERS]
        ):
            changed.append(row)
    return update_rows(
        Job, _EXPLANATION_COLUMNS, changed, where_state=JobState.PENDING, only_changed=True
    )


def explanation_of(decision: Pending) -> Explanation:
    """The stored form of a Pending decision: code, message, numbers, position, and the
    estimated start with its band (likely, earliest, latest)."""
    return (
        decision.reason.code.value,
        decision.reason.message,
        _json_numbers(decision.reason.numbers),
        max(decision.position, 0),
        _when(decision.eta),
        _when(decision.eta_earliest),
        _when(decision.eta_latest),
    )


def _when(at: float | None) -> datetime | None:
    return datetime.fromtimestamp(at, tz=UTC) if at is not None and math.isfinite(at) else None


def _json_numbers(numbers: Mapping[str, float | str]) -> dict[str, Any]:
    # JSON has no infinity or NaN; say them in words instead of failing the pass.
    out: dict[str, Any] = {}
    for key, value in numbers.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = "unlimited" if value > 0 else str(value)
        else:
            out[key] = value
    return out


def _explanation_fields(explanation: Explanation) -> dict[str, Any]:
    return dict(zip(_EXPLANATION_COLUMNS, explanation, strict=True))

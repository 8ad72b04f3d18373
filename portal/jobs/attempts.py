"""The life of one attempt of a job: start, finish, lose, requeue, stop, release and charge.

An attempt is one run of a job on the slices one assignment gave it (``Job.attempt`` counts
them; a scheduling pass begins the next one, PENDING -> ASSIGNED). Whatever happens to an
attempt afterwards happens here, whoever asks: an agent's report, the reaper, a cancel, a
preemption. Every state change goes through ``portal.jobs.transitions`` and is guarded by the
job's state and attempt number, so a repeated or late request (a report the broker delivered
twice, a reaper that raced a ``finished``) changes nothing. Nothing here talks to agents or
waits on the broker: callers send their messages after commit.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.accounting.services import charge_attempt
from portal.cluster.models import Gpu, Node, Slice
from portal.compiled_queries import compiled_rows, prepared_cursor
from portal.jobs.gangs import GangMember, gang_members
from portal.jobs.models import HOLDING_STATES, Allocation, GangPart, Job, JobEvent, JobState
from portal.jobs.transitions import (
    Move,
    Note,
    announce_moves,
    record_event,
    record_events,
    transition,
    transition_each,
)
from portal.passes import schedule_pass_on_commit
from portal.policy import scheduler_config
from scheduler.units import billed_units

S = JobState

# An agent's outcome of an attempt -> the job's end state.
OUTCOME_STATES = {
    "succeeded": S.SUCCEEDED,
    "failed": S.FAILED,
    "launch_error": S.FAILED,
    "timed_out": S.TIMED_OUT,
    "cancelled": S.CANCELLED,
    "preempted": S.PREEMPTED,
    # The attempt did not run to its end through no doing of the job's: requeued while the
    # job has retries left (see ``attempt_lose``).
    "fenced": S.LOST,
    "lost": S.LOST,
    "unknown": S.LOST,
    "superseded": S.LOST,
}
# End states after which the job is over: they get finished_at and a reason.
_FINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED})
# The portal's own stop reason for a job whose GPUs stayed idle (portal.agents.idle): a cancel
# to the agent (the dispatch sends any reason of the portal's own as a cancel), and the job
# ends CANCELLED with reason IDLE_RECLAIMED, never requeued.
IDLE_RECLAIM = "idle_reclaim"
IDLE_RECLAIMED = "IDLE_RECLAIMED"
# Stop reasons that end the job: whatever the agent reports, it is not run again.
_ENDING_STOPS = frozenset({"cancel", IDLE_RECLAIM})
# The portal's own stop reason for the other parts of a multi-node gang once one part ended
# otherwise than succeeded (sent as a cancel): the gang's end state is that part's.
GANG_STOP = "gang"
# The portal's own stop reasons for an attempt whose slices left its node's inventory
# (portal.agents.hardware) -> the code its loss is recorded with. Sent to the agent as a
# cancel; whatever stop outcome the agent reports, the attempt is LOST and the job requeued
# within its retry bound, as for any loss.
HARDWARE_STOPS = {
    "gpu_lost": "GPU_LOST",
    "mig_reconfigured": "MIG_RECONFIGURED",
    "gpu_reconfigured": "GPU_RECONFIGURED",
}


# --- start ------------------------------------------------------------------------------------


def attempt_start(
    *,
    job_id: int,
    attempt: int,
    started_at: datetime,
    message: str,
    at: datetime,
    node: str = "",
) -> bool:
    """ASSIGNED -> RUNNING, recording when the attempt really started.

    Guard: the job is ASSIGNED at ``attempt``. Returns False (and changes nothing) otherwise:
    a repeated ``started``, one that arrived after its ``finished``, or a stale attempt.

    For a multi-node gang, ``node``'s part started (``gang_part_start``): the job is RUNNING
    once every part has.
    """
    if node and Job.objects.filter(pk=job_id, multi_node=True).exists():
        return gang_part_start(
            job_id=job_id, attempt=attempt, node=node, started_at=started_at, at=at
        )
    left = transition(
        job_id,
        to=S.RUNNING,
        from_states=[S.ASSIGNED],
        attempt=attempt,
        message=message,
        at=at,
        started_at=started_at,
    )
    return left is not None


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """One attempt's start as its agent told it (``attempts_start``)."""

    job_id: int
    attempt: int
    started_at: datetime
    message: str


def attempts_start(starts: Sequence[AttemptStarted], *, at: datetime) -> set[tuple[int, int]]:
    """``attempt_start`` for many attempts of single-node jobs at once (one node's batch of
    ``started`` reports): ASSIGNED -> RUNNING in one guarded UPDATE, their events in one
    INSERT. The guard is ``attempt_start``'s, per job: ASSIGNED at that attempt, and not a
    multi-node gang (whose parts start one by one, ``gang_part_start``).

    Returns the (job, attempt)s that started. The others changed nothing: a repeat, a stale
    attempt, a gang's part, a job that moved on; the caller takes them one by one.
    """
    moves = [
        Move(s.job_id, s.attempt, s.message, values=(s.started_at, s.attempt, False))
        for s in starts
    ]
    moved = transition_each(
        moves,
        to=S.RUNNING,
        from_state=S.ASSIGNED,
        columns=("started_at",),
        match=("attempt", "multi_node"),
        at=at,
    )
    return {(m.job_id, m.attempt) for m in moved}


@dataclass(frozen=True, slots=True)
class ReportedAttempt:
    """One report of a node's batch, as ``attempts_start_on_node`` needs it: the attempt it
    is about, and its start when it is a ``started``."""

    job_id: int
    attempt: int
    start: AttemptStarted | None = None


@dataclass(frozen=True, slots=True)
class NodeStarts:
    """What ``attempts_start_on_node`` found and did: the (job, attempt)s of the batch that
    were ever placed on the node, and those of them that started."""

    placed: set[tuple[int, int]]
    started: set[tuple[int, int]]


def attempts_start_on_node(
    *, node: str, reported: Sequence[ReportedAttempt], at: datetime
) -> NodeStarts:
    """A node's batch of reports (in its order, one per report key): which of its attempts
    were ever placed on ``node`` (an allocation of theirs on one of its slices, held now or
    before; a report about another one is not applied), and ``attempts_start`` for the first
    ``started`` of each job among those placed. Returns both.

    On PostgreSQL that is ONE prepared statement (``_start_on_node_sql``): the batch travels
    as one JSON parameter; the placed attempts, the guarded UPDATE (ASSIGNED at that
    attempt, not a multi-node gang) and the INSERT of the moved jobs' events are its
    data-modifying parts, with the same guards and rows as the two ORM-built statements and
    the query they replace (what SQLite still runs). Their events are announced after commit
    as every transition's."""
    if not reported:
        return NodeStarts(placed=set(), started=set())
    if not _starts_in_one_statement():
        placed = _attempts_placed_on_node(node, sorted({r.job_id for r in reported}))
        first: dict[int, AttemptStarted] = {}
        for report in reported:
            if report.start is not None and (report.job_id, report.attempt) in placed:
                first.setdefault(report.job_id, report.start)
        return NodeStarts(placed=placed, started=attempts_start(list(first.values()), at=at))
    rows = [
        {
            "ord": ord,
            "job_id": r.job_id,
            "attempt": r.attempt,
            "starts": r.start is not None,
            "started_at": None if r.start is None else r.start.started_at.isoformat(),
            "message": "" if r.start is None else r.start.message,
        }
        for ord, r in enumerate(reported)
    ]
    with prepared_cursor() as cursor:
        cursor.execute(_start_on_node_sql(), [json.dumps(rows), node, at])
        result = cursor.fetchall()
    placed = {(job_id, attempt) for job_id, attempt, _ in result}
    moved = {(job_id, attempt) for job_id, attempt, did in result if did}
    announce_moves(
        [
            Move(r.job_id, r.attempt, r.start.message)
            for r in reported
            if r.start is not None and (r.job_id, r.attempt) in moved
        ],
        from_state=S.ASSIGNED,
        to=S.RUNNING,
        at=at,
    )
    return NodeStarts(placed=placed, started=moved)


def _starts_in_one_statement() -> bool:
    return connection.vendor == "postgresql"


def _attempts_placed_on_node(node: str, job_ids: Sequence[int]) -> set[tuple[int, int]]:
    """The (job, attempt)s of ``job_ids`` ever placed on ``node``; SQL compiled once per
    number of jobs (portal.compiled_queries): every batch asks."""
    return {
        (row["job_id"], row["attempt"])
        for row in compiled_rows(
            key=("attempts-placed-on-node", len(job_ids)),
            build=lambda values: (
                Allocation.objects.filter(job_id__in=values[1:], slice__gpu__node__name=values[0])
                .values("job_id", "attempt")
                .distinct()
            ),
            values=[node, *job_ids],
        )
    }


@functools.cache
def _start_on_node_sql() -> str:
    """``attempts_start_on_node``'s statement (PostgreSQL): $1 the batch as JSON, $2 the
    node's name, $3 the events' time. Returns (job, attempt, started) per placed attempt."""
    quote = connection.ops.quote_name

    def table(model: Any) -> str:
        return quote(model._meta.db_table)

    def column(model: Any, name: str) -> str:
        return quote(model._meta.get_field(name).column)

    job, event, allocation = table(Job), table(JobEvent), table(Allocation)
    state, attempt = column(Job, "state"), column(Job, "attempt")
    # Each report once, in the batch's order; a job's first `started` among the attempts
    # placed on the node is the one that may start it (as reports are taken one by one).
    return f"""
WITH batch AS (
    SELECT * FROM jsonb_to_recordset(%s::jsonb) AS b(
        ord integer, job_id bigint, attempt integer, starts boolean,
        started_at timestamptz, message text)
), node_attempts AS (
    SELECT DISTINCT a.{column(Allocation, "job")} AS job_id,
        a.{column(Allocation, "attempt")} AS attempt
    FROM {allocation} a
    JOIN {table(Slice)} s ON s.{quote("id")} = a.{column(Allocation, "slice")}
    JOIN {table(Gpu)} g ON g.{quote("id")} = s.{column(Slice, "gpu")}
    JOIN {table(Node)} n ON n.{quote("id")} = g.{column(Gpu, "node")}
    WHERE n.{column(Node, "name")} = %s
        AND a.{column(Allocation, "job")} IN (SELECT job_id FROM batch)
), placed AS (
    SELECT b.* FROM batch b
    JOIN node_attempts p ON p.job_id = b.job_id AND p.attempt = b.attempt
), first_starts AS (
    SELECT DISTINCT ON (job_id) * FROM placed WHERE starts ORDER BY job_id, ord
), moved AS (
    UPDATE {job} SET {state} = '{S.RUNNING}', {column(Job, "started_at")} = f.started_at
    FROM first_starts f
    WHERE {job}.{quote("id")} = f.job_id AND {job}.{state} = '{S.ASSIGNED}'
        AND {job}.{attempt} = f.attempt AND NOT {job}.{column(Job, "multi_node")}
    RETURNING {job}.{quote("id")} AS job_id, f.attempt, f.ord, f.message
), events AS (
    INSERT INTO {event} ({column(JobEvent, "job")}, {column(JobEvent, "at")},
        {column(JobEvent, "from_state")}, {column(JobEvent, "to_state")},
        {column(JobEvent, "attempt")}, {column(JobEvent, "message")})
    SELECT job_id, %s, '{S.ASSIGNED}', '{S.RUNNING}', attempt, message FROM moved ORDER BY ord
)
SELECT DISTINCT p.job_id, p.attempt, m.job_id IS NOT NULL
FROM placed p LEFT JOIN moved m ON m.job_id = p.job_id AND m.attempt = p.attempt
"""


# --- end ----------------------------------------------------------------------------------


def attempt_end(
    *,
    job_id: int,
    attempt: int,
    to: str,
    from_states: Iterable[str],
    message: str,
    now: datetime | None = None,
    ended_at: datetime | None = None,
    fields: Mapping[str, Any] | None = None,
) -> bool:
    """Move a holding attempt to ``to``, free its slices, charge its use and ask for a pass.

    Guard: the job is in one of ``from_states`` at ``attempt``. Returns False (and changes
    nothing) otherwise. ``fields`` are other job columns to set in the same guarded UPDATE.
    """
    when = now or timezone.now()
    with transaction.atomic():
        left = transition(
            job_id,
            to=to,
            from_states=from_states,
            attempt=attempt,
            message=message,
            at=when,
            **dict(fields or {}),
        )
        if left is None:
            return False
        attempt_release_and_charge(
            job_id=job_id, attempt=attempt, ended_at=min(ended_at or when, when), now=when
        )
        schedule_pass_on_commit()
    return True


def end_state_for(outcome: str, stop_reason: str) -> str:
    """The job's end state for an agent's outcome, read together with why the portal asked it
    to stop: a cancel that overtook a preemption ends the job (no requeue), and a preempted
    job that an agent reports merely 'cancelled' is requeued."""
    state = OUTCOME_STATES[outcome]
    if stop_reason in _ENDING_STOPS and state in (S.PREEMPTED, S.CANCELLED, S.LOST):
        return S.CANCELLED
    if stop_reason in HARDWARE_STOPS and state in (S.PREEMPTED, S.CANCELLED):
        return S.LOST
    if stop_reason == "preempt" and state in (S.CANCELLED, S.LOST):
        return S.PREEMPTED
    return state


def attempt_finish(
    *,
    job_id: int,
    attempt: int,
    outcome: str,
    node: str,
    exit_code: int | None,
    error: str,
    finished_at: datetime,
    started_at: datetime | None,
    now: datetime,
) -> str | None:
    """End an attempt as its agent saw it end: ``outcome`` on ``node``.

    Guard: the job holds slices (ASSIGNED or RUNNING) at ``attempt``; returns None and changes
    nothing otherwise (a repeated or stale report). Else the job moves to the end state for
    the outcome and its stop reason (``end_state_for``), its slices are freed and its use
    charged, and a preempted job goes back to the queue; returns the attempt's end state.
    A ``finished`` that overtook ``started`` (``started_at`` given, job still ASSIGNED)
    records the start first, so the job's history and times stay whole.
    """
    row = (
        Job.objects.filter(pk=job_id)
        .values_list("state", "attempt", "stop_reason", "multi_node")
        .first()
    )
    if row is None or row[0] not in HOLDING_STATES or row[1] != attempt:
        return None
    if row[3]:
        return gang_part_finish(
            job_id=job_id,
            attempt=attempt,
            outcome=outcome,
            node=node,
            exit_code=exit_code,
            error=error,
            finished_at=finished_at,
            started_at=started_at,
            now=now,
        )
    return _attempt_ends(
        job_id=job_id,
        attempt=attempt,
        state=row[0],
        stop_reason=row[2],
        outcome=outcome,
        node=node,
        exit_code=exit_code,
        error=error,
        finished_at=finished_at,
        started_at=started_at,
        now=now,
    )


def _attempt_ends(
    *,
    job_id: int,
    attempt: int,
    state: str,
    stop_reason: str,
    outcome: str,
    node: str,
    exit_code: int | None,
    error: str,
    finished_at: datetime,
    started_at: datetime | None,
    now: datetime,
) -> str | None:
    """``attempt_finish`` of a job seen ``state`` (holding) with ``stop_reason``."""
    to = end_state_for(outcome, stop_reason)
    if to == S.LOST:
        # The agent says the attempt is over without a result of its own (it was fenced, died
        # with an earlier agent run, or never ran here), or the portal stopped it because its
        # slices left the node's inventory: requeued, within the retry bound.
        why = f"{outcome} on {node}" + (f": {error}" if error else "")
        code = HARDWARE_STOPS.get(stop_reason)
        if code is not None and not error.startswith(code):
            why = f"{code}: its slices left the inventory of {node} ({why})"
        return attempt_lose(job_id=job_id, attempt=attempt, why=why, now=now)
    detail = error or outcome
    if to == S.CANCELLED and stop_reason == IDLE_RECLAIM:
        detail = IDLE_RECLAIMED
    fields: dict[str, Any] = {"exit_code": exit_code}
    if to in _FINAL_STATES:
        fields.update(finished_at=min(finished_at, now), reason="" if to == S.SUCCEEDED else detail)
    exit_text = "" if exit_code is None else f", exit code {exit_code}"
    with transaction.atomic():
        if state == S.ASSIGNED and started_at is not None:
            # Two control workers, or a job that ends at once: the reports crossed.
            attempt_start(
                job_id=job_id,
                attempt=attempt,
                started_at=started_at,
                message=f"started on {node}",
                at=min(started_at, now),
            )
        if not attempt_end(
            job_id=job_id,
            attempt=attempt,
            to=to,
            from_states=HOLDING_STATES,
            message=f"{outcome} on {node}{exit_text}" + (f": {error}" if error else ""),
            now=now,
            ended_at=finished_at,
            fields=fields,
        ):
            return None
        if to == S.PREEMPTED:
            attempt_requeue(
                job_id=job_id,
                attempt=attempt,
                from_state=S.PREEMPTED,
                message="requeued after preemption, keeping its place",
                at=now,
            )
    return to


# --- multi-node gangs ---------------------------------------------------------------------


def _locked_gang(job_id: int, attempt: int) -> tuple[str, str, bool, str] | None:
    """The gang's state, stop reason, whether a stop was asked and its first node, with its
    row locked (on PostgreSQL), so two reports of its parts are applied one after the other;
    None unless it holds slices at ``attempt``."""
    rows = Job.objects.filter(pk=job_id, attempt=attempt, state__in=HOLDING_STATES)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update(of=("self",))
    row = rows.values_list("state", "stop_reason", "stop_requested_at", "node__name").first()
    if row is None:
        return None
    return row[0], row[1], row[2] is not None, row[3] or ""


def _gang_part(
    job_id: int, attempt: int, node: str, first: str
) -> tuple[GangPart | None, tuple[GangMember, ...]]:
    """``node``'s part of the gang's attempt (made by its first report), and the members; no
    part when the node holds none of the attempt's slices."""
    members = gang_members(job_id=job_id, attempt=attempt, first=first)
    member = next((m for m in members if m.node == node), None)
    if member is None:
        return None, members
    part, _ = GangPart.objects.get_or_create(
        job_id=job_id, attempt=attempt, node_id=member.node_id, defaults={"rank": member.rank}
    )
    return part, members


def gang_part_start(
    *, job_id: int, attempt: int, node: str, started_at: datetime, at: datetime
) -> bool:
    """``node``'s part of a multi-node gang started; ASSIGNED -> RUNNING once every part has
    (the job's ``started_at`` is then the last part's start: all ranks run from there).

    Guard: the job holds slices at ``attempt``, the node holds some of them, and the part's
    start is not recorded yet. Returns False (and changes nothing) otherwise.
    """
    with transaction.atomic():
        found = _locked_gang(job_id, attempt)
        if found is None:
            return False
        state = found[0]
        part, members = _gang_part(job_id, attempt, node, found[3])
        if part is None:
            return False
        if not GangPart.objects.filter(pk=part.pk, started_at__isnull=True).update(
            started_at=started_at
        ):
            return False
        starts = list(
            GangPart.objects.filter(
                job_id=job_id, attempt=attempt, started_at__isnull=False
            ).values_list("started_at", flat=True)
        )
        record_event(
            job_id,
            message=f"rank {part.rank} started on {node} ({len(starts)} of {len(members)} nodes)",
            attempt=attempt,
            at=at,
        )
        if state == S.ASSIGNED and len(starts) == len(members):
            transition(
                job_id,
                to=S.RUNNING,
                from_states=[S.ASSIGNED],
                attempt=attempt,
                message=f"started on all {len(members)} nodes",
                at=at,
                started_at=max(starts),
            )
    return True


def gang_part_finish(
    *,
    job_id: int,
    attempt: int,
    outcome: str,
    node: str,
    exit_code: int | None,
    error: str,
    finished_at: datetime,
    started_at: datetime | None,
    now: datetime,
) -> str | None:
    """``node``'s part of a multi-node gang ended with ``outcome``.

    Its slices are freed now (the other parts keep theirs until they end). The first part that
    ends otherwise than succeeded has the others stopped (stop reason ``GANG_STOP``, unless a
    stop was asked already; the caller sends it after commit). Once every part ended, the job
    ends as ``attempt_finish`` ends a job: with the first such part's outcome, exit code and
    error, or succeeded when every part did; it is charged for each slice until its part ended.

    Guard: the job holds slices at ``attempt``, the node holds some of them, and the part's
    end is not recorded yet (a repeat or a stale report returns None). Returns the job's state
    afterwards: still ASSIGNED or RUNNING while parts run, else its end state.
    """
    with transaction.atomic():
        found = _locked_gang(job_id, attempt)
        if found is None:
            return None
        part, members = _gang_part(job_id, attempt, node, found[3])
        if part is None or part.outcome:
            return None
        if started_at is not None and part.started_at is None:
            gang_part_start(
                job_id=job_id, attempt=attempt, node=node, started_at=started_at, at=now
            )
        GangPart.objects.filter(pk=part.pk).update(
            ended_at=min(finished_at, now),
            recorded_at=now,
            outcome=outcome,
            exit_code=exit_code,
            error=error,
        )
        exit_text = "" if exit_code is None else f", exit code {exit_code}"
        record_event(
            job_id,
            message=f"rank {part.rank} on {node}: {outcome}{exit_text}"
            + (f": {error}" if error else ""),
            attempt=attempt,
            at=now,
        )
        parts = list(GangPart.objects.filter(job_id=job_id, attempt=attempt).select_related("node"))
        ended = [p for p in parts if p.outcome]
        state, stop_reason, stopping, _ = _locked_gang(job_id, attempt) or found
        if len(ended) < len(members):
            attempt_release_and_charge(
                job_id=job_id, attempt=attempt, ended_at=min(finished_at, now), now=now, node=node
            )
            if outcome != "succeeded" and not stopping:
                attempt_request_stop(
                    job_id=job_id,
                    reason=GANG_STOP,
                    attempt=attempt,
                    message=(
                        f"rank {part.rank} on {node} ended ({outcome}): stopping the other "
                        f"{len(members) - len(ended)} of {len(members)} nodes"
                    ),
                    at=now,
                )
            return state
        failures = sorted(
            (p for p in ended if p.outcome != "succeeded"),
            key=lambda p: (p.recorded_at or now, p.rank),
        )
        # The first part that failed decides; it ended before any stop of the gang's own, so
        # its outcome stands. Else every part succeeded.
        first = failures[0] if failures else None
        return _attempt_ends(
            job_id=job_id,
            attempt=attempt,
            state=state,
            stop_reason="" if stop_reason == GANG_STOP else stop_reason,
            outcome=first.outcome if first else "succeeded",
            node=(
                f"{first.node.name} (rank {first.rank} of {len(members)} nodes)"
                if first
                else f"all {len(members)} nodes"
            ),
            exit_code=first.exit_code if first else 0,
            error=(f"rank {first.rank} on {first.node.name}: {first.error or first.outcome}")
            if first
            else "",
            finished_at=max(p.ended_at or now for p in ended),
            started_at=None,
            now=now,
        )


# Outcomes that are the job's own result (it ran to its end), as opposed to a stop.
_RESULT_STATES = {"succeeded": S.SUCCEEDED, "failed": S.FAILED, "timed_out": S.TIMED_OUT}


@dataclass(frozen=True, slots=True)
class LateSettlement:
    """A job ended by the late result of an attempt it had given up on: its end state, and
    the attempt it no longer needs (to stop on ``node``, if it was placed there)."""

    state: str
    superseded_attempt: int
    node: str | None


def attempt_settle_late(
    *,
    job_id: int,
    attempt: int,
    outcome: str,
    node: str,
    exit_code: int | None,
    error: str,
    finished_at: datetime,
    started_at: datetime | None,
    now: datetime,
) -> LateSettlement | None:
    """The result of an attempt the portal declared lost arrives after the job was requeued.

    The attempt really ran to its end (its node was cut off, the agent kept the result in its
    outbox). When the job's next attempt has not started yet, the job ends with that result
    instead of running a second time; the next attempt's slices are freed and the caller stops
    it on its node (an agent that never saw it keeps a tombstone and never starts it). The
    job's attempt number goes back to the one whose result it keeps, so its log is that one.

    Guard: ``outcome`` is the job's own result (succeeded, failed, timed out), ``attempt`` was
    LOST, and the job is PENDING since (at that attempt) or ASSIGNED at a later attempt that
    has no start. Returns
    None and changes nothing otherwise (it then really is a stale report).
    """
    to = _RESULT_STATES.get(outcome)
    if to is None:
        return None
    row = (
        Job.objects.filter(pk=job_id, multi_node=False)
        .values_list("state", "attempt", "started_at", "node__name")
        .first()
    )
    if row is None:
        # Also a multi-node gang: one part's result is not the gang's (its other parts were
        # stopped when it was lost), so a late one never ends the job.
        return None
    state, current, current_start, current_node = row
    # A requeue keeps the attempt number (the next assignment counts it up): PENDING at the
    # lost attempt, or ASSIGNED at a later one that has not started.
    waiting = (state == S.PENDING and current == attempt) or (
        state == S.ASSIGNED and current > attempt and current_start is None
    )
    if not waiting:
        return None
    if not JobEvent.objects.filter(job_id=job_id, attempt=attempt, to_state=S.LOST).exists():
        return None
    exit_text = "" if exit_code is None else f", exit code {exit_code}"
    with transaction.atomic():
        left = transition(
            job_id,
            to=to,
            from_states=[state],
            attempt=current,
            message=(
                f"{outcome} on {node}{exit_text}: attempt {attempt} ran to its end while its node "
                "was out of reach; it is not run again"
            ),
            at=now,
            event_attempt=attempt,
            exit_code=exit_code,
            started_at=started_at,
            finished_at=min(finished_at, now),
            reason="" if to == S.SUCCEEDED else (error or outcome),
            stop_requested_at=None,
            stop_reason="",
        )
        if left is None:
            return None
        if current != attempt:
            attempt_release_and_charge(job_id=job_id, attempt=current, ended_at=now, now=now)
            Job.objects.filter(pk=job_id).update(attempt=attempt)
        schedule_pass_on_commit()
    return LateSettlement(
        state=to,
        superseded_attempt=current,
        node=current_node if state == S.ASSIGNED else None,
    )


def attempt_lose(*, job_id: int, attempt: int, why: str, now: datetime | None = None) -> str | None:
    """A holding attempt whose agent is gone or forgot it: LOST, then requeued while the job
    has retries left (PORTAL_JOB_MAX_RETRIES lost attempts), else FAILED.

    Guard: the job is ASSIGNED or RUNNING at ``attempt``. Returns the state it ended in
    (PENDING or FAILED), or None when the attempt was not holding any more.
    """
    when = now or timezone.now()
    with transaction.atomic():
        if not attempt_end(
            job_id=job_id,
            attempt=attempt,
            to=S.LOST,
            from_states=HOLDING_STATES,
            message=f"lost: {why}",
            now=when,
        ):
            return None
        losses = JobEvent.objects.filter(job_id=job_id, to_state=S.LOST).count()
        retries = settings.JOB_MAX_RETRIES
        if losses > retries:
            reason = f"lost {losses} times (PORTAL_JOB_MAX_RETRIES={retries}); last: {why}"
            transition(
                job_id,
                to=S.FAILED,
                from_states=[S.LOST],
                attempt=attempt,
                message=reason,
                at=when,
                reason=reason,
                finished_at=when,
            )
            return S.FAILED
        attempt_requeue(
            job_id=job_id,
            attempt=attempt,
            from_state=S.LOST,
            message=f"requeued after loss {losses} of {retries + 1} allowed",
            at=when,
        )
        return S.PENDING


def attempt_requeue(
    *, job_id: int, attempt: int, from_state: str, message: str, at: datetime | None = None
) -> bool:
    """PREEMPTED/LOST -> PENDING, keeping ``queued_since`` (its place) and the attempt number
    (the next assignment counts it up). ``at`` is the time of the end it follows, so the
    job's history keeps its order (an end recorded at the caller's ``now``, then this).

    Guard: the job is in ``from_state`` at ``attempt``; returns False otherwise.
    """
    left = transition(
        job_id,
        to=S.PENDING,
        from_states=[from_state],
        attempt=attempt,
        message=message,
        at=at,
        stop_requested_at=None,
        stop_reason="",
        assigned_at=None,
        started_at=None,
        finished_at=None,
        exit_code=None,
        borrowed=False,
    )
    return left is not None


def attempt_release_and_charge(
    *, job_id: int, attempt: int, ended_at: datetime, now: datetime, node: str = ""
) -> None:
    """Release the attempt's allocations and charge the hold, from its first allocation to
    ``ended_at``, in billed GPU units.

    ``node``: release only that node's allocations (one part of a multi-node gang ended); the
    attempt is charged once no allocation of it is held any more, each slice until its own
    release (the last ones until ``ended_at``), as one hold of all its units that lasts the
    units-weighted mean of those times.

    Guard: only allocations of ``attempt`` that are still held; the charge is written once per
    attempt (``charge_attempt`` is idempotent), so a second call does nothing.
    """
    config = scheduler_config()
    allocations = list(
        Allocation.objects.filter(job_id=job_id, attempt=attempt)
        .select_related("slice__gpu__node", "job")
        .order_by("created_at")
    )
    held = [
        a
        for a in allocations
        if a.released_at is None and (not node or a.slice.gpu.node.name == node)
    ]
    if not held:
        return
    Allocation.objects.filter(pk__in=[a.pk for a in held]).update(released_at=now)
    releasing = {a.pk for a in held}
    if any(a.released_at is None and a.pk not in releasing for a in allocations):
        return  # other parts of the gang still hold theirs
    job = held[0].job
    held_from = allocations[0].created_at
    billed = [
        (
            billed_units(a.slice.units, a.slice.gpu.model, config.model_weights),
            a.released_at if a.released_at is not None and a.pk not in releasing else ended_at,
        )
        for a in allocations
    ]
    units = sum(b for b, _ in billed)
    held_until = max(ended_at, held_from)
    if units > 0 and len({until for _, until in billed}) > 1:
        mean_s = sum(b * max(0.0, (until - held_from).total_seconds()) for b, until in billed)
        held_until = held_from + timedelta(seconds=mean_s / units)
    charge_attempt(
        job_id=job_id,
        attempt=attempt,
        team_id=job.team_id,
        user_id=job.user_id,
        units=units,
        held_from=held_from,
        held_until=held_until,
        half_life_s=config.usage_half_life_s,
    )


# --- stop -------------------------------------------------------------------------------------


class StopAsked(enum.StrEnum):
    """What a stop request found."""

    REQUESTED = "requested"  # written now, with its event
    ALREADY_STOPPING = "already_stopping"  # asked before, for this reason or one that wins
    NOT_HOLDING = "not_holding"  # no slices held (at that attempt): nothing to stop


@dataclass(frozen=True, slots=True)
class StopWanted:
    """One job to stop: the event's message, and the attempt the caller saw (None: whichever
    attempt holds slices now)."""

    job_id: int
    message: str
    attempt: int | None = None


def attempt_request_stop(
    *,
    job_id: int,
    reason: str,
    message: str,
    attempt: int | None = None,
    at: datetime | None = None,
) -> StopAsked:
    """``attempt_request_stops`` for one job."""
    wanted = [StopWanted(job_id=job_id, message=message, attempt=attempt)]
    return attempt_request_stops(wanted=wanted, reason=reason, at=at or timezone.now())[job_id]


def attempt_request_stops(
    *, wanted: Sequence[StopWanted], reason: str, at: datetime
) -> dict[int, StopAsked]:
    """Ask holding attempts to stop for ``reason`` (``cancel``, ``preempt`` or
    ``IDLE_RECLAIM``): the one place that writes ``stop_requested_at`` / ``stop_reason``, each
    with its event.

    Guard: the job is ASSIGNED or RUNNING (at the attempt given); its row is locked (on
    PostgreSQL; SQLite's transactions take the write lock up front) so the read and the write
    see the same job. The first request sets both columns; a later one changes nothing,
    except that a cancel overrides another reason (a preemption in progress then ends the job
    instead of requeueing it). The slices stay held until the agent reports the attempt's
    end. Returns, for every job in ``wanted``, what the request found; sending the stop is the
    caller's, after commit.
    """
    by_job = {w.job_id: w for w in wanted}
    found = dict.fromkeys(by_job, StopAsked.NOT_HOLDING)
    if not by_job:
        return found
    with transaction.atomic():
        rows = Job.objects.filter(pk__in=list(by_job), state__in=HOLDING_STATES)
        if connection.features.has_select_for_update:
            rows = rows.select_for_update()
        fresh: list[Note] = []
        overridden: list[Note] = []
        for pk, attempt, state, asked_at, asked_for in rows.values_list(
            "pk", "attempt", "state", "stop_requested_at", "stop_reason"
        ):
            want = by_job[pk]
            if want.attempt is not None and want.attempt != attempt:
                continue
            note = Note(job_id=pk, state=state, attempt=attempt, message=want.message)
            if asked_at is None:
                fresh.append(note)
            elif reason == "cancel" and asked_for != reason:
                overridden.append(note)
            else:
                found[pk] = StopAsked.ALREADY_STOPPING
        if fresh:
            Job.objects.filter(pk__in=[n.job_id for n in fresh]).update(
                stop_requested_at=at, stop_reason=reason
            )
        if overridden:
            Job.objects.filter(pk__in=[n.job_id for n in overridden]).update(stop_reason=reason)
        written = fresh + overridden
        record_events(written, at=at)
    for note in written:
        found[note.job_id] = StopAsked.REQUESTED
    return found

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.accounting.services import charge_attempt
from portal.jobs.models import HOLDING_STATES, Allocation, Job, JobEvent, JobState
from portal.jobs.transitions import Note, record_events, transition
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
    *, job_id: int, attempt: int, started_at: datetime, message: str, at: datetime
) -> bool:
    """ASSIGNED -> RUNNING, recording when the attempt really started.

    Guard: the job is ASSIGNED at ``attempt``. Returns False (and changes nothing) otherwise:
    a repeated ``started``, one that arrived after its ``finished``, or a stale attempt.
    """
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
    row = Job.objects.filter(pk=job_id).values_list("state", "attempt", "stop_reason").first()
    if row is None or row[0] not in HOLDING_STATES or row[1] != attempt:
        return None
    to = end_state_for(outcome, row[2])
    if to == S.LOST:
        # The agent says the attempt is over without a result of its own (it was fenced, died
        # with an earlier agent run, or never ran here), or the portal stopped it because its
        # slices left the node's inventory: requeued, within the retry bound.
        why = f"{outcome} on {node}" + (f": {error}" if error else "")
        code = HARDWARE_STOPS.get(row[2])
        if code is not None and not error.startswith(code):
            why = f"{code}: its slices left the inventory of {node} ({why})"
        return attempt_lose(job_id=job_id, attempt=attempt, why=why, now=now)
    detail = error or outcome
    if to == S.CANCELLED and row[2] == IDLE_RECLAIM:
        detail = IDLE_RECLAIMED
    fields: dict[str, Any] = {"exit_code": exit_code}
    if to in _FINAL_STATES:
        fields.update(finished_at=min(finished_at, now), reason="" if to == S.SUCCEEDED else detail)
    exit_text = "" if exit_code is None else f", exit code {exit_code}"
    with transaction.atomic():
        if row[0] == S.ASSIGNED and started_at is not None:
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
        Job.objects.filter(pk=job_id)
        .values_list("state", "attempt", "started_at", "node__name")
        .first()
    )
    if row is None:
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
    *, job_id: int, attempt: int, ended_at: datetime, now: datetime
) -> None:
    """Release the attempt's allocations and charge the hold, from its first allocation to
    ``ended_at``, in billed GPU units.

    Guard: only allocations of ``attempt`` that are still held; the charge is written once per
    attempt (``charge_attempt`` is idempotent), so a second call does nothing.
    """
    config = scheduler_config()
    held = list(
        Allocation.objects.filter(job_id=job_id, attempt=attempt, released_at__isnull=True)
        .select_related("slice__gpu", "job")
        .order_by("created_at")
    )
    if not held:
        return
    Allocation.objects.filter(pk__in=[a.pk for a in held]).update(released_at=now)
    job = held[0].job
    units = sum(billed_units(a.slice.units, a.slice.gpu.model, config.model_weights) for a in held)
    held_from = held[0].created_at
    charge_attempt(
        job_id=job_id,
        attempt=attempt,
        team_id=job.team_id,
        user_id=job.user_id,
        units=units,
        held_from=held_from,
        held_until=max(ended_at, held_from),
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

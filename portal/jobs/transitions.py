"""The one place that changes a job's state.

Every change is a guarded conditional UPDATE (``... WHERE id = %s AND state = %s [AND attempt
= %s]``): when zero rows match, someone else got there first and the caller is told so,
instead of overwriting their change. Every change that happens is written as a JobEvent in
the same transaction.

After that transaction commits, ``job_state_changed`` is sent with the changes it made, so
apps above this one (notifications) can follow jobs without jobs importing them. A receiver
runs outside the transition: its errors are logged, never felt by the job.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from portal.bulk import insert_rows, update_rows, updated_pks
from portal.compiled_queries import prepared_cursor
from portal.jobs.models import Job, JobEvent, JobState

S = JobState
log = logging.getLogger("portal.jobs")


@dataclass(frozen=True, slots=True)
class StateChange:
    """One committed change of a job's state, as ``job_state_changed`` tells it."""

    job_id: int
    from_state: str
    to_state: str
    attempt: int
    at: datetime
    message: str


# Sent (sender=Job, changes=tuple[StateChange, ...]) once the transaction that made the
# changes has committed; never for a change that was rolled back.
job_state_changed = Signal()


def _announce_on_commit(changes: Sequence[StateChange]) -> None:
    if changes and job_state_changed.has_listeners(Job):
        announced = tuple(changes)
        transaction.on_commit(lambda: _announce(announced), robust=True)


def _announce(changes: tuple[StateChange, ...]) -> None:
    for receiver, result in job_state_changed.send_robust(sender=Job, changes=changes):
        if isinstance(result, Exception):
            log.error(
                "a receiver of job state changes failed (%s); the jobs are not affected: %r",
                getattr(receiver, "__qualname__", receiver),
                result,
                exc_info=result,
            )


# Which state may follow which. Anything else is a programming error, refused loudly.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # A requeued job whose lost attempt's own result arrives before the next attempt started
    # ends with that result (portal.jobs.attempts.attempt_settle_late).
    S.PENDING: frozenset({S.ASSIGNED, S.HELD, S.CANCELLED, S.FAILED, S.SUCCEEDED, S.TIMED_OUT}),
    S.HELD: frozenset({S.PENDING, S.CANCELLED, S.FAILED}),
    # An agent's "finished" may overtake its "started": ASSIGNED may end directly.
    S.ASSIGNED: frozenset(
        {S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.PREEMPTED, S.LOST}
    ),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.PREEMPTED, S.LOST}),
    S.PREEMPTED: frozenset({S.PENDING, S.FAILED}),
    S.LOST: frozenset({S.PENDING, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}


class IllegalTransition(ValueError):
    """Asked for a state change the state machine does not have."""


def check_transition(from_state: str, to_state: str) -> None:
    if to_state not in ALLOWED_TRANSITIONS.get(from_state, frozenset()):
        allowed = ", ".join(sorted(ALLOWED_TRANSITIONS.get(from_state, ()))) or "none"
        raise IllegalTransition(
            f"a job cannot go from {from_state} to {to_state} (from {from_state}: {allowed})"
        )


def transition(
    job_id: int,
    *,
    to: str,
    from_states: Iterable[str],
    attempt: int | None = None,
    message: str = "",
    at: datetime | None = None,
    event_attempt: int | None = None,
    **fields: Any,
) -> str | None:
    """Move job ``job_id`` to ``to`` if it is in one of ``from_states`` (and at ``attempt``).

    ``fields`` are other columns to set in the same UPDATE. Returns the state the job left,
    or None when it was in none of ``from_states`` (someone else changed it first).
    """
    sources = list(dict.fromkeys(from_states))
    for source in sources:
        check_transition(source, to)
    when = at or timezone.now()
    with transaction.atomic():
        for source in sources:
            rows = Job.objects.filter(pk=job_id, state=source)
            if attempt is not None:
                rows = rows.filter(attempt=attempt)
            if rows.update(state=to, **fields):
                if event_attempt is None:
                    event_attempt = fields.get("attempt", attempt)
                    if event_attempt is None:
                        event_attempt = (
                            Job.objects.filter(pk=job_id).values_list("attempt", flat=True).get()
                        )
                JobEvent.objects.create(
                    job_id=job_id,
                    at=when,
                    from_state=source,
                    to_state=to,
                    attempt=event_attempt,
                    message=message,
                )
                _announce_on_commit([StateChange(job_id, source, to, event_attempt, when, message)])
                return source
    return None


@dataclass(frozen=True, slots=True)
class Move:
    """One job of a batch transition: its new attempt, its event's message, and the values of
    the batch's other columns."""

    job_id: int
    attempt: int
    message: str
    values: tuple[Any, ...] = ()


def transition_many(
    moves: Sequence[Move], *, to: str, from_state: str, columns: Sequence[str], at: datetime
) -> bool:
    """``transition`` for many jobs at once (a scheduling pass assigns thousands): the same
    check, the same guard — only rows still in ``from_state`` change — and the same events,
    in a few statements instead of a few per job.

    Returns False when any job had left ``from_state``; the caller must then roll back its
    transaction (nothing here is partial on its own).
    """
    check_transition(from_state, to)
    if not moves:
        return True
    rows = [(m.job_id, to, *m.values) for m in moves]
    if update_rows(Job, ("state", *columns), rows, where_state=from_state) != len(moves):
        return False
    _record_moves(moves, from_state=from_state, to=to, at=at)
    return True


def transition_each(
    moves: Sequence[Move],
    *,
    to: str,
    from_state: str,
    columns: Sequence[str],
    match: Sequence[str],
    at: datetime,
) -> list[Move]:
    """``transition`` for many jobs at once, each on its own guard: a job moves only while it
    is in ``from_state`` and its ``match`` columns hold its move's values (its attempt); the
    others are left as they are, for the caller to look at one by one. A move's ``values`` are
    those of ``columns``, then those of ``match``. One UPDATE and one INSERT of the events of
    the jobs that moved, whatever their number; returns their moves. One move per job."""
    check_transition(from_state, to)
    if len({m.job_id for m in moves}) != len(moves):
        raise ValueError("transition_each takes one move per job")
    if not moves:
        return []
    rows = [(m.job_id, to, *m.values) for m in moves]
    moved = set(updated_pks(Job, ("state", *columns), rows, where_state=from_state, match=match))
    done = [m for m in moves if m.job_id in moved]
    _record_moves(done, from_state=from_state, to=to, at=at)
    return done


def _record_moves(moves: Sequence[Move], *, from_state: str, to: str, at: datetime) -> None:
    """The events of jobs a batch moved, in one INSERT, announced after commit."""
    insert_rows(
        JobEvent,
        ("job", "at", "from_state", "to_state", "attempt", "message"),
        [(m.job_id, at, from_state, to, m.attempt, m.message) for m in moves],
    )
    announce_moves(moves, from_state=from_state, to=to, at=at)


def announce_moves(moves: Sequence[Move], *, from_state: str, to: str, at: datetime) -> None:
    """Announce after commit the moves of a batch whose UPDATE and events were written by
    one statement of the caller's (``attempts_start_on_node``)."""
    check_transition(from_state, to)
    _announce_on_commit(
        [StateChange(m.job_id, from_state, to, m.attempt, at, m.message) for m in moves]
    )


def record_submission(job_id: int, *, message: str, at: datetime) -> None:
    """A job's first event: it came into being as PENDING (no attempt yet)."""
    record_submissions([(job_id, message)], at=at)


def record_submissions(submitted: Sequence[tuple[int, str]], *, at: datetime) -> None:
    """``record_submission`` for many jobs (an array's members): (job id, message) each."""
    # One INSERT written by hand, not the ORM's compiled anew for each submit.
    insert_rows(
        JobEvent,
        _SUBMITTED_EVENT_COLUMNS,
        [_submitted_event(job_id, at=at, message=text) for job_id, text in submitted],
    )


def insert_submitted_job(job: Job, *, at: datetime, message: str) -> None:
    """Store ``job`` (a new Job, as ``bulk_create`` would store it: every concrete field's
    value as the ORM prepares it) and its submission event in ONE statement, and give
    ``job`` its id. PostgreSQL only: ``WITH job AS (INSERT ... RETURNING id) INSERT INTO
    jobs_jobevent ... SELECT ... FROM job``, a prepared statement; being one statement, it
    needs no transaction around it."""
    sql, job_fields, event_fields = _submitted_job_sql()
    params = [field.get_db_prep_save(field.pre_save(job, True), connection) for field in job_fields]
    event = _submitted_event(None, at=at, message=message)[1:]
    params += [
        field.get_db_prep_save(value, connection)
        for field, value in zip(event_fields, event, strict=True)
    ]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        (job.pk,) = cursor.fetchone()
    job._state.adding = False
    job._state.db = connection.alias


_SUBMITTED_EVENT_COLUMNS = ("job", "at", "from_state", "to_state", "attempt", "message")


def _submitted_event(job_id: int | None, *, at: datetime, message: str) -> tuple[Any, ...]:
    """A submitted job's first event, as the values of ``_SUBMITTED_EVENT_COLUMNS``: it came
    into being as PENDING, with no attempt yet."""
    return (job_id, at, "", S.PENDING, 0, message)


@functools.cache
def _submitted_job_sql() -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    quote = connection.ops.quote_name
    job_fields = tuple(field for field in Job._meta.concrete_fields if not field.primary_key)
    columns = [JobEvent._meta.get_field(name) for name in _SUBMITTED_EVENT_COLUMNS]
    event_fields = tuple(columns[1:])  # the job's id comes from the first INSERT
    job_pk = quote(Job._meta.pk.column)  # type: ignore[union-attr]
    sql = (
        f"WITH new_job AS (INSERT INTO {quote(Job._meta.db_table)} "  # noqa: S608 - our names
        f"({', '.join(quote(field.column) for field in job_fields)}) "
        f"VALUES ({', '.join(['%s'] * len(job_fields))}) RETURNING {job_pk}) "
        f"INSERT INTO {quote(JobEvent._meta.db_table)} "
        f"({', '.join(quote(field.column) for field in columns)}) "
        f"SELECT new_job.{job_pk}, "
        + ", ".join(f"%s::{field.cast_db_type(connection)}" for field in event_fields)
        + f" FROM new_job RETURNING {quote(columns[0].column)}"
    )
    return sql, job_fields, event_fields


@dataclass(frozen=True, slots=True)
class Note:
    """One event of a batch that changes no state: the job, the state it stays in, its
    attempt and what happened."""

    job_id: int
    state: str
    attempt: int
    message: str


def record_events(notes: Sequence[Note], *, at: datetime) -> None:
    """``record_event`` for many jobs whose state the caller read under a lock (a scheduling
    pass asking its preemption victims to stop), in one statement."""
    if not notes:
        return
    JobEvent.objects.bulk_create(
        JobEvent(
            job_id=note.job_id,
            at=at,
            from_state=note.state,
            to_state=note.state,
            attempt=note.attempt,
            message=note.message,
        )
        for note in notes
    )


def record_event(job_id: int, *, message: str, attempt: int, at: datetime | None = None) -> None:
    """A notable thing that is not a state change (a preemption asked for, a stop sent)."""
    state = Job.objects.filter(pk=job_id).values_list("state", flat=True).get()
    JobEvent.objects.create(
        job_id=job_id,
        at=at or timezone.now(),
        from_state=state,
        to_state=state,
        attempt=attempt,
        message=message,
    )

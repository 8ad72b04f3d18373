"""The job state machine: only its edges are allowed, guarded updates lose races politely."""

from __future__ import annotations

import itertools

import pytest

from portal.jobs.models import Job, JobEvent, JobState
from portal.jobs.testing import make_job, make_team, make_user
from portal.jobs.transitions import (
    ALLOWED_TRANSITIONS,
    IllegalTransition,
    Move,
    check_transition,
    record_event,
    transition,
    transition_many,
)

S = JobState

# The edges ARCHITECTURE.md draws, written out independently of the table under test.
EXPECTED_EDGES = {
    (S.PENDING, S.ASSIGNED),
    (S.PENDING, S.HELD),
    (S.PENDING, S.CANCELLED),
    (S.PENDING, S.FAILED),  # a dependency failed, or a lost attempt's late result
    (S.PENDING, S.SUCCEEDED),  # a lost attempt's late result (attempt_settle_late)
    (S.PENDING, S.TIMED_OUT),  # likewise
    (S.HELD, S.PENDING),
    (S.HELD, S.CANCELLED),
    (S.HELD, S.FAILED),
    (S.ASSIGNED, S.RUNNING),
    *((S.ASSIGNED, end) for end in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT)),
    (S.ASSIGNED, S.PREEMPTED),
    (S.ASSIGNED, S.LOST),
    *((S.RUNNING, end) for end in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT)),
    (S.RUNNING, S.PREEMPTED),
    (S.RUNNING, S.LOST),
    (S.PREEMPTED, S.PENDING),
    (S.PREEMPTED, S.FAILED),
    (S.LOST, S.PENDING),
    (S.LOST, S.FAILED),
}
ALL_PAIRS = list(itertools.product(S.values, S.values))
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in EXPECTED_EDGES]


def test_the_table_has_exactly_the_documented_edges():
    table = {
        (source, target) for source, targets in ALLOWED_TRANSITIONS.items() for target in targets
    }
    assert table == EXPECTED_EDGES


def test_terminal_states_lead_nowhere():
    for state in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT):
        assert ALLOWED_TRANSITIONS[state] == frozenset()


@pytest.mark.parametrize(("source", "target"), ILLEGAL)
def test_every_illegal_transition_is_refused(source, target):
    with pytest.raises(IllegalTransition, match=f"cannot go from {source} to {target}"):
        check_transition(source, target)


@pytest.fixture
def job(db):
    team = make_team("vision")
    return make_job(team=team, user=make_user("alice", team=team))


@pytest.mark.parametrize(("source", "target"), ILLEGAL[:: max(1, len(ILLEGAL) // 12)])
def test_an_illegal_transition_changes_nothing_in_the_database(db, source, target):
    team = make_team("vision")
    job = make_job(team=team, user=make_user("alice", team=team), state=source)
    events_before = JobEvent.objects.filter(job=job).count()

    with pytest.raises(IllegalTransition):
        transition(job.pk, to=target, from_states=[source])

    job.refresh_from_db()
    assert job.state == source
    assert JobEvent.objects.filter(job=job).count() == events_before


def test_the_error_names_the_allowed_next_states():
    with pytest.raises(IllegalTransition) as caught:
        check_transition(S.HELD, S.RUNNING)
    assert str(caught.value) == (
        "a job cannot go from HELD to RUNNING (from HELD: CANCELLED, FAILED, PENDING)"
    )


def test_a_transition_moves_the_job_sets_fields_and_writes_an_event(job):
    left = transition(
        job.pk, to=S.ASSIGNED, from_states=[S.PENDING], message="placed", attempt=0, borrowed=True
    )

    assert left == S.PENDING
    job.refresh_from_db()
    assert (job.state, job.borrowed) == (S.ASSIGNED, True)
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.message) == (S.PENDING, S.ASSIGNED, "placed")


def test_the_guarded_update_returns_none_when_the_state_moved(job):
    Job.objects.filter(pk=job.pk).update(state=S.CANCELLED)  # someone else got there first
    events_before = JobEvent.objects.filter(job=job).count()

    assert transition(job.pk, to=S.ASSIGNED, from_states=[S.PENDING]) is None

    job.refresh_from_db()
    assert job.state == S.CANCELLED
    assert JobEvent.objects.filter(job=job).count() == events_before


def test_the_guarded_update_returns_none_for_a_stale_attempt(job):
    Job.objects.filter(pk=job.pk).update(state=S.RUNNING, attempt=2)

    assert transition(job.pk, to=S.SUCCEEDED, from_states=[S.RUNNING], attempt=1) is None
    assert transition(job.pk, to=S.SUCCEEDED, from_states=[S.RUNNING], attempt=2) == S.RUNNING
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.to_state, event.attempt) == (S.SUCCEEDED, 2)


def test_only_the_first_of_two_identical_transitions_happens(job):
    first = transition(job.pk, to=S.CANCELLED, from_states=[S.PENDING, S.HELD])
    second = transition(job.pk, to=S.CANCELLED, from_states=[S.PENDING, S.HELD])

    assert (first, second) == (S.PENDING, None)
    assert JobEvent.objects.filter(job=job, to_state=S.CANCELLED).count() == 1


def test_record_event_notes_a_thing_without_changing_the_state(job):
    record_event(job.pk, message="stop sent", attempt=0)
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.message) == (S.PENDING, S.PENDING, "stop sent")


# --- the services that drive it --------------------------------------------------------


def test_hold_and_release_move_a_waiting_job_and_release_requeues_it_at_the_end(job):
    from portal.jobs.services import job_hold, job_release

    first_queued_since = job.queued_since
    held = job_hold(job=job, user=job.user)
    assert held.state == S.HELD
    released = job_release(job=held, user=job.user)
    assert released.state == S.PENDING
    assert released.queued_since > first_queued_since
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", "message")) == [
        (S.PENDING, ""),
        (S.HELD, "held by alice"),
        (S.PENDING, "released by alice"),
    ]


def test_only_a_pending_job_can_be_held(job):
    from portal.jobs.services import JobActionError, job_hold, job_release

    Job.objects.filter(pk=job.pk).update(state=S.RUNNING)
    with pytest.raises(JobActionError, match=f"job {job.pk} is RUNNING; only a PENDING job"):
        job_hold(job=job, user=job.user)
    with pytest.raises(JobActionError, match="only a HELD job can be released"):
        job_release(job=job, user=job.user)


def test_a_job_being_requeued_cannot_be_cancelled_yet(job):
    from portal.jobs.services import JobActionError, job_cancel

    Job.objects.filter(pk=job.pk).update(state=S.PREEMPTED)
    with pytest.raises(JobActionError) as caught:
        job_cancel(job=job, user=job.user)
    assert str(caught.value) == (
        f"job {job.pk} is PREEMPTED and about to be requeued; cancel it again in a few seconds"
    )


def test_a_cancel_that_loses_a_race_with_the_scheduler_stops_the_job_instead(job):
    """The job is read as PENDING but is ASSIGNED by the time the guarded update runs."""
    from unittest import mock

    from portal.jobs import services

    real_transition = services.transition

    def scheduler_wins(*args, **kwargs):
        Job.objects.filter(pk=job.pk).update(state=S.ASSIGNED, attempt=1)
        return real_transition(*args, **kwargs)

    with mock.patch.object(services, "transition", side_effect=scheduler_wins):
        cancelled = services.job_cancel(job=job, user=job.user)

    assert (cancelled.state, cancelled.stop_reason) == (S.ASSIGNED, "cancel")
    assert cancelled.stop_requested_at is not None


def test_a_batch_transition_moves_every_job_with_its_columns_and_events(db):
    team = make_team("vision")
    user = make_user("alice", team=team)
    jobs = [make_job(team=team, user=user) for _ in range(3)]
    at = jobs[0].submitted_at

    moved = transition_many(
        [Move(job_id=j.pk, attempt=1, message=f"assigned {j.pk}", values=(1,)) for j in jobs],
        to=S.ASSIGNED,
        from_state=S.PENDING,
        columns=("attempt",),
        at=at,
    )

    assert moved is True
    assert set(Job.objects.values_list("state", "attempt")) == {(S.ASSIGNED, 1)}
    events = JobEvent.objects.filter(to_state=S.ASSIGNED).order_by("job_id")
    assert [(e.job_id, e.from_state, e.message) for e in events] == [
        (j.pk, S.PENDING, f"assigned {j.pk}") for j in jobs
    ]


def test_a_batch_transition_reports_a_job_that_moved_on_and_refuses_illegal_edges(db):
    team = make_team("vision")
    user = make_user("alice", team=team)
    waiting, cancelled = make_job(team=team, user=user), make_job(team=team, user=user)
    transition(cancelled.pk, to=S.CANCELLED, from_states=[S.PENDING])
    moves = [Move(job_id=j.pk, attempt=1, message="assigned") for j in (waiting, cancelled)]

    assert not transition_many(
        moves, to=S.ASSIGNED, from_state=S.PENDING, columns=(), at=waiting.submitted_at
    )
    with pytest.raises(IllegalTransition):
        transition_many(
            moves, to=S.RUNNING, from_state=S.PENDING, columns=(), at=waiting.submitted_at
        )

"""The attempt lifecycle's stop requests: written once, guarded by state and attempt, and a
cancel wins over a preemption (never the other way round)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.jobs.attempts import StopAsked, StopWanted, attempt_request_stop, attempt_request_stops
from portal.jobs.models import Job, JobEvent, JobState
from portal.jobs.testing import make_job, make_team, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def running() -> Job:
    team = make_team("vision")
    return make_job(team=team, user=make_user("alice", team=team), state=JobState.RUNNING)


def _stop_events(job: Job) -> list[str]:
    return list(
        JobEvent.objects.filter(job=job, from_state=JobState.RUNNING, to_state=JobState.RUNNING)
        .order_by("id")
        .values_list("message", flat=True)
    )


def test_a_stop_request_is_written_once_with_one_event(running):
    first = attempt_request_stop(job_id=running.pk, reason="preempt", message="preempt it")
    again = attempt_request_stop(job_id=running.pk, reason="preempt", message="preempt it")

    running.refresh_from_db()
    assert (first, again) == (StopAsked.REQUESTED, StopAsked.ALREADY_STOPPING)
    assert (running.state, running.stop_reason) == (JobState.RUNNING, "preempt")
    assert running.stop_requested_at is not None
    assert _stop_events(running) == ["preempt it"]


def test_a_cancel_overrides_a_preemption_in_progress_but_keeps_its_time(running):
    attempt_request_stop(job_id=running.pk, reason="preempt", message="preempt it")
    asked_at = Job.objects.get(pk=running.pk).stop_requested_at

    found = attempt_request_stop(job_id=running.pk, reason="cancel", message="cancel it")

    running.refresh_from_db()
    assert found == StopAsked.REQUESTED
    assert (running.stop_reason, running.stop_requested_at) == ("cancel", asked_at)
    assert _stop_events(running) == ["preempt it", "cancel it"]


def test_a_preemption_never_overrides_a_cancel_in_progress(running):
    attempt_request_stop(job_id=running.pk, reason="cancel", message="cancel it")

    found = attempt_request_stop(job_id=running.pk, reason="preempt", message="preempt it")

    running.refresh_from_db()
    assert found == StopAsked.ALREADY_STOPPING
    assert running.stop_reason == "cancel"
    assert _stop_events(running) == ["cancel it"]


def test_a_stop_for_an_attempt_the_job_moved_past_or_a_job_holding_nothing_changes_nothing(
    running,
):
    waiting = make_job(team=running.team, user=running.user, state=JobState.PENDING)

    found = attempt_request_stops(
        wanted=[
            StopWanted(job_id=running.pk, message="old attempt", attempt=running.attempt - 1),
            StopWanted(job_id=waiting.pk, message="not running"),
        ],
        reason="preempt",
        at=timezone.now(),
    )

    assert found == {running.pk: StopAsked.NOT_HOLDING, waiting.pk: StopAsked.NOT_HOLDING}
    assert not Job.objects.filter(stop_requested_at__isnull=False).exists()
    assert _stop_events(running) == []

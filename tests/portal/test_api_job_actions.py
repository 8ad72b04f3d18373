"""Hold, release and resubmit through the API: one service each, a 409 naming the state when
the job's state does not allow it, never a 500."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from rest_framework.test import APIClient

from portal.jobs.models import Job, JobDependency, JobState
from portal.jobs.testing import World, make_job
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return World()


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=user)}")
    return client


def post(user: Any, job: Job | int, action: str) -> Any:
    job_id = job if isinstance(job, int) else job.pk
    return api_for(user).post(f"/api/v1/jobs/{job_id}/{action}/")


# --- hold and release ------------------------------------------------------------------------


def test_hold_then_release_puts_a_pending_job_back_at_the_end_of_the_queue(world):
    job = make_job(team=world.vision, user=world.alice, pending_code="NO_FIT", queue_position=1)
    queued_before = job.queued_since

    held = post(world.alice, job, "hold")
    released = post(world.alice, job, "release")

    assert held.status_code == 200, held.json()
    assert (held.json()["state"], held.json()["pending"]) == ("HELD", None)
    assert released.status_code == 200, released.json()
    assert released.json()["state"] == "PENDING"
    job.refresh_from_db()
    assert job.queued_since > queued_before
    messages = [event["message"] for event in released.json()["events"]]
    assert messages[-2:] == ["held by alice", "released by alice"]


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.HELD, JobState.SUCCEEDED])
def test_hold_of_a_job_that_is_not_pending_is_a_409_naming_its_state(world, state):
    job = make_job(team=world.vision, user=world.alice, state=state)

    response = post(world.alice, job, "hold")

    assert response.status_code == 409
    assert response.json() == {
        "errors": {"state": f"job {job.pk} is {state}; only a PENDING job can be held"}
    }
    assert Job.objects.get(pk=job.pk).state == state


def test_release_of_a_job_that_is_not_held_is_a_409_naming_its_state(world):
    job = make_job(team=world.vision, user=world.alice)

    response = post(world.alice, job, "release")

    assert response.status_code == 409
    assert response.json()["errors"]["state"] == (
        f"job {job.pk} is PENDING; only a HELD job can be released"
    )


def test_a_team_mate_may_not_hold_my_job_but_the_team_admin_may(world):
    job = make_job(team=world.vision, user=world.vera)
    teammate = make_job(team=world.vision, user=world.alice)

    refused = post(world.alice, job, "hold")
    by_admin = post(world.vera, teammate, "hold")

    assert refused.status_code == 403
    assert "only the job's owner" in refused.json()["errors"]["detail"]
    assert by_admin.status_code == 200
    assert Job.objects.get(pk=teammate.pk).state == JobState.HELD


@pytest.mark.parametrize("action", ["hold", "release", "resubmit"])
def test_another_teams_job_or_a_missing_one_is_a_404(world, action):
    job = make_job(team=world.nlp, user=world.bob, state=JobState.FAILED)

    foreign = post(world.alice, job, action)
    missing = post(world.alice, 999999, action)

    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == {"errors": {"detail": f"no job {job.pk} among the jobs of your teams"}}


def test_actions_refuse_a_get_with_a_405(world):
    job = make_job(team=world.vision, user=world.alice)

    response = api_for(world.alice).get(f"/api/v1/jobs/{job.pk}/hold/")

    assert response.status_code == 405
    assert "errors" in response.json()


# --- resubmit --------------------------------------------------------------------------------


def test_resubmit_makes_a_new_pending_job_with_the_same_request(
    world, django_capture_on_commit_callbacks
):
    first = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)
    original = make_job(
        team=world.vision,
        user=world.alice,
        state=JobState.FAILED,
        name="train",
        gpu_kind="mig",
        gpu_profile="1g.10gb",
        gpu_count=2,
        env={"SEED": "3"},
        priority="low",
        time_limit_s=120,
        preemptible=False,
    )
    JobDependency.objects.create(job=original, depends_on=first, kind="after_any")

    # No broker here: the scheduling pass the new job asks for (after commit) is recorded.
    with (
        mock.patch("portal.passes.request_schedule_pass") as asked_for_a_pass,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = post(world.alice, original, "resubmit")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert response["Location"] == f"/api/v1/jobs/{body['id']}/"
    new = Job.objects.get(pk=body["id"])
    assert new.pk != original.pk
    assert (new.state, new.attempt, new.user, new.team) == (
        JobState.PENDING,
        0,
        world.alice,
        world.vision,
    )
    same = ("name", "image", "command", "env", "gpu_kind", "gpu_profile", "gpu_count")
    same += ("priority", "time_limit_s", "preemptible")
    assert {f: getattr(new, f) for f in same} == {f: getattr(original, f) for f in same}
    assert body["depends_on"] == [{"job": first.pk, "kind": "after_any"}]
    assert body["events"][-1]["message"] == f"resubmitted from job {original.pk}"
    assert original.events.last().message == f"resubmitted by alice as job {new.pk}"
    asked_for_a_pass.assert_called_once_with()


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.HELD, JobState.RUNNING])
def test_resubmit_of_a_job_that_has_not_ended_is_a_409_naming_its_state(world, state):
    job = make_job(team=world.vision, user=world.alice, state=state)

    response = post(world.alice, job, "resubmit")

    assert response.status_code == 409
    assert response.json()["errors"]["state"] == (
        f"job {job.pk} is {state}; only an ended job (CANCELLED, FAILED, SUCCEEDED, TIMED_OUT) "
        "can be resubmitted"
    )
    assert Job.objects.count() == 1


def test_resubmit_checks_the_request_again_and_stores_nothing_when_it_no_longer_fits(world):
    # Since the job ran, its team's highest priority went down.
    job = make_job(team=world.vision, user=world.alice, state=JobState.FAILED, priority="high")
    world.vision.max_priority = "normal"
    world.vision.save()

    response = post(world.alice, job, "resubmit")

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"priority"}
    assert Job.objects.count() == 1


def test_a_team_mate_may_not_resubmit_my_job(world):
    job = make_job(team=world.vision, user=world.vera, state=JobState.FAILED)

    response = post(world.alice, job, "resubmit")

    assert response.status_code == 403
    assert Job.objects.count() == 1

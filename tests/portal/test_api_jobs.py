"""The jobs API as a notebook uses it: submit, follow, read the log, cancel."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.jobs.models import Allocation, Job, JobDependency, JobEvent, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_node, token_client
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db

BODY = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
}


@contextmanager
def patched_request_stop():
    """Patch what sends stops to the agents (``portal.agents.dispatch.request_stops``)."""
    with mock.patch("portal.agents.dispatch.request_stops") as stop:
        yield stop


# --- submit ------------------------------------------------------------------------------


def test_submit_stores_a_pending_job_and_answers_201_with_id_and_state(world, alice_api):
    make_node(gpus=[{"mode": "mig", "profiles": ["1g.10gb"]}])
    response = alice_api.post("/api/v1/jobs/", BODY, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "PENDING"
    assert response["Location"] == f"/api/v1/jobs/{body['id']}/"
    job = Job.objects.get(pk=body["id"])
    assert (job.team, job.user, job.gpu_kind, job.gpu_profile) == (
        world.vision,
        world.alice,
        "mig",
        "1g.10gb",
    )
    assert job.queued_since == job.submitted_at
    assert body["gpu"] == {
        "kind": "mig",
        "count": 1,
        "min_count": None,
        "profile": "1g.10gb",
        "model": "",
        "multi_node": False,
    }
    assert body["pending"] == {
        "code": None,
        "message": "waiting for the next scheduling pass",
        "numbers": {},
        "position": None,
        "estimated_start_at": None,
        "estimated_start_band": None,
    }
    assert [(e["from_state"], e["to_state"], e["message"]) for e in body["events"]] == [
        ("", "PENDING", "submitted by alice")
    ]


def test_submit_asks_for_a_scheduling_pass_after_commit(
    world, alice_api, django_capture_on_commit_callbacks
):
    with (
        mock.patch("portal.passes.request_schedule_pass") as schedule,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = alice_api.post("/api/v1/jobs/", BODY, format="json")
    assert response.status_code == 201
    schedule.assert_called_once_with()


def test_submit_stores_dependencies_env_and_options(world, alice_api):
    first = make_job(team=world.vision, user=world.alice)
    body = {
        **BODY,
        "env": {"SEED": "7"},
        "priority": "low",
        "time_limit_s": 600,
        "preemptible": False,
        "gpu": {"kind": "whole", "count": 2, "min_count": 1, "model": "NVIDIA A100"},
        "depends_on": [{"job": first.pk, "kind": "after_any"}],
    }
    response = alice_api.post("/api/v1/jobs/", body, format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["depends_on"] == [{"job": first.pk, "kind": "after_any"}]
    assert (data["env"], data["priority"], data["time_limit_s"], data["preemptible"]) == (
        {"SEED": "7"},
        "low",
        600,
        False,
    )
    assert data["gpu"]["min_count"] == 1
    assert JobDependency.objects.get(job_id=data["id"]).depends_on == first


def test_a_bearer_token_works_too(world):
    token = token_issue(user=world.alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/jobs/").status_code == 200


# --- list and detail ---------------------------------------------------------------------


def test_list_shows_my_teams_jobs_newest_first_with_filters(world, alice_api):
    now = timezone.now()
    old = make_job(team=world.vision, user=world.vera, submitted_at=now - timedelta(hours=1))
    new = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING, submitted_at=now)
    make_job(team=world.nlp, user=world.bob)

    everything = alice_api.get("/api/v1/jobs/").json()
    assert len(everything["results"]) == 2
    assert [job["id"] for job in everything["results"]] == [new.pk, old.pk]

    running = alice_api.get("/api/v1/jobs/?state=running").json()
    assert [job["id"] for job in running["results"]] == [new.pk]
    both = alice_api.get("/api/v1/jobs/?state=PENDING,RUNNING&team=vision").json()
    assert len(both["results"]) == 2


def test_the_list_pages_by_cursor_newest_first_and_a_new_job_shifts_no_page(world, alice_api):
    now = timezone.now()
    # Five jobs, two of them submitted at the same instant (an array's members are): the id
    # breaks the tie.
    at = [now - timedelta(minutes=m) for m in (5, 4, 3, 3, 1)]
    jobs = [make_job(team=world.vision, user=world.alice, submitted_at=when) for when in at]
    newest_first = [job.pk for job in sorted(jobs, key=lambda j: (j.submitted_at, j.pk))][::-1]

    first = alice_api.get("/api/v1/jobs/?limit=2").json()
    assert [job["id"] for job in first["results"]] == newest_first[:2]
    assert first["previous"] is None
    make_job(team=world.vision, user=world.alice, submitted_at=now)  # lands before page one

    second = alice_api.get(first["next"]).json()
    assert [job["id"] for job in second["results"]] == newest_first[2:4]
    third = alice_api.get(second["next"]).json()
    assert [job["id"] for job in third["results"]] == newest_first[4:]
    assert third["next"] is None

    back = alice_api.get(third["previous"]).json()
    assert [job["id"] for job in back["results"]] == newest_first[2:4]
    assert [job["id"] for job in alice_api.get(back["previous"]).json()["results"]] == (
        newest_first[:2]
    )


def test_a_site_admin_lists_every_teams_jobs(world):
    make_job(team=world.vision, user=world.alice)
    make_job(team=world.nlp, user=world.bob)
    assert len(token_client(world.admin).get("/api/v1/jobs/").json()["results"]) == 2


def test_the_job_list_costs_the_same_few_queries_for_3_or_30_jobs(
    world, alice_api, django_assert_max_num_queries
):
    make_node(gpus=[{"mode": "whole"}] * 30)

    def add_jobs(first: int, count: int) -> None:
        for index in range(first, first + count):
            job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
            allocate(job, [f"GPU-node-1-{index}"])

    add_jobs(0, 3)
    alice_api.get("/api/v1/jobs/")  # a token's first use in a minute also records last_used_at
    with CaptureQueriesContext(connection) as few:
        assert alice_api.get("/api/v1/jobs/").status_code == 200
    add_jobs(3, 27)
    # the token, the user's and the token's rate-limit counters (one statement), the page:
    # no COUNT of the whole list
    with django_assert_max_num_queries(3):
        response = alice_api.get("/api/v1/jobs/")
    assert len(response.json()["results"]) == 30
    assert all(job["node"] == "node-1" for job in response.json()["results"])
    with CaptureQueriesContext(connection) as many:
        alice_api.get("/api/v1/jobs/")
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]


def test_detail_shows_the_slices_node_and_exit_code_of_a_finished_job(world, alice_api):
    make_node(gpus=[{"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}])
    job = make_job(
        team=world.vision,
        user=world.alice,
        state=JobState.SUCCEEDED,
        gpu_kind="mig",
        gpu_profile="1g.10gb",
        exit_code=0,
        reason="exited with 0",
    )
    allocate(job, ["MIG-node-1-0-1"], released=True)

    body = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()

    assert (body["state"], body["exit_code"], body["attempt"], body["node"]) == (
        "SUCCEEDED",
        0,
        1,
        "node-1",
    )
    assert body["pending"] is None
    assert body["slices"] == [
        {
            "key": "MIG-node-1-0-1",
            "kind": "mig",
            "profile": "1g.10gb",
            "gpu_uuid": "GPU-node-1-0",
            "mig_uuid": "MIG-node-1-0-1",
            "units": pytest.approx(1 / 7),
            "node": "node-1",
            "gpu_index": 0,
            "gpu_model": "NVIDIA A100",
            "active": False,
        }
    ]


def test_detail_explains_a_pending_job_with_reason_position_and_estimated_start(world, alice_api):
    eta = timezone.now() + timedelta(minutes=5)
    job = make_job(
        team=world.vision,
        user=world.alice,
        pending_code="QUOTA_LIMIT",
        pending_message="team uses 4 of 4 units, job needs 1",
        pending_numbers={"used": 4.0, "limit": 4.0, "needs": 1.0},
        queue_position=3,
        estimated_start_at=eta,
        estimated_start_earliest_at=eta - timedelta(minutes=2),
    )

    pending = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()["pending"]
    listed = alice_api.get("/api/v1/jobs/").json()["results"][0]["pending"]

    assert pending == listed
    assert pending["code"] == "QUOTA_LIMIT"
    assert pending["message"] == "team uses 4 of 4 units, job needs 1"
    assert pending["numbers"] == {"used": 4.0, "limit": 4.0, "needs": 1.0}
    assert pending["position"] == 3
    assert pending["estimated_start_at"] == eta.isoformat().replace("+00:00", "Z")
    # The band around it; its latest end unknown (a job ahead has no known end).
    assert pending["estimated_start_band"] == {
        "earliest": (eta - timedelta(minutes=2)).isoformat().replace("+00:00", "Z"),
        "likely": pending["estimated_start_at"],
        "latest": None,
    }


# --- log ---------------------------------------------------------------------------------


@pytest.fixture
def job_with_two_attempts(world) -> Job:
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING, attempt=2)
    for attempt, seq, data in [(1, 0, "first try\n"), (2, 1, "world\n"), (2, 0, "hello ")]:
        JobLogChunk.objects.create(job=job, attempt=attempt, seq=seq, data=data)
    return job


def test_the_log_is_plain_text_of_the_latest_attempt_by_default(alice_api, job_with_two_attempts):
    job = job_with_two_attempts
    response = alice_api.get(f"/api/v1/jobs/{job.pk}/log/", HTTP_ACCEPT="*/*")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == "hello world\n"
    assert (response["X-Job-State"], response["X-Job-Attempt"]) == ("RUNNING", "2")


def test_the_log_of_an_earlier_attempt_as_json(alice_api, job_with_two_attempts):
    job = job_with_two_attempts
    by_query = alice_api.get(f"/api/v1/jobs/{job.pk}/log/?attempt=1&format=json")
    by_header = alice_api.get(
        f"/api/v1/jobs/{job.pk}/log/?attempt=1", HTTP_ACCEPT="application/json"
    )

    expected = {"job": job.pk, "attempt": 1, "state": "RUNNING", "log": "first try\n"}
    assert by_query.json() == by_header.json() == expected


def test_the_log_refuses_an_attempt_the_job_never_had(alice_api, job_with_two_attempts):
    job = job_with_two_attempts
    response = alice_api.get(f"/api/v1/jobs/{job.pk}/log/?attempt=3&format=json")

    assert response.status_code == 400
    assert response.json() == {
        "errors": {"attempt": f"'3' is not an attempt of job {job.pk}; allowed: 1 to 2"}
    }
    as_text = alice_api.get(f"/api/v1/jobs/{job.pk}/log/?attempt=x")
    assert as_text.status_code == 400
    assert as_text.content.decode() == (
        f"attempt: 'x' is not an attempt of job {job.pk}; allowed: 1 to 2\n"
    )


# --- cancel ------------------------------------------------------------------------------


def test_cancel_of_a_pending_job_ends_it_at_once(world, alice_api):
    job = make_job(team=world.vision, user=world.alice, pending_code="NO_FIT", queue_position=1)

    response = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["reason"], body["pending"]) == (
        "CANCELLED",
        "cancelled by alice",
        None,
    )
    job.refresh_from_db()
    assert (job.state, job.pending_code, job.queue_position) == (JobState.CANCELLED, "", None)
    assert job.finished_at is not None
    assert JobEvent.objects.filter(
        job=job, to_state="CANCELLED", message="cancelled by alice"
    ).exists()


def test_cancel_of_a_running_job_requests_a_stop_from_its_agent_after_commit(
    world, alice_api, django_capture_on_commit_callbacks
):
    make_node(gpus=[{"mode": "whole"}])
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])

    with patched_request_stop() as request_stop, django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 200
    request_stop.assert_called_once_with([job.pk])
    job.refresh_from_db()
    # Still RUNNING: the agent's "finished" report ends it and frees the slice.
    assert (job.state, job.stop_reason) == (JobState.RUNNING, "cancel")
    assert job.stop_requested_at is not None
    assert response.json()["stop_reason"] == "cancel"
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1
    assert JobEvent.objects.filter(job=job, message="cancel requested by alice").count() == 1


def test_a_second_cancel_resends_the_stop_without_a_second_event(
    world, alice_api, django_capture_on_commit_callbacks
):
    job = make_job(team=world.vision, user=world.alice, state=JobState.ASSIGNED)
    with patched_request_stop() as request_stop, django_capture_on_commit_callbacks(execute=True):
        alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
        alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert request_stop.call_args_list == [mock.call([job.pk]), mock.call([job.pk])]
    assert JobEvent.objects.filter(job=job, message="cancel requested by alice").count() == 1


def test_cancel_turns_a_preemption_in_progress_into_a_cancel(world, alice_api):
    job = make_job(
        team=world.vision,
        user=world.alice,
        state=JobState.RUNNING,
        stop_requested_at=timezone.now(),
        stop_reason="preempt",
    )
    with patched_request_stop():
        response = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.json()["stop_reason"] == "cancel"


def test_cancel_of_a_finished_job_is_a_conflict_with_a_clear_message(world, alice_api):
    job = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)

    response = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 409
    assert response.json() == {
        "errors": {"state": f"job {job.pk} already ended (SUCCEEDED); nothing to cancel"}
    }


def test_a_member_may_not_cancel_a_team_mates_job_but_the_team_admin_may(world, alice_api):
    job = make_job(team=world.vision, user=world.vera)
    mate = make_job(team=world.vision, user=world.alice)

    refused = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert refused.status_code == 403
    assert refused.json() == {
        "errors": {
            "detail": f"only the job's owner, an admin of team vision or a site admin may "
            f"cancel job {job.pk}"
        }
    }
    assert token_client(world.vera).post(f"/api/v1/jobs/{mate.pk}/cancel/").status_code == 200
    assert token_client(world.admin).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 200


# --- teams -------------------------------------------------------------------------------


def test_team_overview_counts_units_in_use_and_jobs(world, alice_api):
    make_node(gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}])
    running = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(running, ["GPU-node-1-0", "MIG-node-1-1-0"])
    finished = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)
    allocate(finished, ["MIG-node-1-1-1"], released=True)
    make_job(team=world.vision, user=world.vera)

    body = alice_api.get("/api/v1/teams/vision/").json()

    assert body["units_in_use"] == pytest.approx(1 + 3 / 7)
    assert (body["running_jobs"], body["pending_jobs"], body["held_jobs"]) == (1, 1, 0)
    assert body["members"] == [
        {"username": "alice", "role": "member"},
        {"username": "vera", "role": "admin"},
    ]
    assert (body["guaranteed_units"], body["limit_units"], body["weight"]) == (2.0, 4.0, 1.0)
    assert (body["can_admin"], body["can_edit_quota"]) == (False, False)


def test_the_team_list_shows_my_teams_or_all_for_a_site_admin(
    world, alice_api, django_assert_max_num_queries
):
    assert [team["name"] for team in alice_api.get("/api/v1/teams/").json()] == ["vision"]
    admin = token_client(world.admin)
    admin.get("/api/v1/teams/")  # a token's first use in a minute also records last_used_at
    with django_assert_max_num_queries(6):  # 5, plus the rate-limit counters (one statement)
        teams = admin.get("/api/v1/teams/").json()
    assert [(team["name"], team["can_edit_quota"]) for team in teams] == [
        ("nlp", True),
        ("vision", True),
    ]
    vera_sees = token_client(world.vera).get("/api/v1/teams/vision/").json()
    assert (vera_sees["can_admin"], vera_sees["can_edit_quota"]) == (True, False)


def test_a_site_admin_edits_a_quota(world):
    response = token_client(world.admin).patch(
        "/api/v1/teams/nlp/", {"guaranteed_units": 1.5, "limit_units": None}, format="json"
    )

    assert response.status_code == 200, response.json()
    assert (response.json()["guaranteed_units"], response.json()["limit_units"]) == (1.5, None)
    world.nlp.refresh_from_db()
    assert (world.nlp.guaranteed_units, world.nlp.limit_units) == (1.5, None)


def test_a_team_admin_may_not_edit_the_quota(world):
    response = token_client(world.vera).patch(
        "/api/v1/teams/vision/", {"limit_units": 100}, format="json"
    )
    assert response.status_code == 403
    assert response.json() == {"errors": {"detail": "only site admins may change a team's quota"}}
    world.vision.refresh_from_db()
    assert world.vision.limit_units == 4.0


def test_a_quota_edit_with_bad_values_names_the_fields(world):
    admin = token_client(world.admin)
    response = admin.patch(
        "/api/v1/teams/vision/", {"weight": -1, "limit_units": 1, "colour": "red"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {
        "errors": {
            "colour": "unknown field; allowed: weight, guaranteed_units, limit_units, "
            "max_priority, member_limit_units, budget_gpu_hours"
        }
    }
    response = admin.patch("/api/v1/teams/vision/", {"weight": -1, "limit_units": 1}, format="json")
    assert response.json() == {
        "errors": {"weight": "-1 is out of range; allowed: a number from 0 to 1000000"}
    }
    response = admin.patch("/api/v1/teams/vision/", {"limit_units": 1}, format="json")
    assert response.json() == {
        "errors": {
            "limit_units": "the limit (1) must not be below the guarantee (2); allowed: "
            "limit >= guarantee, or no limit (null)"
        }
    }
    response = admin.patch("/api/v1/teams/vision/", {"max_priority": "urgent"}, format="json")
    assert response.json() == {
        "errors": {"max_priority": "unknown class 'urgent'; allowed: low, normal, high"}
    }


# --- schema ------------------------------------------------------------------------------


def test_the_openapi_schema_is_served(world):
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"/api/v1/jobs/", "/api/v1/jobs/{job_id}/", "/api/v1/jobs/{job_id}/log/"} <= set(paths)
    assert "tokenAuth" in response.json()["components"]["securitySchemes"]


def test_the_schema_of_the_api_generates_without_warnings(tmp_path):
    from django.core.management import call_command

    out = tmp_path / "schema.yml"
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(out))
    assert "/api/v1/jobs/{job_id}/cancel/" in out.read_text()

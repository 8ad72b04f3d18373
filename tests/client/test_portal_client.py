"""The Python client against the real API, over HTTP to Django's live server."""

from __future__ import annotations

from typing import Any

import pytest

import portal_client.client
from portal.jobs.models import Job, JobLogChunk, JobState
from portal.jobs.testing import make_job, make_team, make_user
from portal.jobs.transitions import transition
from portal.tenants.models import Membership, Team
from portal.tenants.tokens import token_issue
from portal_client import TERMINAL, PortalClient, PortalError

pytestmark = pytest.mark.usefixtures("transactional_db")

HELLO: dict[str, Any] = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
}


@pytest.fixture(autouse=True)
def no_scheduling_pass(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No broker here: record the pass a submit asks for instead of sending it."""
    asked: list[str] = []
    monkeypatch.setattr("portal.passes.request_schedule_pass", lambda: asked.append("pass"))
    return asked


@pytest.fixture
def vision() -> Team:
    return make_team("vision")


@pytest.fixture
def alice(vision: Team) -> Any:
    return make_user("alice", team=vision)


@pytest.fixture
def portal(live_server: Any, alice: Any) -> PortalClient:
    return PortalClient(live_server.url, token_issue(user=alice))


def test_submit_stores_the_job_and_returns_it_pending(portal: PortalClient) -> None:
    first = portal.submit(**HELLO)
    second = portal.submit(
        **HELLO,
        env={"SEED": "7"},
        priority="low",
        time_limit_s=60,
        preemptible=False,
        depends_on=[{"job": first["id"], "kind": "after_any"}],
    )

    assert first["state"] == "PENDING"
    assert (first["gpu"]["kind"], first["gpu"]["count"], first["gpu"]["profile"]) == (
        "mig",
        1,
        "1g.10gb",
    )
    stored = Job.objects.get(pk=second["id"])
    assert (stored.name, stored.team.name, stored.user.username) == ("hello", "vision", "alice")
    assert (stored.env, stored.priority, stored.time_limit_s, stored.preemptible) == (
        {"SEED": "7"},
        "low",
        60,
        False,
    )
    assert second["depends_on"] == [{"job": first["id"], "kind": "after_any"}]


def test_job_reads_the_job_with_its_details(portal: PortalClient) -> None:
    submitted = portal.submit(**HELLO)

    job = portal.job(submitted["id"])

    assert job["id"] == submitted["id"]
    assert job["image"] == "python:3.11-slim"
    assert job["command"] == ["python", "-c", "print('hi')"]
    assert [event["to_state"] for event in job["events"]] == ["PENDING"]


def test_jobs_follows_every_page_and_filters_by_state_and_team(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    nlp = make_team("nlp")
    Membership.objects.create(team=nlp, user=alice)
    # More than the API's page of 50, so the client must fetch a second page.
    pending = [make_job(team=vision, user=alice, name=f"p{n}").pk for n in range(52)]
    running = make_job(team=vision, user=alice, state=JobState.RUNNING).pk
    held = make_job(team=nlp, user=alice, state=JobState.HELD).pk

    everything = portal.jobs()

    assert sorted(job["id"] for job in everything) == sorted([*pending, running, held])
    assert [job["id"] for job in portal.jobs(state=["running", "HELD"])] == [held, running]
    assert [job["id"] for job in portal.jobs(state="HELD")] == [held]
    assert [job["id"] for job in portal.jobs(team="nlp")] == [held]


def test_log_reads_the_latest_attempt_or_the_one_asked_for(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    job = make_job(team=vision, user=alice, state=JobState.RUNNING, attempt=2)
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, data="first try\n")
    JobLogChunk.objects.create(job=job, attempt=2, seq=0, data="second ")
    JobLogChunk.objects.create(job=job, attempt=2, seq=1, data="try\n")

    assert portal.log(job.pk) == "second try\n"
    assert portal.log(job.pk, attempt=1) == "first try\n"


def test_cancel_ends_a_pending_job_and_a_second_cancel_is_a_409(portal: PortalClient) -> None:
    job = portal.submit(**HELLO)

    cancelled = portal.cancel(job["id"])

    assert cancelled["state"] == "CANCELLED"
    assert Job.objects.get(pk=job["id"]).state == JobState.CANCELLED
    with pytest.raises(PortalError) as refused:
        portal.cancel(job["id"])
    assert refused.value.status == 409
    assert "already ended" in refused.value.errors["state"]


def test_bad_input_becomes_a_portal_error_naming_each_field(portal: PortalClient) -> None:
    bad = {**HELLO, "gpu": {"kind": "mig", "profile": "1g.11gb"}, "priority": "urgent"}

    with pytest.raises(PortalError) as refused:
        portal.submit(**bad)

    error = refused.value
    assert error.status == 400
    assert set(error.errors) == {"gpu.profile", "priority"}
    assert "1g.10gb" in error.errors["gpu.profile"]  # the allowed profiles are listed
    assert f"gpu.profile: {error.errors['gpu.profile']}" in str(error)
    assert f"priority: {error.errors['priority']}" in str(error)
    assert str(error).startswith("HTTP 400 on POST /jobs/:")
    assert not Job.objects.exists()


def test_an_unknown_job_is_a_404_and_a_bad_token_a_401(
    portal: PortalClient, live_server: Any
) -> None:
    with pytest.raises(PortalError) as missing:
        portal.job(9999)
    assert missing.value.status == 404
    assert "no job 9999" in missing.value.errors["detail"]

    with pytest.raises(PortalError) as refused:
        PortalClient(live_server.url, "not-a-token").teams()
    assert refused.value.status == 401
    assert "unknown or revoked token" in refused.value.errors["authorization"]


def test_wait_polls_until_the_job_reaches_a_terminal_state(
    portal: PortalClient, vision: Team, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(team=vision, user=alice, state=JobState.RUNNING)
    naps: list[float] = []

    def nap(seconds: float) -> None:
        # The job ends while the client sleeps between two polls.
        naps.append(seconds)
        transition(job.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING], exit_code=0)

    monkeypatch.setattr(portal_client.client.time, "sleep", nap)

    done = portal.wait(job.pk, poll=0.25)

    assert (done["state"], done["exit_code"]) == ("SUCCEEDED", 0)
    assert naps == [0.25]
    assert done["state"] in TERMINAL


def test_wait_gives_up_after_its_timeout_and_refuses_unknown_states(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    job = make_job(team=vision, user=alice)

    with pytest.raises(TimeoutError, match=f"job {job.pk} still PENDING after 0.2 s"):
        portal.wait(job.pk, timeout=0.2, poll=0.05)
    assert portal.wait(job.pk, states="PENDING")["state"] == "PENDING"
    with pytest.raises(ValueError, match="states: unknown DONE; allowed: ASSIGNED, CANCELLED"):
        portal.wait(job.pk, states={"DONE"})


def test_from_env_reads_the_url_and_token(
    portal: PortalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PORTAL_URL", portal.api)
    monkeypatch.delenv("PORTAL_TOKEN", raising=False)
    with pytest.raises(ValueError, match="PORTAL_TOKEN not set"):
        PortalClient.from_env()

    monkeypatch.setenv("PORTAL_TOKEN", portal.token)
    teams = PortalClient.from_env().teams()

    assert [team["name"] for team in teams] == ["vision"]
    assert "token" not in repr(PortalClient.from_env()).lower()

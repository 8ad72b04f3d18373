"""The Python client (clients/python) against the real API, over HTTP to Django's live server:
Job objects, progress while waiting, log offsets, and every exception, provoked for real."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import portal_client.client
import pytest
from django.utils import timezone
from flaky_http import flaky_portal
from portal_client import (
    TERMINAL,
    AuthenticationError,
    ConfigError,
    Conflict,
    Job,
    NotFound,
    PermissionDenied,
    PortalClient,
    PortalError,
    PortalUnavailable,
    RateLimited,
    ValidationError,
    WaitTimeout,
)

from portal.jobs.models import Job as JobRow
from portal.jobs.models import JobLogChunk, JobState
from portal.jobs.testing import make_job, make_team, make_user
from portal.jobs.transitions import transition
from portal.tenants.models import Membership, Team
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.usefixtures("transactional_db")

HELLO: dict[str, Any] = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python3", "-c", "print('hi')"],
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
def portal(live_server: Any, alice: Any) -> Iterator[PortalClient]:
    with PortalClient(live_server.url, token_issue(user=alice), backoff=0.01) as client:
        yield client


# --- jobs as objects -------------------------------------------------------------------------


def test_submit_returns_a_pending_job_object_and_stores_every_field(portal: PortalClient) -> None:
    first = portal.submit(**HELLO)
    second = portal.submit(
        **HELLO,
        env={"SEED": "7"},
        priority="low",
        time_limit_s=60,
        preemptible=False,
        depends_on=[{"job": first.id, "kind": "after_any"}],
    )

    assert isinstance(first, Job)
    assert (first.state, first.name, first.team, first.user) == (
        "PENDING",
        "hello",
        "vision",
        "alice",
    )
    assert first.reason == "waiting for the next scheduling pass"
    assert first["gpu"] == first.data["gpu"]
    stored = JobRow.objects.get(pk=second.id)
    assert (stored.env, stored.priority, stored.time_limit_s, stored.preemptible) == (
        {"SEED": "7"},
        "low",
        60,
        False,
    )
    assert second["depends_on"] == [{"job": first.id, "kind": "after_any"}]


def test_a_pending_job_says_why_it_waits_its_place_and_eta(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    eta = timezone.now() + timedelta(minutes=5)
    row = make_job(
        team=vision,
        user=alice,
        name="queued",
        pending_code="QUOTA_LIMIT",
        pending_message="team uses 4 of 4 units, job needs 1",
        queue_position=3,
        estimated_start_at=eta,
    )

    job = portal.job(row.pk)

    assert (job.reason_code, job.position) == ("QUOTA_LIMIT", 3)
    assert job.reason == "QUOTA_LIMIT: team uses 4 of 4 units, job needs 1"
    assert abs((job.eta - eta).total_seconds()) < 1
    assert repr(job) == f"<Job {row.pk} 'queued' PENDING (QUOTA_LIMIT, position 3)>"
    html = job._repr_html_()
    assert "QUOTA_LIMIT: team uses 4 of 4 units" in html and "queue position" in html


def test_a_finished_job_shows_its_exit_code_run_time_and_slice_and_escapes_its_html(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    started = timezone.now() - timedelta(seconds=75)
    row = make_job(
        team=vision,
        user=alice,
        name="<b>x</b>",
        state=JobState.FAILED,
        exit_code=3,
        reason="exit code 3",
        started_at=started,
        finished_at=started + timedelta(seconds=65),
    )

    job = portal.job(row.pk)

    assert (job.done, job.succeeded, job.exit_code) == (True, False, 3)
    assert job.run_time == timedelta(seconds=65)
    assert repr(job) == f"<Job {row.pk} '<b>x</b>' FAILED (exit 3, ran 0:01:05)>"
    assert "&lt;b&gt;x&lt;/b&gt;" in job._repr_html_()
    assert "<b>x</b>" not in job._repr_html_()


def test_refresh_cancel_hold_release_and_resubmit_act_on_the_job(portal: PortalClient) -> None:
    job = portal.submit(**HELLO)

    assert job.hold() is job and job.state == "HELD"
    assert job.release().state == "PENDING"
    JobRow.objects.filter(pk=job.id).update(name="renamed")
    assert job.refresh().name == "renamed"
    assert job.cancel().state == "CANCELLED"
    again = job.resubmit()

    assert again.id != job.id
    assert (again.state, again.name) == ("PENDING", "renamed")


def test_jobs_follows_every_page_filters_and_stops_at_a_limit(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    nlp = make_team("nlp")
    Membership.objects.create(team=nlp, user=alice)
    # More than the API's page of 50, so the client must fetch a second page.
    pending = [make_job(team=vision, user=alice, name=f"p{n}").pk for n in range(52)]
    running = make_job(team=vision, user=alice, state=JobState.RUNNING).pk
    held = make_job(team=nlp, user=alice, state=JobState.HELD).pk

    everything = portal.jobs()

    assert sorted(job.id for job in everything) == sorted([*pending, running, held])
    assert [job.id for job in portal.jobs(state=["running", "HELD"])] == [held, running]
    assert [job.id for job in portal.jobs(state="HELD")] == [held]
    assert [job.id for job in portal.jobs(team="nlp")] == [held]
    assert [job.id for job in portal.jobs(limit=2)] == [held, running]


# --- logs ------------------------------------------------------------------------------------


def between_polls(monkeypatch: pytest.MonkeyPatch, happenings: list[Any]) -> None:
    """Instead of sleeping between two polls, the client lets the next thing happen."""
    sleep = portal_client.client.time.sleep

    def next_happening(seconds: float) -> None:
        if threading.current_thread() is not threading.main_thread():
            sleep(seconds)  # the live server's threads sleep for real
            return
        happenings.pop(0)()

    monkeypatch.setattr(portal_client.client.time, "sleep", next_happening)


def test_log_reads_the_latest_attempt_or_the_one_asked_for(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    row = make_job(team=vision, user=alice, state=JobState.RUNNING, attempt=2)
    JobLogChunk.objects.create(job=row, attempt=1, seq=0, data="first try\n")
    JobLogChunk.objects.create(job=row, attempt=2, seq=0, data="second ")
    JobLogChunk.objects.create(job=row, attempt=2, seq=1, data="try\n")

    assert portal.log(row.pk) == "second try\n"
    assert portal.log(row.pk, attempt=1) == "first try\n"
    assert portal.job(row.pk).logs() == "second try\n"


def test_following_a_log_prints_each_piece_once_and_goes_on_to_a_requeued_attempt(
    portal: PortalClient, vision: Team, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = make_job(team=vision, user=alice, state=JobState.RUNNING)
    JobLogChunk.objects.create(job=row, attempt=1, seq=0, data="step 1\n")
    # What the agents ship while the client sleeps between two reads: more output, then the
    # node is lost and the job runs again (attempt 2) to its end.
    happenings = [
        lambda: JobLogChunk.objects.create(job=row, attempt=1, seq=1, data="step 2\n"),
        lambda: JobRow.objects.filter(pk=row.pk).update(attempt=2),
        lambda: JobLogChunk.objects.create(job=row, attempt=2, seq=0, data="again\n"),
        lambda: transition(row.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING]),
    ]
    between_polls(monkeypatch, happenings)
    printed = io.StringIO()

    followed = portal.job(row.pk).logs(follow=True, file=printed)

    expected = f"step 1\nstep 2\n\n[gpu-portal] job {row.pk} requeued: attempt 2\nagain\n"
    assert followed == printed.getvalue() == expected
    assert happenings == []


def test_following_a_log_of_a_job_that_has_not_started_waits_for_its_first_attempt(
    portal: PortalClient, vision: Team, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CI failure: a follower that began while the job was pending (attempt 0) asked for
    # "attempt 0" once the job ran, and died of the 400 that answered it.
    row = make_job(team=vision, user=alice)
    happenings = [
        lambda: None,  # still pending at the next read
        lambda: JobRow.objects.filter(pk=row.pk).update(state=JobState.RUNNING, attempt=1),
        lambda: JobLogChunk.objects.create(job=row, attempt=1, seq=0, data="step 1\n"),
        lambda: transition(row.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING]),
    ]
    between_polls(monkeypatch, happenings)
    printed = io.StringIO()

    followed = portal.job(row.pk).logs(follow=True, file=printed)

    assert followed == printed.getvalue() == "step 1\n"
    assert happenings == []


def test_following_a_log_begun_while_pending_reads_from_the_first_attempt(
    portal: PortalClient, vision: Team, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = make_job(team=vision, user=alice)

    def ran_once_and_again() -> None:  # between two reads: attempt 1 ran, was lost, 2 started
        JobLogChunk.objects.create(job=row, attempt=1, seq=0, data="first\n")
        JobRow.objects.filter(pk=row.pk).update(state=JobState.RUNNING, attempt=2)

    happenings = [
        ran_once_and_again,
        lambda: transition(row.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING]),
    ]
    between_polls(monkeypatch, happenings)

    followed = portal.job(row.pk).logs(follow=True, file=io.StringIO())

    assert followed == f"first\n\n[gpu-portal] job {row.pk} requeued: attempt 2\n"
    assert happenings == []


def test_following_the_log_of_a_job_cancelled_before_it_ran_ends_at_once(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    row = make_job(team=vision, user=alice)
    transition(row.pk, to=JobState.CANCELLED, from_states=[JobState.PENDING])

    assert portal.job(row.pk).logs(follow=True, file=io.StringIO()) == ""


# --- waiting ---------------------------------------------------------------------------------


def test_wait_shows_state_reason_position_and_elapsed_while_it_waits(
    portal: PortalClient,
    vision: Team,
    alice: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    row = make_job(team=vision, user=alice, pending_code="QUOTA_LIMIT", queue_position=2, name="w")
    steps = [
        lambda: transition(row.pk, to=JobState.ASSIGNED, from_states=[JobState.PENDING]),
        lambda: transition(row.pk, to=JobState.RUNNING, from_states=[JobState.ASSIGNED]),
        lambda: transition(
            row.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING], exit_code=0
        ),
    ]
    between_polls(monkeypatch, steps)

    done = portal.job(row.pk).wait(poll=0.25)

    assert (done.state, done.exit_code) == ("SUCCEEDED", 0)
    shown = capsys.readouterr().err
    assert (
        f"job {row.pk} PENDING · QUOTA_LIMIT · position 2 · ETA unknown · elapsed 0:00:00" in shown
    )
    assert f"job {row.pk} RUNNING" in shown
    assert f"job {row.pk} SUCCEEDED · exit 0 · elapsed" in shown


def test_wait_with_progress_off_prints_nothing(
    portal: PortalClient, capsys: pytest.CaptureFixture[str]
) -> None:
    job = portal.submit(**HELLO)

    assert job.wait(states="PENDING", progress=False).state == "PENDING"
    assert capsys.readouterr() == ("", "")


def test_a_wait_that_times_out_names_the_last_state_and_reason(
    portal: PortalClient, vision: Team, alice: Any
) -> None:
    row = make_job(
        team=vision, user=alice, pending_code="NO_FIT", pending_message="no node has 8 free GPUs"
    )

    with pytest.raises(WaitTimeout) as timed_out:
        portal.wait(row.pk, timeout=0.2, poll=0.05, progress=False)

    assert str(timed_out.value).startswith(
        f"job {row.pk} still PENDING (NO_FIT: no node has 8 free GPUs) after 0.2 s"
    )
    assert timed_out.value.job.reason_code == "NO_FIT"
    assert isinstance(timed_out.value, TimeoutError) and isinstance(timed_out.value, PortalError)
    with pytest.raises(ValueError, match="states: unknown DONE; allowed: ASSIGNED, CANCELLED"):
        portal.wait(row.pk, states={"DONE"})
    assert "SUCCEEDED" in TERMINAL


# --- every error, for real -------------------------------------------------------------------


def test_bad_input_is_a_validation_error_naming_each_field(portal: PortalClient) -> None:
    bad = {**HELLO, "gpu": {"kind": "mig", "profile": "1g.11gb"}, "priority": "urgent"}

    with pytest.raises(ValidationError) as refused:
        portal.submit(**bad)

    error = refused.value
    assert error.status == 400
    assert set(error.errors) == {"gpu.profile", "priority"}
    assert "1g.10gb" in error.errors["gpu.profile"]  # the allowed profiles are listed
    assert str(error).startswith("HTTP 400 on POST /jobs/:")
    assert f"priority: {error.errors['priority']}" in str(error)
    assert not JobRow.objects.exists()


def test_a_bad_token_is_an_authentication_error(live_server: Any) -> None:
    with pytest.raises(AuthenticationError) as refused:
        PortalClient(live_server.url, "not-a-token").teams()

    assert refused.value.status == 401
    assert "unknown or revoked token" in refused.value.errors["authorization"]


def test_cancelling_a_team_mates_job_is_permission_denied(
    portal: PortalClient, vision: Team
) -> None:
    vera = make_user("vera", team=vision)
    row = make_job(team=vision, user=vera)

    with pytest.raises(PermissionDenied) as refused:
        portal.cancel(row.pk)

    assert refused.value.status == 403
    assert JobRow.objects.get(pk=row.pk).state == JobState.PENDING


def test_an_unknown_job_is_not_found(portal: PortalClient) -> None:
    with pytest.raises(NotFound) as missing:
        portal.job(999999)

    assert "no job 999999" in missing.value.errors["detail"]


def test_a_second_cancel_is_a_conflict_naming_the_state(portal: PortalClient) -> None:
    job = portal.submit(**HELLO).cancel()

    with pytest.raises(Conflict) as refused:
        job.cancel()

    assert refused.value.status == 409
    assert "already ended (CANCELLED)" in refused.value.errors["state"]


def test_too_many_requests_is_rate_limited_with_the_wait(
    portal: PortalClient, settings: Any
) -> None:
    settings.API_THROTTLE_TOKEN = (2, 60.0)
    settings.API_THROTTLE_USER = (100, 60.0)
    portal.teams()
    portal.teams()

    with pytest.raises(RateLimited) as limited:
        portal.teams()

    assert limited.value.status == 429
    assert limited.value.retry_after is not None and 1 <= limited.value.retry_after <= 60


def test_a_stopped_server_is_portal_unavailable_with_the_url() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()  # stopped: nothing listens there any more

    with pytest.raises(PortalUnavailable) as unreachable:
        PortalClient(url, "token", retries=1, backoff=0.01).job(1)

    error = unreachable.value
    assert error.url == f"{url}/api/v1/jobs/1/"
    assert error.status is None
    assert f"cannot reach the portal at {url}/api/v1/jobs/1/" in str(error)


def test_an_unknown_host_is_portal_unavailable() -> None:
    with pytest.raises(PortalUnavailable, match="cannot reach the portal at http://portal.invalid"):
        PortalClient("http://portal.invalid", "token", retries=0).teams()


def test_a_portal_that_never_answers_is_portal_unavailable_after_the_timeout() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts connections, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        with pytest.raises(PortalUnavailable, match="no answer in time"):
            PortalClient(url, "token", timeout=0.3, retries=0).teams()


# --- retries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_read_is_retried_on_a_gateway_error_until_it_answers(status: int) -> None:
    with flaky_portal(failures=2, status=status) as (url, seen):
        teams = PortalClient(url, "token", backoff=0.01).teams()

    assert teams == []
    assert seen == ["GET /api/v1/teams/"] * 3


def test_a_read_gives_up_after_its_retries_with_portal_unavailable() -> None:
    with flaky_portal(failures=10) as (url, seen), pytest.raises(PortalUnavailable) as unavailable:
        PortalClient(url, "token", retries=2, backoff=0.01).teams()

    assert unavailable.value.status == 503
    assert unavailable.value.errors == {"detail": "database unavailable, try again"}
    assert len(seen) == 3


def test_a_submit_is_never_retried(portal: PortalClient) -> None:
    with flaky_portal(failures=1) as (url, seen), pytest.raises(PortalUnavailable):
        PortalClient(url, "token", backoff=0.01).submit(**HELLO)

    assert seen == ["POST /api/v1/jobs/"]


def test_a_cancel_is_retried_as_it_changes_nothing_when_repeated() -> None:
    with flaky_portal(failures=1, answer={"id": 5, "state": "CANCELLED"}) as (url, seen):
        job = PortalClient(url, "token", backoff=0.01).cancel(5)

    assert (job.id, job.state) == (5, "CANCELLED")
    assert seen == ["POST /api/v1/jobs/5/cancel/"] * 2


# --- configuration ---------------------------------------------------------------------------


def test_from_env_reads_the_url_and_token_then_the_login_file(
    portal: PortalClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPU_PORTAL_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("PORTAL_URL", portal.api)
    monkeypatch.delenv("PORTAL_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="PORTAL_TOKEN not set"):
        PortalClient.from_env()

    monkeypatch.setenv("PORTAL_TOKEN", portal.token)
    from_env = PortalClient.from_env()
    monkeypatch.delenv("PORTAL_URL")
    monkeypatch.delenv("PORTAL_TOKEN")
    (tmp_path / "config.json").write_text(json.dumps({"url": portal.url, "token": portal.token}))
    from_file = PortalClient.from_env()

    assert [team["name"] for team in from_env.teams()] == ["vision"]
    assert [team["name"] for team in from_file.teams()] == ["vision"]
    assert "token" not in repr(from_env).lower() and portal.token not in repr(from_env)

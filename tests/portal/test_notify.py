"""Notifications (issue 10.6): a job's state changes become e-mails and signed webhooks for
exactly the people and teams that asked for them, delivered by the control worker with
retries, recorded, and never in the way of the transition that caused them."""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.celery import app
from portal.env import ConfigError, TargetAllowList, env_target_allow_list
from portal.jobs.attempts import attempt_finish, attempt_start
from portal.jobs.models import Job, JobEvent, JobState
from portal.jobs.testing import World, make_job, token_client
from portal.jobs.transitions import StateChange
from portal.notify import services
from portal.notify.models import Delivery, NotificationSettings, TeamWebhook
from portal.notify.services import (
    notification_settings_update,
    notify_state_changes,
    team_webhook_update,
)
from portal.notify.signing import verify
from portal.notify.targets import url_problem
from portal.notify.tasks import deliver
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db

LOOPBACK_ONLY = TargetAllowList(public=False, networks=(ipaddress.ip_network("127.0.0.1/32"),))


# --- a real webhook receiver on 127.0.0.1 -------------------------------------------------


class Receiver:
    """An HTTP server in a thread that records every POST and answers the scripted statuses
    (then 200), after ``delay`` seconds."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.delay = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers.items()), body))
                time.sleep(receiver.delay)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/gpu?src=portal"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def notify_settings(settings: Any) -> None:
    # The receiver is on loopback, which the default allow-list refuses; no waits between tries.
    settings.WEBHOOK_ALLOW = LOOPBACK_ONLY
    settings.NOTIFY_RETRY_S = 0.0
    settings.NOTIFY_MAX_ATTEMPTS = 3
    settings.WEBHOOK_TIMEOUT_S = 5.0
    settings.PUBLIC_URL = "https://gpu.example.org"


@pytest.fixture
def eager() -> Iterator[None]:
    """Deliveries run at once, in this process (the worker's code, without a broker)."""
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


class Queue:
    """Stands in for the broker: records what was handed to the control worker."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[Any], str]] = []

    def apply_async(self, *, args: list[Any], queue: str) -> None:
        self.sent.append((args, queue))

    def run(self) -> list[str]:
        """What the control worker would do with each message."""
        return [deliver.apply(args=args).get() for args, _ in self.sent]


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> Queue:
    queue = Queue()
    monkeypatch.setattr(services, "deliver", queue)
    return queue


@pytest.fixture
def people(world: World) -> World:
    world.alice.email = "alice@example.org"
    world.alice.save()
    world.bob.email = "bob@example.org"
    world.bob.save()
    return world


def _running(world: World, **fields: Any) -> Job:
    return make_job(team=world.vision, user=world.alice, state=JobState.ASSIGNED, **fields)


def _start(job: Job, capture: Any) -> None:
    with capture(execute=True):
        now = timezone.now()
        attempt_start(job_id=job.pk, attempt=job.attempt, started_at=now, message="started", at=now)


def _finish(job: Job, capture: Any, outcome: str = "failed", exit_code: int = 3) -> str | None:
    now = timezone.now()
    with capture(execute=True):
        return attempt_finish(
            job_id=job.pk,
            attempt=job.attempt,
            outcome=outcome,
            node="gpu-1",
            exit_code=exit_code,
            error="",
            finished_at=now,
            started_at=None,
            now=now,
        )


def _sent(job: Job) -> set[tuple[str, str, str]]:
    return set(Delivery.objects.filter(job=job).values_list("event", "channel", "recipient"))


# --- who is told what -----------------------------------------------------------------


def test_a_change_is_delivered_exactly_to_who_asked_for_its_event(
    people, queued, receiver, django_capture_on_commit_callbacks
):
    alice, vision = people.alice, people.vision
    notification_settings_update(user=alice, events=["fail"], webhook_url=receiver.url)
    team_webhook_update(team=vision, by=people.vera, url=receiver.url, events=["start", "end"])
    usual = _running(people)  # alice's own events: fail
    told_start = _running(people, notify=["start"])  # this job's own list replaces them
    silent = _running(people, notify=[])  # nothing about this one to alice
    bobs = make_job(team=people.nlp, user=people.bob, state=JobState.ASSIGNED)  # no settings

    for job in (usual, told_start, silent, bobs):
        _start(job, django_capture_on_commit_callbacks)

    alice_ = f"user:{alice.pk}"
    team = f"team:{vision.pk}"
    assert _sent(usual) == {("start", "webhook", team)}
    assert _sent(told_start) == {
        ("start", "email", alice_),
        ("start", "webhook", alice_),
        ("start", "webhook", team),
    }
    assert _sent(silent) == {("start", "webhook", team)}
    assert _sent(bobs) == set()

    for job in (usual, told_start, silent):
        assert _finish(job, django_capture_on_commit_callbacks) == JobState.FAILED

    # A failure is "fail" to who wants failures and "end" to who wants ends.
    assert _sent(usual) == {
        ("start", "webhook", team),
        ("fail", "email", alice_),
        ("fail", "webhook", alice_),
        ("end", "webhook", team),
    }
    assert _sent(told_start) - {
        ("start", c, r) for c in ("email", "webhook") for r in (alice_, team)
    } == {("end", "webhook", team)}
    assert _sent(silent) == {("start", "webhook", team), ("end", "webhook", team)}
    # Every delivery went to the control queue once, and nothing else did.
    assert sorted(args[0] for args, _ in queued.sent) == sorted(
        Delivery.objects.values_list("pk", flat=True)
    )
    assert {queue for _, queue in queued.sent} == {"control"}


def test_no_email_without_an_address_or_when_email_is_off(
    people, queued, django_capture_on_commit_callbacks
):
    notification_settings_update(user=people.bob, events=["start"], email=False)
    notification_settings_update(user=people.nick, events=["start"])  # nick has no address
    off = make_job(team=people.nlp, user=people.bob, state=JobState.ASSIGNED)
    no_address = make_job(team=people.nlp, user=people.nick, state=JobState.ASSIGNED)

    _start(off, django_capture_on_commit_callbacks)
    _start(no_address, django_capture_on_commit_callbacks)

    assert Delivery.objects.count() == 0
    assert queued.sent == []


def test_a_change_told_twice_is_delivered_once(people, queued):
    notification_settings_update(user=people.alice, events=["end"])
    job = _running(people)
    change = StateChange(job.pk, "RUNNING", "SUCCEEDED", job.attempt, timezone.now(), "done")

    first = notify_state_changes(changes=[change])
    again = notify_state_changes(changes=[change])

    assert len(first) == 1 and again == []
    assert Delivery.objects.get().event == "end"


def test_reading_who_wants_a_batch_of_changes_costs_one_query(
    people, queued, django_assert_num_queries
):
    jobs = [_running(people) for _ in range(20)]
    changes = [
        StateChange(job.pk, "ASSIGNED", "RUNNING", 1, timezone.now(), "started") for job in jobs
    ]

    with django_assert_num_queries(1):
        assert notify_state_changes(changes=changes) == []
    with django_assert_num_queries(0):  # assignments are no event anyone can ask for
        notify_state_changes(
            changes=[StateChange(j.pk, "PENDING", "ASSIGNED", 1, timezone.now(), "") for j in jobs]
        )


# --- e-mail ------------------------------------------------------------------------------


def test_an_email_lands_in_the_outbox_with_the_job_and_what_happened(
    people, eager, mailoutbox, django_capture_on_commit_callbacks
):
    notification_settings_update(user=people.alice, events=["end"])
    job = _running(people, name="resnet")

    _finish(job, django_capture_on_commit_callbacks, outcome="succeeded", exit_code=0)

    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert mail.to == ["alice@example.org"]
    assert mail.subject == f"[GPU portal] job {job.pk} 'resnet': SUCCEEDED"
    assert f"Job {job.pk} (resnet) of team vision is SUCCEEDED (was ASSIGNED)" in mail.body
    assert "succeeded on gpu-1, exit code 0" in mail.body
    assert "Exit code: 0" in mail.body
    assert f"https://gpu.example.org/jobs/{job.pk}/" in mail.body
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 1, "")


# --- webhooks -------------------------------------------------------------------------


def test_a_webhook_gets_exactly_one_signed_request_per_event(
    people, eager, receiver, django_capture_on_commit_callbacks
):
    secret = notification_settings_update(
        user=people.alice, events=["start", "end"], email=False, webhook_url=receiver.url
    ).secret
    job = _running(people)

    _start(job, django_capture_on_commit_callbacks)
    _finish(job, django_capture_on_commit_callbacks, outcome="succeeded", exit_code=0)

    assert [headers["X-Portal-Event"] for headers, _ in receiver.requests] == ["start", "end"]
    assert [json.loads(body)["job"]["state"] for _, body in receiver.requests] == [
        "RUNNING",
        "SUCCEEDED",
    ]
    for headers, body in receiver.requests:
        assert verify(secret, body, headers["X-Portal-Signature"], now=time.time())
    assert list(Delivery.objects.order_by("id").values_list("status", "attempts")) == [
        ("delivered", 1),
        ("delivered", 1),
    ]


def test_a_webhook_gets_one_signed_delivery_retried_after_a_500(
    people, eager, receiver, django_capture_on_commit_callbacks
):
    secret = notification_settings_update(
        user=people.alice, events=["fail"], email=False, webhook_url=receiver.url
    ).secret
    job = _running(people, name="train")
    receiver.statuses = [500]

    _finish(job, django_capture_on_commit_callbacks)

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivered", 2)
    assert "answered 500" in delivery.last_error
    assert len(receiver.requests) == 2  # the 500, then the retry that got a 200
    for headers, body in receiver.requests:
        assert headers["X-Portal-Delivery"] == str(delivery.pk)
        assert headers["X-Portal-Event"] == "fail"
        assert headers["Content-Type"] == "application/json"
        assert verify(secret, body, headers["X-Portal-Signature"], now=time.time())
        assert not verify(secret, body + b" ", headers["X-Portal-Signature"], now=time.time())
        assert not verify("whsec_other", body, headers["X-Portal-Signature"], now=time.time())
    payload = json.loads(receiver.requests[-1][1])
    assert payload["delivery"] == delivery.pk
    assert payload["event"] == "fail"
    assert payload["job"] | {} == {
        "id": job.pk,
        "name": "train",
        "team": "vision",
        "user": "alice",
        "state": "FAILED",
        "previous_state": "ASSIGNED",
        "attempt": 1,
        "exit_code": 3,
        "reason": "failed",
        "url": f"https://gpu.example.org/jobs/{job.pk}/",
        "api_url": f"https://gpu.example.org/api/v1/jobs/{job.pk}/",
    }


def test_a_webhook_that_keeps_failing_is_recorded_failed_and_the_job_is_not_affected(
    people, eager, receiver, django_capture_on_commit_callbacks
):
    notification_settings_update(
        user=people.alice, events=["end"], email=False, webhook_url=receiver.url
    )
    job = _running(people)
    receiver.statuses = [503] * 10

    assert _finish(job, django_capture_on_commit_callbacks) == JobState.FAILED

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 3)  # PORTAL_NOTIFY_MAX_ATTEMPTS
    assert delivery.last_error.startswith("RetryableAnswer: the receiver answered 503")
    assert delivery.finished_at is not None
    assert len(receiver.requests) == 3
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert JobEvent.objects.filter(job=job, to_state=JobState.FAILED).count() == 1


def test_a_refusing_answer_is_not_retried(
    people, eager, receiver, django_capture_on_commit_callbacks
):
    notification_settings_update(
        user=people.alice, events=["end"], email=False, webhook_url=receiver.url
    )
    receiver.statuses = [401]

    _finish(_running(people), django_capture_on_commit_callbacks)

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert delivery.last_error.startswith("the receiver answered 401")


def test_a_slow_receiver_never_delays_the_transition(
    people, queued, receiver, django_capture_on_commit_callbacks
):
    notification_settings_update(
        user=people.alice, events=["end"], email=False, webhook_url=receiver.url
    )
    job = _running(people)
    receiver.delay = 2.0

    started = time.monotonic()
    assert _finish(job, django_capture_on_commit_callbacks) == JobState.FAILED
    took = time.monotonic() - started

    assert took < 1.0  # the transition and its commit never waited for the receiver
    assert receiver.requests == []
    assert Delivery.objects.get().status == "pending"
    assert queued.run() == ["delivered"]  # the control worker, later, does the waiting
    assert len(receiver.requests) == 1


def test_a_broken_notification_receiver_never_breaks_the_transition(
    people, monkeypatch, django_capture_on_commit_callbacks
):
    notification_settings_update(user=people.alice, events=["end"])

    def broken(changes: Any) -> list[int]:
        raise RuntimeError("the notify app is broken")

    monkeypatch.setattr(services, "plan_deliveries", broken)
    job = _running(people)

    assert _finish(job, django_capture_on_commit_callbacks) == JobState.FAILED
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert Delivery.objects.count() == 0


def test_a_target_the_allow_list_refuses_fails_at_delivery_without_a_request(
    people, eager, receiver, settings, django_capture_on_commit_callbacks
):
    # Saved before the operator narrowed PORTAL_WEBHOOK_ALLOW to public addresses (the default).
    NotificationSettings.objects.create(
        user=people.alice,
        events=["end"],
        email=False,
        webhook_url=receiver.url,
        webhook_secret="whsec_x",
    )
    settings.WEBHOOK_ALLOW = TargetAllowList()

    _finish(_running(people), django_capture_on_commit_callbacks)

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert "127.0.0.1 is a loopback address" in delivery.last_error
    assert receiver.requests == []


def test_a_webhook_changed_after_the_event_is_not_sent_the_old_one(
    people, queued, receiver, django_capture_on_commit_callbacks
):
    notification_settings_update(
        user=people.alice, events=["end"], email=False, webhook_url=receiver.url
    )
    _finish(_running(people), django_capture_on_commit_callbacks)
    notification_settings_update(user=people.alice, webhook_url="")

    assert queued.run() == ["failed"]
    assert "changed or removed" in Delivery.objects.get().last_error
    assert receiver.requests == []


def test_the_sweep_resends_a_delivery_whose_message_was_lost(people, queued):
    notification_settings_update(user=people.alice, events=["end"])
    job = _running(people)
    change = StateChange(job.pk, "RUNNING", "SUCCEEDED", 1, timezone.now(), "done")
    [delivery_id] = notify_state_changes(changes=[change])
    queued.sent.clear()  # the broker lost it

    assert services.resend_overdue() == 0  # not overdue yet
    later = timezone.now() + services.OVERDUE_AFTER * 2
    assert services.resend_overdue(now=later) == 1
    assert queued.sent == [([delivery_id, 0], "control")]


def test_two_messages_for_the_same_try_send_once(people, queued, mailoutbox):
    notification_settings_update(user=people.alice, events=["end"])
    job = _running(people)
    change = StateChange(job.pk, "RUNNING", "SUCCEEDED", 1, timezone.now(), "done")
    [delivery_id] = notify_state_changes(changes=[change])

    first = deliver.apply(args=[delivery_id, 0]).get()
    again = deliver.apply(args=[delivery_id, 0]).get()

    assert (first, again) == ("delivered", "skipped")
    assert len(mailoutbox) == 1


# --- where a webhook may go -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.org/gpu", None),
        ("http://93.184.216.34:8080/x", None),
        ("ftp://hooks.example.org/", "scheme 'ftp' is not allowed"),
        ("hooks.example.org/gpu", "no scheme is not allowed"),
        ("http:///path", "no host"),
        ("https://user:pw@hooks.example.org/", "must not carry a user name or password"),
        ("http://127.0.0.1:9000/", "127.0.0.1 is a loopback address"),
        ("http://10.1.2.3/", "10.1.2.3 is a private address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://[::1]/", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "127.0.0.1 is a loopback address"),
        ("http://localhost:8000/", "localhost is this machine"),
        ("https://hooks.example.org/a b", "must not contain spaces"),
    ],
)
def test_webhook_urls_are_http_to_public_addresses_by_default(url, problem):
    found = url_problem(url, allow=TargetAllowList())
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "allowed:" in found or "must not" in found


def test_operators_may_allow_internal_networks_and_hosts(monkeypatch):
    monkeypatch.setenv("PORTAL_WEBHOOK_ALLOW", "10.0.0.0/8, hooks.corp.example, .svc.internal")
    allow = env_target_allow_list("PORTAL_WEBHOOK_ALLOW")

    assert allow == TargetAllowList(
        public=False,
        networks=(ipaddress.ip_network("10.0.0.0/8"),),
        hosts=("hooks.corp.example", ".svc.internal"),
    )
    assert url_problem("http://10.1.2.3/hook", allow=allow) is None
    assert url_problem("http://a.b.svc.internal/hook", allow=allow) is None
    assert "any public address" not in (url_problem("http://192.168.1.1/", allow=allow) or "")
    assert "192.168.1.1 is a private address" in (
        url_problem("http://192.168.1.1/", allow=allow) or ""
    )
    # Only what is listed: "public" must be named to keep public addresses too.
    assert "is a public address" in (url_problem("http://93.184.216.34/", allow=allow) or "")

    monkeypatch.setenv("PORTAL_WEBHOOK_ALLOW", "none")
    assert "no webhook target is allowed" in (
        url_problem(
            "https://hooks.example.org/", allow=env_target_allow_list("PORTAL_WEBHOOK_ALLOW")
        )
        or ""
    )
    monkeypatch.setenv("PORTAL_WEBHOOK_ALLOW", "public,not a host!")
    with pytest.raises(ConfigError, match="neither a network nor a host name"):
        env_target_allow_list("PORTAL_WEBHOOK_ALLOW")


# --- the job request's notify -----------------------------------------------------------

SUBMIT = {
    "name": "n",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["true"],
    "gpu": {"kind": "whole", "count": 1},
}


@pytest.mark.parametrize(
    ("notify", "message"),
    [
        (["end", "bogus"], "unknown event 'bogus'; allowed: a list of end, fail, preempt, start"),
        (5, "must be a list; allowed: a list of end, fail, preempt, start"),
        ([{"event": "end"}], "unknown event {'event': 'end'}"),
    ],
)
def test_a_bad_notify_is_a_400_naming_the_allowed_events_and_nothing_is_stored(
    alice_api, notify, message
):
    response = alice_api.post("/api/v1/jobs/", {**SUBMIT, "notify": notify}, format="json")

    assert response.status_code == 400
    assert message in response.json()["errors"]["notify"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("notify", "stored"),
    [
        (["start", "fail", "end"], ["end", "fail", "start"]),
        ([], []),
        (None, None),
        ("end, fail", ["end", "fail"]),
    ],
)
def test_a_job_keeps_its_notify_list(alice_api, notify, stored):
    response = alice_api.post("/api/v1/jobs/", {**SUBMIT, "notify": notify}, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["notify"] == stored
    assert Job.objects.get().notify == stored


# --- my settings and the team's webhook in the API --------------------------------------


def test_my_notifications_in_the_api_show_the_secret_once(world, alice_api):
    assert alice_api.get("/api/v1/me/notifications/").json() == {
        "events": [],
        "email": True,
        "email_address": None,
        "webhook_url": "",
        "webhook_secret_hint": None,
        "deliveries": [],
    }

    made = alice_api.put(
        "/api/v1/me/notifications/",
        {"events": ["preempt", "end"], "webhook_url": "https://hooks.example.org/alice"},
        format="json",
    )
    assert made.status_code == 200
    assert made["Cache-Control"] == "no-store"
    body = made.json()
    secret = body.pop("webhook_secret")
    assert secret.startswith("whsec_") and len(secret) > 30
    assert body["events"] == ["end", "preempt"]
    assert body["webhook_secret_hint"] == secret[:10] + "…"

    # Left-out fields keep their values, and the secret is not shown again.
    again = alice_api.put("/api/v1/me/notifications/", {"email": False}, format="json").json()
    assert "webhook_secret" not in again
    assert (again["email"], again["events"], again["webhook_url"]) == (
        False,
        ["end", "preempt"],
        "https://hooks.example.org/alice",
    )
    rotated = alice_api.put("/api/v1/me/notifications/", {"rotate_secret": True}, format="json")
    assert rotated.json()["webhook_secret"] not in ("", secret)
    assert (
        NotificationSettings.objects.get(user=world.alice).webhook_secret
        == rotated.json()["webhook_secret"]
    )


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"events": ["end", "finish"]}, "events", "allowed: a list of end, fail, preempt, start"),
        ({"events": "end"}, "events", "allowed: a list of end, fail, preempt, start"),
        ({"webhook_url": "ftp://x.example.org/"}, "webhook_url", "allowed: an http:// or https://"),
        ({"webhook_url": "http://10.0.0.1/"}, "webhook_url", "private address"),
        ({"email": "yes"}, "email", "allowed: true, false"),
        ({"rotate_secret": True}, "rotate_secret", "no webhook"),
        ({"sms": True}, "sms", "unknown field; allowed: events, email, webhook_url, rotate_secret"),
    ],
)
def test_bad_notification_settings_are_a_400_naming_the_field(alice_api, body, field, message):
    response = alice_api.put("/api/v1/me/notifications/", body, format="json")

    assert response.status_code == 400
    assert message in response.json()["errors"][field]
    assert not NotificationSettings.objects.exists()


def test_a_read_token_may_look_but_not_change_my_notifications(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=world.alice, scopes=['read'])}")

    assert client.get("/api/v1/me/notifications/").status_code == 200
    response = client.put("/api/v1/me/notifications/", {"events": ["end"]}, format="json")
    assert response.status_code == 403
    assert "'admin' scope" in response.json()["errors"]["scope"]


def test_a_team_webhook_is_for_its_admins(world):
    vera, alice, bob = (token_client(u) for u in (world.vera, world.alice, world.bob))

    made = vera.put(
        "/api/v1/teams/vision/webhook/",
        {"url": "https://hooks.example.org/vision", "events": ["start", "end"]},
        format="json",
    )
    assert made.status_code == 200
    secret = made.json()["secret"]
    assert TeamWebhook.objects.get(team=world.vision).secret == secret
    assert vera.get("/api/v1/teams/vision/webhook/").json() == {
        "url": "https://hooks.example.org/vision",
        "events": ["end", "start"],
        "secret_hint": secret[:10] + "…",
    }
    assert alice.get("/api/v1/teams/vision/webhook/").status_code == 403
    assert alice.put("/api/v1/teams/vision/webhook/", {"url": ""}, format="json").status_code == 403
    assert bob.get("/api/v1/teams/vision/webhook/").status_code == 404

    removed = vera.put("/api/v1/teams/vision/webhook/", {"url": ""}, format="json")
    assert removed.json() == {"url": "", "events": [], "secret_hint": None}
    assert not TeamWebhook.objects.exists()


# --- the page ---------------------------------------------------------------------------


def test_the_notifications_page_saves_settings_and_shows_the_secret_once(world, client, settings):
    settings.WEBHOOK_ALLOW = TargetAllowList()  # the default: public addresses only
    client.force_login(world.alice)

    page = client.get("/settings/notifications/")
    assert page.status_code == 200
    assert b"Tell me when a job of mine" in page.content
    assert b"Team vision: webhook" not in page.content  # alice administers no team

    saved = client.post(
        "/settings/notifications/",
        {"form": "mine", "events": ["fail"], "webhook_url": "https://hooks.example.org/a"},
    )
    own = NotificationSettings.objects.get(user=world.alice)
    assert saved.status_code == 200
    assert own.events == ["fail"] and own.email is False  # an unticked box is "off"
    assert own.webhook_secret.encode() in saved.content
    assert own.webhook_secret.encode() not in client.get("/settings/notifications/").content

    refused = client.post(
        "/settings/notifications/",
        {"form": "mine", "events": ["fail"], "webhook_url": "http://127.0.0.1:8000/"},
    )
    assert refused.status_code == 422
    assert b"127.0.0.1 is a loopback address" in refused.content
    assert NotificationSettings.objects.get(user=world.alice).webhook_url == own.webhook_url


def test_a_team_admin_sets_the_team_webhook_on_the_page(world, client):
    client.force_login(world.vera)

    saved = client.post(
        "/settings/notifications/",
        {"form": "team", "team": "vision", "url": "https://hooks.example.org/v", "events": ["end"]},
    )

    assert saved.status_code == 200
    hook = TeamWebhook.objects.get(team=world.vision)
    assert (hook.url, hook.events) == ("https://hooks.example.org/v", ["end"])
    assert hook.secret.encode() in saved.content
    other = client.post(
        "/settings/notifications/",
        {"form": "team", "team": "nlp", "url": "https://hooks.example.org/n", "events": ["end"]},
    )
    assert other.status_code == 422
    assert not TeamWebhook.objects.filter(team=world.nlp).exists()

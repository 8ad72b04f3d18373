"""A node's `reports` batch: one signed message, one transaction, one acknowledgement, and
exactly the effects its reports have when each comes alone."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from portal.accounting.models import UsageRecord
from portal.agents.models import RefusedMessage, SeenNonce
from portal.agents.tasks import agent_report
from portal.agents.testing import (
    capture_sent_messages,
    deliver,
    finished,
    log_chunk,
    register_node,
    reports,
    signed,
    started,
)
from portal.cluster.models import Slice
from portal.jobs.models import Allocation, Job, JobEvent, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user

pytestmark = pytest.mark.django_db

NODE = "node-1"
OTHER = "node-2"


@pytest.fixture
def team_and_user():
    team = make_team("vision", limit_units=None)
    return team, make_user("alice", team=team)


EIGHT_GPUS = {"gpus": [{"mode": "whole", "count": 8}]}


@pytest.fixture
def nodes():
    return register_node(NODE, description=EIGHT_GPUS), register_node(OTHER, description=EIGHT_GPUS)


def _free_slice(node: str) -> str:
    held = Allocation.objects.filter(released_at__isnull=True).values("slice_id")
    key = (
        Slice.objects.filter(gpu__node__name=node)
        .exclude(pk__in=held)
        .values_list("key", flat=True)
        .order_by("gpu__index")
        .first()
    )
    assert key is not None, f"no free slice left on {node}"
    return key


def _holding(team, user, node: str = NODE, *, state=JobState.ASSIGNED, attempt=1) -> Job:
    job = make_job(team=team, user=user, state=state, attempt=attempt)
    allocate(job, [_free_slice(node)])
    held_since = timezone.now() - timedelta(seconds=100)
    Job.objects.filter(pk=job.pk).update(assigned_at=held_since)
    job.allocations.update(created_at=held_since)
    job.refresh_from_db()
    return job


def _key(kind: str, job_id: int, attempt: int, seq: int = 0) -> dict:
    return {"kind": kind, "job_id": job_id, "attempt": attempt, "seq": seq}


def _acked(sent) -> list[list[dict]]:
    return [message["reports"] for message, _ in sent.acks()]


def test_a_batch_starts_every_attempt_in_it_and_acknowledges_them_in_one_ack_after_commit(
    nodes, team_and_user, django_capture_on_commit_callbacks
):
    jobs = [_holding(*team_and_user) for _ in range(2)]
    at = time.time()
    batch = reports(*(started(job.pk, 1, at=at) for job in jobs))

    with capture_sent_messages() as sent:
        with django_capture_on_commit_callbacks() as callbacks:
            assert deliver(batch) == "reports"
        assert sent.acks() == []  # nothing before the commit
        for callback in callbacks:
            callback()

    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.started_at) == ("RUNNING", datetime.fromtimestamp(at, tz=UTC))
        (event,) = job.events.filter(to_state="RUNNING")
        assert (event.from_state, event.attempt, event.message) == (
            "ASSIGNED",
            1,
            f"started on {NODE}",
        )
    assert _acked(sent) == [[_key("started", job.pk, 1) for job in jobs]]
    assert [queue for _, queue in sent.acks()] == [f"node.{NODE}"]


def test_a_batch_with_a_bad_signature_is_refused_whole_and_recorded(nodes, team_and_user):
    job = _holding(*team_and_user)
    envelope = signed(reports(started(job.pk, 1), log_chunk(job.pk, 1, 0, "hi\n")))
    forged = {**envelope, "sig": "0" * 64}

    with capture_sent_messages() as sent:
        assert agent_report(forged) == "refused: bad_signature"

    assert Job.objects.get(pk=job.pk).state == "ASSIGNED"
    assert not JobLogChunk.objects.exists()
    assert sent.acks() == []
    (refusal,) = RefusedMessage.objects.all()
    assert (refusal.node, refusal.kind, refusal.reason) == (NODE, "reports", "bad_signature")


def test_a_replayed_batch_is_refused_and_changes_nothing(
    nodes, team_and_user, django_capture_on_commit_callbacks
):
    team, alice = team_and_user
    job = _holding(team, alice)
    envelope = signed(reports(started(job.pk, 1), finished(job.pk, 1)))

    nonces = SeenNonce.objects.filter(node=NODE).count()
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert agent_report(envelope) == "reports"
        events = job.events.count()
        assert agent_report(envelope) == "refused: replay"

    job.refresh_from_db()
    assert (job.state, job.events.count()) == ("SUCCEEDED", events)
    assert UsageRecord.objects.filter(job=job).count() == 1
    assert len(sent.acks()) == 1
    assert RefusedMessage.objects.filter(node=NODE, reason="replay", kind="reports").count() == 1
    assert SeenNonce.objects.filter(node=NODE).count() == nonces + 1


def test_repeats_inside_a_batch_are_applied_once_and_acknowledged_once(
    nodes, team_and_user, django_capture_on_commit_callbacks
):
    job = _holding(*team_and_user)
    at = time.time()
    batch = reports(
        started(job.pk, 1, at=at),
        log_chunk(job.pk, 1, 0, "hello\n"),
        started(job.pk, 1, at=at + 5),
        log_chunk(job.pk, 1, 0, "hello\n"),
        log_chunk(job.pk, 1, 1, "world\n"),
    )

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert deliver(batch) == "reports"

    job.refresh_from_db()
    assert (job.state, job.started_at) == ("RUNNING", datetime.fromtimestamp(at, tz=UTC))
    assert job.events.filter(to_state="RUNNING").count() == 1
    assert list(JobLogChunk.objects.order_by("seq").values_list("seq", "data")) == [
        (0, "hello\n"),
        (1, "world\n"),
    ]
    assert _acked(sent) == [
        [_key("started", job.pk, 1), _key("log", job.pk, 1, 0), _key("log", job.pk, 1, 1)]
    ]
    assert sent.stops() == []


def test_a_batch_mixing_kinds_has_each_reports_own_effect(
    nodes, team_and_user, django_capture_on_commit_callbacks
):
    team, alice = team_and_user
    starting = _holding(team, alice)
    running = _holding(team, alice, state=JobState.RUNNING)
    quick = _holding(team, alice)  # starts and ends within the batch
    stale = _holding(team, alice, attempt=3)
    Allocation.objects.create(  # its attempt 2 ran here before
        job=stale,
        attempt=2,
        slice=Slice.objects.get(key=_free_slice(NODE)),
        created_at=timezone.now(),
        released_at=timezone.now(),
    )
    elsewhere = _holding(team, alice, OTHER)  # never placed on NODE
    batch = reports(
        started(starting.pk, 1),
        log_chunk(starting.pk, 1, 0, "loading\n"),
        finished(running.pk, 1, outcome="failed", exit_code=3, error="boom"),
        started(quick.pk, 1),
        finished(quick.pk, 1),
        started(stale.pk, 2),
        started(elsewhere.pk, 1),
    )

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert deliver(batch) == "reports"

    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {
        starting.pk: "RUNNING",
        running.pk: "FAILED",
        quick.pk: "SUCCEEDED",
        stale.pk: "ASSIGNED",
        elsewhere.pk: "ASSIGNED",
    }
    assert Job.objects.get(pk=running.pk).exit_code == 3
    assert [e.to_state for e in JobEvent.objects.filter(job=quick).order_by("pk")] == [
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert JobLogChunk.objects.filter(job=starting).count() == 1
    assert set(UsageRecord.objects.values_list("job_id", flat=True)) == {running.pk, quick.pk}
    # The stale attempt is told to stop; the report about another node's attempt is refused.
    assert [(m["job_id"], m["attempt"]) for m, _ in sent.stops()] == [(stale.pk, 2)]
    (refusal,) = RefusedMessage.objects.all()
    assert (refusal.reason, refusal.node) == ("not_its_attempt", NODE)
    assert str(elsewhere.pk) in refusal.detail
    assert _acked(sent) == [
        [
            _key("started", starting.pk, 1),
            _key("log", starting.pk, 1, 0),
            _key("finished", running.pk, 1),
            _key("started", quick.pk, 1),
            _key("finished", quick.pk, 1),
            _key("started", stale.pk, 2),
            _key("started", elsewhere.pk, 1),
        ]
    ]


def _world(team, user, node: str) -> tuple[list[Job], list[dict[str, Any]]]:
    """Jobs on ``node`` in every situation a report meets, and the reports its agent sends."""
    starting, again, running, quick, failing, repeat_log = (
        _holding(team, user, node) for _ in range(6)
    )
    for job in (running, failing, repeat_log):
        Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    stale = make_job(team=team, user=user, state=JobState.RUNNING, attempt=2)
    allocate(stale, [_free_slice(node)])
    at = 1_700_000_000.0
    sent = [
        started(starting.pk, 1, node=node, at=at),
        started(again.pk, 1, node=node, at=at),
        log_chunk(again.pk, 1, 0, "a\n", node=node),
        started(again.pk, 1, node=node, at=at + 1),
        finished(running.pk, 1, node=node, at=at + 50),
        started(quick.pk, 1, node=node, at=at),
        log_chunk(quick.pk, 1, 0, "q\n", node=node),
        finished(quick.pk, 1, node=node, at=at + 2),
        finished(failing.pk, 1, node=node, outcome="lost", exit_code=None, at=at + 3),
        log_chunk(repeat_log.pk, 1, 0, "r\n", node=node),
        log_chunk(repeat_log.pk, 1, 0, "r\n", node=node),
        started(stale.pk, 1, node=node, at=at),
        finished(stale.pk, 1, node=node, at=at),
    ]
    return [starting, again, running, quick, failing, repeat_log, stale], sent


def _end_state(jobs: list[Job], node: str) -> list[Any]:
    """What the database says of ``jobs``, the node's name written as NODE."""
    state = []
    for job in jobs:
        row = Job.objects.filter(pk=job.pk).values(
            "state", "attempt", "started_at", "finished_at", "exit_code", "reason"
        )[0]
        row["reason"] = row["reason"].replace(node, "NODE")
        events = [
            (e.from_state, e.to_state, e.attempt, e.message.replace(node, "NODE"))
            for e in JobEvent.objects.filter(job=job).order_by("pk")
        ]
        logs = list(
            JobLogChunk.objects.filter(job=job)
            .order_by("seq")
            .values_list("attempt", "seq", "data")
        )
        usage = list(UsageRecord.objects.filter(job=job).values_list("attempt", "gpu_units"))
        held = Allocation.objects.filter(job=job, released_at__isnull=True).count()
        state.append((row, events, logs, usage, held))
    return state


def test_a_batch_ends_in_exactly_the_state_its_reports_make_one_by_one(
    nodes, team_and_user, django_capture_on_commit_callbacks
):
    team, alice = team_and_user
    alone_jobs, alone_reports = _world(team, alice, NODE)
    batch_jobs, batch_reports = _world(team, alice, OTHER)

    with capture_sent_messages() as sent:
        with django_capture_on_commit_callbacks(execute=True):
            for report in alone_reports:
                deliver(report)
        one_by_one = len(sent.sent)
        with django_capture_on_commit_callbacks(execute=True):
            assert deliver(reports(*batch_reports, node=OTHER)) == "reports"

    assert _end_state(batch_jobs, OTHER) == _end_state(alone_jobs, NODE)
    refusals = RefusedMessage.objects.values_list("reason", flat=True)
    assert (
        list(refusals.filter(node=OTHER))
        == list(refusals.filter(node=NODE))
        == [
            "not_its_attempt",
            "not_its_attempt",
        ]
    )
    # The same stops and the same acknowledged keys, the batch's in one ack.
    alone_sent, batch_sent = sent.sent[:one_by_one], sent.sent[one_by_one:]

    def stops(items):
        return sorted(
            (_unwrap(m)["attempt"], _unwrap(m)["reason"])
            for name, m, _ in items
            if name == "agent.stop"
        )

    assert stops(batch_sent) == stops(alone_sent)
    alone_keys = [_unwrap(m)["reports"] for name, m, _ in alone_sent if name == "agent.ack"]
    (batch_keys,) = [_unwrap(m)["reports"] for name, m, _ in batch_sent if name == "agent.ack"]
    seen: list[dict] = []
    for keys in alone_keys:
        seen += [key for key in keys if key not in seen]
    to_alone = {b.pk: a.pk for a, b in zip(alone_jobs, batch_jobs, strict=True)}
    assert [{**key, "job_id": to_alone[key["job_id"]]} for key in batch_keys] == seen


def _unwrap(message: Any) -> Any:
    return json.loads(message["signed"])["msg"]


def _guard_world(team, user, node: str, other: str) -> tuple[list[Job], list[dict[str, Any]]]:
    """A job for each guard a batch's ``started`` meets on ``node``, and the batch."""
    starting, repeat, gang, cancelled, twice = (_holding(team, user, node) for _ in range(5))
    Job.objects.filter(pk=repeat.pk).update(state=JobState.RUNNING)
    Job.objects.filter(pk=gang.pk).update(multi_node=True)
    Job.objects.filter(pk=cancelled.pk).update(state=JobState.CANCELLED)
    elsewhere = _holding(team, user, other)
    # Placed on the node at attempt 1 (released), now ASSIGNED at attempt 2 there: a late
    # `started` of attempt 1 is its node's, but not the job's current attempt.
    moved_on = make_job(team=team, user=user, state=JobState.ASSIGNED, attempt=1)
    allocate(moved_on, [_free_slice(node)], released=True)
    Job.objects.filter(pk=moved_on.pk).update(attempt=2)
    moved_on.refresh_from_db()
    allocate(moved_on, [_free_slice(node)])
    at = 1_700_000_000.0
    sent = [
        started(starting.pk, 1, node=node, at=at),
        started(repeat.pk, 1, node=node, at=at),
        started(gang.pk, 1, node=node, at=at),
        started(cancelled.pk, 1, node=node, at=at),
        started(elsewhere.pk, 1, node=node, at=at),
        started(moved_on.pk, 1, node=node, at=at),
        # A job's first `started` about an attempt never on the node, then its own.
        started(twice.pk, 7, node=node, at=at),
        log_chunk(twice.pk, 1, 0, "t\n", node=node),
        started(twice.pk, 1, node=node, at=at + 5),
        started(999_999, 1, node=node, at=at),  # no such job
    ]
    return [starting, repeat, gang, cancelled, elsewhere, moved_on, twice], sent


def test_the_one_statement_start_refuses_and_starts_exactly_as_the_orm_path(
    postgres_db, nodes, team_and_user, django_capture_on_commit_callbacks, monkeypatch
):
    import portal.jobs.attempts as attempts

    assert attempts._starts_in_one_statement()  # PostgreSQL: the statement is what runs
    team, alice = team_and_user
    orm_jobs, orm_reports = _guard_world(team, alice, NODE, OTHER)
    one_jobs, one_reports = _guard_world(team, alice, OTHER, NODE)

    with capture_sent_messages() as sent:
        with monkeypatch.context() as patched:
            patched.setattr(attempts, "_starts_in_one_statement", lambda: False)
            with django_capture_on_commit_callbacks(execute=True):
                assert deliver(reports(*orm_reports, node=NODE)) == "reports"
        by_orm = len(sent.sent)
        with django_capture_on_commit_callbacks(execute=True):
            assert deliver(reports(*one_reports, node=OTHER)) == "reports"

    assert _end_state(one_jobs, OTHER) == _end_state(orm_jobs, NODE)
    states = [row["state"] for row, *_ in _end_state(one_jobs, OTHER)]
    # starting, repeat, gang (its own path, one part), cancelled, elsewhere, moved_on, twice
    assert states == ["RUNNING", "RUNNING", "RUNNING", "CANCELLED", "ASSIGNED", "ASSIGNED"] + [
        "RUNNING"
    ]
    to_orm = {one.pk: orm.pk for orm, one in zip(orm_jobs, one_jobs, strict=True)}

    def refused(node, jobs):
        return [
            (reason, re.sub(r"job (\d+)", lambda m: f"job {jobs.get(int(m[1]), m[1])}", detail))
            for reason, detail in RefusedMessage.objects.filter(node=node)
            .order_by("pk")
            .values_list("reason", "detail")
        ]

    assert [
        (reason, detail.replace(OTHER, NODE)) for reason, detail in refused(OTHER, to_orm)
    ] == refused(NODE, {})
    assert len(refused(OTHER, {})) == 3  # elsewhere, attempt 7, no such job

    orm_sent, one_sent = sent.sent[:by_orm], sent.sent[by_orm:]
    assert [name for name, _, _ in one_sent] == [name for name, _, _ in orm_sent]
    (one_ack,) = [_unwrap(m)["reports"] for name, m, _ in one_sent if name == "agent.ack"]
    (orm_ack,) = [_unwrap(m)["reports"] for name, m, _ in orm_sent if name == "agent.ack"]
    to_orm[999_999] = 999_999
    assert [{**key, "job_id": to_orm[key["job_id"]]} for key in one_ack] == orm_ack
    stops = [
        (to_orm.get(_unwrap(m)["job_id"], _unwrap(m)["job_id"]), _unwrap(m)["attempt"])
        for name, m, _ in sent.sent
        if name == "agent.stop"
    ]
    assert stops == [(orm_jobs[5].pk, 1), (orm_jobs[5].pk, 1)]  # the attempt moved on from

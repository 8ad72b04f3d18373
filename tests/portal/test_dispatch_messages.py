"""Messages to the agents: built from the database, safe to repeat, never raising on a
broker failure."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.agents.dispatch import record_dispatch, request_stop, send_launch, send_launches
from portal.agents.models import Dispatch
from portal.agents.testing import capture_sent_messages, register_node
from portal.celery import app
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU0 = stable_uuid("GPU", NODE, 0)


@pytest.fixture
def holding_job():
    team = make_team("vision", limit_units=None)
    alice = make_user("alice", team=team)
    register_node(NODE)
    job = make_job(team=team, user=alice, state=JobState.ASSIGNED, assigned_at=timezone.now())
    allocate(job, [GPU0])
    return job


def test_a_broker_failure_is_logged_not_raised_and_not_recorded_as_sent(
    holding_job, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise ConnectionError("broker is down")

    monkeypatch.setattr(app, "send_to_queue", broken)

    send_launch(holding_job.pk)

    assert "could not send agent.launch" in caplog.text
    assert not Dispatch.objects.exists()  # so the reaper sends it again
    assert Job.objects.get(pk=holding_job.pk).state == "ASSIGNED"


def test_a_launch_is_only_sent_for_an_assigned_job(holding_job):
    Job.objects.filter(pk=holding_job.pk).update(state=JobState.RUNNING)
    with capture_sent_messages() as sent:
        send_launch(holding_job.pk)
    assert sent.launches() == []


def test_a_stop_is_sent_only_when_asked_for_and_each_call_sends_it_again(holding_job, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "grace_period_s": 45.0}
    with capture_sent_messages() as sent:
        request_stop(holding_job.pk)
        assert sent.stops() == []

        Job.objects.filter(pk=holding_job.pk).update(
            stop_requested_at=timezone.now(), stop_reason="preempt"
        )
        request_stop(holding_job.pk)
        request_stop(holding_job.pk)

    expected = {
        "type": "stop",
        "v": 2,
        "node": NODE,
        "job_id": holding_job.pk,
        "attempt": 1,
        "reason": "preempt",
        "grace_s": 45.0,  # a preemption's grace comes from the scheduler's config
    }
    assert sent.stops() == [(expected, f"node.{NODE}")] * 2
    assert Dispatch.objects.get(job=holding_job, kind="stop").sends == 2


def test_a_job_that_cannot_be_expressed_as_a_launch_fails_and_frees_its_slices(holding_job):
    Job.objects.filter(pk=holding_job.pk).update(command=[])

    with capture_sent_messages() as sent:
        send_launch(holding_job.pk)

    job = Job.objects.get(pk=holding_job.pk)
    assert job.state == "FAILED"
    assert job.reason == "cannot be launched: launch.command: Expected `array` of length >= 1"
    assert sent.launches() == []
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_node_whose_agent_takes_batches_gets_its_launches_in_one_message():
    team = make_team("vision", limit_units=None)
    alice = make_user("alice", team=team)
    register_node("batching", launch_batches=True)
    register_node("single")
    jobs = {}
    for node in ("batching", "single"):
        for index in range(2):
            job = make_job(team=team, user=alice, state=JobState.ASSIGNED)
            allocate(job, [stable_uuid("GPU", node, index)])
            jobs.setdefault(node, []).append(job.pk)

    with capture_sent_messages() as sent:
        assert send_launches([pk for pks in jobs.values() for pk in pks]) == 4

    by_queue = sorted(
        (queue, message["type"], sorted(m["job_id"] for m in message.get("launches", [message])))
        for message, queue in sent.launches()
    )
    assert by_queue == [
        ("node.batching", "launches", jobs["batching"]),
        ("node.single", "launch", [jobs["single"][0]]),
        ("node.single", "launch", [jobs["single"][1]]),
    ]
    assert set(Dispatch.objects.values_list("job_id", flat=True)) == {
        pk for pks in jobs.values() for pk in pks
    }


def test_record_dispatch_keeps_the_first_send_and_counts_the_others():
    team, user = make_team("vision"), make_user("alice")
    job = make_job(team=team, user=user, state=JobState.ASSIGNED)
    other = make_job(team=team, user=user, state=JobState.ASSIGNED)
    first = timezone.now() - timedelta(minutes=5)
    later = first + timedelta(minutes=2)
    record_dispatch("launch", [(job.pk, 1)], first)
    record_dispatch("launch", [(job.pk, 1), (other.pk, 1), (job.pk, 1)], later)
    record_dispatch("stop", [(job.pk, 1)], later)

    rows = {
        (row.job_id, row.kind): (row.first_sent_at, row.last_sent_at, row.sends)
        for row in Dispatch.objects.filter(attempt=1)
    }
    assert rows == {
        (job.pk, "launch"): (first, later, 2),
        (other.pk, "launch"): (later, later, 1),
        (job.pk, "stop"): (later, later, 1),
    }

"""The reaper: lost agents (only once their lease lapsed), bounded requeues, and messages
that got no answer (a launch never started is asked about, never lost by a guess)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.agents.models import Dispatch, SeenNonce
from portal.agents.recovery import reap_lost_agents
from portal.agents.tasks import reap_lost_agents as reap_task
from portal.agents.testing import capture_sent_messages, register_node
from portal.cluster.models import Node
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU0 = stable_uuid("GPU", NODE, 0)
GPU1 = stable_uuid("GPU", NODE, 1)


@pytest.fixture
def setup(settings):
    settings.AGENT_LEASE_S = 30.0
    settings.JOB_MAX_RETRIES = 1
    settings.LAUNCH_RESEND_S = 30.0
    settings.LAUNCH_TIMEOUT_S = 600.0
    settings.STOP_RESEND_S = 30.0
    team = make_team("vision", limit_units=None)
    alice = make_user("alice", team=team)
    node = register_node(NODE)
    return team, alice, node


def _holding(team, user, key, *, state=JobState.RUNNING, ago_s=120.0, **fields) -> Job:
    job = make_job(team=team, user=user, state=state, **fields)
    allocate(job, [key])
    Job.objects.filter(pk=job.pk).update(assigned_at=timezone.now() - timedelta(seconds=ago_s))
    job.refresh_from_db()
    return job


def _silence(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_an_agent_past_its_lease_is_lost_and_its_jobs_are_requeued(setup):
    team, alice, node = setup
    running = _holding(team, alice, GPU0)
    assigned = _holding(team, alice, GPU1, state=JobState.ASSIGNED)
    _silence(node, 31)

    result = reap_lost_agents()

    assert (result.nodes_lost, result.jobs_lost) == (1, 2)
    assert Node.objects.get(pk=node.pk).state == Node.State.LOST
    for job in (running, assigned):
        job.refresh_from_db()
        assert (job.state, job.attempt) == ("PENDING", 1)
        assert list(job.events.values_list("to_state", flat=True))[-2:] == ["LOST", "PENDING"]
    assert not Allocation.objects.filter(released_at__isnull=True).exists()


def test_an_agent_within_its_lease_is_left_alone(setup):
    team, alice, node = setup
    job = _holding(team, alice, GPU0)
    _silence(node, 29)

    assert reap_lost_agents().as_dict() == {
        "nodes_lost": 0,
        "jobs_lost": 0,
        "launches_resent": 0,
        "launches_queried": 0,
        "stops_resent": 0,
        "nonces_forgotten": 0,
        "drain_stops": 0,
    }
    assert Job.objects.get(pk=job.pk).state == "RUNNING"


def test_a_job_lost_more_often_than_the_retries_allow_fails_with_the_reason(setup):
    team, alice, node = setup
    job = _holding(team, alice, GPU0, attempt=2)
    JobEvent.objects.create(job=job, at=timezone.now(), from_state="RUNNING", to_state="LOST")
    _silence(node, 60)

    reap_lost_agents()

    job.refresh_from_db()
    assert job.state == "FAILED"
    assert job.reason.startswith("lost 2 times (PORTAL_JOB_MAX_RETRIES=1)")


def test_a_launch_without_started_is_sent_again_but_not_on_every_beat(setup):
    team, alice, _node = setup
    job = _holding(team, alice, GPU0, state=JobState.ASSIGNED, ago_s=45)

    with capture_sent_messages() as sent:
        first = reap_lost_agents()
        second = reap_lost_agents()

    assert (first.launches_resent, second.launches_resent) == (1, 0)
    ((message, queue),) = sent.launches()
    assert (message["job_id"], message["attempt"], queue) == (job.pk, 1, f"node.{NODE}")
    assert [d["slice_id"] for d in message["devices"]] == [GPU0]
    dispatch = Dispatch.objects.get(job=job, kind="launch")
    assert (dispatch.attempt, dispatch.sends) == (1, 1)


def test_a_node_is_lost_only_after_its_lease_a_second_before_nothing_happens(setup):
    team, alice, node = setup
    job = _holding(team, alice, GPU0)
    last = timezone.now() - timedelta(seconds=5)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=last)
    events = job.events.count()

    early = reap_lost_agents(now=last + timedelta(seconds=30.0 - 1))

    assert (early.nodes_lost, early.jobs_lost) == (0, 0)
    assert Node.objects.get(pk=node.pk).state == Node.State.READY
    job.refresh_from_db()
    assert (job.state, job.events.count()) == ("RUNNING", events)

    late = reap_lost_agents(now=last + timedelta(seconds=30.0 + 1))

    assert (late.nodes_lost, late.jobs_lost) == (1, 1)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("PENDING", 1)
    lost, requeued = list(job.events.all())[-2:]
    assert (lost.from_state, lost.to_state) == ("RUNNING", "LOST")
    assert lost.message == f"lost: agent on {NODE} stopped sending heartbeats"
    assert requeued.to_state == "PENDING"
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_launch_not_started_in_time_is_asked_about_not_lost(setup, settings):
    settings.QUERY_RESEND_S = 10.0
    team, alice, _node = setup
    job = _holding(team, alice, GPU0, state=JobState.ASSIGNED, ago_s=601)
    events = job.events.count()

    with capture_sent_messages() as sent:
        result = reap_lost_agents()
        again = reap_lost_agents()

    assert (result.launches_queried, result.launches_resent, result.jobs_lost) == (1, 0, 0)
    assert again.launches_queried == 0  # asked within PORTAL_QUERY_RESEND_S already
    job.refresh_from_db()
    assert (job.state, job.attempt, job.events.count()) == ("ASSIGNED", 1, events)
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1
    assert sent.launches() == []
    assert sent.queries() == [
        ({"type": "query", "v": 2, "node": NODE, "job_id": job.pk, "attempt": 1}, f"node.{NODE}")
    ]
    assert Dispatch.objects.get(job=job, kind="query").sends == 1


def test_a_stop_not_answered_is_sent_again(setup):
    team, alice, _node = setup
    job = _holding(
        team,
        alice,
        GPU0,
        stop_requested_at=timezone.now() - timedelta(seconds=40),
        stop_reason="cancel",
    )

    with capture_sent_messages() as sent:
        first = reap_lost_agents()
        second = reap_lost_agents()

    assert (first.stops_resent, second.stops_resent) == (1, 0)
    assert sent.stops() == [
        (
            {
                "type": "stop",
                "v": 2,
                "node": NODE,
                "job_id": job.pk,
                "attempt": 1,
                "reason": "cancel",
                "grace_s": 10.0,
            },
            f"node.{NODE}",
        )
    ]


def test_the_beat_task_runs_the_reaper(setup):
    team, alice, node = setup
    _holding(team, alice, GPU0)
    _silence(node, 31)

    assert reap_task.apply().get()["jobs_lost"] == 1


def test_the_reaper_forgets_nonces_older_than_twice_the_allowed_skew(setup, settings):
    settings.MESSAGE_MAX_SKEW_S = 300.0
    now = timezone.now()
    SeenNonce.objects.create(node=NODE, nonce="old-nonce-1", seen_at=now - timedelta(seconds=601))
    SeenNonce.objects.create(node=NODE, nonce="new-nonce-1", seen_at=now - timedelta(seconds=599))

    assert reap_lost_agents(now=now).nonces_forgotten == 1

    assert set(SeenNonce.objects.values_list("nonce", flat=True)) >= {"new-nonce-1"}
    assert not SeenNonce.objects.filter(nonce="old-nonce-1").exists()

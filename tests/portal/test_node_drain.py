"""Cordon, drain and uncordon a node (portal.agents.drain), against real scheduling passes, the
reaper and agent reports as the agents send them: a cordoned node gets no new job, a drain
waits for its jobs and preempts (requeues) what still runs at the deadline, and the node is
drained once nothing holds its slices."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from portal.agents.drain import (
    DrainError,
    drains_enforce,
    node_cordon,
    node_drain,
    node_overviews,
    node_uncordon,
)
from portal.agents.recovery import reap_lost_agents
from portal.agents.testing import capture_sent_messages, deliver, finished, register_node
from portal.cluster.models import Node, NodeEvent
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from portal.scheduling.service import run_schedule_pass
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

TWO_GPUS = {"gpus": [{"mode": "whole", "count": 2}]}
A, B = "node-a", "node-b"


@pytest.fixture
def cluster(settings):
    # Long enough that no node of these tests is lost while the clock is moved on.
    settings.AGENT_LEASE_S = 3600.0
    settings.STOP_RESEND_S = 3600.0
    team = make_team("vision", guaranteed_units=4.0, limit_units=None)
    alice = make_user("alice", team=team)
    admin = make_user("root", site_admin=True)
    node_a = register_node(A, description=TWO_GPUS)
    node_b = register_node(B, description=TWO_GPUS)
    return team, alice, admin, node_a, node_b


def _gpu(node: str, index: int) -> str:
    return stable_uuid("GPU", node, index)


def _running(team, user, slice_key: str) -> Job:
    job = make_job(team=team, user=user, state=JobState.RUNNING)
    allocate(job, [slice_key])
    return job


def _pass(capture):
    with capture_sent_messages() as sent, capture(execute=True):
        result = run_schedule_pass()
    return result, sent


def _events(node: Node) -> list[tuple[str, str]]:
    return list(NodeEvent.objects.filter(node=node).values_list("kind", "by"))


def _status(node: Node) -> str:
    return node_overviews(name=node.name)[0].status


def test_a_cordoned_node_gets_no_new_job_and_its_jobs_run_on(
    cluster, django_capture_on_commit_callbacks
):
    team, alice, admin, node_a, node_b = cluster
    running = _running(team, alice, _gpu(A, 0))

    assert node_cordon(node=node_a, by=admin) is True

    assert (node_a.state, node_a.cordoned_by) == (Node.State.DRAINED, "root")
    assert _status(node_a) == "cordoned"
    event = NodeEvent.objects.get(node=node_a)
    assert (event.kind, event.by) == ("cordon", "root")
    assert event.message == f"cordoned: no new jobs; 1 job(s) hold its slices ({running.pk})"
    # node-a has a free GPU, node-b two: three jobs of one GPU, and node-a takes none.
    waiting = [make_job(team=team, user=alice, name=f"w{i}") for i in range(3)]
    result, sent = _pass(django_capture_on_commit_callbacks)

    placed = {
        j.pk: j.node.name if j.node else None for j in Job.objects.filter(pk__in=result.assigned)
    }
    assert sorted(placed.values()) == [B, B]
    assert {message["node"] for message, _ in sent.launches()} == {B}
    left = Job.objects.get(pk=(set(j.pk for j in waiting) - set(placed)).pop())
    assert left.state == JobState.PENDING and left.node is None
    assert not Allocation.objects.filter(slice__gpu__node=node_a, released_at__isnull=True).exclude(
        job=running
    )
    running.refresh_from_db()
    assert running.state == JobState.RUNNING and running.stop_requested_at is None
    # Cordoning again changes nothing and records nothing.
    assert node_cordon(node=node_a, by=admin) is False
    assert _events(node_a) == [("cordon", "root")]

    assert node_uncordon(node=node_a, by=admin) is True

    assert (node_a.state, node_a.cordoned_by, node_a.cordoned_at) == (Node.State.READY, "", None)
    assert _events(node_a) == [("cordon", "root"), ("uncordon", "root")]
    result, sent = _pass(django_capture_on_commit_callbacks)
    assert result.assigned == (left.pk,)
    left.refresh_from_db()
    assert (left.state, left.node.name) == (JobState.ASSIGNED, A)
    assert [message["node"] for message, _ in sent.launches()] == [A]


def test_a_drain_waits_then_preempts_at_the_deadline_and_the_jobs_are_requeued_elsewhere(
    cluster, django_capture_on_commit_callbacks
):
    team, alice, admin, node_a, node_b = cluster
    quick = _running(team, alice, _gpu(A, 0))
    slow = _running(team, alice, _gpu(A, 1))
    queued_since = slow.queued_since
    t0 = timezone.now()

    node_drain(node=node_a, by=admin, deadline_s=600, now=t0)

    assert node_a.drain_deadline_at == t0 + timedelta(seconds=600)
    assert _status(node_a) == "draining"
    drain = NodeEvent.objects.get(node=node_a)
    assert (drain.kind, drain.by) == ("drain", "root")
    assert "in 600 s" in drain.message and f"({quick.pk}, {slow.pk})" in drain.message
    # Before the deadline nothing is stopped; one job ends by itself meanwhile.
    assert reap_lost_agents(now=t0 + timedelta(seconds=300)).drain_stops == 0
    assert deliver(finished(quick.pk, 1, node=A)) == "finished"
    quick.refresh_from_db()
    assert quick.state == JobState.SUCCEEDED
    slow.refresh_from_db()
    assert slow.stop_requested_at is None

    # The reaper's drain step, past the deadline: the job still running is preempted.
    late = t0 + timedelta(seconds=601)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert reap_lost_agents(now=late).drain_stops == 1

    slow.refresh_from_db()
    assert (slow.state, slow.stop_reason, slow.stop_requested_at) == (
        JobState.RUNNING,
        "preempt",
        late,
    )
    assert "being drained by root and its deadline passed" in slow.events.last().message
    assert [(m["job_id"], m["attempt"], m["reason"], q) for m, q in sent.stops()] == [
        (slow.pk, 1, "preempt", f"node.{A}")
    ]
    preempt = NodeEvent.objects.filter(node=node_a).last()
    assert (preempt.kind, preempt.by) == ("preempt", "")
    assert preempt.message == (
        f"deadline passed: jobs {slow.pk} asked to stop (preempted, to be requeued)"
    )
    assert _status(node_a) == "draining"
    # The next reaper run asks nothing twice and records nothing new.
    assert drains_enforce(now=late + timedelta(seconds=2)) == 0
    assert NodeEvent.objects.filter(node=node_a).count() == 2

    # The agent stops it and says so: requeued, keeping its place, not failed or lost.
    assert deliver(finished(slow.pk, 1, node=A, outcome="preempted", exit_code=None)) == (
        "finished"
    )
    slow.refresh_from_db()
    assert (slow.state, slow.attempt, slow.queued_since) == (JobState.PENDING, 1, queued_since)
    states = list(slow.events.order_by("id").values_list("to_state", flat=True))
    assert states[-2:] == ["PREEMPTED", "PENDING"]
    assert not Allocation.objects.filter(slice__gpu__node=node_a, released_at__isnull=True)

    assert drains_enforce(now=late + timedelta(seconds=3)) == 0
    node_a.refresh_from_db()
    assert node_a.drain_deadline_at is None and node_a.state == Node.State.DRAINED
    assert _status(node_a) == "drained"
    assert _events(node_a) == [("drain", "root"), ("preempt", ""), ("drained", "")]

    # The requeued job runs again, once, on the node that is not drained.
    result, sent = _pass(django_capture_on_commit_callbacks)
    assert result.assigned == (slow.pk,)
    slow.refresh_from_db()
    assert (slow.state, slow.attempt, slow.node.name) == (JobState.ASSIGNED, 2, B)
    assert [(m["job_id"], m["attempt"], m["node"]) for m, _ in sent.launches()] == [(slow.pk, 2, B)]
    assigned = JobEvent.objects.filter(job=slow, to_state=JobState.ASSIGNED)
    assert list(assigned.values_list("attempt", flat=True)) == [2]


def test_a_drain_with_deadline_zero_preempts_at_once(cluster, django_capture_on_commit_callbacks):
    team, alice, admin, node_a, _ = cluster
    # Not preemptible by the scheduler's rules, yet the operator's deadline wins.
    job = _running(team, alice, _gpu(A, 0))
    Job.objects.filter(pk=job.pk).update(preemptible=False)

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        node_drain(node=node_a, by=admin, deadline_s=0)

    job.refresh_from_db()
    assert job.stop_reason == "preempt" and job.stop_requested_at is not None
    assert [(m["job_id"], m["reason"]) for m, _ in sent.stops()] == [(job.pk, "preempt")]
    assert [kind for kind, _ in _events(node_a)] == ["drain", "preempt"]


def test_an_idle_node_is_drained_at_once(cluster):
    _, _, admin, node_a, _ = cluster

    node_drain(node=node_a, by=admin, deadline_s=3600)

    assert node_a.drain_deadline_at is None and node_a.state == Node.State.DRAINED
    assert _status(node_a) == "drained"
    assert _events(node_a) == [("drain", "root"), ("drained", "")]
    assert drains_enforce() == 0


def test_cordon_calls_a_drain_off_and_its_jobs_are_not_preempted(cluster):
    team, alice, admin, node_a, _ = cluster
    job = _running(team, alice, _gpu(A, 0))
    t0 = timezone.now()
    node_drain(node=node_a, by=admin, deadline_s=60, now=t0)

    assert node_cordon(node=node_a, by=admin) is True

    assert node_a.state == Node.State.DRAINED and node_a.drain_deadline_at is None
    assert _status(node_a) == "cordoned"
    assert drains_enforce(now=t0 + timedelta(seconds=120)) == 0
    job.refresh_from_db()
    assert job.stop_requested_at is None
    assert [kind for kind, _ in _events(node_a)] == ["drain", "drain_called_off"]


def test_a_second_drain_moves_the_deadline(cluster):
    team, alice, admin, node_a, _ = cluster
    _running(team, alice, _gpu(A, 0))
    t0 = timezone.now()
    node_drain(node=node_a, by=admin, deadline_s=60, now=t0)

    node_drain(node=node_a, by=admin, deadline_s=7200, now=t0 + timedelta(seconds=10))

    assert node_a.drain_deadline_at == t0 + timedelta(seconds=7210)
    assert drains_enforce(now=t0 + timedelta(seconds=120)) == 0
    assert "(was " in NodeEvent.objects.filter(node=node_a).last().message


@pytest.mark.parametrize("value", [None, "", -1, 604801, 1.5, "soon", True, [60], {"s": 1}])
def test_a_bad_deadline_is_refused_naming_the_field_and_the_allowed_values(cluster, value):
    _, _, admin, node_a, _ = cluster

    with pytest.raises(DrainError) as refused:
        node_drain(node=node_a, by=admin, deadline_s=value)

    assert list(refused.value.errors) == ["deadline_s"]
    assert "from 0 (preempt at once) to 604800 (7 days)" in refused.value.errors["deadline_s"]
    node_a.refresh_from_db()
    assert node_a.state == Node.State.READY and not NodeEvent.objects.exists()


@pytest.mark.parametrize("value", [0, 604800, "3600", 120.0])
def test_a_good_deadline_is_taken(cluster, value):
    team, alice, admin, node_a, _ = cluster
    _running(team, alice, _gpu(A, 0))
    t0 = timezone.now()

    node_drain(node=node_a, by=admin, deadline_s=value, now=t0)

    assert node_a.state == Node.State.DRAINED
    assert NodeEvent.objects.filter(node=node_a, kind="drain").exists()


def test_only_site_admins_may_cordon_drain_or_uncordon(cluster):
    _, alice, _, node_a, _ = cluster

    for action in (
        lambda: node_cordon(node=node_a, by=alice),
        lambda: node_uncordon(node=node_a, by=alice),
        lambda: node_drain(node=node_a, by=alice, deadline_s=60),
    ):
        with pytest.raises(PermissionDenied):
            action()

    node_a.refresh_from_db()
    assert node_a.state == Node.State.READY and not NodeEvent.objects.exists()


def test_uncordon_of_a_node_whose_agent_is_silent_marks_it_lost(cluster):
    _, _, admin, node_a, _ = cluster
    node_cordon(node=node_a, by=admin)
    Node.objects.filter(pk=node_a.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=3601)
    )

    assert node_uncordon(node=node_a, by=admin) is True

    assert node_a.state == Node.State.LOST
    assert "silent" in NodeEvent.objects.filter(node=node_a).last().message


def test_a_heartbeat_keeps_a_node_cordoned(cluster):
    _, _, admin, node_a, _ = cluster
    node_cordon(node=node_a, by=admin)

    register_node(A, description=TWO_GPUS)

    node_a.refresh_from_db()
    assert node_a.state == Node.State.DRAINED


def test_the_overview_counts_slices_and_jobs_per_node(cluster, django_assert_num_queries):
    team, alice, admin, node_a, node_b = cluster
    job = _running(team, alice, _gpu(A, 1))
    node_drain(node=node_a, by=admin, deadline_s=600)

    with django_assert_num_queries(3):
        overviews = node_overviews()

    a, b = overviews
    assert (a.name, a.status, a.cordoned, a.slices, a.slices_held, a.jobs_running) == (
        A,
        "draining",
        True,
        2,
        1,
        1,
    )
    assert a.job_ids == (job.pk,) and a.units_held == 1.0 and a.drain_deadline_at is not None
    assert (b.name, b.status, b.cordoned, b.slices_held, b.job_ids) == (B, "ready", False, 0, ())

"""Multi-node gangs run as one job: every node's launch carries the rendezvous, the job is
RUNNING once all nodes started, one node failing or lost stops the others, each node's
slices are freed when its part stopped, and the job ends when all parts ended."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.accounting.models import UsageRecord
from portal.agents.dispatch import send_launch
from portal.agents.recovery import reap_lost_agents
from portal.agents.testing import (
    capture_sent_messages,
    deliver,
    finished,
    log_chunk,
    register_node,
    started,
)
from portal.cluster.models import Node, Slice
from portal.jobs.attempts import GANG_STOP
from portal.jobs.models import Allocation, GangPart, Job, JobEvent, JobState
from portal.jobs.selectors import job_log
from portal.jobs.testing import make_job, make_team, make_user
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

S = JobState
A, B = "gpu-a", "gpu-b"
A_ADDRESS, B_ADDRESS = "10.0.0.1", "10.0.0.2"


def _gpus(node: str, count: int) -> list[str]:
    return [stable_uuid("GPU", node, index) for index in range(count)]


@pytest.fixture
def gang():
    """A 4-GPU gang ASSIGNED (attempt 1) to 3 GPUs of gpu-a (its first node) and 1 of gpu-b."""
    register_node(A, description={"gpus": [{"mode": "whole", "count": 3}]}, address=A_ADDRESS)
    register_node(B, description={"gpus": [{"mode": "whole", "count": 2}]}, address=B_ADDRESS)
    team = make_team("vision", limit_units=None)
    job = make_job(
        team=team,
        user=make_user("alice", team=team),
        state=S.ASSIGNED,
        gpu_count=4,
        multi_node=True,
        env={"MASTER_PORT": "1", "EPOCHS": "3"},
        node=Node.objects.get(name=A),
        assigned_at=timezone.now() - timedelta(seconds=60),
    )
    for key in [*_gpus(A, 3), _gpus(B, 1)[0]]:
        Allocation.objects.create(
            job=job,
            attempt=1,
            slice=Slice.objects.get(key=key),
            created_at=timezone.now() - timedelta(seconds=60),
        )
    return job


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _held_on(job: Job) -> dict[str, int]:
    held: dict[str, int] = {}
    for name in Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
        "slice__gpu__node__name", flat=True
    ):
        held[name] = held.get(name, 0) + 1
    return held


def _run_both(job: Job) -> None:
    assert deliver(started(job.pk, 1, node=A)) == "started"
    assert deliver(started(job.pk, 1, node=B)) == "started"
    assert _state(job) == S.RUNNING


# --- the launch ------------------------------------------------------------------------------


def test_each_node_of_a_gang_is_launched_with_its_rank_and_the_rendezvous_env(gang, settings):
    settings.GANG_PORT_BASE, settings.GANG_PORTS = 40000, 10
    with capture_sent_messages() as sent:
        send_launch(gang.pk)
    launches = {queue: message for message, queue in sent.launches()}
    port = str(40000 + gang.pk % 10)
    common = {
        "EPOCHS": "3",
        "MASTER_ADDR": A_ADDRESS,
        "MASTER_PORT": port,  # the portal's, over the user's "1"
        "WORLD_SIZE": "4",
        "NNODES": "2",
        "PORTAL_GANG_HOSTS": f"{A_ADDRESS},{B_ADDRESS}",
        "PORTAL_GANG_SLOTS": f"{A_ADDRESS}:3,{B_ADDRESS}:1",
    }
    assert launches["node.gpu-a"]["env"] == {
        **common,
        "RANK": "0",
        "NODE_RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "3",
    }
    assert launches["node.gpu-b"]["env"] == {
        **common,
        "RANK": "3",  # its first process comes after gpu-a's three
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    assert [d["slice_id"] for d in launches["node.gpu-b"]["devices"]] == _gpus(B, 1)


def test_the_first_node_is_rank_0_whatever_its_name_and_an_older_agent_is_reached_by_hostname(
    gang,
):
    # gpu-b is the first node now, and its agent is older than the address field.
    register_node(B, description={"gpus": [{"mode": "whole", "count": 2}]}, address="")
    Job.objects.filter(pk=gang.pk).update(node=Node.objects.get(name=B))
    with capture_sent_messages() as sent:
        send_launch(gang.pk)
    envs = {queue: message["env"] for message, queue in sent.launches()}
    hostname = Node.objects.get(name=B).hostname
    assert envs["node.gpu-b"]["NODE_RANK"] == "0" and envs["node.gpu-b"]["RANK"] == "0"
    assert envs["node.gpu-a"]["NODE_RANK"] == "1" and envs["node.gpu-a"]["RANK"] == "1"
    assert {env["MASTER_ADDR"] for env in envs.values()} == {hostname}
    assert envs["node.gpu-a"]["PORTAL_GANG_SLOTS"] == f"{hostname}:1,{A_ADDRESS}:3"


def test_a_single_node_job_gets_no_rendezvous(gang):
    Job.objects.filter(pk=gang.pk).update(multi_node=False)
    with capture_sent_messages() as sent:
        send_launch(gang.pk)
    for message, _ in sent.launches():
        assert message["env"] == {"MASTER_PORT": "1", "EPOCHS": "3"}


# --- starting -------------------------------------------------------------------------------


def test_a_gang_is_running_only_once_every_node_started_and_repeats_change_nothing(gang):
    first_start = time.time() - 5
    assert deliver(started(gang.pk, 1, node=A, at=first_start)) == "started"
    assert _state(gang) == S.ASSIGNED
    events = JobEvent.objects.filter(job=gang).count()
    assert deliver(started(gang.pk, 1, node=A, at=first_start)) == "started"  # a repeat
    assert JobEvent.objects.filter(job=gang).count() == events
    assert _state(gang) == S.ASSIGNED

    last_start = time.time() - 1
    deliver(started(gang.pk, 1, node=B, at=last_start))
    job = Job.objects.get(pk=gang.pk)
    assert job.state == S.RUNNING
    # All ranks run from the last node's start.
    assert job.started_at.timestamp() == pytest.approx(last_start, abs=1e-3)
    assert list(GangPart.objects.filter(job=gang).values_list("node__name", "rank", "outcome")) == [
        (A, 0, ""),
        (B, 1, ""),
    ]
    messages = list(JobEvent.objects.filter(job=gang).values_list("message", flat=True))
    assert "rank 0 started on gpu-a (1 of 2 nodes)" in messages
    assert messages[-1] == "started on all 2 nodes"


def test_a_finished_part_that_overtook_its_started_counts_as_started(gang):
    deliver(started(gang.pk, 1, node=A))
    deliver(finished(gang.pk, 1, node=B, started_at=time.time() - 2))
    assert _state(gang) == S.RUNNING
    assert _held_on(gang) == {A: 3}


# --- ending ---------------------------------------------------------------------------------


def test_one_node_failing_stops_the_others_and_the_gang_fails_with_its_exit_code(
    gang, django_capture_on_commit_callbacks
):
    _run_both(gang)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        deliver(finished(gang.pk, 1, node=B, outcome="failed", exit_code=3, error="exit code 3"))
    job = Job.objects.get(pk=gang.pk)
    assert (job.state, job.stop_reason) == (S.RUNNING, GANG_STOP)
    # gpu-b's part stopped: its slice is free; gpu-a's part still holds its three.
    assert _held_on(gang) == {A: 3}
    stops = sent.stops()
    assert [(m["job_id"], m["attempt"], m["reason"], q) for m, q in stops] == [
        (gang.pk, 1, "cancel", "node.gpu-a")
    ]
    assert not UsageRecord.objects.filter(job=gang).exists()

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        deliver(finished(gang.pk, 1, node=B, outcome="failed", exit_code=3))  # a repeat
    assert sent.stops() == [] and _held_on(gang) == {A: 3}

    deliver(finished(gang.pk, 1, node=A, outcome="cancelled", exit_code=143))
    job = Job.objects.get(pk=gang.pk)
    assert (job.state, job.exit_code, job.reason) == (
        S.FAILED,
        3,
        "rank 1 on gpu-b: exit code 3",
    )
    assert _held_on(gang) == {}
    assert UsageRecord.objects.filter(job=gang, attempt=1).count() == 1


def test_a_gang_succeeds_when_every_node_succeeded_and_frees_each_nodes_slices_as_it_ends(
    gang, django_capture_on_commit_callbacks
):
    _run_both(gang)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        deliver(finished(gang.pk, 1, node=A))
    assert _state(gang) == S.RUNNING
    assert _held_on(gang) == {B: 1}
    assert sent.stops() == []  # a part that succeeded stops nobody

    deliver(finished(gang.pk, 1, node=B))
    job = Job.objects.get(pk=gang.pk)
    assert (job.state, job.exit_code, job.reason) == (S.SUCCEEDED, 0, "")
    assert _held_on(gang) == {}
    assert (
        JobEvent.objects.filter(job=gang).last().message == "succeeded on all 2 nodes, exit code 0"
    )


def test_each_slice_is_charged_until_its_own_part_ended(gang):
    _run_both(gang)
    now = timezone.now()
    Allocation.objects.filter(job=gang).update(created_at=now - timedelta(seconds=200))
    deliver(finished(gang.pk, 1, node=B, at=time.time()))
    # As if gpu-b's part had ended (and its slice been freed) 100 s ago.
    Allocation.objects.filter(job=gang, released_at__isnull=False).update(
        released_at=now - timedelta(seconds=100)
    )
    deliver(finished(gang.pk, 1, node=A, at=now.timestamp()))
    record = UsageRecord.objects.get(job=gang, attempt=1)
    assert record.gpu_units == pytest.approx(4.0)
    # gpu-b's 1 unit for 100 s and gpu-a's 3 units for 200 s.
    assert record.unit_seconds == pytest.approx(1 * 100 + 3 * 200, rel=0.01)


def test_a_cancelled_gang_ends_cancelled_once_every_node_stopped(gang):
    from portal.jobs.services import job_cancel

    _run_both(gang)
    job_cancel(job=Job.objects.get(pk=gang.pk), user=gang.user)
    deliver(finished(gang.pk, 1, node=A, outcome="cancelled", exit_code=143))
    assert _state(gang) == S.RUNNING
    deliver(finished(gang.pk, 1, node=B, outcome="cancelled", exit_code=143))
    assert _state(gang) == S.CANCELLED


def test_a_lost_node_has_the_others_stopped_and_the_gang_requeued_once_they_stopped(gang):
    _run_both(gang)
    Node.objects.filter(name=B).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with capture_sent_messages() as sent:
        result = reap_lost_agents()
    assert result.nodes_lost == 1
    assert _state(gang) == S.RUNNING  # gpu-a's part still runs: not requeued under it
    assert _held_on(gang) == {A: 3}
    assert [(m["reason"], q) for m, q in sent.stops()] == [("cancel", "node.gpu-a")]
    part = GangPart.objects.get(job=gang, node__name=B)
    assert (part.outcome, part.error) == ("lost", "agent on gpu-b stopped sending heartbeats")

    deliver(finished(gang.pk, 1, node=A, outcome="cancelled", exit_code=143))
    job = Job.objects.get(pk=gang.pk)
    assert (job.state, job.attempt, job.stop_reason) == (S.PENDING, 1, "")
    assert _held_on(gang) == {}
    lost = JobEvent.objects.get(job=gang, to_state=S.LOST)
    assert lost.message == (
        "lost: lost on gpu-b (rank 1 of 2 nodes): rank 1 on gpu-b: "
        "agent on gpu-b stopped sending heartbeats"
    )


def test_a_gang_lost_more_often_than_the_retries_allow_fails(gang, settings):
    settings.JOB_MAX_RETRIES = 0
    _run_both(gang)
    deliver(finished(gang.pk, 1, node=A, outcome="fenced", exit_code=None))
    deliver(finished(gang.pk, 1, node=B, outcome="cancelled", exit_code=143))
    job = Job.objects.get(pk=gang.pk)
    assert job.state == S.FAILED
    assert job.reason.startswith("lost 1 times (PORTAL_JOB_MAX_RETRIES=0)")


def test_each_nodes_output_is_kept_apart_and_the_log_shows_rank_0(gang):
    _run_both(gang)
    deliver(log_chunk(gang.pk, 1, 0, "rank 0 says hi\n", node=A))
    deliver(log_chunk(gang.pk, 1, 0, "rank 1 says hi\n", node=B))
    deliver(log_chunk(gang.pk, 1, 0, "rank 1 says hi\n", node=B))  # a repeat
    chunks = list(gang.log_chunks.values_list("part", "seq", "data"))
    assert chunks == [(0, 0, "rank 0 says hi\n"), (1, 0, "rank 1 says hi\n")]
    assert job_log(job=Job.objects.get(pk=gang.pk)) == "rank 0 says hi\n"


def test_a_heartbeat_records_where_the_node_is_reached(gang):
    assert Node.objects.get(name=A).address == A_ADDRESS
    register_node(A, description={"gpus": [{"mode": "whole", "count": 3}]}, address="fd00::7")
    assert Node.objects.get(name=A).address == "fd00::7"


def test_a_late_success_of_one_part_never_ends_a_requeued_gang(gang):
    _run_both(gang)
    Node.objects.filter(name=B).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    reap_lost_agents()
    deliver(finished(gang.pk, 1, node=A, outcome="cancelled", exit_code=143))
    assert _state(gang) == S.PENDING
    # gpu-b comes back with the result its part had before its node was cut off.
    register_node(B, description={"gpus": [{"mode": "whole", "count": 2}]}, address=B_ADDRESS)
    deliver(finished(gang.pk, 1, node=B, outcome="succeeded", exit_code=0))
    assert _state(gang) == S.PENDING


def test_a_gang_not_started_in_time_is_asked_about_on_every_node(gang, settings):
    settings.LAUNCH_TIMEOUT_S = 30
    deliver(started(gang.pk, 1, node=A))  # gpu-b's part never starts
    with capture_sent_messages() as sent:
        result = reap_lost_agents()
    assert result.launches_queried == 2
    assert sorted(q for _, q in sent.queries()) == ["node.gpu-a", "node.gpu-b"]
    # gpu-b has no record of it: its part is lost, gpu-a's is stopped.
    with capture_sent_messages() as sent:
        deliver(finished(gang.pk, 1, node=B, outcome="unknown", exit_code=None))
    assert GangPart.objects.get(job=gang, node__name=B).outcome == "unknown"
    assert Job.objects.get(pk=gang.pk).stop_reason == GANG_STOP


def test_the_stop_of_a_gang_whose_first_node_was_lost_is_sent_again_to_the_others(gang, settings):
    settings.STOP_RESEND_S = 0
    _run_both(gang)
    Node.objects.filter(name=A).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with capture_sent_messages() as sent:
        reap_lost_agents()
    assert [q for _, q in sent.stops()] == ["node.gpu-b"]
    with capture_sent_messages() as sent:
        result = reap_lost_agents()  # that stop got no answer
    assert result.stops_resent == 1
    assert [q for _, q in sent.stops()] == ["node.gpu-b"]
    assert _state(gang) == S.RUNNING  # not lost again: gpu-b's part still runs


def test_a_heartbeat_of_a_node_whose_part_ended_does_not_ask_about_the_gang(
    gang, settings, django_capture_on_commit_callbacks
):
    settings.RECONCILE_GRACE_S = 0
    _run_both(gang)
    Job.objects.filter(pk=gang.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    deliver(finished(gang.pk, 1, node=A))  # rank 0 is done; gpu-b's part runs on
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        register_node(A, description={"gpus": [{"mode": "whole", "count": 3}]}, address=A_ADDRESS)
        # gpu-b's heartbeat not listing its running part is asked about, as for any job.
        register_node(B, description={"gpus": [{"mode": "whole", "count": 2}]}, address=B_ADDRESS)
    assert [q for _, q in sent.queries()] == ["node.gpu-b"]

"""A node's inventory changes under its jobs (a GPU fell off the bus, a new MIG layout): the
heartbeat that says so drains the slices that went, asks their attempts to stop with the
reason, records the change on the node; the agent's `finished` ends them LOST with that
reason, requeued within the retry bound; a GPU that comes back is placeable again."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.agents.testing import capture_sent_messages, deliver, finished, heartbeat, register_node
from portal.cluster.models import NodeEvent, Slice
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from portal.policy import scheduler_config
from portal.scheduling.snapshot import load_snapshot
from workers.inventory import DEFAULT_DESCRIPTION, described_inventory, stable_uuid
from workers.protocol import Inventory, LostGpu

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU0 = stable_uuid("GPU", NODE, 0)
GPU2 = stable_uuid("GPU", NODE, 2)
OFF_THE_BUS = f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 0 ({GPU0}): off the bus"
FULL = described_inventory(NODE, DEFAULT_DESCRIPTION)


def without_gpu0(reason: str = OFF_THE_BUS) -> Inventory:
    """The default node's inventory as its agent reports it once GPU 0 is lost."""
    return Inventory(
        hostname=NODE,
        driver="nvml",
        gpus=FULL.gpus[1:],
        lost=(LostGpu(uuid=GPU0, index=0, reason=reason),),
    )


def beat(inventory: Inventory, **kwargs) -> None:
    assert deliver(heartbeat(NODE, inventory=inventory, **kwargs)) == "heartbeat"


def placeable() -> set[str]:
    return set(load_snapshot(now=timezone.now(), config=scheduler_config()).slice_pks)


def events() -> list[tuple[str, str]]:
    return list(NodeEvent.objects.filter(node__name=NODE).values_list("kind", "message"))


@pytest.fixture
def running_on_gpu0() -> Job:
    register_node(NODE)
    team = make_team("vision", limit_units=None)
    job = make_job(team=team, user=make_user("alice", team=team), state=JobState.RUNNING)
    allocate(job, [GPU0])
    return job


def test_registration_and_unchanged_heartbeats_record_no_node_event() -> None:
    register_node(NODE)
    register_node(NODE)
    assert events() == []


def test_a_lost_gpu_is_drained_its_job_asked_to_stop_and_the_change_recorded_on_the_node(
    running_on_gpu0: Job, django_capture_on_commit_callbacks
) -> None:
    job = running_on_gpu0
    assert GPU0 in placeable()
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        beat(without_gpu0())
    assert not Slice.objects.get(key=GPU0).present
    assert GPU0 not in placeable()
    job.refresh_from_db()
    assert (job.state, job.stop_reason) == (JobState.RUNNING, "gpu_lost")
    assert job.stop_requested_at is not None
    stops = [(m["job_id"], m["reason"], queue) for m, queue in sent.stops()]
    assert stops == [(job.pk, "cancel", f"node.{NODE}")]
    assert JobEvent.objects.filter(job=job).order_by("-pk").first().message == (
        f"stop requested: {OFF_THE_BUS}"
    )
    assert events() == [
        (
            "gpu_lost",
            f"{OFF_THE_BUS}; slices drained: {GPU0}; jobs {job.pk} asked to stop (GPU_LOST, "
            "requeued within their retries)",
        )
    ]
    # Its slice stays held until the agent says the attempt stopped: never run twice.
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1


def test_the_agents_lost_report_requeues_the_job_with_the_reason(
    running_on_gpu0: Job, settings
) -> None:
    settings.JOB_MAX_RETRIES = 2
    job = running_on_gpu0
    beat(without_gpu0())
    deliver(finished(job.pk, job.attempt, outcome="lost", exit_code=143, error=OFF_THE_BUS))
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    messages = list(
        JobEvent.objects.filter(job=job).order_by("pk").values_list("message", flat=True)
    )
    assert messages[-2:] == [
        f"lost: lost on {NODE}: {OFF_THE_BUS}",
        "requeued after loss 1 of 3 allowed",
    ]
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_job_the_agent_reports_cancelled_for_the_stop_is_lost_with_the_portals_reason(
    running_on_gpu0: Job,
) -> None:
    job = running_on_gpu0
    beat(without_gpu0())
    deliver(
        finished(job.pk, job.attempt, outcome="cancelled", exit_code=143, error="stopped: cancel")
    )
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    lost = JobEvent.objects.get(job=job, to_state=JobState.LOST)
    assert lost.message == (
        f"lost: GPU_LOST: its slices left the inventory of {NODE} (cancelled on {NODE}: "
        "stopped: cancel)"
    )


def test_past_the_retry_bound_a_gpu_loss_fails_the_job_saying_why(
    running_on_gpu0: Job, settings
) -> None:
    settings.JOB_MAX_RETRIES = 0
    job = running_on_gpu0
    beat(without_gpu0())
    deliver(finished(job.pk, job.attempt, outcome="lost", exit_code=143, error=OFF_THE_BUS))
    job.refresh_from_db()
    assert (job.state, job.reason) == (
        JobState.FAILED,
        f"lost 1 times (PORTAL_JOB_MAX_RETRIES=0); last: lost on {NODE}: {OFF_THE_BUS}",
    )


def test_an_attempt_whose_end_comes_in_the_same_heartbeat_is_not_asked_to_stop(
    running_on_gpu0: Job, django_capture_on_commit_callbacks
) -> None:
    job = running_on_gpu0
    ended = finished(job.pk, job.attempt, outcome="lost", exit_code=143, error=OFF_THE_BUS)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        beat(without_gpu0(), finished=[ended])
    job.refresh_from_db()
    assert (job.state, job.stop_reason) == (JobState.PENDING, "")
    assert sent.stops() == []
    assert events() == [("gpu_lost", f"{OFF_THE_BUS}; slices drained: {GPU0}; no job held them")]


def test_a_gpu_that_comes_back_is_placeable_again_and_says_so(running_on_gpu0: Job) -> None:
    job = running_on_gpu0
    beat(without_gpu0())
    deliver(finished(job.pk, job.attempt, outcome="lost", exit_code=143, error=OFF_THE_BUS))
    beat(FULL)
    assert Slice.objects.get(key=GPU0).present
    assert GPU0 in placeable()
    assert events()[-1] == (
        "gpu_back",
        f"GPU 0 ({GPU0}) is in the inventory again: 1 slice(s) placeable ({GPU0})",
    )


def test_a_new_mig_layout_stops_the_jobs_on_the_instances_that_went_and_offers_the_new_ones() -> (
    None
):
    register_node(NODE)
    team = make_team("vision", limit_units=None)
    old = sorted(Slice.objects.filter(gpu__uuid=GPU2).values_list("key", flat=True))
    on_2g = Slice.objects.get(gpu__uuid=GPU2, profile="2g.20gb")
    job = make_job(team=team, user=make_user("alice", team=team), state=JobState.RUNNING)
    allocate(job, [on_2g.key])
    relaid = {
        "gpus": [
            {"mode": "whole", "count": 2},
            {"mode": "mig", "mig": ["7g.80gb"]},
            {"mode": "mps", "mps_shares": 4},
        ]
    }
    register_node(NODE, description=relaid)
    new = stable_uuid("MIG", NODE, 2, 0, "7g.80gb")
    assert new in placeable()
    assert not set(old) & placeable()
    job.refresh_from_db()
    assert job.stop_reason == "mig_reconfigured"
    assert events() == [
        (
            "reconfigured",
            f"MIG_RECONFIGURED: GPU 2 ({GPU2}) now has MIG 7g.80gb; slices gone: "
            f"{', '.join(old)}; new slices: {new}; jobs {job.pk} asked to stop "
            "(MIG_RECONFIGURED, requeued within their retries)",
        )
    ]
    reason = f"MIG_RECONFIGURED: GPU 2 ({GPU2}) now has MIG 7g.80gb"
    deliver(finished(job.pk, job.attempt, outcome="lost", exit_code=143, error=reason))
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert JobEvent.objects.get(job=job, to_state=JobState.LOST).message == (
        f"lost: lost on {NODE}: {reason}"
    )

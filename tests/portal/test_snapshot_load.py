"""The snapshot the core sees: exactly what the database holds, in a fixed number of queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.accounting.models import UsageBalance, UsageRecord
from portal.cluster.models import Node
from portal.jobs.models import JobDependency, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.policy import scheduler_config
from portal.scheduling.snapshot import load_snapshot
from scheduler.model import (
    Dependency,
    DependencyKind,
    DependencyState,
    GpuRequest,
    Job,
    RunningJob,
    Slice,
    SliceKind,
)
from scheduler.model import Node as CoreNode

pytestmark = pytest.mark.django_db

HALF_LIFE = 3600.0
SNAPSHOT_QUERIES = 10


@pytest.fixture
def config(settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "usage_half_life_s": HALF_LIFE}
    return scheduler_config()


@pytest.fixture
def world():
    now = timezone.now().replace(microsecond=0)
    vision = make_team(
        "vision",
        weight=2.0,
        guaranteed_units=2.0,
        limit_units=4.0,
        max_priority="high",
        member_limit_units=2.0,
        budget_gpu_hours=100.0,
    )
    nlp = make_team("nlp", weight=1.0, guaranteed_units=0.0, limit_units=None)
    alice = make_user("alice", team=vision)
    bob = make_user("bob", team=nlp)
    make_node(
        "node-a",
        gpus=[
            {"mode": "whole"},
            {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]},
            {"mode": "mps", "shares": 2},
        ],
    )
    make_node("node-b", gpus=[{"mode": "whole", "model": "Tesla T4"}])
    Node.objects.filter(name="node-b").update(state=Node.State.DRAINED)
    make_node("node-c", gpus=[{"mode": "whole"}])
    Node.objects.filter(name="node-c").update(state=Node.State.LOST)

    done = make_job(team=vision, user=alice, state=JobState.SUCCEEDED, name="done")
    broke = make_job(team=vision, user=alice, state=JobState.FAILED, name="broke")
    gang = make_job(
        team=vision,
        user=alice,
        name="gang",
        gpu_count=2,
        gpu_min_count=1,
        priority="high",
        time_limit_s=100,
        preemptible=False,
        submitted_at=now - timedelta(seconds=50),
    )
    # Requeued once: it keeps the place it first queued at.
    gang.queued_since = now - timedelta(seconds=40)
    gang.save(update_fields=["queued_since"])
    JobDependency.objects.create(job=gang, depends_on=done, kind="after_ok")
    JobDependency.objects.create(job=gang, depends_on=broke, kind="after_any")
    small = make_job(
        team=nlp,
        user=bob,
        name="small",
        gpu_kind="mig",
        gpu_profile="1g.10gb",
        gpu_model="NVIDIA A100",
        submitted_at=now - timedelta(seconds=30),
        attempt=2,
    )
    runner = make_job(
        team=vision,
        user=alice,
        name="runner",
        state=JobState.RUNNING,
        submitted_at=now - timedelta(seconds=500),
        assigned_at=now - timedelta(seconds=100),
        started_at=now - timedelta(seconds=90),
        borrowed=True,
        stop_requested_at=now - timedelta(seconds=5),
        stop_reason="preempt",
        time_limit_s=3600,
    )
    allocate(runner, ["GPU-node-a-0"])
    # Its allocation row was written now; the hold began at assignment.
    runner.allocations.update(created_at=now - timedelta(seconds=100))

    UsageBalance.objects.create(team=vision, unit_seconds=1000.0, as_of=now - timedelta(hours=1))
    UsageBalance.objects.create(team=vision, user=alice, unit_seconds=200.0, as_of=now)
    UsageRecord.objects.create(
        job=done,
        attempt=1,
        team=vision,
        user=alice,
        gpu_units=1.0,
        started_at=now - timedelta(hours=3),
        ended_at=now - timedelta(hours=1),
        unit_seconds=7200.0,
    )
    return {
        "now": now,
        "gang": gang,
        "small": small,
        "runner": runner,
        "done": done,
        "broke": broke,
    }


def test_it_loads_visible_nodes_with_present_slices_in_a_stable_order(world, config):
    snapshot = load_snapshot(now=world["now"], config=config).snapshot

    a100, t4 = "NVIDIA A100", "Tesla T4"
    assert snapshot.nodes == (
        CoreNode(
            name="node-a",
            slices=(
                Slice("GPU-node-a-0", "node-a", "GPU-node-a-0", SliceKind.WHOLE, 1.0, a100),
                Slice(
                    "MIG-node-a-1-0",
                    "node-a",
                    "GPU-node-a-1",
                    SliceKind.MIG,
                    3 / 7,
                    a100,
                    "3g.40gb",
                ),
                Slice(
                    "MIG-node-a-1-1",
                    "node-a",
                    "GPU-node-a-1",
                    SliceKind.MIG,
                    1 / 7,
                    a100,
                    "1g.10gb",
                ),
                Slice("GPU-node-a-2/mps/0", "node-a", "GPU-node-a-2", SliceKind.MPS, 0.5, a100),
                Slice("GPU-node-a-2/mps/1", "node-a", "GPU-node-a-2", SliceKind.MPS, 0.5, a100),
            ),
            schedulable=True,
        ),
        CoreNode(
            name="node-b",
            slices=(Slice("GPU-node-b-0", "node-b", "GPU-node-b-0", SliceKind.WHOLE, 1.0, t4),),
            schedulable=False,
        ),
    )


def test_it_loads_pending_jobs_with_requests_dependencies_and_times(world, config):
    now = world["now"]
    snapshot = load_snapshot(now=now, config=config).snapshot
    gang, small = world["gang"], world["small"]

    assert snapshot.pending == (
        Job(
            id=str(gang.pk),
            team="vision",
            user="alice",
            request=GpuRequest(kind=SliceKind.WHOLE, count=2, min_count=1),
            submitted_at=(now - timedelta(seconds=50)).timestamp(),
            priority="high",
            time_limit_s=100.0,
            preemptible=False,
            depends_on=(
                Dependency(str(world["done"].pk), DependencyKind.AFTER_OK),
                Dependency(str(world["broke"].pk), DependencyKind.AFTER_ANY),
            ),
            queued_since=(now - timedelta(seconds=40)).timestamp(),
        ),
        Job(
            id=str(small.pk),
            team="nlp",
            user="bob",
            request=GpuRequest(kind=SliceKind.MIG, count=1, profile="1g.10gb", model="NVIDIA A100"),
            submitted_at=(now - timedelta(seconds=30)).timestamp(),
            queued_since=(now - timedelta(seconds=30)).timestamp(),
        ),
    )
    assert dict(snapshot.dependency_states) == {
        str(world["done"].pk): DependencyState.SUCCEEDED,
        str(world["broke"].pk): DependencyState.FAILED,
    }


def test_it_loads_holding_jobs_with_their_slices_borrowing_and_stop_request(world, config):
    now = world["now"]
    loaded = load_snapshot(now=now, config=config)
    runner = world["runner"]

    (running,) = loaded.snapshot.running
    assert running == RunningJob(
        job=Job(
            id=str(runner.pk),
            team="vision",
            user="alice",
            request=GpuRequest(kind=SliceKind.WHOLE, count=1),
            submitted_at=(now - timedelta(seconds=500)).timestamp(),
            time_limit_s=3600.0,
            queued_since=(now - timedelta(seconds=500)).timestamp(),
        ),
        node="node-a",
        slice_ids=("GPU-node-a-0",),
        started_at=(now - timedelta(seconds=90)).timestamp(),
        borrowed=True,
        preempting_since=(now - timedelta(seconds=5)).timestamp(),
    )
    assert loaded.holding[runner.pk].attempt == 1
    assert loaded.holding[runner.pk].stop_requested
    assert loaded.pending[world["small"].pk].attempt == 2


def test_team_and_user_usage_decay_and_include_what_running_jobs_used_so_far(world, config):
    snapshot = load_snapshot(now=world["now"], config=config).snapshot

    vision = snapshot.teams["vision"]
    # 1000 unit-seconds one half-life ago -> 500, plus the running job's 100 s on 1 unit.
    assert vision.usage == pytest.approx(600.0)
    assert (vision.weight, vision.guaranteed, vision.limit) == (2.0, 2.0, 4.0)
    assert (vision.max_priority, vision.member_limit, vision.budget_gpu_hours) == (
        "high",
        2.0,
        100.0,
    )
    # 2 GPU-hours finished this month (when the month is more than 100 s old) + 100 s running.
    if world["now"].day > 1 or world["now"].hour > 3:
        assert vision.used_gpu_hours == pytest.approx(2.0 + 100 / 3600)
    nlp = snapshot.teams["nlp"]
    assert (nlp.usage, nlp.limit, nlp.used_gpu_hours) == (0.0, None, 0.0)
    assert snapshot.user_usage == {("vision", "alice"): pytest.approx(300.0)}


def test_loading_takes_the_same_few_queries_however_big_the_cluster_and_queue(
    world, config, django_assert_num_queries
):
    with django_assert_num_queries(SNAPSHOT_QUERIES):
        load_snapshot(now=world["now"], config=config)

    team = make_team("more")
    user = make_user("carol", team=team)
    make_node("node-d", gpus=[{"mode": "whole"}] * 4 + [{"mode": "mps", "shares": 4}])
    for i in range(20):
        job = make_job(team=team, user=user, name=f"p{i}", gpu_kind="mps")
        JobDependency.objects.create(job=job, depends_on=world["done"])
    for i in range(3):
        running = make_job(team=team, user=user, name=f"r{i}", state=JobState.ASSIGNED)
        allocate(running, [f"GPU-node-d-{i}"])

    with django_assert_num_queries(SNAPSHOT_QUERIES):
        loaded = load_snapshot(now=world["now"], config=config)
    assert (len(loaded.snapshot.pending), len(loaded.snapshot.running)) == (22, 4)

"""Applying the core's decisions writes exactly the rows they say, guarded by state."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.policy import scheduler_config
from portal.scheduling.apply import apply_decisions
from portal.scheduling.snapshot import load_snapshot
from scheduler.model import (
    Assign,
    Decisions,
    Fail,
    Pending,
    PendingCode,
    Preempt,
    Reason,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    team = make_team("vision", limit_units=None)
    alice = make_user("alice", team=team)
    make_node("node-a", gpus=[{"mode": "whole"}, {"mode": "whole"}, {"mode": "mps", "shares": 2}])
    return team, alice


def _load():
    return load_snapshot(now=timezone.now().replace(microsecond=0), config=scheduler_config())


def _active(job: Job) -> list[tuple[str, int]]:
    return sorted(
        Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
            "slice__key", "attempt"
        )
    )


def test_assign_moves_the_job_to_assigned_with_its_allocations_and_an_event(world):
    team, alice = world
    job = make_job(team=team, user=alice, gpu_kind="mps", gpu_count=2, attempt=1)
    Job.objects.filter(pk=job.pk).update(pending_code="NO_FIT", queue_position=3)
    loaded = _load()
    decision = Assign(
        job_id=str(job.pk),
        node="node-a",
        slice_ids=("GPU-node-a-2/mps/0", "GPU-node-a-2/mps/1"),
        borrowed=True,
    )

    applied = apply_decisions(Decisions(assign=(decision,)), loaded=loaded)

    assert (applied.assigned, applied.conflicts) == ([job.pk], [])
    job.refresh_from_db()
    assert (job.state, job.attempt, job.node.name, job.borrowed) == ("ASSIGNED", 2, "node-a", True)
    assert job.assigned_at == loaded.now
    assert (job.pending_code, job.queue_position, job.pending_numbers) == ("", None, {})
    assert _active(job) == [("GPU-node-a-2/mps/0", 2), ("GPU-node-a-2/mps/1", 2)]
    event = job.events.get(to_state="ASSIGNED")
    assert (event.from_state, event.to_state, event.attempt) == ("PENDING", "ASSIGNED", 2)
    assert event.message == (
        "assigned to node-a: GPU-node-a-2/mps/0, GPU-node-a-2/mps/1 "
        "(borrowed capacity: preemptible by reclaim)"
    )


def test_a_borrowing_job_that_is_not_preemptible_is_not_called_preemptible_by_reclaim(world):
    team, alice = world
    job = make_job(team=team, user=alice, preemptible=False)
    decision = Assign(job_id=str(job.pk), node="node-a", slice_ids=("GPU-node-a-0",), borrowed=True)

    applied = apply_decisions(Decisions(assign=(decision,)), loaded=_load())

    assert applied.assigned == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.borrowed) == ("ASSIGNED", True)
    assert job.events.get(to_state="ASSIGNED").message == (
        "assigned to node-a: GPU-node-a-0 "
        "(borrowed capacity; not preemptible, so reclaim leaves it running)"
    )


def test_a_slice_already_held_leaves_only_that_job_pending(world):
    team, alice = world
    first = make_job(team=team, user=alice, name="first")
    second = make_job(team=team, user=alice, name="second")
    loaded = _load()
    # Between the snapshot and the apply, someone else booked GPU 1 (a stale snapshot).
    squatter = make_job(team=team, user=alice, name="squatter", state=JobState.RUNNING)
    allocate(squatter, ["GPU-node-a-1"])
    decisions = Decisions(
        assign=(
            Assign(job_id=str(first.pk), node="node-a", slice_ids=("GPU-node-a-0",)),
            Assign(job_id=str(second.pk), node="node-a", slice_ids=("GPU-node-a-1",)),
        )
    )

    applied = apply_decisions(decisions, loaded=loaded)

    assert (applied.assigned, applied.conflicts) == ([first.pk], [second.pk])
    second.refresh_from_db()
    assert (second.state, second.attempt, _active(second)) == ("PENDING", 0, [])
    assert not second.events.filter(to_state="ASSIGNED").exists()
    assert _active(first) == [("GPU-node-a-0", 1)]
    assert _active(squatter) == [("GPU-node-a-1", 1)]


def test_a_job_cancelled_after_the_snapshot_is_not_assigned(world):
    team, alice = world
    job = make_job(team=team, user=alice)
    loaded = _load()
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)

    applied = apply_decisions(
        Decisions(assign=(Assign(job_id=str(job.pk), node="node-a", slice_ids=("GPU-node-a-0",)),)),
        loaded=loaded,
    )

    assert (applied.assigned, applied.conflicts) == ([], [job.pk])
    assert Allocation.objects.count() == 0
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("CANCELLED", 0)


def test_preempt_asks_the_holding_job_to_stop_once(world):
    team, alice = world
    victim = make_job(team=team, user=alice, state=JobState.RUNNING, borrowed=True)
    allocate(victim, ["GPU-node-a-0"])
    loaded = _load()
    decision = Preempt(job_id=str(victim.pk), reason="reclaim for nlp", for_job_id="9")

    first = apply_decisions(Decisions(preempt=(decision,)), loaded=loaded)
    again = apply_decisions(Decisions(preempt=(decision,)), loaded=_load())

    assert (first.preempted, again.preempted) == ([victim.pk], [])
    victim.refresh_from_db()
    assert (victim.state, victim.stop_reason, victim.stop_requested_at) == (
        "RUNNING",
        "preempt",
        loaded.now,
    )
    events = list(victim.events.filter(message__startswith="preemption"))
    assert [(e.from_state, e.to_state, e.message) for e in events] == [
        ("RUNNING", "RUNNING", "preemption requested: reclaim for nlp (for job 9)")
    ]
    assert _active(victim) == [("GPU-node-a-0", 1)]  # freed only when the agent stopped it


def test_fail_ends_a_pending_job_with_the_reason(world):
    team, alice = world
    job = make_job(team=team, user=alice)
    loaded = _load()

    applied = apply_decisions(
        Decisions(fail=(Fail(job_id=str(job.pk), reason="dependency 4 failed"),)), loaded=loaded
    )

    assert applied.failed == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.reason, job.finished_at) == ("FAILED", "dependency 4 failed", loaded.now)
    assert job.events.filter(to_state="FAILED").count() == 1


def test_pending_writes_reason_numbers_position_and_estimate_only_when_changed(world):
    team, alice = world
    waiting = make_job(team=team, user=alice, name="waiting")
    other = make_job(team=team, user=alice, name="other")
    loaded = _load()
    eta = (loaded.now + timedelta(minutes=5)).timestamp()
    decisions = Decisions(
        pending=(
            Pending(
                job_id=str(waiting.pk),
                reason=Reason(
                    PendingCode.QUOTA_LIMIT,
                    "team uses 6.0 of 8.0 units, job needs 4.0",
                    {"used": 6.0, "limit": 8.0, "needs": 4.0, "free": float("inf")},
                ),
                position=1,
                eta=eta,
            ),
            Pending(
                job_id=str(other.pk),
                reason=Reason(PendingCode.FAIR_SHARE, "others first"),
                position=2,
            ),
        )
    )

    applied = apply_decisions(decisions, loaded=loaded)
    repeated = apply_decisions(decisions, loaded=_load())

    assert (applied.pending, applied.explanations_written) == (2, 2)
    assert (repeated.pending, repeated.explanations_written) == (2, 0)
    waiting.refresh_from_db()
    assert waiting.pending_code == "QUOTA_LIMIT"
    assert waiting.pending_message == "team uses 6.0 of 8.0 units, job needs 4.0"
    assert waiting.pending_numbers == {"used": 6.0, "limit": 8.0, "needs": 4.0, "free": "unlimited"}
    assert (waiting.queue_position, waiting.estimated_start_at) == (
        1,
        loaded.now + timedelta(minutes=5),
    )
    other.refresh_from_db()
    assert (other.pending_code, other.queue_position, other.estimated_start_at) == (
        "FAIR_SHARE",
        2,
        None,
    )
    assert JobEvent.objects.filter(job__in=[waiting, other]).count() == 2  # only "submitted"

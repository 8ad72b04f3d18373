"""``SchedulerConfig.list_pending`` off: a pass builds no pending list, and FIFO nominates
jobs only as far as its queue looks (``scheduler.nominate.InSubmitOrder``), with the same
decisions as a pass that lists every pending job."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import job, running, snapshot, whole_node

from scheduler import core
from scheduler.config import Policy, SchedulerConfig
from scheduler.model import DependencyState


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.FIFO_BACKFILL])
def test_a_fifo_pass_without_a_pending_list_still_fails_a_job_deep_in_the_queue(
    policy: Policy,
) -> None:
    # The cluster is full, so the pass settles at the head of the queue; the job whose
    # dependency failed is last in submit order, and fails all the same.
    queue = [job(f"q{i}", at=float(i), count=2) for i in range(5)]
    queue.append(job("late", at=10.0, after_ok=["gone"]))
    snap = snapshot(
        [whole_node("n0", gpus=2)],
        queue,
        [running(job("r0"), ["n0-g0", "n0-g1"])],
        dependency_states={"gone": DependencyState.FAILED},
    )
    config = SchedulerConfig(policy=policy, explain=False)
    listed = core.schedule(snap, now=100.0, config=config)
    lean = core.schedule(snap, now=100.0, config=replace(config, list_pending=False))
    assert [f.job_id for f in lean.fail] == [f.job_id for f in listed.fail] == ["late"]
    assert (lean.assign, lean.preempt) == (listed.assign, listed.preempt)
    assert lean.pending == () and len(listed.pending) == 5

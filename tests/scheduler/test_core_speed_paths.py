"""The pass's faster paths give what the plain ones give."""

from __future__ import annotations

import dataclasses

from sched_builders import job, running, whole_node

from scheduler.backfill import Estimator, Timeline
from scheduler.cluster import FreeIndex, Pool, build_shape, pool_of
from scheduler.explain import new_pending
from scheduler.model import Pending, PendingCode, Reason
from scheduler.quota import hold


def test_a_fast_pending_is_the_pending_its_constructor_makes() -> None:
    reason = Reason(PendingCode.NO_FIT, "needs 2 x whole, at most 1 free on any node")
    fast = new_pending("j1", reason, 3, 1500.0, 1200.0, None)
    plain = Pending("j1", reason, 3, 1500.0, 1200.0, None)
    assert type(fast) is Pending
    assert fast == plain and repr(fast) == repr(plain)
    # Every field is set (a field added to Pending fails here until new_pending sets it).
    assert [f.name for f in dataclasses.fields(Pending)] == [
        "job_id",
        "reason",
        "position",
        "eta",
        "eta_earliest",
        "eta_latest",
    ]


def _estimator(
    running_jobs: list[tuple[str, list[str], float]],
) -> tuple[Estimator, tuple[Pool, ...]]:
    """An estimator at ``now`` = 1000 over one node of 2 whole GPUs, all held."""
    shape = build_shape([whole_node("n0", gpus=2)])
    held = [
        running(job(job_id, "a", count=len(ids), limit=end - 900.0), ids, started=900.0)
        for job_id, ids, end in running_jobs
    ]
    ledger, held_list, holders = hold(held, shape.slice_by_id, grace_period_s=0.0, weights={})
    index = FreeIndex(shape, holders)
    pools = (pool_of(shape.slice_by_id["n0-g0"]),)
    return Estimator(index, Timeline.of_held(index, held_list), 1000.0), pools


def test_the_earliest_fit_on_one_node_is_when_its_slices_come_free() -> None:
    estimator, pools = _estimator([("r1", ["n0-g0"], 1100.0), ("r2", ["n0-g1"], 1300.0)])
    assert estimator.earliest(pools, 1, False) == 1100.0
    assert estimator.earliest(pools, 2, False) == 1300.0
    assert estimator.earliest(pools, 3, False) is None  # more than the node has

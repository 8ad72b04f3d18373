"""The pass's faster paths give what the plain ones give."""

from __future__ import annotations

import dataclasses
import random

from sched_builders import job, running, whole_node

from scheduler.backfill import Estimator, Timeline, reserve
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


def _reserving_world(seed: int, sweeps: bool) -> tuple[FreeIndex, Timeline, tuple[Pool, ...]]:
    """Six nodes of 8 whole GPUs, most of them held by jobs ending at random times; the same
    world for the same seed."""
    rng = random.Random(seed)
    nodes = [whole_node(f"n{i}", gpus=8) for i in range(6)]
    shape = build_shape(nodes)
    held = []
    for node in nodes:
        ids = [s.id for s in node.slices if rng.random() < 0.8]
        while ids:
            take, ids = ids[: rng.randint(1, 3)], ids[3:]
            end = rng.choice([1100.0, 1200.0, 1500.0, 2000.0, 4000.0])
            held.append(
                running(
                    job(f"r{len(held)}", count=len(take), limit=end - 900.0), take, started=900.0
                )
            )
    _, held_list, holders = hold(held, shape.slice_by_id, grace_period_s=0.0, weights={})
    index = FreeIndex(shape, holders)
    timeline = Timeline.of_held(index, held_list, sweeps=sweeps)
    return index, timeline, (pool_of(shape.slice_by_id["n0-g0"]),)


def test_a_reservation_resumed_from_the_last_sweep_is_the_one_a_full_sweep_finds() -> None:
    # A queue of starving jobs asks for a reservation each, of a few needs, between
    # placements that add releases (``Cache.SWEEPS`` on and off, on worlds built alike).
    for seed in range(30):
        worlds = [_reserving_world(seed, sweeps) for sweeps in (True, False)]
        rng = random.Random(1000 + seed)
        for step in range(25):
            need = rng.choice([1, 2, 4, 8])
            place = rng.random() < 0.3
            found = []
            for index, timeline, pools in worlds:
                if place:
                    placement = index.find(pools, "a", 1, 1, False)
                    if placement is not None:
                        index.take(placement, "a")
                        slices = [item for _, items in placement for item in items]
                        timeline.add(1000.0 + 100.0 * step, slices)
                    found.append(placement)
                    continue
                r = reserve(
                    index,
                    timeline,
                    job_id=f"j{step}",
                    pools=pools,
                    team="a",
                    need=need,
                    multi_node=False,
                )
                found.append((r.at, sorted(s.id for s in r.set_aside), sorted(r.nodes)))
            assert found[0] == found[1], (seed, step, need)

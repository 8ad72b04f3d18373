"""Metric definitions on tiny hand-made segment lists, with the arithmetic in the comments."""

from __future__ import annotations

import pytest
from sim_helpers import record

from scheduler.sim.metrics import (
    GuaranteeOverrun,
    fairness,
    guarantee_overruns,
    jain_index,
    makespan_lower_bound,
    per_team,
    percentile,
    sharing_incentive,
    starvation,
    summarise,
    water_fill,
)


def test_percentiles_interpolate_between_order_statistics() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(v) for v in range(101)], 99) == 99.0
    assert percentile([], 50) == 0.0


def test_wait_counts_work_lost_to_preemption() -> None:
    # Ran 0..90, preempted; ran again 190..1190 for its 1000 s: wait = 1190 - 0 - 1000.
    job = record("a1", 8, 0, 1000, (0, 90, True), (190, 1190, False))
    assert (job.wait_s, job.jct_s, job.finished) == (190, 1190, True)


def test_utilisation_and_its_bound_on_two_gpus() -> None:
    # A: 2 GPUs, submit 0, 10 s; B: 1 GPU, submit 5, 10 s. Work = 20 + 10 = 30 GPU-s.
    # Makespan bound = max(max(submit + duration) = 15, 0 + 30/2 = 15, 5 + 10/2 = 10) = 15.
    # Bound = 30 / (2 x 15) = 1.0. B ran 10..20: utilisation = 30 / (2 x 20) = 0.75.
    # Offered load = 30 / (2 x (5 - 0)) = 3.0.
    records = [record("A", 2, 0, 10, (0, 10, False)), record("B", 1, 5, 10, (10, 20, False))]
    summary = summarise(records, 2)
    assert (summary.utilisation, summary.utilisation_bound, summary.offered_load) == (
        0.75,
        1.0,
        3.0,
    )
    assert (summary.mean_wait_s, summary.makespan_s, summary.makespan_lower_bound_s) == (
        2.5,
        20,
        15,
    )


def test_the_makespan_bound_takes_the_work_still_to_come() -> None:
    # One GPU; 4 s of work at t=0 and 4 s at t=10: 10 + 4/1 = 14 beats 0 + 8/1 = 8.
    records = [record("x", 1, 0, 4), record("y", 1, 10, 4)]
    assert makespan_lower_bound(records, 1) == 14


def test_water_filling_caps_small_demands_and_splits_the_rest_by_weight() -> None:
    # 10 GPUs, weights 1:1:2. a wants 1 (< its 2.5): capped. 9 left for b and c at 1:2.
    shares = water_fill({"a": 1, "b": 10, "c": 10}, {"a": 1, "b": 1, "c": 2}, 10)
    assert shares == pytest.approx({"a": 1, "b": 3, "c": 6})
    assert water_fill({"a": 2, "b": 0}, {"a": 1, "b": 1}, 10) == {"a": 2, "b": 0}


def test_jain_index_of_equal_and_unequal_ratios() -> None:
    assert jain_index([1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0]) == 0.5
    assert jain_index([1.0, 0.5]) == pytest.approx(2.25 / 2.5)  # (1.5)^2 / (2 x 1.25)


def _two_teams() -> list:
    # 4 GPUs, weights 1:1. a1 (4 GPUs) runs 0..10, a2 (4) waits and runs 20..30,
    # b1 (2) waits and runs 10..20; all submitted at 0.
    return [
        record("a1", 4, 0, 10, (0, 10, False), tenant="a"),
        record("a2", 4, 0, 10, (20, 30, False), tenant="a"),
        record("b1", 2, 0, 10, (10, 20, False), tenant="b"),
    ]


def test_fairness_ratios_follow_the_water_filled_share_while_queued() -> None:
    # [0,10): demand a 8, b 2 > 4 GPUs: b capped at 2, a gets 2. a holds 4 -> ratio 1;
    #         b holds 0 -> ratio 0.
    # [10,20): demand a 4, b 2 > 4: b 2, a 2. a holds 0 -> ratio 0; b has nothing queued.
    # [20,30): a alone, nothing queued.
    # a: (1 x 10 + 0 x 10) / 20 = 0.5; b: 0 / 10 = 0; Jain([0.5, 0]) = 0.25 / 0.5 = 0.5.
    measured = fairness(_two_teams(), {"a": 1, "b": 1}, 4)
    assert measured.teams["a"].ratio == 0.5
    assert measured.teams["b"].ratio == 0.0
    assert measured.jain_waiting == 0.5


def test_share_and_entitlement_are_fractions_of_capacity_over_the_run() -> None:
    # Fair share integrated: a 2x10 + 2x10 + 4x10 = 80, b 2x10 + 2x10 = 40 unit-seconds;
    # held: a 40 + 40 = 80, b 20. Capacity x span = 4 x 30 = 120.
    teams, jain = per_team(_two_teams(), {"a": 1, "b": 1}, 4)
    assert teams["a"].share == pytest.approx(80 / 120)
    assert teams["a"].entitlement == pytest.approx(80 / 120)
    assert teams["b"].share == pytest.approx(20 / 120)
    assert teams["b"].entitlement == pytest.approx(40 / 120)
    assert (teams["a"].mean_wait_s, teams["b"].mean_wait_s, jain) == (10, 10, 0.5)


def test_the_sharing_incentive_compares_the_same_jobs_with_slack() -> None:
    # a: private waits 100 and 300 (mean 200), shared 300 and 100 (mean 200 <= 330): holds.
    # b: private 0, shared 200 > 1.05 x 0 + 120: fails. c ran nothing privately: no verdict.
    private = [
        record("a1", 1, 0, 10, (100, 110, False), tenant="a"),
        record("a2", 1, 0, 10, (300, 310, False), tenant="a"),
        record("b1", 1, 0, 10, (0, 10, False), tenant="b"),
    ]
    shared = [
        record("a1", 1, 0, 10, (300, 310, False), tenant="a"),
        record("a2", 1, 0, 10, (100, 110, False), tenant="a"),
        record("a3", 1, 0, 10, (5000, 5010, False), tenant="a"),  # too big privately
        record("b1", 1, 0, 10, (200, 210, False), tenant="b"),
        record("c1", 1, 0, 10, (0, 10, False), tenant="c"),
    ]
    checks = sharing_incentive(shared, private)
    assert (checks["a"].holds, checks["a"].jobs, checks["a"].mean_wait_s) == (True, 2, 200)
    assert checks["b"].holds is False
    assert checks["c"].holds is None


def _overruns(b_first_started: float, reclaim_max_run_s: float) -> GuaranteeOverrun:
    """Two nodes of 4 GPUs. Team b (guarantee 2) borrows 6: a 4-GPU job on n000 started at
    ``b_first_started`` and a 2-GPU job on n001 started at 1,500. Team a (guarantee 6) runs 2
    GPUs on n001 and queues a 4-GPU job at 2,000 that starts at 5,000: 2,910 s over bound 1
    (90 s), which runs out at 2,090."""
    n0 = tuple(f"n000/g{i}" for i in range(4))
    n1 = tuple(f"n001/g{i}" for i in range(4))
    records = [
        record(
            "b-big", 4, 0, 9000, (b_first_started, 9000 + b_first_started, False, n0), tenant="b"
        ),
        record("b-small", 2, 1500, 8000, (1500, 9500, False, n1[:2]), tenant="b"),
        record("a-run", 2, 0, 9000, (0, 9000, False, n1[2:]), tenant="a"),
        record("a-wait", 4, 2000, 100, (5000, 5100, False, n0), tenant="a"),
    ]
    return guarantee_overruns(
        records,
        {"a": 6.0, "b": 2.0},
        capacity=8.0,
        gpus_per_node=4,
        bound_s=90.0,
        reclaim_max_run_s=reclaim_max_run_s,
        min_run_time_s=60.0,
    )


def test_a_wait_over_bound_one_with_only_long_run_borrowed_work_to_reclaim_is_protected() -> None:
    # b's 4-GPU job has run 2,090 s when the bound runs out, past reclaim_max_run_s = 1,000:
    # reclaim may not take it, and n001's young borrowed GPUs (2) do not make room for 4.
    assert _overruns(0.0, reclaim_max_run_s=1000.0) == GuaranteeOverrun(
        over=1, protected=1, worst_unprotected_s=0.0
    )


def test_a_wait_over_bound_one_that_reclaim_could_have_ended_is_a_violation() -> None:
    # b's 4-GPU job started at 1,000: it had run 1,090 s, within reclaim_max_run_s = 3,000.
    assert _overruns(1000.0, reclaim_max_run_s=3000.0) == GuaranteeOverrun(
        over=1, protected=0, worst_unprotected_s=3000.0
    )


# Bound 2 (docs/scheduling.md#starvation): max wait 100 s, longest limit 50 s, no grace, so a
# job that starves alone starts within 100 + 50 = 150 s of its submit, unless another team's
# work within its guarantee started later, while it would borrow: then within 50 s of that.
def _bound2(*records, guarantees):  # noqa: ANN002, ANN202 - records, Starvation
    return starvation(
        records, max_wait_s=100.0, longest_limit_s=50.0, grace_s=0.0, guarantees=guarantees
    )


def test_bound_2_counts_from_the_last_start_of_other_work_within_its_guarantee() -> None:
    # j (team b, no guarantee: it borrows) starts at 240. a's x started at 200 within a's
    # guarantee of 1: j's bound runs from 200, so 250; without a guarantee for a, 150.
    j = record("j", 1, 0.0, 10.0, (240.0, 250.0, False), tenant="b")
    x = record("x", 1, 190.0, 60.0, (200.0, 260.0, False), tenant="a")
    report = _bound2(j, x, guarantees={"a": 1.0})
    assert (report.starved, report.violations, report.deferred) == (1, 0, 1)
    assert report.worst_bound_s == 250.0
    assert _bound2(j, x, guarantees={}).violations == 1
    assert _bound2(j, x, guarantees={}).worst_bound_s == 150.0


def test_bound_2_is_not_moved_by_borrowing_work_own_team_work_or_a_job_within_its_own() -> None:
    j = record("j", 1, 0.0, 10.0, (240.0, 250.0, False), tenant="b")
    # a holds y too when x starts: 2 units against its guarantee of 1, so x borrowed.
    x = record("x", 1, 190.0, 60.0, (200.0, 260.0, False), tenant="a")
    y = record("y", 1, 0.0, 400.0, (0.0, 400.0, False), tenant="a")
    assert _bound2(j, x, y, guarantees={"a": 1.0}).violations == 1
    # The same start by j's own team (b, guarantee 1): the older work of its own team is
    # counted in k, not here.
    xb = record("x", 1, 190.0, 60.0, (200.0, 260.0, False), tenant="b")
    assert _bound2(j, xb, guarantees={"b": 1.0}).violations == 1
    # j would not have borrowed when x started (b's guarantee of 1 held j): not moved.
    assert _bound2(j, x, guarantees={"a": 1.0, "b": 1.0}).violations == 1


def test_bound_2_counts_jobs_started_together_as_within_their_guarantee_each() -> None:
    # a's x1 and x2 start together at 200 with a's guarantee of 1: which went first, the
    # records do not say, so either may have been within it; j's bound moves to 250.
    j = record("j", 1, 0.0, 10.0, (240.0, 250.0, False), tenant="b")
    x1 = record("x1", 1, 190.0, 60.0, (200.0, 260.0, False), tenant="a")
    x2 = record("x2", 1, 190.0, 60.0, (200.0, 260.0, False), tenant="a")
    assert _bound2(j, x1, x2, guarantees={"a": 1.0}).violations == 0

"""ETA calibration on a trace small enough to work out by hand (docs/simulator.md).

One node of 2 GPUs, one team. H runs 0..1000 on both GPUs and finishes: the history of its
shape (2 GPUs; hidden: under a 1 h limit) is then 1000 s. A (2 GPUs, 1000 s) starts at 1000.
B (1 GPU, 500 s) arrives at 1010 and C (2 GPUs, 300 s) at 1020: B starts when A ends (2000),
C when B ends (2500).

Durations shown (limit = duration): B is estimated at A's end, 2000; C behind B, which runs
500 s: 2500. Both exact.

Durations hidden (limits 1 h): A's limit ends at 4600, but jobs of its shape ran 1000 s, so
B is likely at 2000 (latest 4600; earliest the history's 10th percentile, also 1000 s: 2000).
B's shape (1 GPU, 1 h) has no history: it is booked for its whole hour, so C is likely at
2000 + 3600 = 5600 (earliest 2000 when 2 GPUs first come free, latest 4600 + 3600 = 8200).
C really starts at 2500: |2500 - 5600| / (2500 - 1020) = 3100 / 1480.
"""

from __future__ import annotations

import pytest
from sim_helpers import job, team

from scheduler import schedule
from scheduler.config import SchedulerConfig
from scheduler.sim.cluster import ClusterSpec, build_nodes
from scheduler.sim.engine import Estimate, replay, user_limit
from scheduler.sim.metrics import eta_calibration
from scheduler.sim.trace import TraceJob

TRACE = [
    job("H", 2, 0.0, 1000.0),
    job("A", 2, 1000.0, 1000.0),
    job("B", 1, 1010.0, 500.0),
    job("C", 2, 1020.0, 300.0),
]


def _replay(hidden: bool, trace: list[TraceJob] = TRACE, gpus: int = 2):  # noqa: ANN202 - SimResult
    """Replay ``trace`` on nodes of 2 GPUs, one team guaranteed all of them."""
    return replay(
        trace,
        nodes=build_nodes(ClusterSpec(gpus, gpus_per_node=2)),
        teams={"a": team("a", gpus)},
        config=SchedulerConfig(explain=False),
        schedule=schedule,
        hide_durations=hidden,
        record_etas=True,
    )


def _starts(result) -> dict[str, float]:  # noqa: ANN001 - SimResult
    return {r.job_id: r.segments[0].start_s for r in result.records}


@pytest.mark.parametrize("hidden", [False, True])
def test_the_replay_is_the_same_whether_durations_are_hidden_or_estimates_recorded(
    hidden: bool,
) -> None:
    result = _replay(hidden)
    assert _starts(result) == {"H": 0.0, "A": 1000.0, "B": 2000.0, "C": 2500.0}
    plain = replay(
        TRACE,
        nodes=build_nodes(ClusterSpec(2, gpus_per_node=2)),
        teams={"a": team("a", 2)},
        config=SchedulerConfig(explain=False),
        schedule=schedule,
        hide_durations=hidden,
    )
    assert plain.records == result.records
    assert plain.etas == {}


def test_with_durations_shown_the_estimates_are_exact() -> None:
    result = _replay(hidden=False)
    # H and A started in their first pass: no estimate.
    assert result.etas == {
        "B": Estimate(1010.0, 2000.0, 2000.0, 2000.0),
        "C": Estimate(1020.0, 2000.0, 2500.0, 2500.0),
    }
    calibration = eta_calibration(result.records, result.etas)
    assert (calibration.jobs, calibration.unknown) == (2, 0)
    assert (calibration.median_error, calibration.p90_error) == (0.0, 0.0)
    assert calibration.within_band == 1.0


def test_with_durations_hidden_history_corrects_a_limit_and_a_missing_one_costs_an_hour() -> None:
    assert user_limit(500.0) == user_limit(1000.0) == 3600.0
    result = _replay(hidden=True)
    assert result.etas == {
        "B": Estimate(1010.0, 2000.0, 2000.0, 4600.0),
        "C": Estimate(1020.0, 2000.0, 5600.0, 8200.0),
    }
    calibration = eta_calibration(result.records, result.etas)
    c_error = 3100.0 / 1480.0
    assert calibration.jobs == 2
    assert calibration.median_error == pytest.approx(c_error / 2)  # between 0 and C's
    assert calibration.p90_error == pytest.approx(0.9 * c_error)
    assert calibration.within_band == 1.0


def test_user_style_limits_round_up_to_the_next_step() -> None:
    assert [user_limit(d) for d in (0.0, 3600.0, 3601.0, 86400.0, 86401.0)] == [
        3600.0,
        3600.0,
        4 * 3600.0,
        86400.0,
        7 * 86400.0,
    ]
    assert user_limit(8 * 86400.0) == 14 * 86400.0  # beyond a week: whole weeks


# A gang and single GPUs on two nodes of 2 GPUs (durations shown). Four single GPUs start at
# 0, two per node: P1 (1000 s) and P2 (3000 s) on node 0, Q1 (2000 s) and Q2 (4000 s) on node 1.
# G (a 2-GPU gang, 500 s) arrives at 10 and S (1 GPU, 1500 s) at 20. Node 0 has 2 GPUs free
# first at 3000 (P1 and P2 ended): G is reserved there. S fits on node 0 at 1000, when P1 ends,
# and ends at 2500, before the reservation: it starts at 1000, G at 3000.
#
# Counted per pool, the two GPUs free at 2000 (node 0's since 1000, node 1's from Q1) would
# hold G then, and S, which runs past 2000, would be booked after G's end: 2500, an error of
# 1500 / 980. Counted per node, both estimates are exact.
FRAGMENTED = [
    job("P1", 1, 0.0, 1000.0),
    job("P2", 1, 0.0, 3000.0),
    job("Q1", 1, 0.0, 2000.0),
    job("Q2", 1, 0.0, 4000.0),
    job("G", 2, 10.0, 500.0),
    job("S", 1, 20.0, 1500.0),
]


def test_a_single_gpu_is_planned_in_the_hole_a_gang_cannot_use() -> None:
    result = _replay(hidden=False, trace=FRAGMENTED, gpus=4)
    starts = _starts(result)
    assert (starts["G"], starts["S"]) == (3000.0, 1000.0)
    assert result.etas["G"].likely_s == 3000.0
    assert result.etas["S"].likely_s == 1000.0
    calibration = eta_calibration(result.records, result.etas)
    assert (calibration.jobs, calibration.median_error, calibration.p90_error) == (2, 0.0, 0.0)

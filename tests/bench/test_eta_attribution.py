"""``bench.eta``'s split of the ETA error (``--attribute``): told too early or too late, and
told too early with later arrivals ahead in the order, on records and a replay worked out by
hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scheduler.config import SchedulerConfig
from scheduler.sim.cluster import ClusterSpec, build_nodes, build_teams
from scheduler.sim.engine import replay
from scheduler.sim.records import JobRecord, Segment
from scheduler.sim.trace import TraceJob

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.eta import _QueueWatch, split_error  # noqa: E402


def _record(job_id: str, submit: float, start: float) -> JobRecord:
    return JobRecord(job_id, "t", 1.0, submit, 100.0, (Segment(start, start + 100.0, False),))


def test_the_split_counts_the_jobs_told_too_early_that_later_arrivals_went_ahead_of() -> None:
    records = [
        _record("x", 0.0, 2000.0),  # told 1000: early by 1000 of 2000; y (later) ahead
        _record("w", 0.0, 1000.0),  # told 900: early by 100 of 1000; x ahead, not later
        _record("z", 0.0, 1000.0),  # told 1500: late by 500 of 1000
        _record("y", 500.0, 600.0),  # waited 100 s: not counted
    ]
    first = {
        "x": (0.0, 1000.0, frozenset()),
        "w": (0.0, 900.0, frozenset()),
        "z": (0.0, 1500.0, frozenset()),
        "y": (500.0, 600.0, frozenset()),
    }
    last_ahead = {"x": frozenset({"y"}), "w": frozenset({"x"}), "z": frozenset()}
    assert split_error(records, first, last_ahead) == {
        "early": {"jobs": 2, "median_error": 0.3},
        "late": {"jobs": 1, "median_error": 0.5},
        "early_overtaken": {"jobs": 1, "median_error": 0.5},
        "rest": {"jobs": 2, "median_error": 0.3},
    }


def test_the_watch_keeps_the_estimates_the_replay_keeps_and_the_jobs_ahead() -> None:
    # The hand-worked trace of tests/scheduler/sim/test_sim_eta.py, durations hidden: H runs
    # 0..1000 on both GPUs, A (2 GPUs) 1000..2000; B (1 GPU, 500 s) arrives at 1010 and is
    # likely at 2000; C (2 GPUs) arrives at 1020 behind B and is likely at 2000 + 3600
    # (B's shape has no history: its 1 h limit), and starts at 2500.
    trace = [
        TraceJob("H", "a", 2, 0.0, 1000.0),
        TraceJob("A", "a", 2, 1000.0, 1000.0),
        TraceJob("B", "a", 1, 1010.0, 500.0),
        TraceJob("C", "a", 2, 1020.0, 300.0),
    ]
    watch = _QueueWatch()
    result = replay(
        trace,
        nodes=build_nodes(ClusterSpec(2, gpus_per_node=2)),
        teams=build_teams(["a"], None, 2),
        config=SchedulerConfig(explain=False),
        schedule=watch,
        hide_durations=True,
        record_etas=True,
    )
    assert {k: v.likely_s for k, v in result.etas.items()} == {
        k: likely for k, (_, likely, _) in watch.first.items()
    }
    assert watch.first["C"] == (1020.0, 5600.0, frozenset({"B"}))
    assert watch.last_ahead["C"] == frozenset()  # B started at 2000, C's last wait was alone
    split = split_error(result.records, watch.first, watch.last_ahead)
    assert split["late"] == {
        "jobs": 2,
        "median_error": pytest.approx((0 + 3100 / 1480) / 2, abs=1e-4),
    }
    assert split["early"] == {"jobs": 0, "median_error": None}

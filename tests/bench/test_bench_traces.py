"""The benchmark's yardstick and its own traces: the greedy first-fit, the trace generator and
the verdicts `make bench` prints for each trace."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from scheduler import GpuRequest, Job, Node, RunningJob, Slice, SliceKind, Snapshot
from scheduler.sim.cluster import build_teams
from scheduler.sim.trace import load_quotas, load_trace

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make_traces = _load("make_traces", ROOT / "scripts" / "make_traces.py")
sys.path.insert(0, str(ROOT))
from bench import core_pass, philly  # noqa: E402


def _node(name: str, gpus: int, model: str = "A100") -> Node:
    return Node(
        name,
        tuple(
            Slice(f"{name}-g{g}", name, f"g{g}", SliceKind.WHOLE, 1.0, model) for g in range(gpus)
        ),
    )


def _job(job_id: str, count: int, at: float, model: str = "") -> Job:
    return Job(job_id, "t", "u", GpuRequest(SliceKind.WHOLE, count, model=model), at)


def test_greedy_first_fit_takes_jobs_in_submit_order_on_the_first_node_that_holds_them() -> None:
    nodes = (_node("b", 4), _node("a", 2), _node("c", 8, "H100"))
    held = RunningJob(_job("r", 1, 0.0), "a", ("a-g0",), 0.0)
    pending = (
        _job("late", 2, 30.0),  # by then a has 1 free, b has 0: only c
        _job("first", 4, 10.0),  # a holds 1 free, b holds 4: b
        _job("h100", 8, 20.0, "H100"),  # c
        _job("one", 1, 25.0),  # a (first by name with 1 free)
    )
    snapshot = Snapshot(nodes, {}, pending, (held,))
    assert core_pass.greedy_first_fit(snapshot) == 3  # "late" finds c taken by "h100"


@pytest.mark.parametrize("name", make_traces.TRACES)
def test_the_fixtures_are_what_the_generator_writes_from_seed_8(name: str, tmp_path: Path) -> None:
    jobs, quotas = make_traces.write(name, 8, tmp_path)
    kept_jobs, kept_quotas = make_traces.trace_paths(name, FIXTURES)
    assert jobs.read_text() == kept_jobs.read_text()
    assert quotas.read_text() == kept_quotas.read_text()


def test_big_gangs_has_teams_whose_jobs_are_larger_than_their_whole_guarantee() -> None:
    jobs = load_trace(FIXTURES / "trace_big_gangs.csv")
    teams = build_teams(
        (j.tenant for j in jobs), load_quotas(FIXTURES / "trace_big_gangs_quotas.csv"), 64
    )
    small = {name for name in teams if name.startswith("small")}
    assert small
    for name in small:
        sizes = {j.gpus for j in jobs if j.tenant == name}
        assert min(sizes) > teams[name].guaranteed_gpus


def test_flood_late_floods_first_and_the_late_team_comes_on_day_two() -> None:
    jobs = load_trace(FIXTURES / "trace_flood_late.csv")
    flood = [j for j in jobs if j.tenant == "flood"]
    late = [j for j in jobs if j.tenant == "late"]
    work = sum(j.gpus * j.duration_s for j in flood)
    assert max(j.submit_s for j in flood) <= 4 * 3600
    assert work > 2 * 64 * 86400  # more than two days of the whole cluster, queued at once
    assert min(j.submit_s for j in late) >= 2 * 86400


def test_bursty_has_many_teams_of_very_different_sizes_and_a_light_load() -> None:
    with (FIXTURES / "trace_bursty_quotas.csv").open() as handle:
        quotas = [float(row["node num"]) for row in csv.DictReader(handle)]
    assert len(quotas) >= 10 and max(quotas) / min(quotas) >= 20
    jobs = load_trace(FIXTURES / "trace_bursty.csv")
    work = sum(j.gpus * j.duration_s for j in jobs)
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    assert work / (64 * span) < 0.6


def _report(policy: str, wait: float, jain: float, util: float, holds: bool | None) -> dict:
    report = {
        "trace_label": "t",
        "policy": policy,
        "gpus": 64,
        "mean_wait_s": wait,
        "jain_waiting": jain,
        "utilisation": util,
        "utilisation_bound": 0.8,
        "utilisation_vs_bound": util / 0.8,
    }
    if holds is not None:
        report["sharing_incentive"] = {"holds": holds, "teams": {"x": {"holds": holds}}}
    return report


def test_each_trace_gets_the_four_targets_met_or_not() -> None:
    results = [
        _report("fairshare", 100.0, 0.96, 0.79, True),
        _report("fifo_backfill", 90.0, 0.80, 0.8, None),
    ]
    verdicts = {c["target"].split(": ")[1]: c["met"] for c in philly.trace_targets(results)}
    assert verdicts == {
        "jain_waiting >= 0.95": True,
        "mean wait <= fifo_backfill's": False,
        "utilisation >= 97% of its bound": True,
        "sharing incentive for every team": True,
    }
    alone = philly.trace_targets([_report("fairshare", 1.0, 0.9, 0.5, None)])
    assert [c["met"] for c in alone] == [False, None, False, None]
    assert "not run" in philly.render_targets(alone)


def test_make_bench_replays_philly_and_the_own_traces_with_durations_shown_and_hidden() -> None:
    tasks = philly.bench_tasks("jobs.csv", (512, 400))
    on_philly = {(t.gpus, t.policy, t.durations) for t in tasks if t.label == "philly"}
    assert on_philly == {
        (gpus, policy, durations)
        for gpus in (512, 400)
        for policy in ("fairshare", "fifo_backfill", "private")
        for durations in ("shown", "hidden")
    }
    own = {(t.label, t.durations) for t in tasks if t.label != "philly"}
    assert own == {(name, d) for name in philly.OWN_TRACES for d in ("shown", "hidden")}
    full = philly.bench_tasks("jobs.csv", (512, 400), full=True, traces=False)
    assert {t.policy for t in full} == {"fairshare", "fifo", "fifo_backfill", "private"}


def test_each_durations_mode_gets_its_own_targets_and_column() -> None:
    shown = _report("fairshare", 100.0, 0.96, 0.79, True)
    hidden = {**_report("fairshare", 120.0, 0.90, 0.79, True), "durations": "hidden"}
    names = [c["target"] for c in philly.trace_targets([shown, hidden])]
    assert "t @ 64 GPUs: jain_waiting >= 0.95" in names
    assert "t @ 64 GPUs, durations hidden: jain_waiting >= 0.95" in names
    assert philly.column(hidden) == "fairshare@64/hidden"


def test_each_whole_philly_replay_is_held_to_six_minutes_of_cpu_and_a_slice_is_not() -> None:
    def philly_report(policy: str, cpu_s: float, limit_jobs: int | None) -> dict:
        report = {**_report(policy, 100.0, 0.96, 0.79, True), "trace_label": "philly"}
        return {**report, "durations": "shown", "cpu_s": cpu_s, "limit_jobs": limit_jobs}

    whole = philly.check_targets(
        [philly_report("fairshare", 1100.0, None), philly_report("fifo_backfill", 300.0, None)]
    )
    timed = {c["target"]: (c["met"], c["detail"]) for c in whole if "whole replay" in c["target"]}
    assert timed == {
        "fairshare @ 64 GPUs, durations shown: whole replay <= 6 min of CPU": (False, "1100 s"),
        "fifo_backfill @ 64 GPUs, durations shown: whole replay <= 6 min of CPU": (True, "300 s"),
    }
    sliced = philly.check_targets([philly_report("fairshare", 1100.0, 8000)])
    assert not [c for c in sliced if "whole replay" in c["target"]]

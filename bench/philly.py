"""Trace replays for ``make bench``: our policy and the baselines, side by side, with targets.

Every replay (one trace, one cluster size, one policy) runs in a process of its own, as many
at once as there are cores (each replay is single-threaded Python), the longest first. The
private baseline is one of them; each shared policy's sharing-incentive check is made from
its records and the private run's once both are back.

- ``run(trace_path, gpu_sizes=(512, 400))``: the Philly trace with ``fairshare``, ``fifo``,
  ``fifo_backfill`` and ``private`` on every size (``policies`` narrows it; ``make bench``
  leaves the slowest baselines to ``make bench-full``), one table and the targets.
- ``run_traces()``: the traces of ``scripts/make_traces.py`` (tests/fixtures/trace_*.csv) on
  their cluster with ``fairshare``, ``fifo_backfill`` and ``private``, and issue 8's targets
  for each: ``jain_waiting`` >= 0.95, mean wait <= FIFO + backfill's, utilisation >= 97% of
  its bound, the sharing incentive for every team.

``python -m bench.philly [--trace PATH] [--gpus 512,400] [--policies a,b] [--limit-jobs N]
[--workers N] [--json OUT]``; ``--traces`` replays the own traces instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from scheduler.sim.cluster import ClusterSpec, build_teams
from scheduler.sim.records import JobRecord
from scheduler.sim.runner import Scenario, sharing_report, simulate
from scheduler.sim.trace import load_quotas, load_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"
FIXTURES = ROOT / "tests" / "fixtures"
POLICY_ORDER = ("fairshare", "fifo", "fifo_backfill", "private")
TRACE_POLICIES = ("fairshare", "fifo_backfill", "private")
# Every replay runs with the true durations as time limits ("shown") and with user-style
# limits of 1 h / 4 h / 24 h / 7 d ("hidden", as production sees jobs; scheduler/sim/engine.py).
DURATIONS = ("shown", "hidden")
OURS, BASELINE = "fairshare", "fifo_backfill"
UTILISATION_VS_BOUND = 0.97
JAIN_TARGET = 0.95
REPLAY_TARGET_S = 360.0  # a whole Philly replay, per policy, in CPU seconds (issue 8)
# The own traces (scripts/make_traces.py) and the cluster each is written for.
OWN_TRACES = ("bursty", "big_gangs", "flood_late")
OWN_TRACE_GPUS = 64
# Rough relative cost of each policy's replay, to start the longest first (only the order
# matters). Since FIFO nominates only as far as its queue looks (2026-12-05), fair share is
# the dearest: on the full Philly trace at 512 GPUs, durations hidden, it took ~1.7 times
# FIFO + backfill's CPU over the first 48,000 jobs (docs/simulator.md, Latest figures).
_COST = {"fairshare": 4.0, "fifo_backfill": 2.5, "fifo": 2.0, "private": 1.0}
# The own traces (about 2,000 jobs on 64 GPUs) take seconds; a Philly replay minutes, and
# longer on fewer GPUs (longer queues).
_OWN_TRACE_SCALE = 0.01


def _cost(task: Replay) -> float:
    """A replay's rough relative CPU cost (``run_replays`` starts the dearest first)."""
    if task.label != "philly":
        return _OWN_TRACE_SCALE * _COST.get(task.policy, 1.0)
    return _COST.get(task.policy, 1.0) * 512 / task.gpus


_ROWS = (
    ("jobs", "jobs", "{:.0f}"),
    ("mean wait s", "mean_wait_s", "{:.0f}"),
    ("p50 wait s", "p50_wait_s", "{:.0f}"),
    ("p99 wait s", "p99_wait_s", "{:.0f}"),
    ("mean JCT s", "mean_jct_s", "{:.0f}"),
    ("p99 JCT s", "p99_jct_s", "{:.0f}"),
    ("makespan h", "makespan_s", "{:.1f}"),
    ("utilisation", "utilisation", "{:.4f}"),
    ("util. bound", "utilisation_bound", "{:.4f}"),
    ("util./bound", "utilisation_vs_bound", "{:.2%}"),
    ("offered load", "offered_load", "{:.4f}"),
    ("jain_waiting", "jain_waiting", "{:.4f}"),
    ("excluded jobs", "excluded_jobs", "{:.0f}"),
    ("passes", "passes", "{:.0f}"),
    ("wall s", "wall_s", "{:.1f}"),
    ("CPU s", "cpu_s", "{:.1f}"),
)


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay: a trace (with its quota file) on ``gpus`` GPUs under ``policy``."""

    trace: Path
    quotas: Path | None
    gpus: int
    policy: str
    label: str  # the trace's short name in tables ("philly", "bursty", ...)
    limit_jobs: int | None = None
    durations: str = "shown"  # or "hidden": time limits are user-style overestimates

    def __post_init__(self) -> None:
        if self.durations not in DURATIONS:
            raise ValueError(f"durations must be one of {', '.join(DURATIONS)}")


def replay(task: Replay) -> tuple[dict[str, Any], tuple[JobRecord, ...]]:
    """Run one replay (in a worker process); the report without its sharing check."""
    jobs = tuple(load_trace(task.trace, limit=task.limit_jobs))
    quotas = load_quotas(task.quotas) if task.quotas is not None and task.quotas.exists() else None
    teams = build_teams((job.tenant for job in jobs), quotas, task.gpus)
    scenario = Scenario(
        jobs=jobs,
        cluster=ClusterSpec(task.gpus),
        teams=teams,
        trace_name=str(task.trace),
        hide_durations=task.durations == "hidden",
    )
    started = time.process_time()
    report, records = simulate(scenario, task.policy, check_sharing=False)
    # CPU seconds of the replay alone: on a shared machine the wall clock says little.
    report["cpu_s"] = round(time.process_time() - started, 1)
    report["trace_label"] = task.label
    report["limit_jobs"] = task.limit_jobs
    return report, records


def run_replays(
    tasks: Sequence[Replay],
    *,
    workers: int | None = None,
    out: TextIO = sys.stdout,
    on_report: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every replay of ``tasks`` in worker processes (the longest first); the reports in the
    order of ``tasks``, each shared policy's with its sharing-incentive check when the
    private baseline of the same trace and size is among the tasks. Each report is printed,
    and handed to ``on_report``, as soon as its replay ends (a run cut short keeps those)."""
    order = sorted(range(len(tasks)), key=lambda i: -_cost(tasks[i]))
    workers = max(1, min(len(tasks), workers or os.cpu_count() or 1))
    done: dict[int, tuple[dict[str, Any], tuple[JobRecord, ...]]] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(replay, tasks[i]): i for i in order}
        for future in as_completed(futures):
            i = futures[future]
            done[i] = future.result()
            report = done[i][0]
            print(
                f"  {report['trace_label']} {report['policy']} on {report['gpus']} GPUs, "
                f"durations {report['durations']}: "
                f"mean wait {report['mean_wait_s']:.0f} s, utilisation "
                f"{report['utilisation_vs_bound']:.2%} of bound, jain "
                f"{report['jain_waiting']:.3f}, {report['wall_s']:.1f} s wall, "
                f"{report['cpu_s']:.1f} s CPU",
                file=out,
                flush=True,
            )
            if on_report is not None:
                on_report(report)
    private = {
        (task.label, task.gpus, task.durations): done[i][1]
        for i, task in enumerate(tasks)
        if task.policy == "private"
    }
    reports = []
    for i, task in enumerate(tasks):
        report, records = done[i]
        baseline = private.get((task.label, task.gpus, task.durations))
        if task.policy != "private" and baseline is not None:
            report["sharing_incentive"] = sharing_report(records, baseline)
        reports.append(report)
    return reports


def philly_tasks(
    trace_path: str | Path = DEFAULT_TRACE,
    gpu_sizes: Sequence[int] = (512, 400),
    *,
    quotas_path: str | Path | None = None,
    limit_jobs: int | None = None,
    policies: Sequence[str] = POLICY_ORDER,
    durations: Sequence[str] = DURATIONS,
) -> list[Replay]:
    trace = Path(trace_path)
    quotas = Path(quotas_path) if quotas_path else trace.parent / "vc_quota_nodes.csv"
    return [
        Replay(trace, quotas, gpus, policy, "philly", limit_jobs, mode)
        for gpus in gpu_sizes
        for mode in durations
        for policy in policies
    ]


def trace_tasks(
    names: Sequence[str] = OWN_TRACES,
    gpus: int = OWN_TRACE_GPUS,
    *,
    durations: Sequence[str] = DURATIONS,
) -> list[Replay]:
    tasks = []
    for name in names:
        trace, quotas = FIXTURES / f"trace_{name}.csv", FIXTURES / f"trace_{name}_quotas.csv"
        tasks.extend(
            Replay(trace, quotas, gpus, policy, name, durations=mode)
            for mode in durations
            for policy in TRACE_POLICIES
        )
    return tasks


def bench_tasks(
    trace_path: str | Path = DEFAULT_TRACE,
    gpu_sizes: Sequence[int] = (512, 400),
    *,
    full: bool = False,
    limit_jobs: int | None = None,
    philly: bool = True,
    traces: bool = True,
) -> list[Replay]:
    """The replays of `make bench`: Philly on every size and the own traces, with fair share,
    FIFO + backfill and private partitions, each with the durations shown and hidden;
    ``full`` (`make bench-full`) adds plain FIFO on Philly, the slowest baseline."""
    tasks: list[Replay] = []
    if philly:
        policies = POLICY_ORDER if full else TRACE_POLICIES
        tasks += philly_tasks(trace_path, gpu_sizes, limit_jobs=limit_jobs, policies=policies)
    if traces:
        tasks += trace_tasks()
    return tasks


def run(
    trace_path: str | Path = DEFAULT_TRACE,
    gpu_sizes: Sequence[int] = (512, 400),
    *,
    quotas_path: str | Path | None = None,
    limit_jobs: int | None = None,
    policies: Sequence[str] = POLICY_ORDER,
    durations: Sequence[str] = DURATIONS,
    workers: int | None = None,
    out: TextIO = sys.stdout,
) -> list[dict[str, Any]]:
    tasks = philly_tasks(
        trace_path,
        gpu_sizes,
        quotas_path=quotas_path,
        limit_jobs=limit_jobs,
        policies=policies,
        durations=durations,
    )
    results = run_replays(tasks, workers=workers, out=out)
    print(render_table(results), file=out)
    print(render_targets(check_targets(results)), file=out, flush=True)
    return results


def run_traces(
    names: Sequence[str] = OWN_TRACES,
    *,
    durations: Sequence[str] = DURATIONS,
    workers: int | None = None,
    out: TextIO = sys.stdout,
) -> list[dict[str, Any]]:
    results = run_replays(trace_tasks(names, durations=durations), workers=workers, out=out)
    print(render_tables(results), file=out)
    print(render_targets(trace_targets(results)), file=out, flush=True)
    return results


def render_tables(results: Sequence[dict[str, Any]]) -> str:
    """One table per trace."""
    labels = dict.fromkeys(r.get("trace_label", "philly") for r in results)
    return "\n\n".join(
        f"{label}:\n" + render_table([r for r in results if r.get("trace_label") == label])
        for label in labels
    )


def column(report: dict[str, Any]) -> str:
    """A replay's column head: policy@gpus, with "/hidden" when durations were hidden."""
    hidden = "/hidden" if report.get("durations", "shown") == "hidden" else ""
    return f"{report['policy']}@{report['gpus']}{hidden}"


def render_table(results: Sequence[dict[str, Any]]) -> str:
    heads = [column(r) for r in results]
    width = max(12, *(len(h) for h in heads))
    lines = [f"{'':<14}" + "".join(f"{h:>{width + 1}}" for h in heads)]
    for label, key, fmt in _ROWS:
        cells = []
        for r in results:
            value = r.get(key)
            if value is None:
                cells.append("-")
                continue
            cells.append(fmt.format(value / 3600 if key == "makespan_s" else value))
        lines.append(f"{label:<14}" + "".join(f"{c:>{width + 1}}" for c in cells))
    return "\n".join(lines)


def check_targets(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's Philly targets, each with the figures behind its verdict."""
    by = {(r["policy"], r["gpus"], r.get("durations", "shown")): r for r in results}
    sizes = sorted({r["gpus"] for r in results}, reverse=True)
    checks: list[dict[str, Any]] = []
    for gpus, mode in ((gpus, mode) for gpus in sizes for mode in DURATIONS):
        ours, base = by.get((OURS, gpus, mode)), by.get((BASELINE, gpus, mode))
        if ours is None:
            continue
        where = f"{gpus} GPUs, durations {mode}"
        if gpus == max(sizes):
            ratio = ours["utilisation_vs_bound"]
            checks.append(
                _target(
                    f"{where}: utilisation >= {UTILISATION_VS_BOUND:.0%} of its bound",
                    ratio >= UTILISATION_VS_BOUND,
                    f"{ours['utilisation']:.4f} of {ours['utilisation_bound']:.4f} = {ratio:.2%}",
                )
            )
        if gpus == min(sizes):
            checks.append(
                _target(
                    f"{where}: utilisation above {BASELINE}'s",
                    None if base is None else ours["utilisation"] > base["utilisation"],
                    f"{BASELINE} not replayed (make bench-full)"
                    if base is None
                    else f"{ours['utilisation']:.4f} vs {base['utilisation']:.4f}",
                )
            )
        checks.append(
            _target(
                f"{where}: jain_waiting >= {JAIN_TARGET}",
                ours["jain_waiting"] >= JAIN_TARGET,
                f"{ours['jain_waiting']:.4f}",
            )
        )
        checks.append(
            _target(
                f"{where}: mean wait below {BASELINE}'s",
                None if base is None else ours["mean_wait_s"] < base["mean_wait_s"],
                f"{BASELINE} not replayed (make bench-full)"
                if base is None
                else f"{ours['mean_wait_s']:.0f} s vs {base['mean_wait_s']:.0f} s",
            )
        )
        checks.append(_sharing_target(where, ours))
    # Each whole-trace replay against the time one may take (a slice says nothing of it).
    for report in results:
        if report.get("limit_jobs") is None:
            where = f"{report['policy']} @ {report['gpus']} GPUs, durations {report['durations']}"
            checks.append(
                _target(
                    f"{where}: whole replay <= {REPLAY_TARGET_S / 60:.0f} min of CPU",
                    report["cpu_s"] <= REPLAY_TARGET_S,
                    f"{report['cpu_s']:.0f} s",
                )
            )
    return checks


def trace_targets(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 8's targets on every trace, all at once: ``jain_waiting`` >= 0.95, mean wait
    <= FIFO + backfill's, utilisation >= 97% of its bound, the sharing incentive for every
    team (the simulator's definitions, docs/simulator.md)."""
    by = {
        (r["trace_label"], r["policy"], r["gpus"], r.get("durations", "shown")): r for r in results
    }
    checks: list[dict[str, Any]] = []
    for label, policy, gpus, mode in by:
        if policy != OURS:
            continue
        ours, base = by[(label, policy, gpus, mode)], by.get((label, BASELINE, gpus, mode))
        where = f"{label} @ {gpus} GPUs" + (", durations hidden" if mode == "hidden" else "")
        ratio = ours["utilisation_vs_bound"]
        checks.append(
            _target(
                f"{where}: jain_waiting >= {JAIN_TARGET}",
                ours["jain_waiting"] >= JAIN_TARGET,
                f"{ours['jain_waiting']:.4f}",
            )
        )
        checks.append(
            _target(
                f"{where}: mean wait <= {BASELINE}'s",
                None if base is None else ours["mean_wait_s"] <= base["mean_wait_s"],
                "not replayed"
                if base is None
                else f"{ours['mean_wait_s']:.0f} s vs {base['mean_wait_s']:.0f} s "
                f"({ours['mean_wait_s'] / max(base['mean_wait_s'], 1e-9):.2f}x)",
            )
        )
        checks.append(
            _target(
                f"{where}: utilisation >= {UTILISATION_VS_BOUND:.0%} of its bound",
                ratio >= UTILISATION_VS_BOUND,
                f"{ours['utilisation']:.4f} of {ours['utilisation_bound']:.4f} = {ratio:.2%}",
            )
        )
        checks.append(_sharing_target(where, ours))
    return checks


def _sharing_target(where: str, ours: dict[str, Any]) -> dict[str, Any]:
    sharing = ours.get("sharing_incentive")
    name = f"{where}: sharing incentive for every team"
    if sharing is None:
        return _target(name, None, "private baseline not replayed")
    failing = [t for t, v in sharing["teams"].items() if v["holds"] is False]
    return _target(
        name,
        sharing["holds"],
        "all teams hold" if not failing else "fails for " + ", ".join(failing),
    )


def _target(name: str, met: bool | None, detail: str) -> dict[str, Any]:
    """``met`` None: not measured in this run."""
    return {"target": name, "met": None if met is None else bool(met), "detail": detail}


def render_targets(checks: Sequence[dict[str, Any]]) -> str:
    lines = ["targets:"]
    for check in checks:
        verdict = {True: "met", False: "NOT met", None: "not run"}[check["met"]]
        lines.append(f"  {verdict:<8} {check['target']}: {check['detail']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.philly", description=__doc__)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--quotas", type=Path)
    parser.add_argument("--gpus", default="512,400")
    parser.add_argument("--limit-jobs", type=int)
    parser.add_argument("--policies", default=",".join(POLICY_ORDER))
    parser.add_argument(
        "--durations", default=",".join(DURATIONS), help="shown, hidden or both (the default)"
    )
    parser.add_argument("--workers", type=int, help="replays at once (default: the cores)")
    parser.add_argument(
        "--traces", action="store_true", help="replay the own traces (tests/fixtures/trace_*.csv)"
    )
    parser.add_argument("--json", type=Path, help="write the list of results here")
    args = parser.parse_args(argv)
    sizes = tuple(int(size) for size in args.gpus.split(",") if size.strip())
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    durations = tuple(d.strip() for d in args.durations.split(",") if d.strip())
    if args.traces:
        results = run_traces(workers=args.workers, durations=durations)
    else:
        results = run(
            args.trace,
            sizes,
            quotas_path=args.quotas,
            limit_jobs=args.limit_jobs,
            policies=policies,
            durations=durations,
            workers=args.workers,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

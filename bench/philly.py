"""Philly replays for ``make bench``: our policy and the baselines, side by side, with targets.

``run(trace_path, gpu_sizes=(512, 400))`` replays the trace with ``fairshare``, ``fifo``,
``fifo_backfill`` and ``private`` on every size (the private baseline runs once per size
and also feeds each shared policy's sharing-incentive check), prints one table and the
targets with met / not met, and returns the simulator's JSON dicts.

``python -m bench.philly [--trace PATH] [--gpus 512,400] [--policies a,b] [--limit-jobs N]
[--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from scheduler import schedule
from scheduler.sim.cluster import ClusterSpec, build_teams
from scheduler.sim.runner import Scenario, run_private, simulate
from scheduler.sim.trace import load_quotas, load_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"
POLICY_ORDER = ("fairshare", "fifo", "fifo_backfill", "private")
OURS, BASELINE = "fairshare", "fifo_backfill"
UTILISATION_VS_BOUND = 0.97
JAIN_TARGET = 0.95

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
    ("wall s", "wall_s", "{:.1f}"),
)


def run(
    trace_path: str | Path = DEFAULT_TRACE,
    gpu_sizes: Sequence[int] = (512, 400),
    *,
    quotas_path: str | Path | None = None,
    limit_jobs: int | None = None,
    policies: Sequence[str] = POLICY_ORDER,
    out: TextIO = sys.stdout,
) -> list[dict[str, Any]]:
    trace = Path(trace_path)
    quota_file = Path(quotas_path) if quotas_path else trace.parent / "vc_quota_nodes.csv"
    jobs = tuple(load_trace(trace, limit=limit_jobs))
    quotas = load_quotas(quota_file) if quota_file.exists() else None
    results: list[dict[str, Any]] = []
    for gpus in gpu_sizes:
        cluster = ClusterSpec(gpus)
        teams = build_teams((job.tenant for job in jobs), quotas, gpus)
        scenario = Scenario(jobs=jobs, cluster=cluster, teams=teams, trace_name=str(trace))
        private = run_private(scenario, schedule)
        for policy in policies:
            report, _ = simulate(scenario, policy, private=private)
            print(
                f"  {policy} on {gpus} GPUs: mean wait {report['mean_wait_s']:.0f} s, "
                f"utilisation {report['utilisation_vs_bound']:.2%} of bound, "
                f"jain {report['jain_waiting']:.3f}, {report['wall_s']:.1f} s wall",
                file=out,
                flush=True,
            )
            results.append(report)
    print(render_table(results), file=out)
    print(render_targets(check_targets(results)), file=out, flush=True)
    return results


def render_table(results: Sequence[dict[str, Any]]) -> str:
    heads = [f"{r['policy']}@{r['gpus']}" for r in results]
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
    by = {(r["policy"], r["gpus"]): r for r in results}
    sizes = sorted({r["gpus"] for r in results}, reverse=True)
    checks: list[dict[str, Any]] = []
    for gpus in sizes:
        ours, base = by.get((OURS, gpus)), by.get((BASELINE, gpus))
        if ours is None:
            continue
        if gpus == max(sizes):
            ratio = ours["utilisation_vs_bound"]
            checks.append(
                _target(
                    f"{gpus} GPUs: utilisation >= {UTILISATION_VS_BOUND:.0%} of its bound",
                    ratio >= UTILISATION_VS_BOUND,
                    f"{ours['utilisation']:.4f} of {ours['utilisation_bound']:.4f} = {ratio:.2%}",
                )
            )
        if base is not None and gpus == min(sizes):
            checks.append(
                _target(
                    f"{gpus} GPUs: utilisation above {BASELINE}'s",
                    ours["utilisation"] > base["utilisation"],
                    f"{ours['utilisation']:.4f} vs {base['utilisation']:.4f}",
                )
            )
        checks.append(
            _target(
                f"{gpus} GPUs: jain_waiting >= {JAIN_TARGET}",
                ours["jain_waiting"] >= JAIN_TARGET,
                f"{ours['jain_waiting']:.4f}",
            )
        )
        if base is not None:
            checks.append(
                _target(
                    f"{gpus} GPUs: mean wait below {BASELINE}'s",
                    ours["mean_wait_s"] < base["mean_wait_s"],
                    f"{ours['mean_wait_s']:.0f} s vs {base['mean_wait_s']:.0f} s",
                )
            )
        sharing = ours.get("sharing_incentive")
        if sharing is not None:
            failing = [t for t, v in sharing["teams"].items() if v["holds"] is False]
            checks.append(
                _target(
                    f"{gpus} GPUs: sharing incentive for every team",
                    sharing["holds"],
                    "all teams hold" if not failing else "fails for " + ", ".join(failing),
                )
            )
    return checks


def _target(name: str, met: bool, detail: str) -> dict[str, Any]:
    return {"target": name, "met": bool(met), "detail": detail}


def render_targets(checks: Sequence[dict[str, Any]]) -> str:
    lines = ["targets:"]
    for check in checks:
        verdict = "met" if check["met"] else "NOT met"
        lines.append(f"  {verdict:<8} {check['target']}: {check['detail']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.philly", description=__doc__)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--quotas", type=Path)
    parser.add_argument("--gpus", default="512,400")
    parser.add_argument("--limit-jobs", type=int)
    parser.add_argument("--policies", default=",".join(POLICY_ORDER))
    parser.add_argument("--json", type=Path, help="write the list of results here")
    args = parser.parse_args(argv)
    sizes = tuple(int(size) for size in args.gpus.split(",") if size.strip())
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    results = run(
        args.trace, sizes, quotas_path=args.quotas, limit_jobs=args.limit_jobs, policies=policies
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

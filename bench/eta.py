"""ETA calibration and the starvation bound, measured on replays (part of ``make bench``).

``calibration(trace, gpus=..., limit_jobs=...)`` replays the trace with the portal's policy
twice, with the true durations shown to the scheduler as time limits and hidden behind
user-style limits (``scheduler.sim.engine.user_limit``), recording every job's first start
estimate; it returns the ETA error of both (``scheduler.sim.metrics.eta_calibration``: over
the jobs that waited at least 10 minutes, |actual start - estimate| / actual wait).

``starvation(...)`` replays with a maximum wait (``SchedulerConfig.max_wait_s``) and reports
the worst wait of the jobs that reached it against the stated bound
(``scheduler.sim.metrics.starvation``, docs/scheduling.md#starvation).

``python -m bench.eta [--trace PATH] [--gpus 512] [--limit-jobs 3000] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler.sim.cluster import ClusterSpec, build_teams
from scheduler.sim.runner import Scenario, simulate
from scheduler.sim.trace import load_quotas, load_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"
# The slice of the trace the calibration replays (with explanations in every pass that
# meets a new job, a replay costs several times a plain one).
DEFAULT_LIMIT_JOBS = 3000
MEDIAN_TARGET = 0.25  # median ETA error with durations hidden


def _scenario(trace: Path, gpus: int, limit_jobs: int | None) -> Scenario:
    jobs = tuple(load_trace(trace, limit=limit_jobs))
    quota_file = trace.parent / "vc_quota_nodes.csv"
    quotas = load_quotas(quota_file) if quota_file.exists() else None
    teams = build_teams((job.tenant for job in jobs), quotas, gpus)
    return Scenario(jobs=jobs, cluster=ClusterSpec(gpus), teams=teams, trace_name=str(trace))


def calibration(
    trace: str | Path = DEFAULT_TRACE,
    *,
    gpus: int = 512,
    limit_jobs: int | None = DEFAULT_LIMIT_JOBS,
) -> dict[str, Any]:
    """The ETA error of the portal's policy with durations shown and hidden."""
    scenario = replace(_scenario(Path(trace), gpus, limit_jobs), record_etas=True)
    out: dict[str, Any] = {"trace": str(trace), "gpus": gpus, "limit_jobs": limit_jobs}
    for mode, hidden in (("shown", False), ("hidden", True)):
        report, _ = simulate(
            replace(scenario, hide_durations=hidden), "fairshare", check_sharing=False
        )
        out[mode] = {**report["eta"], "mean_wait_s": report["mean_wait_s"]}
        out[mode]["wall_s"] = report["wall_s"]
    out["target"] = {
        "name": f"median ETA error <= {MEDIAN_TARGET:.0%} with durations hidden",
        "met": out["hidden"]["jobs"] > 0 and out["hidden"]["median_error"] <= MEDIAN_TARGET,
    }
    return out


def render_calibration(result: dict[str, Any]) -> str:
    lines = [
        f"ETA calibration, fairshare on {result['gpus']} GPUs, first "
        f"{result['limit_jobs']} jobs of {Path(result['trace']).name}:"
    ]
    for mode in ("shown", "hidden"):
        eta = result[mode]
        lines.append(
            f"  durations {mode:<6}: {eta['jobs']} jobs waited >= {eta['min_wait_s']:.0f} s; "
            f"|actual - predicted| / wait median {eta['median_error']:.1%}, "
            f"p90 {eta['p90_error']:.1%}; {eta['within_band']:.1%} inside the band; "
            f"{eta['unknown']} unknown ({eta['wall_s']:.0f} s wall)"
        )
    target = result["target"]
    lines.append(f"  {'met' if target['met'] else 'NOT met':<8} {target['name']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eta", description=__doc__)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--limit-jobs", type=int, default=DEFAULT_LIMIT_JOBS)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = calibration(args.trace, gpus=args.gpus, limit_jobs=args.limit_jobs)
    print(render_calibration(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

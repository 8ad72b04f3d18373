"""ETA calibration and the starvation bound, measured on replays (part of ``make bench``).

``calibration(trace, gpus=..., limit_jobs=...)`` replays the trace with the portal's policy
twice, with the true durations shown to the scheduler as time limits and hidden behind
user-style limits (``scheduler.sim.engine.user_limit``), recording every job's first start
estimate; it returns the ETA error of both (``scheduler.sim.metrics.eta_calibration``: over
the jobs that waited at least 10 minutes, |actual start - estimate| / actual wait).

``starvation(...)`` replays with a maximum wait (``SchedulerConfig.max_wait_s``) and reports
the worst wait of the jobs that reached it against the stated bound
(``scheduler.sim.metrics.starvation``, docs/scheduling.md#starvation).

``calibration(..., attribute=True)`` (``--attribute``) replays with durations hidden once more
and splits the error: the jobs told too early and too late, and of those told too early, the
ones that later arrivals went ahead of in the queue's order (fair share), which no estimate
from the present queue can foresee.

``python -m bench.eta [--trace PATH] [--quotas PATH] [--gpus 256] [--limit-jobs 2000]
[--attribute] [--json OUT]``; the own traces: ``--trace tests/fixtures/trace_big_gangs.csv
--quotas tests/fixtures/trace_big_gangs_quotas.csv --gpus 64``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler import core
from scheduler.config import SchedulerConfig
from scheduler.model import Decisions, Snapshot
from scheduler.sim.cluster import ClusterSpec, build_teams
from scheduler.sim.engine import user_limit
from scheduler.sim.metrics import (
    ETA_MIN_WAIT_S,
    guarantee_overruns,
    guarantee_waits,
    percentile,
    starvation,
)
from scheduler.sim.records import JobRecord
from scheduler.sim.runner import Scenario, simulate
from scheduler.sim.trace import load_quotas, load_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"
# The slice of the trace the calibration replays (with explanations in every pass that
# meets a new job, a replay costs several times a plain one).
DEFAULT_LIMIT_JOBS = 2000
DEFAULT_GPUS = 256  # (the slice is light on 512 GPUs: few jobs wait 10 minutes)
MEDIAN_TARGET = 0.25  # median ETA error with durations hidden


def _scenario(
    trace: Path, gpus: int, limit_jobs: int | None, quota_file: Path | None = None
) -> Scenario:
    """The replay of ``trace``; team quotas from ``quota_file``, else the trace's folder's
    ``vc_quota_nodes.csv`` (Philly's) when there is one."""
    jobs = tuple(load_trace(trace, limit=limit_jobs))
    if quota_file is None:
        quota_file = trace.parent / "vc_quota_nodes.csv"
    quotas = load_quotas(quota_file) if quota_file.exists() else None
    teams = build_teams((job.tenant for job in jobs), quotas, gpus)
    return Scenario(jobs=jobs, cluster=ClusterSpec(gpus), teams=teams, trace_name=str(trace))


def calibration(
    trace: str | Path = DEFAULT_TRACE,
    *,
    gpus: int = DEFAULT_GPUS,
    limit_jobs: int | None = DEFAULT_LIMIT_JOBS,
    quotas: str | Path | None = None,
    attribute: bool = False,
) -> dict[str, Any]:
    """The ETA error of the portal's policy with durations shown and hidden (with
    ``attribute``, also ``attribution`` of the hidden one, from one more replay)."""
    quota_file = Path(quotas) if quotas is not None else None
    scenario = replace(_scenario(Path(trace), gpus, limit_jobs, quota_file), record_etas=True)
    out: dict[str, Any] = {"trace": str(trace), "gpus": gpus, "limit_jobs": limit_jobs}
    config = scenario.base_config
    for mode, hidden in (("shown", False), ("hidden", True)):
        report, records = simulate(
            replace(scenario, hide_durations=hidden), "fairshare", check_sharing=False
        )
        out[mode] = {**report["eta"], "mean_wait_s": report["mean_wait_s"]}
        out[mode]["wall_s"] = report["wall_s"]
        longest = max(j.duration_s for j in scenario.jobs)
        out[mode]["starvation"] = starvation_report(
            records,
            guarantees={name: float(t.guaranteed_gpus) for name, t in scenario.teams.items()},
            longest_limit_s=user_limit(longest) if hidden else longest,
            config=config,
            cluster=scenario.cluster,
        )
    if attribute:
        out["hidden"]["attribution"] = attribution(scenario)
    out["target"] = {
        "name": f"median ETA error <= {MEDIAN_TARGET:.0%} with durations hidden",
        "met": out["hidden"]["jobs"] > 0 and out["hidden"]["median_error"] <= MEDIAN_TARGET,
    }
    return out


class _QueueWatch:
    """A ``ScheduleFn`` around the core's that only looks: for each job, the estimate of its
    first pending pass with explanations (the one the calibration keeps) and the jobs ahead
    of it then, and the jobs ahead of it in its last pending pass before it first starts."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, float | None, frozenset[str]]] = {}
        self.last_ahead: dict[str, frozenset[str]] = {}
        self._started: set[str] = set()

    def __call__(self, snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        decisions = core.schedule(snapshot, now=now, config=config)
        self._started.update(a.job_id for a in decisions.assign)
        order = sorted(decisions.pending, key=lambda p: p.position)
        ahead: list[str] = []
        for pending in order:
            job_id = pending.job_id
            if job_id not in self._started:
                if config.explain and job_id not in self.first:
                    self.first[job_id] = (now, pending.eta, frozenset(ahead))
                self.last_ahead[job_id] = frozenset(ahead)
            ahead.append(job_id)
        return decisions


def attribution(scenario: Scenario) -> dict[str, Any]:
    """Where the error with durations hidden comes from (``--attribute``): over the jobs of
    the calibration (waited at least 10 minutes, an estimate), those told too early and too
    late, and the jobs told too early that at their start had jobs ahead of them in the
    order which arrived after their estimate (overtaken by later arrivals), with the median
    error of each group and of the others."""
    watch = _QueueWatch()
    hidden = replace(scenario, record_etas=True, hide_durations=True)
    _, records = simulate(hidden, "fairshare", schedule=watch, check_sharing=False)
    return split_error(records, watch.first, watch.last_ahead)


def split_error(
    records: Sequence[JobRecord],
    first: dict[str, tuple[float, float | None, frozenset[str]]],
    last_ahead: dict[str, frozenset[str]],
    *,
    min_wait_s: float = ETA_MIN_WAIT_S,
) -> dict[str, Any]:
    """``attribution`` from a replay's records and what ``_QueueWatch`` saw."""
    submitted = {r.job_id: r.submit_s for r in records}
    groups: dict[str, list[float]] = {"early": [], "late": [], "early_overtaken": [], "rest": []}
    for record in records:
        seen = first.get(record.job_id)
        if seen is None or not record.segments:
            continue
        at, likely, _ = seen
        if likely is None:
            continue
        started = record.segments[0].start_s
        waited = started - record.submit_s
        if waited < min_wait_s:
            continue
        error = abs(started - likely) / waited
        early = likely < started
        groups["early" if early else "late"].append(error)
        overtaken = any(
            submitted[k] > at for k in last_ahead.get(record.job_id, ()) if k in submitted
        )
        groups["early_overtaken" if early and overtaken else "rest"].append(error)
    return {
        name: {
            "jobs": len(errors),
            "median_error": round(percentile(errors, 50), 4) if errors else None,
        }
        for name, errors in groups.items()
    }


def starvation_report(
    records: Sequence[JobRecord],
    *,
    guarantees: dict[str, float],
    longest_limit_s: float,
    config: SchedulerConfig,
    cluster: ClusterSpec,
) -> dict[str, Any]:
    """The worst observed waits against both bounds of docs/scheduling.md#starvation; the
    waits over bound 1 whose only room was borrowed work spared by ``reclaim_max_run_s`` (an
    assumption of the bound) are counted apart from the others."""
    within = guarantee_waits(records, guarantees)
    guarantee_bound = config.min_run_time_s + config.grace_period_s
    overruns = guarantee_overruns(
        records,
        guarantees,
        capacity=float(cluster.gpus),
        gpus_per_node=cluster.gpus_per_node,
        bound_s=guarantee_bound,
        reclaim_max_run_s=config.reclaim_max_run_s,
        min_run_time_s=config.min_run_time_s,
    )
    # When the only victims include a job larger than its team's guarantee, the reclaiming
    # job may wait up to reclaim_wait_s more (docs/scheduling.md); the records do not say
    # which victims a wait faced, so the jobs over each bound are counted.
    patient_bound = guarantee_bound + (config.reclaim_wait_s or 0.0)
    out: dict[str, Any] = {
        "guarantee": {
            "bound_s": guarantee_bound,
            "jobs": len(within),
            "worst_wait_s": round(max(within.values(), default=0.0), 1),
            "over_bound": overruns.over,
            # of those, blocked only by borrowed jobs past reclaim_max_run_s (an assumption)
            "over_bound_protected_only": overruns.protected,
            "over_bound_other": overruns.over - overruns.protected,
            "worst_other_wait_s": round(overruns.worst_unprotected_s, 1),
            "bound_with_reclaim_wait_s": patient_bound,
            "over_bound_with_reclaim_wait": sum(
                1 for w in within.values() if w > patient_bound + 1e-6
            ),
        }
    }
    if config.max_wait_s is not None:
        starved = starvation(
            records,
            max_wait_s=config.max_wait_s,
            longest_limit_s=longest_limit_s,
            grace_s=config.grace_period_s,
            guarantees=guarantees,
        )
        out["max_wait"] = {
            "max_wait_s": starved.max_wait_s,
            "starved_jobs": starved.starved,
            "worst_wait_s": round(starved.worst_wait_s, 1),
            "its_bound_s": round(starved.worst_bound_s, 1),
            "worst_wait_over_bound": round(starved.worst_ratio, 4),
            "over_bound": starved.violations,
            # bounds counted from a later start of another team's work within its guarantee
            "deferred_by_guarantees": starved.deferred,
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
    lines.append("starvation bounds (docs/scheduling.md#starvation), same replays:")
    for mode in ("shown", "hidden"):
        bounds = result[mode]["starvation"]
        g = bounds["guarantee"]
        lines.append(
            f"  durations {mode:<6}: within the guarantee, worst wait after heading the team's "
            f"queue {g['worst_wait_s']:.0f} s against {g['bound_s']:.0f} s "
            f"({g['over_bound']} of {g['jobs']} jobs over; "
            f"{g['over_bound_with_reclaim_wait']} over {g['bound_with_reclaim_wait_s']:.0f} s, "
            "the bound when the victims include a job larger than its team's guarantee)"
        )
        lines.append(
            f"    of the {g['over_bound']} over: {g['over_bound_protected_only']} blocked only by "
            "borrowed jobs past reclaim_max_run_s (an assumption of the bound), "
            f"{g['over_bound_other']} otherwise (worst {g['worst_other_wait_s']:.0f} s)"
        )
        m = bounds.get("max_wait")
        if m is not None:
            lines.append(
                f"  durations {mode:<6}: {m['starved_jobs']} jobs waited past "
                f"{m['max_wait_s'] / 86400:.0f} d; worst {m['worst_wait_s'] / 3600:.1f} h against "
                f"its bound {m['its_bound_s'] / 3600:.1f} h; highest wait / bound "
                f"{m['worst_wait_over_bound']:.2f} ({m['over_bound']} over; "
                f"{m['deferred_by_guarantees']} counted from a later start of another team's "
                "work within its guarantee)"
            )
    return "\n".join(lines)


def render_attribution(split: dict[str, Any]) -> str:
    def part(name: str) -> str:
        group = split[name]
        median = group["median_error"]
        return f"{group['jobs']} (median {'-' if median is None else f'{median:.1%}'})"

    return (
        f"  durations hidden, the error split: told too early {part('early')}, too late "
        f"{part('late')}; told too early with later arrivals ahead of them in the order at "
        f"their start {part('early_overtaken')}, all the others {part('rest')}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eta", description=__doc__)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--limit-jobs", type=int, default=DEFAULT_LIMIT_JOBS)
    parser.add_argument(
        "--quotas", type=Path, help="team quotas (vc,node num); default: the trace's folder's"
    )
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="also split the hidden error: told early or late, overtaken by later arrivals",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = calibration(
        args.trace,
        gpus=args.gpus,
        limit_jobs=args.limit_jobs,
        quotas=args.quotas,
        attribute=args.attribute,
    )
    print(render_calibration(result))
    if args.attribute:
        print(render_attribution(result["hidden"]["attribution"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

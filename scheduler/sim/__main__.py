"""``python -m scheduler.sim``: replay a trace through the scheduling core.

Example::

    python -m scheduler.sim --trace ../shared/traces/philly/jobs.csv \\
        --quotas ../shared/traces/philly/vc_quota_nodes.csv --gpus 512 --policy fairshare \\
        --json /tmp/fairshare.json --jobs-out /tmp/segments.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from scheduler.sim.cluster import (
    DEFAULT_MIG_LAYOUT,
    DEFAULT_QUOTA_NODES,
    ClusterError,
    ClusterSpec,
    build_teams,
)
from scheduler.sim.engine import ProgressFn, SimulationError
from scheduler.sim.report import render_text, save_jobs_csv, save_json
from scheduler.sim.runner import POLICIES, Scenario, assign_users, simulate
from scheduler.sim.trace import TraceError, load_quotas, load_trace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.sim",
        description="Replay a GPU job trace through scheduler.schedule() and report waits, "
        "completion times, utilisation and fairness against their bounds.",
    )
    parser.add_argument(
        "--trace", required=True, help="CSV: job_id,submit_s,duration_s,gpus,tenant"
    )
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the simulated cluster")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--quotas", help="CSV vc,node num: team weights and guarantees in nodes")
    parser.add_argument("--policy", choices=POLICIES, default="fairshare")
    parser.add_argument("--json", dest="json_out", help="write the report as JSON here")
    parser.add_argument("--jobs-out", help="write one CSV row per run segment here")
    parser.add_argument("--limit-jobs", type=int, help="replay only the first N jobs of the file")
    parser.add_argument("--seed", type=int, default=0, help="seed for the user assignment")
    parser.add_argument(
        "--users-per-team",
        type=int,
        default=1,
        help="spread jobs without a user over this many users per team (by --seed)",
    )
    parser.add_argument(
        "--default-quota-nodes",
        type=float,
        default=DEFAULT_QUOTA_NODES,
        help="quota in nodes of teams with no row in --quotas",
    )
    parser.add_argument("--mig-nodes", type=int, default=0, help="nodes whose GPUs are MIG-split")
    parser.add_argument(
        "--mig-layout",
        default=",".join(DEFAULT_MIG_LAYOUT),
        help="MIG profiles of each GPU on a MIG node",
    )
    parser.add_argument("--grace-period-s", type=float, help="override the core's grace period")
    parser.add_argument("--min-run-time-s", type=float, help="override the core's minimum run")
    parser.add_argument(
        "--progress", action="store_true", help="report the simulated time now and then (stderr)"
    )
    parser.add_argument(
        "--hide-durations",
        action="store_true",
        help="time limits are the durations rounded up to 1 h / 4 h / 24 h / 7 d, as users "
        "ask; the scheduler never sees true durations",
    )
    parser.add_argument(
        "--etas",
        action="store_true",
        help="record each job's first start estimate and report the ETA error (slower: "
        "passes with new jobs explain)",
    )
    parser.add_argument(
        "--no-sharing-check",
        action="store_true",
        help="skip the private-partition run that the sharing-incentive check needs",
    )
    return parser


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    jobs = load_trace(args.trace, limit=args.limit_jobs)
    jobs = assign_users(jobs, args.users_per_team, args.seed)
    cluster = ClusterSpec(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        mig_nodes=args.mig_nodes,
        mig_layout=tuple(p.strip() for p in args.mig_layout.split(",") if p.strip()),
    )
    quotas = load_quotas(args.quotas) if args.quotas else None
    teams = build_teams(
        (job.tenant for job in jobs),
        quotas,
        cluster.gpus,
        default_quota_nodes=args.default_quota_nodes,
    )
    scenario = Scenario(
        jobs=tuple(jobs),
        cluster=cluster,
        teams=teams,
        trace_name=str(args.trace),
        seed=args.seed,
        default_quota_nodes=args.default_quota_nodes,
        hide_durations=args.hide_durations,
        record_etas=args.etas,
    )
    if args.progress:
        scenario = replace(scenario, progress=_print_progress(time.perf_counter()))
    config = scenario.base_config
    if args.grace_period_s is not None:
        config = replace(
            config, grace_period_s=_non_negative("--grace-period-s", args.grace_period_s)
        )
    if args.min_run_time_s is not None:
        config = replace(
            config, min_run_time_s=_non_negative("--min-run-time-s", args.min_run_time_s)
        )
    return replace(scenario, base_config=config)


def _print_progress(started: float) -> ProgressFn:
    def report(now: float, finished: int, pending: int) -> None:
        print(
            f"  t={now / 86400:.2f} d: {finished} jobs finished, {pending} pending, "
            f"{time.perf_counter() - started:.0f} s wall",
            file=sys.stderr,
            flush=True,
        )

    return report


def _non_negative(option: str, value: float) -> float:
    if value < 0:
        raise ClusterError(f"{option} must be >= 0 seconds, got {value:g}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scenario = scenario_from_args(args)
        report, records = simulate(scenario, args.policy, check_sharing=not args.no_sharing_check)
    except (OSError, TraceError, ClusterError, SimulationError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        if args.json_out:
            save_json(report, args.json_out)
        if args.jobs_out:
            save_jobs_csv(records, args.jobs_out)
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(render_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

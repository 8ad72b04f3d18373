"""Running a policy on a scenario and turning the replay into the report's JSON.

Policies: ``fairshare`` (the portal's policy), ``fifo`` and ``fifo_backfill`` (the baselines
of ``scheduler/baselines.py``, through the same core with another ``Policy``), and
``private``: every team alone on a partition the size of its guarantee, run through the same
core with FIFO + backfill; a job larger than its team's partition is left out of that
baseline and counted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from scheduler import core
from scheduler.config import Policy, SchedulerConfig
from scheduler.memo import Carry
from scheduler.sim.cluster import DEFAULT_QUOTA_NODES, ClusterSpec, TeamSpec, build_nodes
from scheduler.sim.engine import ProgressFn, ScheduleFn, SimResult, replay
from scheduler.sim.metrics import (
    ETA_MIN_WAIT_S,
    TeamResult,
    eta_calibration,
    per_team,
    sharing_incentive,
    summarise,
)
from scheduler.sim.records import JobRecord
from scheduler.sim.trace import TraceJob

POLICIES = ("fairshare", "fifo", "fifo_backfill", "private")
_CORE_POLICY = {
    "fairshare": Policy.FAIRSHARE,
    "fifo": Policy.FIFO,
    "fifo_backfill": Policy.FIFO_BACKFILL,
    "private": Policy.FIFO_BACKFILL,
}


def _replay_config() -> SchedulerConfig:
    return SchedulerConfig(explain=False)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trace on a cluster with its teams, and the knobs every policy shares."""

    jobs: tuple[TraceJob, ...]
    cluster: ClusterSpec
    teams: Mapping[str, TeamSpec]
    trace_name: str = ""
    seed: int = 0
    base_config: SchedulerConfig = field(default_factory=_replay_config)
    default_quota_nodes: float = DEFAULT_QUOTA_NODES
    progress: ProgressFn | None = None  # for long replays: called now and then
    # Time limits are user-style overestimates, not the true durations (``engine``).
    hide_durations: bool = False
    # Keep each job's first start estimate (passes with new jobs explain) for the ETA error.
    record_etas: bool = False


def config_for(policy: str, base: SchedulerConfig) -> SchedulerConfig:
    if policy not in _CORE_POLICY:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    # Nothing reads the pending list of a pass without explanations: no entry is built.
    return replace(base, policy=_CORE_POLICY[policy], explain=False, list_pending=False)


def assign_users(jobs: Sequence[TraceJob], users_per_team: int, seed: int) -> list[TraceJob]:
    """Give jobs without a user one of ``users_per_team`` users of their team, by seed."""
    if users_per_team < 1:
        raise ValueError(f"--users-per-team must be >= 1, got {users_per_team}")
    if users_per_team == 1:
        return list(jobs)
    rng = random.Random(seed)
    return [
        job if job.user else replace(job, user=f"{job.tenant}-u{rng.randrange(users_per_team)}")
        for job in jobs
    ]


@dataclass(frozen=True, slots=True)
class PrivateRun:
    records: tuple[JobRecord, ...]
    excluded: Mapping[str, int]  # per team: jobs larger than its partition
    passes: int
    wall_s: float


def carrying(schedule: ScheduleFn) -> ScheduleFn:
    """The core's pass with one ``scheduler.Carry`` for a whole replay: the replay hands the
    core the same ``Job`` objects pass after pass, so each pending job is made a candidate
    once, not once per pass (the decisions are the same). Any other ``schedule`` as it is."""
    if schedule is not core.schedule:
        return schedule
    return partial(core.schedule, carry=Carry())


def run_shared(scenario: Scenario, policy: str, schedule: ScheduleFn) -> tuple[SimResult, float]:
    """Replay the whole trace on the shared cluster; returns the result and wall seconds."""
    started = time.perf_counter()
    result = replay(
        scenario.jobs,
        nodes=build_nodes(scenario.cluster),
        teams=scenario.teams,
        config=config_for(policy, scenario.base_config),
        schedule=carrying(schedule),
        gpus_per_node=scenario.cluster.gpus_per_node,
        progress=scenario.progress,
        hide_durations=scenario.hide_durations,
        record_etas=scenario.record_etas,
    )
    return result, time.perf_counter() - started


def run_private(scenario: Scenario, schedule: ScheduleFn) -> PrivateRun:
    """Each team alone on whole-GPU nodes adding up to its guarantee, FIFO + backfill."""
    started = time.perf_counter()
    config = config_for("private", scenario.base_config)
    records: list[JobRecord] = []
    excluded: dict[str, int] = {}
    passes = 0
    for name, team in sorted(scenario.teams.items()):
        jobs = [job for job in scenario.jobs if job.tenant == name]
        if team.guaranteed_gpus < 1:
            excluded[name] = len(jobs)
            continue
        partition = ClusterSpec(team.guaranteed_gpus, scenario.cluster.gpus_per_node)
        result = replay(
            jobs,
            nodes=build_nodes(partition),
            teams={name: team},
            config=config,
            schedule=carrying(schedule),
            gpus_per_node=partition.gpus_per_node,
            hide_durations=scenario.hide_durations,
        )
        records.extend(result.records)
        excluded[name] = len(result.excluded)
        passes += result.passes
    return PrivateRun(tuple(records), excluded, passes, time.perf_counter() - started)


def simulate(
    scenario: Scenario,
    policy: str,
    *,
    schedule: ScheduleFn = core.schedule,
    private: PrivateRun | None = None,
    check_sharing: bool = True,
) -> tuple[dict[str, Any], tuple[JobRecord, ...]]:
    """Run one policy through ``schedule`` (the core's, unless a test passes a stand-in);
    returns the report's JSON dict and the job records.

    For a shared policy the sharing-incentive check needs the private baseline: pass one
    already run (the benchmark does, once per cluster size) or it is run here.
    """
    if policy == "private":
        run = private if private is not None else run_private(scenario, schedule)
        report = _report(scenario, policy, run.records, float(scenario.cluster.gpus))
        report.update(
            excluded_jobs=sum(run.excluded.values()),
            passes=run.passes,
            wall_s=round(run.wall_s, 3),
        )
        for team, count in run.excluded.items():
            report["teams"][team]["excluded_jobs"] = count
        return report, run.records
    result, wall_s = run_shared(scenario, policy, schedule)
    report = _report(scenario, policy, result.records, result.capacity)
    report.update(
        excluded_jobs=len(result.excluded),
        unfinished_jobs=len(result.unfinished),
        failed_jobs=len(result.failed),
        passes=result.passes,
        skipped_passes=result.skipped,
        ticks=result.ticks,
        wall_s=round(wall_s, 3),
    )
    if scenario.record_etas:
        report["eta"] = eta_report(result)
    if check_sharing:
        baseline = private if private is not None else run_private(scenario, schedule)
        report["sharing_incentive"] = sharing_report(result.records, baseline.records)
    return report, result.records


def eta_report(result: SimResult) -> dict[str, Any]:
    """The ETA error of a replay that recorded estimates (``metrics.eta_calibration``)."""
    calibration = eta_calibration(result.records, result.etas)
    return {
        "min_wait_s": ETA_MIN_WAIT_S,
        "jobs": calibration.jobs,
        "unknown": calibration.unknown,
        "median_error": round(calibration.median_error, 4),
        "p90_error": round(calibration.p90_error, 4),
        "within_band": round(calibration.within_band, 4),
    }


def sharing_report(shared: Sequence[JobRecord], private: Sequence[JobRecord]) -> dict[str, Any]:
    checks = sharing_incentive(shared, private)
    teams = {
        team: {
            "jobs": check.jobs,
            "mean_wait_s": round(check.mean_wait_s, 1),
            "private_mean_wait_s": round(check.private_mean_wait_s, 1),
            "holds": check.holds,
        }
        for team, check in checks.items()
    }
    verdicts = [check.holds for check in checks.values() if check.holds is not None]
    return {"holds": all(verdicts), "teams": teams}


def _report(
    scenario: Scenario, policy: str, records: Sequence[JobRecord], capacity: float
) -> dict[str, Any]:
    summary = summarise(records, capacity)
    weights = {name: team.weight for name, team in scenario.teams.items()}
    teams, jain = per_team(records, weights, capacity)
    defaulted = sorted(name for name, team in scenario.teams.items() if team.defaulted)
    return {
        "policy": policy,
        "trace": scenario.trace_name,
        "gpus": scenario.cluster.gpus,
        "gpus_per_node": scenario.cluster.gpus_per_node,
        "mig_nodes": scenario.cluster.mig_nodes,
        "capacity_units": capacity,
        "seed": scenario.seed,
        "durations": "hidden" if scenario.hide_durations else "shown",
        "jobs": summary.jobs,
        "mean_wait_s": round(summary.mean_wait_s, 1),
        "p50_wait_s": round(summary.p50_wait_s, 1),
        "p99_wait_s": round(summary.p99_wait_s, 1),
        "mean_jct_s": round(summary.mean_jct_s, 1),
        "p50_jct_s": round(summary.p50_jct_s, 1),
        "p99_jct_s": round(summary.p99_jct_s, 1),
        "mean_duration_s": round(summary.mean_duration_s, 1),
        "makespan_s": round(summary.makespan_s, 1),
        "makespan_lower_bound_s": round(summary.makespan_lower_bound_s, 1),
        "utilisation": round(summary.utilisation, 4),
        "utilisation_bound": round(summary.utilisation_bound, 4),
        "utilisation_vs_bound": round(
            summary.utilisation / summary.utilisation_bound if summary.utilisation_bound else 0,
            4,
        ),
        "offered_load": round(summary.offered_load, 4),
        "jain_waiting": round(jain, 4),
        "default_quota": {"nodes": scenario.default_quota_nodes, "teams": defaulted},
        "teams": {
            name: _team_entry(scenario.teams[name], teams.get(name))
            for name in sorted(scenario.teams)
        },
    }


def _team_entry(spec: TeamSpec, measured: TeamResult | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "weight": spec.weight,
        "guaranteed_gpus": spec.guaranteed_gpus,
        "quota_default": spec.defaulted,
        "jobs": 0,
        "mean_wait_s": 0.0,
        "share": 0.0,
        "entitlement": 0.0,
        "fair_ratio": None,
    }
    if measured is not None:
        entry.update(
            jobs=measured.jobs,
            mean_wait_s=round(measured.mean_wait_s, 1),
            share=round(measured.share, 4),
            entitlement=round(measured.entitlement, 4),
            fair_ratio=None if measured.fair_ratio is None else round(measured.fair_ratio, 4),
        )
    return entry

"""Small builders for scheduling-core tests: clusters, jobs, snapshots, decision summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler import (
    Decisions,
    Dependency,
    DependencyKind,
    DependencyState,
    GpuRequest,
    Job,
    Node,
    RunningJob,
    SchedulerConfig,
    Slice,
    SliceKind,
    Snapshot,
    Team,
    schedule,
)
from scheduler.units import mig_units

WHOLE, MIG, MPS = SliceKind.WHOLE, SliceKind.MIG, SliceKind.MPS


def whole_node(name: str, gpus: int = 4, model: str = "A100", schedulable: bool = True) -> Node:
    """``name`` with whole GPUs ``name-g0`` ..."""
    slices = tuple(Slice(f"{name}-g{g}", name, f"g{g}", WHOLE, 1.0, model) for g in range(gpus))
    return Node(name, slices, schedulable)


def mig_node(name: str, layout: Sequence[Sequence[str]], model: str = "A100") -> Node:
    """One GPU per entry of ``layout``, each split into the listed MIG profiles.

    Slice ids are ``name-g<gpu>-<i>``.
    """
    slices = tuple(
        Slice(f"{name}-g{g}-{i}", name, f"g{g}", MIG, mig_units(p), model, p)
        for g, profiles in enumerate(layout)
        for i, p in enumerate(profiles)
    )
    return Node(name, slices)


def mps_node(name: str, gpus: int = 2, shares: int = 4, model: str = "A100") -> Node:
    """MPS GPUs split into ``shares`` shares each; slice ids ``name-g<gpu>-s<i>``."""
    slices = tuple(
        Slice(f"{name}-g{g}-s{s}", name, f"g{g}", MPS, 1.0 / shares, model)
        for g in range(gpus)
        for s in range(shares)
    )
    return Node(name, slices)


def job(
    job_id: str,
    team: str = "a",
    *,
    user: str = "u",
    count: int = 1,
    kind: SliceKind = WHOLE,
    profile: str = "",
    model: str = "",
    at: float = 0.0,
    priority: str = "normal",
    limit: float | None = None,
    min_count: int = 0,
    multi_node: bool = False,
    after_ok: Iterable[str] = (),
    after_any: Iterable[str] = (),
    preemptible: bool = True,
    queued_since: float | None = None,
    array: str = "",
) -> Job:
    deps = tuple(Dependency(d, DependencyKind.AFTER_OK) for d in after_ok) + tuple(
        Dependency(d, DependencyKind.AFTER_ANY) for d in after_any
    )
    return Job(
        id=job_id,
        team=team,
        user=user,
        request=GpuRequest(kind, count, profile, model, min_count, multi_node),
        submitted_at=at,
        priority=priority,
        time_limit_s=limit,
        preemptible=preemptible,
        depends_on=deps,
        queued_since=queued_since,
        array=array,
    )


def running(
    held: Job,
    slice_ids: Sequence[str],
    *,
    started: float = 0.0,
    borrowed: bool = False,
    preempting_since: float | None = None,
) -> RunningJob:
    node = slice_ids[0].split("-")[0]
    return RunningJob(held, node, tuple(slice_ids), started, borrowed, preempting_since)


def snapshot(
    nodes: Sequence[Node],
    pending: Sequence[Job] = (),
    running_jobs: Sequence[RunningJob] = (),
    teams: Sequence[Team] = (),
    user_usage: Mapping[tuple[str, str], float] | None = None,
    dependency_states: Mapping[str, DependencyState] | None = None,
    array_limits: Mapping[str, int] | None = None,
) -> Snapshot:
    known = {t.name: t for t in teams}
    for j in [*pending, *(r.job for r in running_jobs)]:
        known.setdefault(j.team, Team(j.team))
    return Snapshot(
        nodes=tuple(nodes),
        teams=known,
        pending=tuple(pending),
        running=tuple(running_jobs),
        user_usage=dict(user_usage or {}),
        dependency_states=dict(dependency_states or {}),
        array_limits=dict(array_limits or {}),
    )


def decide(snap: Snapshot, now: float = 1000.0, **config: Any) -> Decisions:
    return schedule(snap, now=now, config=SchedulerConfig(**config))


def placed(decisions: Decisions) -> dict[str, tuple[str, ...]]:
    """job id -> slice ids it was given."""
    return {a.job_id: a.slice_ids for a in decisions.assign}


def codes(decisions: Decisions) -> dict[str, str]:
    """job id -> pending reason code."""
    return {p.job_id: p.reason.code.value for p in decisions.pending}


def summary(decisions: Decisions) -> list[tuple[Any, ...]]:
    """Every decision as a short tuple, in the order the core made them."""
    out: list[tuple[Any, ...]] = [("assign", a.job_id, a.slice_ids) for a in decisions.assign]
    out += [("preempt", p.job_id, p.for_job_id) for p in decisions.preempt]
    out += [("pending", p.job_id, p.reason.code.value, p.position) for p in decisions.pending]
    out += [("fail", f.job_id) for f in decisions.fail]
    return out

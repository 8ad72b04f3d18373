"""Stand-in cores and builders for the simulator's own tests.

The stand-ins exist only here, to test the event loop apart from the real core: a strict
FIFO first-fit, and the same with a crude reclaim rule that lets the loop's preemption,
grace-period and tick handling be checked with numbers worked out by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.config import SchedulerConfig
from scheduler.model import Assign, Decisions, Preempt, RunningJob, Snapshot
from scheduler.sim.cluster import TeamSpec
from scheduler.sim.records import JobRecord, Segment
from scheduler.sim.trace import TraceJob


def job(job_id: str, gpus: int, submit: float, duration: float, tenant: str = "a") -> TraceJob:
    return TraceJob(id=job_id, tenant=tenant, gpus=gpus, submit_s=submit, duration_s=duration)


def team(name: str, guaranteed: int = 0, quota_nodes: float = 1.0) -> TeamSpec:
    return TeamSpec(name, quota_nodes, guaranteed, defaulted=False)


def record(
    job_id: str,
    gpus: float,
    submit: float,
    duration: float,
    *segments: tuple[float, float, bool] | tuple[float, float, bool, tuple[str, ...]],
    tenant: str = "a",
) -> JobRecord:
    return JobRecord(job_id, tenant, gpus, submit, duration, tuple(Segment(*s) for s in segments))


def _free_by_node(snapshot: Snapshot) -> dict[str, list[str]]:
    taken = {s for r in snapshot.running for s in r.slice_ids}
    return {node.name: [s.id for s in node.slices if s.id not in taken] for node in snapshot.nodes}


def _first_fit(free: dict[str, list[str]], gpus: int, multi_node: bool) -> list[str] | None:
    for slices in free.values():
        if len(slices) >= gpus:
            chosen = slices[:gpus]
            del slices[:gpus]
            return chosen
    if multi_node and sum(len(s) for s in free.values()) >= gpus:
        chosen: list[str] = []
        for slices in free.values():
            take = slices[: gpus - len(chosen)]
            chosen.extend(take)
            del slices[: len(take)]
        return chosen
    return None


def fifo_standin(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
    """Strict FIFO, first fit: the head of the queue blocks everything behind it."""
    free = _free_by_node(snapshot)
    assigns: list[Assign] = []
    for pending in sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id)):
        chosen = _first_fit(free, pending.request.count, pending.request.multi_node)
        if chosen is None:
            break
        assigns.append(Assign(pending.id, chosen[0].split("/")[0], tuple(chosen)))
    return Decisions(assign=tuple(assigns))


def reclaim_standin(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
    """FIFO, plus: a blocked head whose team is under its guarantee preempts the youngest
    job of a team above its guarantee that has run ``min_run_time_s``."""
    decisions = fifo_standin(snapshot, now=now, config=config)
    placed = {a.job_id for a in decisions.assign}
    waiting = [j for j in snapshot.pending if j.id not in placed]
    if not waiting:
        return decisions
    head = min(waiting, key=lambda j: (j.submitted_at, j.id))
    held = _held(snapshot.running)
    if held.get(head.team, 0.0) >= snapshot.teams[head.team].guaranteed:
        return decisions
    victims = sorted(
        (
            r
            for r in snapshot.running
            if r.preempting_since is None
            and held.get(r.job.team, 0.0) > snapshot.teams[r.job.team].guaranteed
            and now - r.started_at >= config.min_run_time_s
        ),
        key=lambda r: -r.started_at,
    )
    free = sum(len(s) for s in _free_by_node(snapshot).values())
    draining = sum(len(r.slice_ids) for r in snapshot.running if r.preempting_since is not None)
    chosen: list[Preempt] = []
    for victim in victims:
        if free + draining >= head.request.count:
            break
        chosen.append(Preempt(victim.job.id, "reclaim", head.id))
        draining += len(victim.slice_ids)
    return Decisions(assign=decisions.assign, preempt=tuple(chosen))


def _held(running: Iterable[RunningJob]) -> dict[str, float]:
    held: dict[str, float] = {}
    for r in running:
        held[r.job.team] = held.get(r.job.team, 0.0) + len(r.slice_ids)
    return held

"""Run-time history: how long past jobs of the same shape ran, for start estimates.

A running job's end is certain only up to its time limit, and a job without one has no known
end at all. The caller (the portal's shell from its finished jobs, the simulator from the
jobs it has finished) passes what past jobs of the same *shape* ran, as data in
``Snapshot.run_times``; the core never reads history itself.

A job's shape (``shape_of_job``) is what it asks for: kind, count, MIG profile, GPU model and
its time limit (jobs with the same limit are the ones a user thinks of as alike; a job without
a limit is its own shape). Its history is looked up in this order, the first with samples
winning: the same user and shape, the same team and shape, the shape across teams; nothing
else is known without it.

History informs estimates only, never a decision: reservations and backfill keep to the time
limits, which jobs are held to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from scheduler.model import Job, RunTime, RunTimes


def shape_of_job(job: Job) -> str:
    """The history key of a job's request: ``whole:4::A100:3600`` (kind, count, profile,
    model, time limit in whole seconds or ``-`` without one)."""
    request = job.request
    limit = "-" if job.time_limit_s is None else f"{job.time_limit_s:.0f}"
    return f"{request.kind.value}:{request.count}:{request.profile}:{request.model}:{limit}"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``values``, interpolated linearly between order
    statistics (the simulator's definition)."""
    if not values:
        raise ValueError("percentile: values must not be empty")
    at = q * (len(values) - 1)
    low = math.floor(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def run_time_of(durations: Iterable[float]) -> RunTime | None:
    """The summary of some past run times in seconds (None without any)."""
    ordered = sorted(d for d in durations if d >= 0 and math.isfinite(d))
    if not ordered:
        return None
    return RunTime(
        samples=len(ordered),
        p10_s=percentile(ordered, 0.1),
        median_s=percentile(ordered, 0.5),
        p90_s=percentile(ordered, 0.9),
    )


def history_of(history: RunTimes, job: Job) -> RunTime | None:
    """What jobs like ``job`` ran: user and shape, team and shape, shape; else None."""
    if not (history.by_user or history.by_team or history.by_shape):
        return None
    shape = shape_of_job(job)
    found = history.by_user.get(user_key(job.team, job.user, shape))
    if found is None:
        found = history.by_team.get(team_key(job.team, shape))
    if found is None:
        found = history.by_shape.get(shape)
    return found


def user_key(team: str, user: str, shape: str) -> str:
    return f"{team}\x1f{user}\x1f{shape}"


def team_key(team: str, shape: str) -> str:
    return f"{team}\x1f{shape}"


def run_times_from(finished: Iterable[tuple[Job, float]]) -> RunTimes:
    """``RunTimes`` from finished jobs and how long each ran, at all three levels."""
    users: dict[str, list[float]] = {}
    teams: dict[str, list[float]] = {}
    shapes: dict[str, list[float]] = {}
    for job, ran in finished:
        shape = shape_of_job(job)
        users.setdefault(user_key(job.team, job.user, shape), []).append(ran)
        teams.setdefault(team_key(job.team, shape), []).append(ran)
        shapes.setdefault(shape, []).append(ran)
    return RunTimes(_summaries(users), _summaries(teams), _summaries(shapes))


def _summaries(groups: Mapping[str, list[float]]) -> Mapping[str, RunTime]:
    out: dict[str, RunTime] = {}
    for key, durations in groups.items():
        summary = run_time_of(durations)
        if summary is not None:
            out[key] = summary
    return MappingProxyType(out)


# --- a job's end, three ways ------------------------------------------------------------------

# (earliest, likely, latest) end or run time; None: unknown.
Band = tuple[float | None, float | None, float | None]


def run_band(job: Job, history: RunTimes) -> Band:
    """How long ``job`` will run: earliest, likely and latest, in seconds.

    With a time limit the latest is the limit and history may only shorten the others; with
    history and no limit, its 10th, 50th and 90th percentiles; with neither, unknown."""
    limit = job.time_limit_s
    past = history_of(history, job)
    if past is None:
        return (limit, limit, limit)
    if limit is None:
        return (past.p10_s, past.median_s, past.p90_s)
    return (min(limit, past.p10_s), min(limit, past.median_s), limit)


def end_band(job: Job, started_at: float, now: float, history: RunTimes) -> Band:
    """When a job that started at ``started_at`` ends, as of ``now``.

    Without history: its time limit (unknown without one). With history (each point capped
    by the limit): the latest is the limit, else the 90th percentile; the likely end is the
    median, or once that has passed the 90th percentile, or once that has passed too
    halfway between now and the latest (unknown without a limit); the earliest is the 10th
    percentile. Nothing ends before ``now``."""
    limit = job.time_limit_s
    limit_end = None if limit is None else max(now, started_at + limit)
    past = history_of(history, job)
    if past is None:
        return (limit_end, limit_end, limit_end)
    low, mid, high = (
        started_at + (run if limit is None else min(run, limit))
        for run in (past.p10_s, past.median_s, past.p90_s)
    )
    latest = limit_end if limit_end is not None else (high if high > now else None)
    if mid > now:
        likely: float | None = mid
    elif high > now:
        likely = high
    else:
        likely = None if latest is None else (now + latest) / 2
    earliest = max(now, low) if likely is None else min(max(now, low), likely)
    return (earliest, likely, latest)

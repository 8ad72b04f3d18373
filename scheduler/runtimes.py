"""Run-time history: how long past jobs of the same shape ran, for start estimates.

A running job's end is certain only up to its time limit, and a job without one has no known
end at all. The caller (the portal's shell from its finished jobs, the simulator from the
jobs it has finished) passes what past jobs of the same *shape* ran, as data in
``Snapshot.run_times``; the core never reads history itself.

A job's shape (``shape_of_job``) is what it asks for: kind, count, MIG profile, GPU model and
its time limit (jobs with the same limit are the ones a user thinks of as alike; a job without
a limit is its own shape). Its history is looked up in this order, the first with samples
winning: the same user and shape, the same team and shape, the shape across teams; nothing
else is known without it. Each key summarises its ``RECENT_RUNS`` most recent runs, and
keeps their distribution, so a running job's end is estimated from the past runs at least
as long as it has run so far (``end_band``).

History informs estimates only, never a decision: reservations and backfill keep to the time
limits, which jobs are held to.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from scheduler.model import Job, RunTime, RunTimes

# Each key's summary is of its most recent runs only, this many: a user's jobs of one shape
# come in runs of alike experiments, and the recent ones say more of the next (docs/
# scheduling.md#estimates-measured: 100 against 200, 50 and 20 on Philly).
RECENT_RUNS = 100


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


# A summary keeps the distribution at this many equal steps (0, 5%, ..., 100%).
QUANTILE_STEPS = 20


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
        quantiles=tuple(percentile(ordered, i / QUANTILE_STEPS) for i in range(QUANTILE_STEPS + 1)),
    )


def share_within(quantiles: Sequence[float], run_s: float) -> float:
    """The share (0..1) of past runs that ended within ``run_s``, from a summary's equally
    spaced ``quantiles`` (linear between them, the inverse of ``percentile`` on them; 1 at
    or past the longest)."""
    last = len(quantiles) - 1
    if run_s >= quantiles[last]:
        return 1.0
    i = bisect.bisect_right(quantiles, run_s) - 1  # quantiles[i] <= run_s < quantiles[i + 1]
    if i < 0:
        return 0.0
    return (i + (run_s - quantiles[i]) / (quantiles[i + 1] - quantiles[i])) / last


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


def run_times_from(
    finished: Iterable[tuple[Job, float]], *, newest_first: bool = False
) -> RunTimes:
    """``RunTimes`` from finished jobs and how long each ran, at all three levels, each key
    from its ``RECENT_RUNS`` most recent runs (``finished`` in the order they finished,
    or the reverse with ``newest_first``)."""
    users: dict[str, list[float]] = {}
    teams: dict[str, list[float]] = {}
    shapes: dict[str, list[float]] = {}
    for job, ran in finished:
        shape = shape_of_job(job)
        for level, key in (
            (users, user_key(job.team, job.user, shape)),
            (teams, team_key(job.team, shape)),
            (shapes, shape),
        ):
            runs = level.get(key)
            if runs is None:
                level[key] = [ran]
            elif newest_first:
                if len(runs) < RECENT_RUNS:
                    runs.append(ran)
            else:
                runs.append(ran)
                if len(runs) > 2 * RECENT_RUNS:
                    del runs[:-RECENT_RUNS]
    return RunTimes(_summaries(users), _summaries(teams), _summaries(shapes))


def _summaries(groups: Mapping[str, list[float]]) -> Mapping[str, RunTime]:
    out: dict[str, RunTime] = {}
    for key, durations in groups.items():
        summary = run_time_of(durations[-RECENT_RUNS:])
        if summary is not None:
            out[key] = summary
    return MappingProxyType(out)


# --- a job's end, three ways ------------------------------------------------------------------

# (earliest, likely, latest) end or run time; None: unknown.
Band = tuple[float | None, float | None, float | None]


def run_band(job: Job, history: RunTimes, running: Mapping[str, float] | None = None) -> Band:
    """How long ``job`` will run: earliest, likely and latest, in seconds.

    With a time limit the latest is the limit and history may only shorten the others; with
    history and no limit, its 10th, 50th and 90th percentiles; with neither, unknown. The
    likely run is never shorter than the same user's jobs of its shape running now have run
    so far (the median, ``running``, from ``running_runs``): a new series of longer jobs
    shows there before any of it has finished."""
    limit = job.time_limit_s
    past = history_of(history, job)
    if past is None:
        return (limit, limit, limit)
    likely = past.median_s
    if running:
        now_running = running.get(user_key(job.team, job.user, shape_of_job(job)))
        if now_running is not None and now_running > likely:
            likely = now_running
    if limit is None:
        return (min(past.p10_s, likely), likely, max(past.p90_s, likely))
    return (min(limit, past.p10_s, likely), min(limit, likely), limit)


def running_runs(runs: Iterable[tuple[Job, float]]) -> dict[str, float]:
    """The median time run so far (seconds) of the running jobs of each user and shape, from
    (job, time run) pairs, for ``run_band``. (What they have run, not their likely runs:
    the jobs running at any moment are the longer ones, and their likely ends, past the
    history, say more than any of them is known to run.)"""
    by_key: dict[str, list[float]] = {}
    for job, run_s in runs:
        by_key.setdefault(user_key(job.team, job.user, shape_of_job(job)), []).append(run_s)
    return {key: percentile(sorted(values), 0.5) for key, values in by_key.items()}


def end_band(job: Job, started_at: float, now: float, history: RunTimes) -> Band:
    """When a job that started at ``started_at`` ends, as of ``now``.

    Without history: its time limit (unknown without one). With history (each point capped
    by the limit): the latest is the limit, else the 90th percentile. With the distribution
    (``RunTime.quantiles``) the job, having run ``now - started_at``, is one of the past
    runs at least that long: its ends are the 10th, 50th and 90th percentiles of those
    (``_end_given_run``). With the three percentiles only: the likely end is the median, or
    once that has passed the 90th percentile, or once that has passed too halfway between
    now and the latest (unknown without a limit); the earliest is the 10th percentile.
    Nothing ends before ``now``."""
    limit = job.time_limit_s
    limit_end = None if limit is None else max(now, started_at + limit)
    past = history_of(history, job)
    if past is None:
        return (limit_end, limit_end, limit_end)
    if past.quantiles:
        return _end_given_run(past.quantiles, limit, started_at, now, limit_end)
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


def _end_given_run(
    quantiles: Sequence[float],
    limit: float | None,
    started_at: float,
    now: float,
    limit_end: float | None,
) -> Band:
    """``end_band`` from the whole distribution: a job that has run ``now - started_at``
    is one of the past runs at least that long, so its ends are the 10th, 50th and 90th
    percentiles of those (capped by the limit). Past the longest past run: likely halfway
    between now and the limit, latest the limit (both unknown without one)."""
    ran = share_within(quantiles, now - started_at)
    if ran >= 1.0:
        return (now, None if limit_end is None else (now + limit_end) / 2, limit_end)
    low, mid, high = (
        max(now, started_at + (run if limit is None else min(run, limit)))
        for run in (percentile(quantiles, ran + (1.0 - ran) * q) for q in (0.1, 0.5, 0.9))
    )
    return (low, mid, limit_end if limit_end is not None else high)

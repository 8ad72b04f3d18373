"""Idle GPUs: a running job whose GPUs stayed idle gets a warning, and optionally is stopped
(docs/agent.md, "Idle GPUs").

Judged on the job's raw GPU samples (``portal.agents.gpu_metrics``), by beat every
PORTAL_IDLE_CHECK_S, with the team's settings (empty: the site's defaults):

- A sample is *idle* when its SM utilisation is under ``idle_util_pct``, or, where NVML gives
  no utilisation (MIG instances, a shared MPS GPU), when the job has no process on its GPUs.
  A sample that is neither (busy, or telling neither) ends an idle stretch.
- A job is idle since its first sample after its last busy one (or its first sample), for
  as long as its latest sample says: idle for = latest - since. Nothing happens on stale
  samples (the latest older than ``FRESH``). Only raw samples count (the last
  PORTAL_METRICS_RAW_HOURS).
1. Idle for ``idle_warn_minutes`` (0: no detection for the team): a warning in the job's
   events (a JobEvent starting ``IDLE_WARNING``), once per idle stretch, and the signal
   ``portal.jobs.signals.job_idle`` after commit: the hook a notification channel listens to.
2. With ``idle_reclaim_minutes`` > 0 (0, the default: never): still idle that long after its
   warning, the job is asked to stop with the portal's stop reason ``IDLE_RECLAIM`` through
   the one stop path (``attempt_request_stops``), the stop is sent after commit, and the job
   ends CANCELLED with reason IDLE_RECLAIMED when its agent reports the end: its slices are
   freed then, and it is never requeued.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min, Q

from portal import agent_messages
from portal.agents.models import JobGpuSample
from portal.jobs.attempts import (
    IDLE_RECLAIM,
    IDLE_RECLAIMED,
    StopAsked,
    StopWanted,
    attempt_request_stops,
)
from portal.jobs.models import Job, JobEvent, JobState
from portal.jobs.signals import job_idle
from portal.jobs.transitions import Note, record_events
from portal.tenants.models import Team

log = logging.getLogger("portal.agents")

# The start of every idle warning in a job's events (how a stretch's warning is found again).
IDLE_WARNING = "GPU idle:"
# Samples older than this say nothing about now: an agent that stopped sending is not idle.
FRESH = timedelta(minutes=10)
# Jobs whose samples are read per query (three conditions each in the last one).
CHUNK = 200


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """A team's idle settings, with the site's defaults filled in."""

    util_pct: float
    warn: timedelta | None  # None: no detection
    reclaim: timedelta | None  # None: never stopped


def idle_policy(
    *, util_pct: float | None, warn_minutes: int | None, reclaim_minutes: int | None
) -> IdlePolicy:
    warn = settings.IDLE_WARN_MINUTES if warn_minutes is None else warn_minutes
    reclaim = settings.IDLE_RECLAIM_MINUTES if reclaim_minutes is None else reclaim_minutes
    return IdlePolicy(
        util_pct=settings.IDLE_UTIL_PCT if util_pct is None else util_pct,
        warn=timedelta(minutes=warn) if warn > 0 else None,
        reclaim=timedelta(minutes=reclaim) if warn > 0 and reclaim > 0 else None,
    )


def busy(util_pct: float) -> Q:
    """The samples that end an idle stretch: utilisation at or over ``util_pct``, or no
    utilisation and a process (or nothing known) on the job's GPUs."""
    no_util = Q(sm_util_pct__isnull=True)
    return Q(sm_util_pct__gte=util_pct) | (
        no_util & (Q(processes__gt=0) | Q(processes__isnull=True))
    )


@dataclass(frozen=True, slots=True)
class IdleStretch:
    """The trailing idle stretch of one attempt's raw samples: its first and latest sample."""

    since: datetime
    latest: datetime

    @property
    def duration(self) -> timedelta:
        return self.latest - self.since


@dataclass
class IdleResult:
    warned: list[int]
    reclaimed: list[int]

    def as_dict(self) -> dict[str, int]:
        return {"warned": len(self.warned), "reclaimed": len(self.reclaimed)}


@dataclass(frozen=True, slots=True)
class _Running:
    job_id: int
    attempt: int
    stopping: bool
    policy: IdlePolicy


def check_idle_jobs(*, now: datetime) -> IdleResult:
    """Warn the running jobs idle long enough, stop those idle long after their warning."""
    running = _running_jobs()
    stretches = _stretches(running, now=now)
    warnings = _warnings(set(stretches))
    warn: list[Note] = []
    reclaim: list[StopWanted] = []
    told: list[tuple[_Running, IdleStretch]] = []
    for job in running:
        stretch = stretches.get(job.job_id)
        if stretch is None or job.policy.warn is None or now - stretch.latest > FRESH:
            continue
        warned_at = max(
            (at for at in warnings.get((job.job_id, job.attempt), ()) if at >= stretch.since),
            default=None,
        )
        if warned_at is None:
            if stretch.duration >= job.policy.warn:
                message = _warning(job, stretch, now)
                warn.append(Note(job.job_id, JobState.RUNNING, job.attempt, message))
                told.append((job, stretch))
        elif (
            job.policy.reclaim is not None
            and not job.stopping
            and now - warned_at >= job.policy.reclaim
            and stretch.duration >= job.policy.warn + job.policy.reclaim
        ):
            reclaim.append(
                StopWanted(
                    job_id=job.job_id,
                    attempt=job.attempt,
                    message=(
                        f"stop requested ({IDLE_RECLAIMED}): its GPUs stayed under "
                        f"{job.policy.util_pct:g}% utilisation since "
                        f"{stretch.since:%Y-%m-%d %H:%M:%S} UTC ({_minutes(stretch.duration)})"
                    ),
                )
            )
    with transaction.atomic():
        if warn:
            # Written only for jobs still running that attempt, read under a lock (PostgreSQL;
            # SQLite's write transaction serialises): a job that ended meanwhile gets no note.
            rows = Job.objects.filter(pk__in=[n.job_id for n in warn], state=JobState.RUNNING)
            if connection.features.has_select_for_update:
                rows = rows.select_for_update()
            still = set(rows.values_list("pk", "attempt"))
            warn = [n for n in warn if (n.job_id, n.attempt) in still]
            told = [(job, stretch) for job, stretch in told if (job.job_id, job.attempt) in still]
        record_events(warn, at=now)
        asked = attempt_request_stops(wanted=reclaim, reason=IDLE_RECLAIM, at=now)
        stopped = [job_id for job_id, found in asked.items() if found == StopAsked.REQUESTED]
        if stopped:
            transaction.on_commit(lambda: agent_messages.request_stops(stopped))
        if told:
            transaction.on_commit(lambda: _announce(told, now))
    result = IdleResult(warned=[n.job_id for n in warn], reclaimed=stopped)
    if warn or stopped:
        log.info("idle GPUs: warned jobs %s, stopping jobs %s", result.warned, stopped)
    return result


def _running_jobs() -> list[_Running]:
    rows = list(
        Job.objects.filter(state=JobState.RUNNING, started_at__isnull=False).values_list(
            "pk", "attempt", "stop_requested_at", "team_id"
        )
    )
    policies = {
        pk: idle_policy(util_pct=util, warn_minutes=warn, reclaim_minutes=reclaim)
        for pk, util, warn, reclaim in Team.objects.filter(
            pk__in={row[3] for row in rows}
        ).values_list("pk", "idle_util_pct", "idle_warn_minutes", "idle_reclaim_minutes")
    }
    return [
        _Running(job_id=pk, attempt=attempt, stopping=asked is not None, policy=policies[team])
        for pk, attempt, asked, team in rows
        if policies[team].warn is not None
    ]


def _stretches(running: Sequence[_Running], *, now: datetime) -> dict[int, IdleStretch]:
    """Each running job's trailing idle stretch in the raw samples of its current attempt
    taken up to ``now``, in a few grouped queries per CHUNK jobs: the latest sample and the
    latest busy one (per threshold), then the first sample after that."""
    found: dict[int, IdleStretch] = {}
    for start in range(0, len(running), CHUNK):
        chunk = {job.job_id: job for job in running[start : start + CHUNK]}
        latest: dict[int, datetime] = {}
        last_busy: dict[int, datetime | None] = {}
        for util_pct in sorted({job.policy.util_pct for job in chunk.values()}):
            ids = [j for j, job in chunk.items() if job.policy.util_pct == util_pct]
            rows = (
                JobGpuSample.objects.filter(job_id__in=ids, period_s=0, at__lte=now)
                .values("job_id", "attempt")
                .annotate(latest=Max("at"), last_busy=Max("at", filter=busy(util_pct)))
                .values_list("job_id", "attempt", "latest", "last_busy")
            )
            for job_id, attempt, at, busy_at in rows:
                if attempt == chunk[job_id].attempt and (busy_at is None or busy_at < at):
                    latest[job_id], last_busy[job_id] = at, busy_at
        if not latest:
            continue
        after = Q()
        for job_id in latest:
            here = Q(job_id=job_id, attempt=chunk[job_id].attempt)
            busy_at = last_busy[job_id]
            after |= here & Q(at__gt=busy_at) if busy_at is not None else here
        firsts = (
            JobGpuSample.objects.filter(after, period_s=0, at__lte=now)
            .values("job_id")
            .annotate(first=Min("at"))
            .values_list("job_id", "first")
        )
        for job_id, first in firsts:
            found[job_id] = IdleStretch(since=first, latest=latest[job_id])
    return found


def _warnings(job_ids: set[int]) -> dict[tuple[int, int], list[datetime]]:
    """When each (job, attempt) among ``job_ids`` was warned of idle GPUs."""
    found: dict[tuple[int, int], list[datetime]] = defaultdict(list)
    ids = sorted(job_ids)
    for start in range(0, len(ids), CHUNK):
        rows = JobEvent.objects.filter(
            job_id__in=ids[start : start + CHUNK], message__startswith=IDLE_WARNING
        ).values_list("job_id", "attempt", "at")
        for job_id, attempt, at in rows:
            found[(job_id, attempt)].append(at)
    return found


def _minutes(span: timedelta) -> str:
    return f"{span.total_seconds() / 60:.0f} min"


def _warning(job: _Running, stretch: IdleStretch, now: datetime) -> str:
    text = (
        f"{IDLE_WARNING} utilisation under {job.policy.util_pct:g}% since "
        f"{stretch.since:%Y-%m-%d %H:%M:%S} UTC ({_minutes(stretch.duration)})"
    )
    if job.policy.reclaim is None:
        return f"{text}; it keeps its slices"
    stop_at = now + job.policy.reclaim
    return (
        f"{text}; if it stays idle it is stopped and its slices freed at "
        f"{stop_at:%Y-%m-%d %H:%M:%S} UTC ({IDLE_RECLAIMED})"
    )


def _announce(told: Sequence[tuple[_Running, IdleStretch]], now: datetime) -> None:
    for job, stretch in told:
        reclaim_at = now + job.policy.reclaim if job.policy.reclaim is not None else None
        for receiver, result in job_idle.send_robust(
            sender=Job,
            job_id=job.job_id,
            attempt=job.attempt,
            idle_since=stretch.since,
            util_pct=job.policy.util_pct,
            reclaim_at=reclaim_at,
        ):
            if isinstance(result, Exception):
                log.error(
                    "a receiver of job_idle failed (%s): %r",
                    getattr(receiver, "__qualname__", receiver),
                    result,
                    exc_info=result,
                )

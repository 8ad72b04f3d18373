"""GPU samples over time: stored from the agents' ``metrics`` batches, rolled up after a day,
read back for the job page.

- ``record_gpu_samples``: one batch (at most ``METRICS_MAX_SAMPLES``) costs a bounded number
  of statements whatever its size: the node, its devices and the attempts ever placed on it
  are read once each, then one bulk insert per table and one upsert of the latest samples.
  Samples of another node's devices or attempts, from the future, or older than the raw window
  are dropped; a batch the broker delivers twice is stored once (unique per series and time).
- ``rollup_gpu_samples`` (beat, every PORTAL_METRICS_ROLLUP_S): raw samples older than
  PORTAL_METRICS_RAW_HOURS become means over PORTAL_METRICS_MEAN_S (one row per series and
  period, ``samples`` raw samples behind it), and every row older than
  PORTAL_METRICS_KEEP_DAYS is deleted. Each run handles at most ``ROLLUP_SERIES`` series of
  each table; the rest wait for the next run.
- ``job_gpu_series``: one attempt's samples for its page.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Model

from portal.agents.models import DeviceGpuSample, JobGpuSample, JobMetrics
from portal.cluster.models import Gpu, Node, Slice
from portal.jobs.models import Allocation, Job
from workers.protocol import AttemptSample, DeviceSample, Metrics

log = logging.getLogger("portal.agents")

# The values every sample row has (raw or mean), in the order the rollup reads them.
VALUES = (
    "sm_util_pct",
    "mem_util_pct",
    "memory_used_mb",
    "processes",
    "power_w",
    "temperature_c",
)
DEVICE_VALUES = (*VALUES, "memory_total_mb", "mps_clients")
# Samples further ahead of the portal's clock than this are refused (a wrong clock).
FUTURE_SLACK = timedelta(minutes=5)
# Series rolled up per run and table: bounds the work of one beat task.
ROLLUP_SERIES = 500
INSERT_BATCH = 1_000


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def raw_window() -> timedelta:
    return timedelta(hours=settings.METRICS_RAW_HOURS)


# --- storing a batch ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stored:
    """What ``record_gpu_samples`` kept and dropped of one batch."""

    jobs: int = 0
    devices: int = 0
    dropped: int = 0


def record_gpu_samples(msg: Metrics, *, now: datetime) -> Stored:
    """Keep the samples of one ``metrics`` batch (see the module docstring)."""
    oldest, newest = now - raw_window(), now + FUTURE_SLACK
    fresh_jobs = [s for s in msg.attempts if oldest <= _at(s.at) <= newest]
    fresh_devices = [s for s in msg.devices if oldest <= _at(s.at) <= newest]
    job_rows = _job_rows(msg.node, fresh_jobs)
    device_rows = _device_rows(msg.node, fresh_devices)
    with transaction.atomic():
        JobGpuSample.objects.bulk_create(job_rows, batch_size=INSERT_BATCH, ignore_conflicts=True)
        DeviceGpuSample.objects.bulk_create(
            device_rows, batch_size=INSERT_BATCH, ignore_conflicts=True
        )
        _keep_latest(fresh_jobs, {(r.job_id, r.attempt) for r in job_rows})
    dropped = len(msg.attempts) + len(msg.devices) - len(job_rows) - len(device_rows)
    if dropped:
        log.info("%s: %d GPU sample(s) not kept (not its own, or too old)", msg.node, dropped)
    return Stored(jobs=len(job_rows), devices=len(device_rows), dropped=dropped)


def _values(sample: AttemptSample | DeviceSample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in VALUES}


def _job_rows(node: str, samples: Sequence[AttemptSample]) -> list[JobGpuSample]:
    if not samples:
        return []
    # Attempts ever placed on this node (held now or before: a batch may follow the end).
    placed = set(
        Allocation.objects.filter(
            job_id__in={s.job_id for s in samples}, slice__gpu__node__name=node
        )
        .values_list("job_id", "attempt")
        .distinct()
    )
    return [
        JobGpuSample(job_id=s.job_id, attempt=s.attempt, at=_at(s.at), **_values(s))
        for s in samples
        if (s.job_id, s.attempt) in placed
    ]


def _device_rows(node_name: str, samples: Sequence[DeviceSample]) -> list[DeviceGpuSample]:
    if not samples:
        return []
    node_id = Node.objects.filter(name=node_name).values_list("pk", flat=True).first()
    if node_id is None:
        return []
    uuids = {s.uuid for s in samples}
    own = set(Gpu.objects.filter(node_id=node_id, uuid__in=uuids).values_list("uuid", flat=True))
    own |= set(
        Slice.objects.filter(gpu__node_id=node_id, mig_uuid__in=uuids).values_list(
            "mig_uuid", flat=True
        )
    )
    return [
        DeviceGpuSample(
            node_id=node_id,
            uuid=s.uuid,
            at=_at(s.at),
            memory_total_mb=s.memory_total_mb,
            mps_clients=s.mps_clients,
            error=s.error,
            **_values(s),
        )
        for s in samples
        if s.uuid in own
    ]


def _keep_latest(samples: Sequence[AttemptSample], kept: set[tuple[int, int]]) -> None:
    """The latest sample of each attempt that holds slices now, in JobMetrics (what /metrics
    exports), in one upsert."""
    latest: dict[tuple[int, int], AttemptSample] = {}
    for sample in samples:
        key = (sample.job_id, sample.attempt)
        newer = key not in latest or sample.at > latest[key].at
        if key in kept and sample.memory_used_mb is not None and newer:
            latest[key] = sample
    if not latest:
        return
    current = set(Job.objects.filter(pk__in={j for j, _ in latest}).values_list("pk", "attempt"))
    rows = [
        JobMetrics(
            job_id=job_id,
            attempt=attempt,
            gpu_util_pct=s.sm_util_pct,
            memory_used_mb=s.memory_used_mb,
            sampled_at=_at(s.at),
        )
        for (job_id, attempt), s in latest.items()
        if (job_id, attempt) in current
    ]
    JobMetrics.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["job"],
        update_fields=["attempt", "gpu_util_pct", "memory_used_mb", "sampled_at"],
    )


# --- rolling up -----------------------------------------------------------------------------


@dataclass
class RollupResult:
    means_written: int = 0
    raw_rolled_up: int = 0
    pruned: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "means_written": self.means_written,
            "raw_rolled_up": self.raw_rolled_up,
            "pruned": self.pruned,
        }


def rollup_cutoff(now: datetime) -> datetime:
    """Raw samples before this become means: the start of the period that holds
    now - PORTAL_METRICS_RAW_HOURS, one period earlier still, so that a batch the report
    handler still takes (it drops samples older than the raw window) never lands in a
    period already rolled up."""
    period = settings.METRICS_MEAN_S
    edge = (now - raw_window()).timestamp()
    return _at((edge // period - 1) * period)


def rollup_gpu_samples(*, now: datetime) -> RollupResult:
    """Means for raw samples older than the cutoff, then the retention (module docstring)."""
    result = RollupResult()
    cutoff = rollup_cutoff(now)
    for model, series, values in (
        (JobGpuSample, ("job_id", "attempt"), VALUES),
        (DeviceGpuSample, ("node_id", "uuid"), DEVICE_VALUES),
    ):
        _rollup(model, series, values, cutoff, result)
    keep_after = now - timedelta(days=settings.METRICS_KEEP_DAYS)
    for model in (JobGpuSample, DeviceGpuSample):
        deleted, _ = model.objects.filter(at__lt=keep_after).delete()
        result.pruned += deleted
    if result.means_written or result.pruned:
        log.info("GPU samples: %s", result.as_dict())
    return result


def _rollup(
    model: type[Model],
    series: tuple[str, str],
    values: Sequence[str],
    cutoff: datetime,
    result: RollupResult,
) -> None:
    manager = model._default_manager
    raw = manager.filter(period_s=0, at__lt=cutoff)
    keys = list(raw.values_list(*series).order_by(*series).distinct()[:ROLLUP_SERIES])
    if not keys:
        return
    period = settings.METRICS_MEAN_S
    first, second = series
    rows = raw.filter(
        **{f"{first}__in": {k[0] for k in keys}, f"{second}__in": {k[1] for k in keys}}
    ).values_list("pk", *series, "at", *values)
    wanted = set(keys)
    groups: dict[tuple[Any, Any, float], list[tuple[Any, ...]]] = defaultdict(list)
    rolled: list[int] = []
    for pk, a, b, at, *numbers in rows:
        if (a, b) not in wanted:
            continue
        start = at.timestamp() // period * period
        groups[(a, b, start)].append(tuple(numbers))
        rolled.append(pk)
    means = [
        model(
            **dict(zip(series, (a, b), strict=True)),
            at=_at(start),
            period_s=period,
            samples=len(members),
            **{name: _mean(m[i] for m in members) for i, name in enumerate(values)},
        )
        for (a, b, start), members in groups.items()
    ]
    with transaction.atomic():
        # A period rolled up before (samples that arrived late) keeps its first mean.
        manager.bulk_create(means, batch_size=INSERT_BATCH, ignore_conflicts=True)
        for start in range(0, len(rolled), INSERT_BATCH):
            manager.filter(pk__in=rolled[start : start + INSERT_BATCH]).delete()
    result.means_written += len(means)
    result.raw_rolled_up += len(rolled)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuPoint:
    """One point of a job's series: raw (``period_s`` 0) or a mean."""

    at: datetime
    period_s: int
    samples: int
    sm_util_pct: float | None
    mem_util_pct: float | None
    memory_used_mb: float | None
    processes: float | None
    power_w: float | None
    temperature_c: float | None


def job_gpu_series(*, job_id: int, attempt: int) -> list[GpuPoint]:
    """The GPU samples of one attempt, oldest first (one query)."""
    rows = (
        JobGpuSample.objects.filter(job_id=job_id, attempt=attempt)
        .order_by("at", "period_s")
        .values_list("at", "period_s", "samples", *VALUES)
    )
    return [GpuPoint(*row) for row in rows]

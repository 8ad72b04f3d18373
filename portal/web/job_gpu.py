"""What a job's page shows of its GPU use (docs/pages.md, "Job page"): the
GPU-unit-hours it was charged (and, while it runs, what its hold has cost so far), its GPU
utilisation and memory over time as two small SVG charts with the same numbers in a table,
and, for a job that failed, the last lines of its log next to its exit code.

At most three queries whatever the job's length: its samples, its charges, its held slices. Long
series are shown as at most ``MAX_POINTS`` equal stretches of time, each the mean of the
samples in it (weighted by the raw samples behind a 5-minute mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Sum

from portal.accounting.models import UsageRecord
from portal.agents.gpu_metrics import VALUES, GpuPoint, job_gpu_series
from portal.jobs.models import HOLDING_STATES, Allocation, Job, JobState
from portal.policy import scheduler_config
from portal.web.charts import Line, lines
from scheduler.units import billed_units

MAX_POINTS = 48
# Lines of the log shown next to a failed job's exit code.
FAILURE_LOG_LINES = 20
HOUR_S = 3600.0
FAILED_STATES = frozenset({JobState.FAILED, JobState.TIMED_OUT})


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One stretch of time of the chart and its table row: means of the samples in it."""

    start: datetime
    end: datetime
    samples: int
    sm_util_pct: float | None
    mem_util_pct: float | None
    memory_used_mb: float | None
    processes: float | None
    power_w: float | None
    temperature_c: float | None

    @property
    def memory_used_gib(self) -> float | None:
        return None if self.memory_used_mb is None else self.memory_used_mb / 1024


def stretches(points: Sequence[GpuPoint], *, max_points: int = MAX_POINTS) -> list[GpuRow]:
    """``points`` (oldest first), one row each, or, when there are more than ``max_points``,
    in ``max_points`` equal stretches of time (empty ones left out)."""
    if len(points) <= max_points:
        return [
            GpuRow(
                start=p.at,
                end=p.at,
                samples=p.samples,
                **{name: getattr(p, name) for name in VALUES},
            )
            for p in points
        ]
    first, last = points[0].at.timestamp(), points[-1].at.timestamp()
    count = max_points
    width = (last - first) / count if last > first else 1.0
    groups: list[list[GpuPoint]] = [[] for _ in range(count)]
    for point in points:
        groups[min(count - 1, int((point.at.timestamp() - first) / width))].append(point)
    rows = []
    for index, group in enumerate(groups):
        if not group:
            continue
        start = datetime.fromtimestamp(first + index * width, tz=UTC)
        end = datetime.fromtimestamp(first + (index + 1) * width, tz=UTC)
        rows.append(
            GpuRow(
                start=start,
                end=end,
                samples=sum(p.samples for p in group),
                **{name: _weighted(group, name) for name in VALUES},
            )
        )
    return rows


def _weighted(group: Sequence[GpuPoint], name: str) -> float | None:
    known = [(getattr(p, name), p.samples) for p in group if getattr(p, name) is not None]
    weight = sum(w for _, w in known)
    return sum(v * w for v, w in known) / weight if weight else None


def _label(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%H:%M")


def _charts(job: Job, rows: Sequence[GpuRow]) -> dict[str, Any]:
    positions = [(r.start.timestamp() + r.end.timestamp()) / 2 for r in rows]
    titles = [
        f"{r.start:%Y-%m-%d %H:%M:%S} UTC"
        if r.start == r.end
        else f"{r.start:%H:%M}–{r.end:%H:%M} UTC"
        for r in rows
    ]
    step = max(1, len(rows) // 6)
    ticks = [(positions[i], _label(rows[i].start)) for i in range(0, len(rows), step)]
    utilisation, util_legend = lines(
        chart_id=f"job-{job.pk}-gpu-util",
        title=f"GPU utilisation of job {job.pk}",
        description="SM and memory-controller utilisation of the job's GPUs over time, in %; "
        "the table below has the same numbers.",
        positions=positions,
        point_titles=titles,
        ticks=ticks,
        series=[
            Line("SM utilisation", [r.sm_util_pct for r in rows]),
            Line("memory utilisation", [r.mem_util_pct for r in rows]),
        ],
        unit="%",
        top=100.0,
    )
    memory, memory_legend = lines(
        chart_id=f"job-{job.pk}-gpu-memory",
        title=f"GPU memory of job {job.pk}",
        description="GPU memory the job's processes used over time, in GiB; the table below "
        "has the same numbers.",
        positions=positions,
        point_titles=titles,
        ticks=ticks,
        series=[Line("memory used", [r.memory_used_gib for r in rows])],
        unit="GiB",
    )
    return {
        "util_chart": utilisation,
        "util_legend": util_legend,
        "memory_chart": memory,
        "memory_legend": memory_legend,
    }


def _unit_hours(job: Job, *, now: datetime) -> tuple[float, float | None]:
    """(GPU-unit-hours charged for its ended attempts, what its current hold has cost so far
    or None when it holds nothing), in billed units as the budget counts them."""
    charged = UsageRecord.objects.filter(job=job).aggregate(total=Sum("unit_seconds"))["total"]
    running = None
    if job.state not in HOLDING_STATES:
        return (charged or 0.0) / HOUR_S, running  # nothing held, or no longer charged
    held = list(
        Allocation.objects.filter(
            job=job, attempt=job.attempt, released_at__isnull=True
        ).values_list("slice__units", "slice__gpu__model", "created_at")
    )
    if held:
        weights = scheduler_config().model_weights
        units = sum(billed_units(u, model, weights) for u, model, _ in held)
        since = min(created for _, _, created in held)
        running = units * max(0.0, (now - since).total_seconds()) / HOUR_S
    return (charged or 0.0) / HOUR_S, running


def job_gpu_context(*, job: Job, log: str, now: datetime) -> dict[str, Any]:
    """The job page's GPU part and its failure box; ``log`` is the attempt's output."""
    points = job_gpu_series(job_id=job.pk, attempt=job.attempt) if job.attempt else []
    rows = stretches(points)
    charged, running = _unit_hours(job, now=now)
    failure_lines = ""
    if job.state in FAILED_STATES and log:
        failure_lines = "\n".join(log.rstrip("\n").split("\n")[-FAILURE_LOG_LINES:])
    return {
        "now": now,  # for the run time (the run_seconds filter)
        "charged_unit_hours": charged,
        "running_unit_hours": running,
        "gpu_rows": rows,
        "gpu_samples": sum(r.samples for r in rows),
        "failure_log": failure_lines,
        **(_charts(job, rows) if rows else {}),
    }

"""What the scheduling loop remembers between passes: one row, updated by every pass."""

from __future__ import annotations

from django.db import models


class SchedulerState(models.Model):
    """The latest scheduling pass (always row id 1).

    ``snapshot_at`` lets a pass asked for by a trigger see that a later pass already covered
    the request (coalescing); the rest is for operators.
    """

    snapshot_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(default=0.0)
    passes = models.PositiveBigIntegerField(default=0)
    assigned = models.PositiveIntegerField(default=0)
    preempted = models.PositiveIntegerField(default=0)
    pending = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"scheduler state after {self.passes} passes"


# Pass timings kept for /metrics: enough recent passes for a useful histogram (about 17
# minutes at the default 2 s beat), few enough that a scrape reads them in one cheap query.
PASS_TIMINGS_KEPT = 500


class PassTiming(models.Model):
    """How long each phase of one scheduling pass took; only the latest ``PASS_TIMINGS_KEPT``
    passes are kept (every pass prunes the older ones)."""

    finished_at = models.DateTimeField()
    snapshot_ms = models.FloatField(help_text="loading the snapshot (after the lock)")
    decide_ms = models.FloatField(help_text="the pure core: scheduler.schedule()")
    apply_ms = models.FloatField(help_text="writing the decisions")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"pass {self.pk}: {self.snapshot_ms + self.decide_ms + self.apply_ms:.1f} ms"

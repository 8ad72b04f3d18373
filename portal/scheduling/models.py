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

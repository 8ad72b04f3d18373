"""What jobs used, charged in GPU-unit-seconds, and the decayed balances fair share reads."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class UsageRecord(models.Model):
    """One attempt's use of its slices, written when the attempt ends."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="usage_records")
    attempt = models.PositiveIntegerField()
    team = models.ForeignKey("tenants.Team", on_delete=models.PROTECT, related_name="usage_records")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="usage_records"
    )
    gpu_units = models.FloatField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    unit_seconds = models.FloatField()

    class Meta:
        ordering = ["-ended_at"]
        constraints = [
            # Charged once per attempt, however often the agent repeats its report.
            models.UniqueConstraint(fields=["job", "attempt"], name="one_usage_record_per_attempt")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt}: {self.unit_seconds:.0f} unit-s"


class UsageBalance(models.Model):
    """Decayed usage of a team (user empty) or of a user inside a team, as of ``as_of``."""

    team = models.ForeignKey("tenants.Team", on_delete=models.CASCADE, related_name="balances")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    unit_seconds = models.FloatField(default=0.0)
    as_of = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team"], condition=models.Q(user__isnull=True), name="one_team_balance"
            ),
            models.UniqueConstraint(
                fields=["team", "user"],
                condition=models.Q(user__isnull=False),
                name="one_user_balance_per_team",
            ),
        ]

    def __str__(self) -> str:
        who = f"{self.team_id}/{self.user_id}" if self.user_id else f"team {self.team_id}"
        return f"{who}: {self.unit_seconds:.0f} unit-s as of {self.as_of:%Y-%m-%d %H:%M}"

"""What the scheduling loop remembers between passes: one row, updated by every pass."""

from __future__ import annotations

from django.conf import settings
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


class PassRequests(models.Model):
    """The requests for a pass that were left to a running pass's task (always row id 1).

    A request that finds another pass running, or the passes paced, counts itself here and
    leaves: the task that ran the last pass compares the count after it with the count
    before, and runs again when it grew (``portal.scheduling.tasks``). One follow-up pass for
    all of them, where each used to retry on its own until a pass started after it. A count,
    not a time: no clock compared.

    ``paced_until``: set while a task waits before its follow-up (the passes paced); the
    requests counted meanwhile are left to it. A time only so that a task that died waiting
    is not waited for long (``tasks.PACING_SLACK``).
    """

    count = models.PositiveBigIntegerField(default=0)
    paced_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.count} requests for a pass left to a running one"


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


# --- the fair-share numbers of the latest pass (``scheduler.standing``) ------------------
# What Slurm's ``sshare -l`` and ``sprio`` show, as the core used them in the latest pass:
# every pass replaces every row (portal/scheduling/fairshare.py), in its own transaction.


class FairSharePass(models.Model):
    """The pass the fair-share rows come from (always row id 1), and the knobs it used."""

    as_of = models.DateTimeField(help_text="the pass's snapshot time")
    capacity_units = models.FloatField(help_text="GPU units of the nodes the pass saw")
    scale_units = models.FloatField(
        help_text="what the teams' fair shares divide: max(capacity, sum of their E)"
    )
    history_per_unit = models.FloatField(
        help_text="decayed GPU-unit-seconds -> units of E: history_weight * ln 2 / half-life"
    )
    aging_per_hour = models.FloatField()

    def __str__(self) -> str:
        return f"fair share as of {self.as_of:%Y-%m-%d %H:%M:%S}"


class FairShareTeam(models.Model):
    """One team's fair-share standing in the latest pass. E and shares in billed units."""

    team = models.OneToOneField(
        "tenants.Team", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    weight = models.FloatField()
    guaranteed_units = models.FloatField()
    usage_unit_seconds = models.FloatField(help_text="decayed GPU-unit-seconds")
    held_units = models.FloatField(help_text="GPU units held as the pass began")
    effective_units = models.FloatField(help_text="E as the pass began")
    effective_end_units = models.FloatField(help_text="E as the pass ended")
    fair_units = models.FloatField(null=True, help_text="null: no pending work, not ranked")
    factor = models.FloatField(null=True, help_text="2 ** (-E / fair) as the pass began")
    factor_end = models.FloatField(null=True, help_text="as the pass ended")
    rank = models.PositiveIntegerField(null=True, help_text="1 = the highest factor_end")

    def __str__(self) -> str:
        return f"fair share of team {self.team_id}"


class FairShareMember(models.Model):
    """One member's standing inside their team in the latest pass."""

    team = models.ForeignKey("tenants.Team", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    usage_unit_seconds = models.FloatField()
    held_units = models.FloatField()
    effective_units = models.FloatField()
    effective_end_units = models.FloatField()
    fair_units = models.FloatField(null=True)
    factor = models.FloatField(null=True)
    factor_end = models.FloatField(null=True)
    rank = models.PositiveIntegerField(null=True, help_text="inside the team")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="fairshare_member_once")
        ]

    def __str__(self) -> str:
        return f"fair share of user {self.user_id} in team {self.team_id}"


class JobPriority(models.Model):
    """The parts of a pending job's place in the order, as the latest pass chose it."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="priority_parts"
    )
    priority = models.CharField(max_length=16, help_text="the class it was ordered in")
    class_rank = models.PositiveSmallIntegerField(help_text="0 = the lowest class")
    within_guarantee = models.BooleanField(help_text="ordered in its class's first round")
    team_factor = models.FloatField()
    user_factor = models.FloatField()
    age_boost = models.FloatField(help_text="aging_per_hour * hours queued")

    class Meta:
        verbose_name_plural = "job priorities"

    def __str__(self) -> str:
        return f"priority parts of job {self.job_id}"

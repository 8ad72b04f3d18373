"""Reads of the fair-share numbers the latest pass used (stored by
``portal.scheduling.fairshare``): the Fair share page, ``GET /api/v1/fairshare/`` and a
pending job's priority parts on its page.

Who sees what: every team's aggregate numbers (weight, guarantee, usage, holdings, factor,
rank) are for everyone, as ``sshare`` shows them; the members of a team and its pending
jobs only to the team's members and to site admins.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from portal.jobs.models import Job, JobState
from portal.scheduling.models import FairShareMember, FairSharePass, FairShareTeam, JobPriority
from portal.tenants.selectors import teams_for_user

# This many queries, whatever the number of teams, members and pending jobs: the asker's
# teams, the pass, the teams' rows, the members' rows, the jobs' rows and their count.
FAIRSHARE_QUERIES = 6
# Pending jobs listed with their priority parts, first in the queue first (the rest are
# counted; each job's page shows its own).
JOBS_SHOWN = 100

_HOUR_S = 3600.0
_STANDING = (
    "held_units",
    "effective_units",
    "effective_end_units",
    "fair_units",
    "factor",
    "factor_end",
    "rank",
)
_PARTS = (
    "priority",
    "class_rank",
    "within_guarantee",
    "team_factor",
    "user_factor",
    "age_boost",
)


class FairShareQueryError(ValueError):
    """A bad ``team`` or ``job`` asked for: the field, and what was wrong and what it allows."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def fairshare_report(*, user: Any, team: str = "", job: str = "") -> dict[str, Any]:
    """The latest pass's fair-share numbers as ``user`` may see them: every team, the
    members of the asker's teams (``team``: of that one only), and the first ``JOBS_SHOWN``
    pending jobs of those teams in queue order with their priority parts (``job``: that job
    only). Raises ``FairShareQueryError`` for a team the asker does not see or a job id
    that is not a number."""
    visible = dict(teams_for_user(user=user).values_list("name", "pk"))
    team = team.strip()
    if team and team not in visible:
        allowed = ", ".join(sorted(visible)) or "none (you are in no team)"
        raise FairShareQueryError("team", f"{team!r} is not one of your teams; allowed: {allowed}")
    job = job.strip()
    if job and not (job.isascii() and job.isdigit() and len(job) <= 18):
        raise FairShareQueryError("job", f"{job!r} is not a job id; allowed: a whole number")
    team_ids = [visible[team]] if team else list(visible.values())

    stored = FairSharePass.objects.filter(pk=1).first()
    teams = [
        _standing(row) | {"members_shown": row["name"] in visible}
        for row in FairShareTeam.objects.annotate(name=F("team__name"))
        .order_by(F("rank").asc(nulls_last=True), "team__name")
        .values("name", "weight", "guaranteed_units", "usage_unit_seconds", *_STANDING)
    ]
    members = [
        _standing(row)
        for row in FairShareMember.objects.filter(team_id__in=team_ids)
        .annotate(team_name=F("team__name"), username=F("user__username"))
        .order_by("team__name", F("rank").asc(nulls_last=True), "user__username")
        .values("team_name", "username", "usage_unit_seconds", *_STANDING)
    ]
    waiting = JobPriority.objects.filter(job__state=JobState.PENDING, job__team_id__in=team_ids)
    if job:
        waiting = waiting.filter(job_id=int(job))
    jobs = [
        _parts(row)
        for row in waiting.annotate(
            id=F("job_id"),
            name=F("job__name"),
            team=F("job__team__name"),
            user=F("job__user__username"),
            queue_position=F("job__queue_position"),
            pending_code=F("job__pending_code"),
        )
        .order_by(F("job__queue_position").asc(nulls_last=True), "job_id")
        .values("id", "name", "team", "user", "queue_position", "pending_code", *_PARTS)[
            :JOBS_SHOWN
        ]
    ]
    return {
        "as_of": stored.as_of if stored else None,
        "capacity_units": stored.capacity_units if stored else None,
        "scale_units": stored.scale_units if stored else None,
        "history_per_unit": stored.history_per_unit if stored else None,
        "aging_per_hour": stored.aging_per_hour if stored else None,
        "team": team,
        "visible_teams": sorted(visible),
        "teams": teams,
        "members": members,
        "jobs": jobs,
        "jobs_total": waiting.count(),
    }


def job_priority(*, job: Job) -> dict[str, Any] | None:
    """A pending job's priority parts from the latest pass (one query); None when the job is
    not pending or the pass did not order it (a dependency, a class its team may not use,
    a request no node offers, or no pass since it was submitted)."""
    if job.state != JobState.PENDING:
        return None
    row = JobPriority.objects.filter(job_id=job.pk).values(*_PARTS).first()
    return _parts(row) if row is not None else None


def _standing(row: dict[str, Any]) -> dict[str, Any]:
    """A stored standing, its decayed usage in GPU-unit-hours."""
    usage = row.pop("usage_unit_seconds")
    return {**row, "usage_unit_hours": usage / _HOUR_S}


def _parts(row: dict[str, Any]) -> dict[str, Any]:
    """Stored parts, with what the queue compared: factor + aging boost, per level."""
    return {
        **row,
        "team_key": row["team_factor"] + row["age_boost"],
        "user_key": row["user_factor"] + row["age_boost"],
    }

"""Reads of usage: decayed balances, GPU-hours of the budget period, and finished charges
over a range of days (``portal.jobs.usage`` adds the running holds and draws the series).

What teams hold *now* is read from their jobs' allocations (``portal.jobs.selectors``):
accounting sits below jobs in the app order, because ending an attempt charges it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import QuerySet, Sum

from portal.accounting.models import UsageBalance, UsageRecord
from portal.accounting.usage import balance_at


def budget_period_start(now: datetime) -> datetime:
    """Budgets are per calendar month (UTC)."""
    now = now.astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def decayed_balances(
    *, now: datetime, half_life_s: float
) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """Every balance decayed to ``now``: ({team id: usage}, {(team id, user id): usage}). One query."""
    teams: dict[int, float] = {}
    users: dict[tuple[int, int], float] = {}
    at = now.timestamp()
    rows = UsageBalance.objects.values_list("team_id", "user_id", "unit_seconds", "as_of")
    for team_id, user_id, unit_seconds, as_of in rows:
        value = balance_at(unit_seconds, as_of.timestamp(), at, half_life_s)
        if user_id is None:
            teams[team_id] = value
        else:
            users[(team_id, user_id)] = value
    return teams, users


def _records_in_period(*, now: datetime, team_id: int | None) -> QuerySet[UsageRecord]:
    """The finished attempts the budget period counts: an attempt counts in the period in
    which it ended (a hold across the first of the month counts wholly in the new month)."""
    rows = UsageRecord.objects.filter(ended_at__gte=budget_period_start(now))
    return rows if team_id is None else rows.filter(team_id=team_id)


def gpu_hours_in_period(*, now: datetime, team_id: int | None = None) -> dict[int, float]:
    """GPU-unit-hours of finished attempts per team in the current budget period. One query."""
    rows = _records_in_period(now=now, team_id=team_id)
    totals = rows.values("team_id").annotate(total=Sum("unit_seconds"))
    return {row["team_id"]: (row["total"] or 0.0) / 3600.0 for row in totals}


def gpu_hours_in_period_by_user(*, now: datetime, team_id: int) -> list[tuple[int, str, float]]:
    """``gpu_hours_in_period`` of one team by user: (user id, username, GPU-unit-hours). One
    query."""
    rows = _records_in_period(now=now, team_id=team_id)
    totals = rows.values("user_id", "user__username").annotate(total=Sum("unit_seconds"))
    return [
        (row["user_id"], row["user__username"], (row["total"] or 0.0) / 3600.0) for row in totals
    ]


@dataclass(frozen=True, slots=True)
class Charge:
    """A hold charged to a user: ``units`` billed GPU units over ``[held_from, held_until]``
    (epoch seconds)."""

    user_id: int
    username: str
    units: float
    held_from: float
    held_until: float
    # The job the hold was its (its name and state now, for the lists of jobs that used it).
    job_id: int
    job_name: str
    job_state: str


def charges_between(*, team_id: int, start: datetime, end: datetime) -> list[Charge]:
    """The finished attempts of a team whose hold overlaps ``[start, end)``. One query."""
    rows = UsageRecord.objects.filter(
        team_id=team_id, started_at__lt=end, ended_at__gt=start
    ).values_list(
        "user_id",
        "user__username",
        "gpu_units",
        "started_at",
        "ended_at",
        "job_id",
        "job__name",
        "job__state",
    )
    return [
        Charge(user, username, units, started.timestamp(), ended.timestamp(), job, name, state)
        for user, username, units, started, ended, job, name, state in rows
    ]

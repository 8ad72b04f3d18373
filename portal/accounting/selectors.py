"""Reads of usage: decayed balances and GPU-hours of the budget period.

What teams hold *now* is read from their jobs' allocations (``portal.jobs.selectors``):
accounting sits below jobs in the app order, because ending an attempt charges it here.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Sum

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


def gpu_hours_in_period(*, now: datetime, team_id: int | None = None) -> dict[int, float]:
    """GPU-unit-hours of finished attempts per team in the current budget period. One query.

    An attempt counts in the period in which it ended (a hold across the first of the month
    counts wholly in the new month).
    """
    rows = UsageRecord.objects.filter(ended_at__gte=budget_period_start(now))
    if team_id is not None:
        rows = rows.filter(team_id=team_id)
    totals = rows.values("team_id").annotate(total=Sum("unit_seconds"))
    return {row["team_id"]: (row["total"] or 0.0) / 3600.0 for row in totals}

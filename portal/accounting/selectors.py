"""Reads of usage: decayed balances, what is held now, GPU-hours of the budget period."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from django.db.models import Sum

from portal.accounting.models import UsageBalance, UsageRecord
from portal.accounting.usage import balance_at, hold_charge
from portal.cluster.models import Allocation
from portal.jobs.models import HOLDING_STATES
from portal.tenants.models import Team
from scheduler.units import billed_units


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


def team_usage(*, team: Team, now: datetime) -> dict[str, Any]:
    """A team's usage as fair share and its page see it at ``now``.

    ``decayed_unit_seconds`` includes what its running jobs used so far; ``units_in_use`` is
    what it holds now (raw GPU units); ``gpu_hours_this_month`` counts the budget period.
    """
    from portal.scheduling.config import scheduler_config

    config = scheduler_config()
    half_life = config.usage_half_life_s
    at = now.timestamp()
    period_start = budget_period_start(now).timestamp()
    balance = UsageBalance.objects.filter(team=team, user__isnull=True).first()
    decayed = (
        balance_at(balance.unit_seconds, balance.as_of.timestamp(), at, half_life)
        if balance
        else 0.0
    )
    held = Allocation.objects.filter(
        released_at__isnull=True, job__team=team, job__state__in=HOLDING_STATES
    ).values_list("job_id", "slice__units", "slice__gpu__model", "created_at")
    raw_units = 0.0
    billed_by_job: dict[int, float] = defaultdict(float)
    held_from: dict[int, float] = {}
    for job_id, units, model, created_at in held:
        raw_units += units
        billed_by_job[job_id] += billed_units(units, model, config.model_weights)
        held_from[job_id] = created_at.timestamp()
    running_hours = 0.0
    for job_id, units in billed_by_job.items():
        decayed += hold_charge(units, held_from[job_id], at)
        running_hours += units * max(0.0, at - max(held_from[job_id], period_start)) / 3600.0
    finished_hours = gpu_hours_in_period(now=now, team_id=team.pk).get(team.pk, 0.0)
    return {
        "team": team.name,
        "as_of": now,
        "decayed_unit_seconds": decayed,
        "half_life_s": half_life,
        "units_in_use": raw_units,
        "gpu_hours_this_month": finished_hours + running_hours,
        "budget_gpu_hours": team.budget_gpu_hours,
    }

"""What the Usage page (``/usage/``, ``portal.web.usage``) and the usage part of a team page
show: GPU-unit-hours per day and per member, the budget, and what the team holds against its
guarantee, as charts (inline SVG, ``portal.web.charts``) with their numbers in tables beside
them. The numbers are ``portal.jobs.usage``'s, the same the API serves."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.utils import timezone

from portal.jobs.usage import UsageReport, holdings_by_day, page_range, team_usage_report
from portal.tenants.models import Team
from portal.web.charts import Level, Series, held_against_guarantee, stacked_bars, top_series

UNIT_HOURS = "GPU-unit-hours"
# The Usage page lists the latest jobs (the API all of them).
PAGE_JOBS = 20


def page_report(*, team: Team, viewer: Any) -> UsageReport:
    """The report the pages show: the last 30 days, holdings over the last 7."""
    now = timezone.now()
    first_day, last_day, holdings_from = page_range(now)
    return team_usage_report(
        team=team,
        viewer=viewer,
        now=now,
        first_day=first_day,
        last_day=last_day,
        holdings_from=holdings_from,
    )


def usage_context(report: UsageReport) -> dict[str, Any]:
    """The numbers of the team page's usage part (and the top of the Usage page)."""
    budget = report.budget_gpu_hours
    return {
        "report": report,
        "first_day": report.days[0],
        "last_day": report.days[-1],
        "days": len(report.days),
        "budget_used_percent": (
            min(100.0, 100.0 * report.period_hours / budget) if budget else None
        ),
        "over_budget": report.budget_left_hours is not None and report.budget_left_hours < 0,
        "over_by": -report.budget_left_hours if report.budget_left_hours else 0.0,
        "jobs": report.jobs[:PAGE_JOBS],
        "jobs_more": max(0, len(report.jobs) - PAGE_JOBS),
    }


def chart_context(report: UsageReport) -> dict[str, Any]:
    """The Usage page's two charts, their legends and the tables beside them."""
    series = _day_series(report)
    drawn = top_series(series, others="everyone else")
    span = f"{_day(report.days[0])} to {_day(report.days[-1])} (UTC)"
    daily_svg, daily_legend = stacked_bars(
        chart_id="usage-daily",
        title=f"GPU-unit-hours per day of team {report.team}, stacked by member",
        description=f"{len(report.days)} days, {span}; the table beside it has the numbers.",
        labels=[str(day.day) for day in report.days],
        bar_titles=[_day(day, weekday=True) for day in report.days],
        series=drawn,
        unit=UNIT_HOURS,
    )
    daily_rows = [
        {
            "day": day,
            "cells": [{"name": s.name, "value": s.values[index]} for s in series],
            "total": report.team_hours_by_day[index],
        }
        for index, day in enumerate(report.days)
    ]
    levels = [
        Level(
            label=f"{hour.start:%a %-d %b %H:%M} UTC",
            mean=hour.mean_units,
            peak=hour.peak_units,
            day_mark=f"{hour.start:%a %-d}" if hour.start.hour == 0 else "",
        )
        for hour in report.holdings
    ]
    held_svg, held_legend = held_against_guarantee(
        chart_id="usage-held",
        title=f"GPU units team {report.team} held per hour against its guarantee",
        description=(
            f"The last {len(levels)} hours (UTC): the mean held in each hour; the part above "
            f"the guarantee ({report.guaranteed_units:g} units) is borrowed. The table beside "
            "it has the numbers per day, and every hour below it."
        ),
        levels=levels,
        guarantee=report.guaranteed_units,
        limit=report.limit_units,
    )
    return {
        "daily_svg": daily_svg,
        "daily_legend": daily_legend,
        "daily_columns": [s.name for s in series],
        "daily_rows": daily_rows,
        "held_svg": held_svg,
        "held_legend": held_legend,
        "held_days": holdings_by_day(report),
        "held_hours": report.holdings,
    }


def _day_series(report: UsageReport) -> list[Series]:
    """A series per member shown (with any hours on these days), and the rest of the team
    as one when the viewer may see only themself."""
    series = [
        Series(member.username, member.hours_by_day)
        for member in report.members
        if any(member.hours_by_day)
    ]
    if not report.every_member and any(report.others_hours_by_day):
        series.append(Series("rest of the team", report.others_hours_by_day))
    return series


def _day(day: date, *, weekday: bool = False) -> str:
    return f"{day:%a} {day.day} {day:%b %Y}" if weekday else f"{day.day} {day:%b %Y}"

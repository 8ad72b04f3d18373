"""A team's usage over time, as the Usage page, the team page and
``GET /api/v1/teams/<name>/usage/`` show it: GPU-unit-hours per day and per member, the
budget period, and what the team held against its guarantee hour by hour.

It lives with the jobs because running holds are the jobs' allocations (accounting, below
jobs in the app order, keeps the finished charges and the arithmetic).

Two kinds of hours, on purpose:

- **Per day** a hold is split at midnight (UTC) into the days it covers; a running job counts
  up to ``now``. Billed GPU units (a GPU model's billing weight applies), like every charge.
- **This period** counts what the monthly budget counts (``portal.accounting.selectors``):
  a finished attempt in the period in which it ended, a running one from the period's start,
  so "budget left" is exactly what the scheduler enforces.

Holdings are raw GPU units (quota, guarantee and limit count raw units), integrated per hour
from the allocations' intervals; borrowed is what is held above the team's guarantee (the
guarantee of today: a team's past guarantees are not kept).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db.models import Q

from portal.accounting.selectors import (
    Charge,
    budget_period_start,
    charges_between,
    gpu_hours_in_period_by_user,
)
from portal.accounting.usage import held_per_bin, hold_charge, spread_over_bins
from portal.jobs.models import HOLDING_STATES, Allocation
from portal.policy import scheduler_config
from portal.tenants.models import Membership, Team
from portal.tenants.selectors import can_admin_team
from scheduler.units import billed_units

DAY_S = 86_400.0
HOUR_S = 3_600.0
# The API's longest range of days, so one request cannot ask for years of hourly holdings.
MAX_RANGE_DAYS = 366
# What the pages show.
PAGE_DAYS = 30
PAGE_HOLDING_HOURS = 7 * 24


@dataclass(frozen=True, slots=True)
class MemberUsage:
    username: str
    role: str  # "admin", "member", or "" for someone no longer in the team
    hours_by_day: tuple[float, ...]
    range_hours: float  # over the report's days
    period_hours: float  # this budget period, counted as the budget counts


@dataclass(frozen=True, slots=True)
class JobUsage:
    """A job that held GPUs on the report's days (`sacct`'s line): what it was charged there."""

    job_id: int
    name: str
    username: str
    state: str  # now
    gpu_unit_hours: float  # billed, on the report's days (a running job: up to now)
    last_held_at: datetime  # when its latest hold on those days ended (now: still held)
    running: bool


@dataclass(frozen=True, slots=True)
class HeldHour:
    start: datetime
    mean_units: float
    peak_units: float
    borrowed_unit_hours: float


@dataclass(frozen=True, slots=True)
class UsageReport:
    team: str
    as_of: datetime
    days: tuple[date, ...]
    team_hours_by_day: tuple[float, ...]
    # Every member (team admins and site admins), or only the viewer (a member): the rest of
    # the team is then ``others_hours_by_day``, a total with no names.
    every_member: bool
    members: tuple[MemberUsage, ...]
    others_hours_by_day: tuple[float, ...]
    period_start: datetime
    period_hours: float
    others_period_hours: float
    budget_gpu_hours: float | None
    budget_left_hours: float | None  # negative when the team has gone over its budget
    guaranteed_units: float
    limit_units: float | None
    held_units: float
    borrowed_units: float
    holdings: tuple[HeldHour, ...]
    # The jobs the viewer may see by name (a member: their own) that held GPUs on these
    # days, the latest first.
    jobs: tuple[JobUsage, ...]

    @property
    def range_hours(self) -> float:
        return _round(sum(self.team_hours_by_day))

    @property
    def others_range_hours(self) -> float:
        return _round(sum(self.others_hours_by_day))


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def team_usage_report(
    *,
    team: Team,
    viewer: Any,
    now: datetime,
    first_day: date,
    last_day: date,
    holdings_from: datetime | None = None,
) -> UsageReport:
    """``team``'s usage on the days ``first_day``..``last_day`` (UTC, both included) and its
    holdings hour by hour from ``holdings_from`` (default: the first day) to the end of the
    last day or ``now``, whichever is sooner, as ``viewer`` may see them.

    A fixed number of queries (five), however many members, jobs and days.
    """
    now = now.astimezone(UTC)
    every_member = can_admin_team(user=viewer, team=team)
    days = tuple(first_day + timedelta(days=n) for n in range((last_day - first_day).days + 1))
    range_start, range_end = day_start(first_day), day_start(last_day) + timedelta(days=1)
    held_from = holdings_from or range_start
    until = min(range_end, now).timestamp()
    period_start = budget_period_start(now)
    config = scheduler_config()

    charges = charges_between(team_id=team.pk, start=range_start, end=range_end)
    period_rows = gpu_hours_in_period_by_user(now=now, team_id=team.pk)
    period_by_user = defaultdict(float, {user_id: hours for user_id, _, hours in period_rows})
    allocations = _allocations_overlapping(
        team, start=min(range_start, held_from), end=min(range_end, now)
    )
    memberships = list(
        Membership.objects.filter(team=team).values_list("user_id", "user__username", "role")
    )

    # What is held: every allocation's interval (raw units); what runs: charged so far.
    holds: list[tuple[float, float, float]] = []
    held_now = 0.0
    running: dict[int, Charge] = {}
    for job_id, name, user_id, username, state, units, model, created, released in allocations:
        holds.append((units, created.timestamp(), (released or now).timestamp()))
        if released is not None:
            continue
        held_now += units
        if state not in HOLDING_STATES:
            continue  # still held but no longer charged as running (being stopped as LOST)
        billed = billed_units(units, model, config.model_weights)
        before = running.get(job_id)
        running[job_id] = Charge(
            user_id=user_id,
            username=username,
            units=billed + (before.units if before else 0.0),
            # An attempt is charged from its first allocation (portal.jobs.attempts).
            held_from=min(created.timestamp(), before.held_from if before else float("inf")),
            held_until=now.timestamp(),
            job_id=job_id,
            job_name=name,
            job_state=state,
        )
    for charge in running.values():
        counted_from = max(charge.held_from, period_start.timestamp())
        period_by_user[charge.user_id] += (
            hold_charge(charge.units, counted_from, now.timestamp()) / HOUR_S
        )

    # Per day: each charge spread over the days it covers.
    by_user: dict[int, list[float]] = defaultdict(lambda: [0.0] * len(days))
    by_job: dict[int, list[Charge]] = defaultdict(list)
    job_hours: dict[int, float] = defaultdict(float)
    usernames = {user_id: username for user_id, username, _ in [*period_rows, *memberships]}
    for charge in [*charges, *running.values()]:
        usernames.setdefault(charge.user_id, charge.username)
        spread = spread_over_bins(
            charge.held_from,
            charge.held_until,
            first=range_start.timestamp(),
            bin_s=DAY_S,
            bins=len(days),
        )
        for index, seconds in spread:
            by_user[charge.user_id][index] += charge.units * seconds / HOUR_S
            job_hours[charge.job_id] += charge.units * seconds / HOUR_S
        by_job[charge.job_id].append(charge)
    team_by_day = [sum(values[i] for values in by_user.values()) for i in range(len(days))]
    period_hours = sum(period_by_user.values())

    # Who the viewer sees by name: everyone who is in the team or used it (admins), or
    # only themself (a member); the rest of the team is then one total without names.
    roles = {user_id: role for user_id, _, role in memberships}
    if every_member:
        shown = set(roles) | {u for u, hours in by_user.items() if any(hours)}
        shown |= {u for u, hours in period_by_user.items() if hours}
    else:
        shown = {viewer.pk}
        usernames.setdefault(viewer.pk, viewer.get_username())
    no_hours = [0.0] * len(days)
    members = tuple(
        sorted(
            (
                MemberUsage(
                    username=usernames[user_id],
                    role=roles.get(user_id, ""),
                    hours_by_day=_rounded(by_user.get(user_id, no_hours)),
                    range_hours=_round(sum(by_user.get(user_id, no_hours))),
                    period_hours=_round(period_by_user.get(user_id, 0.0)),
                )
                for user_id in shown
            ),
            key=lambda member: member.username,
        )
    )
    others_by_day = [
        total - sum(by_user[u][index] for u in shown if u in by_user)
        for index, total in enumerate(team_by_day)
    ]
    others_period = period_hours - sum(period_by_user.get(u, 0.0) for u in shown)

    shown_user = None if every_member else viewer.pk
    jobs = _job_lines(by_job, job_hours, shown=shown_user, running=set(running))

    guarantee = team.guaranteed_units
    hour_from = held_from.timestamp()
    per_hour = held_per_bin(holds, first=hour_from, until=until, bin_s=HOUR_S, guarantee=guarantee)
    budget = team.budget_gpu_hours
    return UsageReport(
        team=team.name,
        as_of=now,
        days=days,
        team_hours_by_day=_rounded(team_by_day),
        every_member=every_member,
        members=members,
        others_hours_by_day=_rounded(others_by_day),
        period_start=period_start,
        period_hours=_round(period_hours),
        others_period_hours=_round(others_period),
        budget_gpu_hours=budget,
        budget_left_hours=None if budget is None else _round(budget - period_hours),
        guaranteed_units=guarantee,
        limit_units=team.limit_units,
        held_units=_round(held_now),
        borrowed_units=_round(max(0.0, held_now - guarantee)),
        holdings=tuple(
            HeldHour(
                start=datetime.fromtimestamp(hour_from + index * HOUR_S, tz=UTC),
                mean_units=_round(hour.mean_units),
                peak_units=_round(hour.peak_units),
                borrowed_unit_hours=_round(hour.borrowed_unit_seconds / HOUR_S),
            )
            for index, hour in enumerate(per_hour)
        ),
        jobs=jobs,
    )


def _job_lines(
    by_job: dict[int, list[Charge]],
    hours: dict[int, float],
    *,
    shown: int | None,
    running: set[int],
) -> tuple[JobUsage, ...]:
    """A line per job with hours on the report's days, of every user (``shown`` None) or of
    the user ``shown``; the latest held first."""
    lines = []
    for job_id, held in by_job.items():
        first = held[0]
        if (shown is not None and first.user_id != shown) or not hours.get(job_id):
            continue
        lines.append(
            JobUsage(
                job_id=job_id,
                name=first.job_name,
                username=first.username,
                state=first.job_state,
                gpu_unit_hours=_round(hours[job_id]),
                last_held_at=datetime.fromtimestamp(max(c.held_until for c in held), tz=UTC),
                running=job_id in running,
            )
        )
    return tuple(sorted(lines, key=lambda line: (line.last_held_at, line.job_id), reverse=True))


def _allocations_overlapping(team: Team, *, start: datetime, end: datetime) -> list[Any]:
    """The team's allocations held at some time in ``[start, end)``, and every one held now
    (a running job counts in the budget period whenever it started)."""
    return list(
        Allocation.objects.filter(job__team=team)
        .filter(Q(released_at__isnull=True) | Q(created_at__lt=end, released_at__gt=start))
        .values_list(
            "job_id",
            "job__name",
            "job__user_id",
            "job__user__username",
            "job__state",
            "slice__units",
            "slice__gpu__model",
            "created_at",
            "released_at",
        )
    )


def _round(value: float) -> float:
    # Sums of float seconds leave dust (2.9999999999); six decimals is a few milliseconds.
    return round(value, 6) + 0.0  # + 0.0: no "-0.0"


def _rounded(values: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    return tuple(_round(value) for value in values)


@dataclass(frozen=True, slots=True)
class HeldDay:
    """A day of ``UsageReport.holdings``: the mean over the hours of it the report covers."""

    day: date
    hours: float  # how much of the day the report covers (the first and the last may be cut)
    mean_units: float
    peak_units: float
    borrowed_unit_hours: float


def holdings_by_day(report: UsageReport) -> list[HeldDay]:
    """The report's hourly holdings added up per day (UTC)."""
    days: dict[date, list[tuple[float, HeldHour]]] = defaultdict(list)
    for hour in report.holdings:
        length = (min(hour.start + timedelta(hours=1), report.as_of) - hour.start).total_seconds()
        days[hour.start.date()].append((max(0.0, length) / HOUR_S, hour))
    summary = []
    for day, hours in sorted(days.items()):
        covered = sum(length for length, _ in hours)
        held = sum(length * hour.mean_units for length, hour in hours)
        summary.append(
            HeldDay(
                day=day,
                hours=_round(covered),
                mean_units=_round(held / covered) if covered else 0.0,
                peak_units=max(hour.peak_units for _, hour in hours),
                borrowed_unit_hours=_round(sum(hour.borrowed_unit_hours for _, hour in hours)),
            )
        )
    return summary


def page_range(now: datetime) -> tuple[date, date, datetime]:
    """What the pages show at ``now``: the last ``PAGE_DAYS`` days (today included) and the
    holdings of the last ``PAGE_HOLDING_HOURS`` hours, from the start of the hour they reach
    back into (up to now: the hour going on is cut short)."""
    now = now.astimezone(UTC)
    today = now.date()
    back = now - timedelta(hours=PAGE_HOLDING_HOURS)
    return (
        today - timedelta(days=PAGE_DAYS - 1),
        today,
        back.replace(minute=0, second=0, microsecond=0),
    )

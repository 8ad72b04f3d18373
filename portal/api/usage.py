"""``GET /api/v1/teams/<name>/usage/?from=&to=``: a team's usage per day and member, its
budget period and its holdings hour by hour, the series the Usage page draws
(``portal.jobs.usage``). A token needs the ``read`` scope."""

from __future__ import annotations

import re
from datetime import UTC, date, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.views import ERRORS, NOT_FOUND, PortalAPIView, _team_for
from portal.jobs.usage import MAX_RANGE_DAYS, PAGE_DAYS, UsageReport, team_usage_report

DATE_FORMAT = "a date as YYYY-MM-DD (UTC)"
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class UsageDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    gpu_unit_hours = serializers.FloatField(help_text="the whole team's, that day")
    members = serializers.DictField(
        child=serializers.FloatField(),
        help_text="username -> GPU-unit-hours, for the members you may see",
    )
    others = serializers.FloatField(
        help_text="the rest of the team, when you see only yourself (0 for an admin)"
    )


class UsageMemberSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text='"admin", "member", or "" when no longer in the team')
    gpu_unit_hours = serializers.FloatField(help_text="over the requested days")
    period_gpu_unit_hours = serializers.FloatField(help_text="this budget period")


class UsagePeriodSerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="the first of this month, 00:00 UTC")
    gpu_unit_hours = serializers.FloatField(help_text="as the budget counts them")
    others_gpu_unit_hours = serializers.FloatField()
    budget_gpu_unit_hours = serializers.FloatField(allow_null=True, help_text="null: no budget")
    budget_left_gpu_unit_hours = serializers.FloatField(
        allow_null=True, help_text="negative when over the budget; null: no budget"
    )


class UsageQuotaSerializer(serializers.Serializer):
    guaranteed_units = serializers.FloatField()
    limit_units = serializers.FloatField(allow_null=True)
    held_units = serializers.FloatField(help_text="GPU units the team's jobs hold now")
    borrowed_units = serializers.FloatField(help_text="held above the guarantee now")


class UsageHourSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    mean_units = serializers.FloatField(help_text="GPU units held, averaged over the hour")
    peak_units = serializers.FloatField()
    borrowed_unit_hours = serializers.FloatField(help_text="held above the guarantee")


class UsageJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    username = serializers.CharField()
    state = serializers.CharField(help_text="the job's state now")
    gpu_unit_hours = serializers.FloatField(
        help_text="billed, on the requested days (a running job: up to now)"
    )
    last_held_at = serializers.DateTimeField(
        help_text="when its latest hold on those days ended (now, while it runs)"
    )
    running = serializers.BooleanField(help_text="it holds GPUs now")


class TeamUsageSerializer(serializers.Serializer):
    team = serializers.CharField()
    as_of = serializers.DateTimeField()
    every_member = serializers.BooleanField(
        help_text="true: every member is listed (you administer the team); false: only you"
    )
    days = UsageDaySerializer(many=True)
    members = UsageMemberSerializer(many=True)
    period = UsagePeriodSerializer()
    quota = UsageQuotaSerializer()
    holdings = UsageHourSerializer(many=True)
    jobs = UsageJobSerializer(
        many=True,
        help_text="the jobs that held GPUs on these days, latest first: every member's for "
        "a team admin or site admin, your own for a member",
    )


def usage_data(report: UsageReport) -> dict[str, Any]:
    return {
        "team": report.team,
        "as_of": report.as_of,
        "every_member": report.every_member,
        "days": [
            {
                "date": day,
                "gpu_unit_hours": report.team_hours_by_day[index],
                "members": {m.username: m.hours_by_day[index] for m in report.members},
                "others": report.others_hours_by_day[index],
            }
            for index, day in enumerate(report.days)
        ],
        "members": [
            {
                "username": m.username,
                "role": m.role,
                "gpu_unit_hours": m.range_hours,
                "period_gpu_unit_hours": m.period_hours,
            }
            for m in report.members
        ],
        "period": {
            "start": report.period_start,
            "gpu_unit_hours": report.period_hours,
            "others_gpu_unit_hours": report.others_period_hours,
            "budget_gpu_unit_hours": report.budget_gpu_hours,
            "budget_left_gpu_unit_hours": report.budget_left_hours,
        },
        "quota": {
            "guaranteed_units": report.guaranteed_units,
            "limit_units": report.limit_units,
            "held_units": report.held_units,
            "borrowed_units": report.borrowed_units,
        },
        "holdings": [
            {
                "start": hour.start,
                "mean_units": hour.mean_units,
                "peak_units": hour.peak_units,
                "borrowed_unit_hours": hour.borrowed_unit_hours,
            }
            for hour in report.holdings
        ],
        "jobs": [
            {
                "id": job.job_id,
                "name": job.name,
                "username": job.username,
                "state": job.state,
                "gpu_unit_hours": job.gpu_unit_hours,
                "last_held_at": job.last_held_at,
                "running": job.running,
            }
            for job in report.jobs
        ],
    }


def usage_range(params: Any, *, today: date) -> tuple[date, date]:
    """The days asked for: ``from`` and ``to`` (both included), by default the last
    ``PAGE_DAYS`` days up to today; at most ``MAX_RANGE_DAYS`` days, none after today."""
    last = _date_param(params, "to", default=today)
    first = _date_param(params, "from", default=last - timedelta(days=PAGE_DAYS - 1))
    if last > today:
        raise ValidationError({"to": f"{last} is after today; allowed: {today} or earlier"})
    if first > last:
        raise ValidationError({"from": f"{first} is after to ({last}); allowed: {last} or earlier"})
    if (last - first).days + 1 > MAX_RANGE_DAYS:
        earliest = last - timedelta(days=MAX_RANGE_DAYS - 1)
        raise ValidationError(
            {
                "from": f"{first} to {last} is {(last - first).days + 1} days; allowed: at "
                f"most {MAX_RANGE_DAYS} days, so from {earliest} or later"
            }
        )
    return first, last


def _date_param(params: Any, name: str, *, default: date) -> date:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    try:
        if ISO_DATE.fullmatch(raw):
            return date.fromisoformat(raw)
    except ValueError:
        pass  # 2024-02-30
    raise ValidationError({name: f"{raw!r} is not a date; allowed: {DATE_FORMAT}"})


class TeamUsageView(PortalAPIView):
    @extend_schema(
        summary="A team's usage: GPU-unit-hours per day and member, the budget, holdings",
        description=(
            "Days are UTC; a hold across midnight counts in each day for its part there, a "
            "running job up to now. Members: all of them for a team admin or site admin, "
            "yourself only for a member (the rest of the team is `others`). Holdings: GPU "
            "units held per hour over the same days (up to now)."
        ),
        parameters=[
            OpenApiParameter(
                "from", OpenApiTypes.DATE, description=f"first day; default: {PAGE_DAYS} days ago"
            ),
            OpenApiParameter("to", OpenApiTypes.DATE, description="last day; default: today"),
        ],
        responses={200: TeamUsageSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        now = timezone.now().astimezone(UTC)
        first, last = usage_range(request.query_params, today=now.date())
        report = team_usage_report(
            team=team, viewer=request.user, now=now, first_day=first, last_day=last
        )
        return Response(TeamUsageSerializer(usage_data(report)).data)

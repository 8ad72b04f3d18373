"""``GET /api/v1/fairshare/``: what the Fair share page shows, from the same selector
(``portal.scheduling.selectors.fairshare_report``): the numbers the latest scheduling pass
used, per team, per member and per pending job (its priority parts).

Any logged-in user (a token needs ``read``): every team's totals; the members and pending
jobs of the asker's teams only (site admins: all). ``?team=`` narrows members and jobs to one
of those teams, ``?job=`` the jobs to one job.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.views import ERRORS, PortalAPIView
from portal.scheduling.selectors import JOBS_SHOWN, FairShareQueryError, fairshare_report


class _StandingSerializer(serializers.Serializer):
    usage_unit_hours = serializers.FloatField(help_text="decayed GPU-unit-hours")
    held_units = serializers.FloatField(help_text="GPU units held as the pass began")
    effective_units = serializers.FloatField(
        help_text="E as the pass began: billed units held + history_per_unit * decayed usage"
    )
    effective_end_units = serializers.FloatField(help_text="E as the pass ended")
    fair_units = serializers.FloatField(
        allow_null=True, help_text="its fair share of E; null: no pending work, not ranked"
    )
    factor = serializers.FloatField(
        allow_null=True, help_text="2 ** (-E / fair) as the pass began, in (0, 1]"
    )
    factor_end = serializers.FloatField(allow_null=True, help_text="as the pass ended")


class FairShareTeamSerializer(_StandingSerializer):
    name = serializers.CharField()
    weight = serializers.FloatField()
    guaranteed_units = serializers.FloatField()
    rank = serializers.IntegerField(
        allow_null=True, help_text="1 = the highest factor_end (ties by name); null: unranked"
    )
    members_shown = serializers.BooleanField(help_text="its members and jobs are yours to see")


class FairShareMemberSerializer(_StandingSerializer):
    team = serializers.CharField(source="team_name")
    username = serializers.CharField()
    rank = serializers.IntegerField(allow_null=True, help_text="inside the team")


class FairShareJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    user = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)
    pending_code = serializers.CharField()
    priority = serializers.CharField(help_text="the class it was ordered in")
    class_rank = serializers.IntegerField(help_text="0 = the lowest class")
    within_guarantee = serializers.BooleanField(
        help_text="ordered among the jobs within their team's guarantee (before the others)"
    )
    team_factor = serializers.FloatField(help_text="its team's factor when its turn came")
    user_factor = serializers.FloatField(help_text="its user's factor inside the team, then")
    age_boost = serializers.FloatField(help_text="aging_per_hour * hours queued")
    team_key = serializers.FloatField(help_text="team_factor + age_boost: how teams compare")
    user_key = serializers.FloatField(help_text="user_factor + age_boost: how members compare")


class FairShareSerializer(serializers.Serializer):
    as_of = serializers.DateTimeField(
        allow_null=True, help_text="the latest pass's snapshot time; null: no numbers yet"
    )
    capacity_units = serializers.FloatField(allow_null=True)
    scale_units = serializers.FloatField(
        allow_null=True, help_text="what the teams' fair shares divide: max(capacity, sum E)"
    )
    history_per_unit = serializers.FloatField(allow_null=True)
    aging_per_hour = serializers.FloatField(allow_null=True)
    team = serializers.CharField(help_text="the ?team= asked for, or empty")
    visible_teams = serializers.ListField(
        child=serializers.CharField(), help_text="the teams whose members and jobs you see"
    )
    teams = FairShareTeamSerializer(many=True)
    members = FairShareMemberSerializer(many=True)
    jobs = FairShareJobSerializer(many=True, help_text=f"the first {JOBS_SHOWN} in queue order")
    jobs_total = serializers.IntegerField(help_text="pending jobs with priority parts in all")


class FairShareView(PortalAPIView):
    @extend_schema(
        summary="Fair share: each team's and member's standing, pending jobs' priority parts",
        description="The numbers the latest scheduling pass used (what `sshare -l` and "
        "`sprio` show): every team's weight, guarantee, decayed usage, holdings, E, fair "
        "share, factor and rank; the members of your teams (site admins: all) with theirs; "
        "and your teams' pending jobs in queue order with their priority parts (class, "
        "team factor, user factor, age boost) as the pass came to each.",
        parameters=[
            OpenApiParameter(
                "team", OpenApiTypes.STR, description="members and jobs of this team only"
            ),
            OpenApiParameter("job", OpenApiTypes.INT, description="this job's parts only"),
        ],
        responses={200: FairShareSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        try:
            report = fairshare_report(
                user=request.user, team=params.get("team", ""), job=params.get("job", "")
            )
        except FairShareQueryError as error:
            raise ValidationError({error.field: error.detail}) from None
        return Response(FairShareSerializer(report).data)

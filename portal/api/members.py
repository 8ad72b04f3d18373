"""A team's members in the API: list and add (``/teams/<name>/members/``), change a role or a
limit and remove (``/teams/<name>/members/<username>/``), and the team's audit log
(``/teams/<name>/audit/``). The same services as the team page (``portal.tenants.members``);
writes need a team admin or a site admin, and a token with the ``admin`` scope."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.auth import ADMIN
from portal.api.guards import whole_number
from portal.api.views import ERRORS, FORBIDDEN, NOT_FOUND, PortalAPIView, _fields_of, _team_for
from portal.tenants.audit import AUDIT_MAX, AUDIT_SHOWN, audit_for_team
from portal.tenants.members import (
    ROLES,
    MemberError,
    member_add,
    member_list,
    member_remove,
    member_set_limit,
    member_set_role,
)
from portal.tenants.models import Membership, TeamAuditEntry

LIMIT_HELP = (
    "GPU units this member's jobs may hold at once: a number from 0 to the team's per-member "
    "limit (which only site admins set); null = the team's per-member limit"
)


class TeamMemberSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=ROLES)
    limit_units = serializers.FloatField(allow_null=True, help_text=LIMIT_HELP)
    effective_limit_units = serializers.FloatField(
        allow_null=True,
        help_text="what applies: the smaller of limit_units and the team's member_limit_units; "
        "null = no limit",
    )
    joined_at = serializers.DateTimeField()


class MemberAddSerializer(serializers.Serializer):
    username = serializers.CharField(help_text="an existing, active account")
    role = serializers.ChoiceField(choices=ROLES, required=False, help_text="default: member")
    limit_units = serializers.FloatField(required=False, allow_null=True, help_text=LIMIT_HELP)


class MemberChangeSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES, required=False)
    limit_units = serializers.FloatField(required=False, allow_null=True, help_text=LIMIT_HELP)


class AuditEntrySerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    actor = serializers.CharField(source="actor_name", help_text="who made the change")
    action = serializers.ChoiceField(choices=TeamAuditEntry.Action.values)
    member = serializers.CharField(source="subject", help_text="the member; empty for quota")
    field = serializers.CharField()
    old = serializers.CharField(source="old_value", help_text="before; empty = none")
    new = serializers.CharField(source="new_value", help_text="after; empty = none")


class TeamMemberListView(PortalAPIView):
    write_scope = ADMIN

    @extend_schema(
        summary="The team's members: role, own limit and the limit that applies",
        responses={200: TeamMemberSerializer(many=True), **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        return Response(TeamMemberSerializer(member_list(team=team), many=True).data)

    @extend_schema(
        summary="Add a member (team admins and site admins)",
        request=MemberAddSerializer,
        responses={201: TeamMemberSerializer, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def post(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        data = _fields_of(
            request, MemberAddSerializer, "send a JSON object: username, role, limit_units"
        )
        membership = member_add(
            team=team,
            by=request.user,
            username=data.get("username"),
            role=data.get("role", Membership.Role.MEMBER),
            limit_units=data.get("limit_units"),
        )
        row = _row(team, membership.user.get_username())
        return Response(
            TeamMemberSerializer(row).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": f"/api/v1/teams/{team.name}/members/{row['username']}/"},
        )


class TeamMemberDetailView(PortalAPIView):
    write_scope = ADMIN

    @extend_schema(
        summary="One member of the team",
        responses={200: TeamMemberSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str, username: str) -> Response:
        team = _team_for(request, name)
        return Response(TeamMemberSerializer(_row(team, username)).data)

    @extend_schema(
        summary="Change a member's role or limit (team admins and site admins)",
        description="Both fields are checked before either is stored: a 400 stores nothing.",
        request=MemberChangeSerializer,
        responses={200: TeamMemberSerializer, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def patch(self, request: Request, name: str, username: str) -> Response:
        team = _team_for(request, name)
        data = _fields_of(request, MemberChangeSerializer, "send a JSON object: role, limit_units")
        if not data:
            raise MemberError({"detail": "nothing to change; send role, limit_units or both"})
        errors: dict[str, str] = {}
        changes: list[tuple[str, Any]] = [
            ("role", member_set_role),
            ("limit_units", member_set_limit),
        ]
        with transaction.atomic():
            for field, service in changes:
                if field not in data:
                    continue
                try:
                    with transaction.atomic():
                        service(
                            team=team, by=request.user, username=username, **{field: data[field]}
                        )
                except MemberError as error:
                    errors.update(error.errors)
            if errors:
                transaction.set_rollback(True)
        if errors:
            raise MemberError(errors)
        return Response(TeamMemberSerializer(_row(team, username)).data)

    @extend_schema(
        summary="Remove a member (team admins and site admins)",
        description="They lose access to the team's jobs at once; their jobs are not stopped.",
        request=None,
        responses={204: None, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def delete(self, request: Request, name: str, username: str) -> Response:
        team = _team_for(request, name)
        member_remove(team=team, by=request.user, username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamAuditView(PortalAPIView):
    @extend_schema(
        summary="The team's audit log: changes to its members and quota, newest first",
        parameters=[
            OpenApiParameter(
                "limit",
                OpenApiTypes.INT,
                description=f"how many entries (1 to {AUDIT_MAX}; default {AUDIT_SHOWN})",
            )
        ],
        responses={200: AuditEntrySerializer(many=True), **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        raw = request.query_params.get("limit", "")
        limit = AUDIT_SHOWN
        if raw.strip():
            allowed = f"a whole number from 1 to {AUDIT_MAX}"
            limit = whole_number(raw, name="limit", low=1, high=AUDIT_MAX, allowed=allowed)
        entries = audit_for_team(team=team, limit=limit)
        return Response(AuditEntrySerializer(entries, many=True).data)


def _row(team: Any, username: str) -> dict[str, Any]:
    """One member as the list shows them; ``Membership.DoesNotExist`` (a 404) if none."""
    for row in member_list(team=team, username=username):
        return row
    raise Membership.DoesNotExist(f"no member {username!r} in team {team.name}")

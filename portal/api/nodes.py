"""The nodes in the API (site admins only): list, one node with its events, and cordon,
uncordon and drain (``portal.agents.drain``; writes need a token with the ``admin`` scope)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.agents.drain import (
    DRAIN_DEADLINE_MAX_S,
    DrainError,
    node_cordon,
    node_drain,
    node_events,
    node_overviews,
    node_uncordon,
)
from portal.api.auth import ADMIN
from portal.api.views import ERRORS, PortalAPIView, _fields_of
from portal.cluster.models import Node, NodeEvent
from portal.tenants.selectors import is_site_admin

SITE_ADMINS_ONLY = {
    403: OpenApiResponse(description="not a site admin, or the token lacks the scope"),
}
NO_SUCH_NODE = {404: OpenApiResponse(description="no node of that name")}


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    state = serializers.CharField(help_text="ready, lost or drained (taken out of scheduling)")
    status = serializers.CharField(
        help_text="ready, lost, cordoned (jobs run on, none placed), draining (a deadline is "
        "set) or drained (cordoned and nothing holds its slices)"
    )
    cordoned = serializers.BooleanField()
    cordoned_at = serializers.DateTimeField(allow_null=True)
    cordoned_by = serializers.CharField()
    drain_deadline_at = serializers.DateTimeField(
        allow_null=True, help_text="jobs still holding its slices then are preempted"
    )
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    agent_version = serializers.CharField()
    slices = serializers.IntegerField(help_text="slices it offers now")
    slices_held = serializers.IntegerField()
    units = serializers.FloatField(help_text="GPU units it offers now")
    units_held = serializers.FloatField()
    jobs_running = serializers.IntegerField(help_text="jobs holding its slices")
    jobs_stopping = serializers.IntegerField(help_text="of those, jobs asked to stop")
    job_ids = serializers.ListField(child=serializers.IntegerField())


class NodeEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=NodeEvent.Kind.choices)
    by = serializers.CharField(help_text="username; empty when the portal acted")
    message = serializers.CharField()


class NodeDetailSerializer(NodeSerializer):
    events = NodeEventSerializer(many=True, help_text="the latest 50, newest first")


class NodeDrainSerializer(serializers.Serializer):
    """Schema only: ``node_drain`` checks the value."""

    deadline_s = serializers.IntegerField(
        min_value=0,
        max_value=DRAIN_DEADLINE_MAX_S,
        help_text="seconds its jobs get to end before they are preempted and requeued; "
        "0 preempts at once",
    )


def _site_admin(request: Request) -> None:
    if not is_site_admin(request.user):
        raise PermissionDenied("only site admins may see and change nodes")


def _node_for(request: Request, node: str) -> Node:
    _site_admin(request)
    return Node.objects.get(name=node)  # a missing node is a 404 (portal/api/errors.py)


def _detail(node: Node) -> dict[str, Any]:
    overview = node_overviews(name=node.name)[0]
    data = dict(NodeSerializer(overview).data)
    data["events"] = NodeEventSerializer(node_events(node=node), many=True).data
    return data


class NodeListView(PortalAPIView):
    @extend_schema(
        summary="Every node: state, cordon and drain, slices and jobs held (site admins)",
        responses={200: NodeSerializer(many=True), **ERRORS, **SITE_ADMINS_ONLY},
    )
    def get(self, request: Request) -> Response:
        _site_admin(request)
        return Response(NodeSerializer(node_overviews(), many=True).data)


class NodeDetailView(PortalAPIView):
    @extend_schema(
        summary="One node with its latest events (site admins)",
        responses={200: NodeDetailSerializer, **ERRORS, **SITE_ADMINS_ONLY, **NO_SUCH_NODE},
    )
    def get(self, request: Request, node: str) -> Response:
        return Response(_detail(_node_for(request, node)))


class NodeCordonView(PortalAPIView):
    write_scope = ADMIN

    @extend_schema(
        summary="Cordon a node: no new jobs on it, its jobs run on (site admins)",
        description="On a node being drained this calls the drain off (it stays cordoned).",
        request=None,
        responses={200: NodeDetailSerializer, **ERRORS, **SITE_ADMINS_ONLY, **NO_SUCH_NODE},
    )
    def post(self, request: Request, node: str) -> Response:
        found = _node_for(request, node)
        node_cordon(node=found, by=request.user)
        return Response(_detail(found))


class NodeUncordonView(PortalAPIView):
    write_scope = ADMIN

    @extend_schema(
        summary="Put a cordoned or draining node back in scheduling (site admins)",
        request=None,
        responses={200: NodeDetailSerializer, **ERRORS, **SITE_ADMINS_ONLY, **NO_SUCH_NODE},
    )
    def post(self, request: Request, node: str) -> Response:
        found = _node_for(request, node)
        node_uncordon(node=found, by=request.user)
        return Response(_detail(found))


class NodeDrainView(PortalAPIView):
    write_scope = ADMIN

    @extend_schema(
        summary="Drain a node: cordon it, then preempt what still runs at the deadline",
        description="Jobs that end by the deadline end as usual; those still holding the "
        "node's slices then are preempted (requeued, keeping their place). The node shows "
        "`drained` once nothing holds its slices. A second drain sets a new deadline.",
        request=NodeDrainSerializer,
        responses={200: NodeDetailSerializer, **ERRORS, **SITE_ADMINS_ONLY, **NO_SUCH_NODE},
    )
    def post(self, request: Request, node: str) -> Response:
        found = _node_for(request, node)
        data = _fields_of(request, NodeDrainSerializer, 'send a JSON object: {"deadline_s": N}')
        try:
            node_drain(node=found, by=request.user, deadline_s=data.get("deadline_s"))
        except DrainError as error:
            raise ValidationError(error.errors) from None
        return Response(_detail(found))

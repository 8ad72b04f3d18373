"""``GET /api/v1/cluster/``: what the Cluster page shows, from the same selector
(``portal.jobs.capacity.cluster_capacity``): nodes, GPUs and slices with their status and
holder, the free totals by kind and profile, and the last 24 hours' utilisation.

Any logged-in user (a token needs ``read``); the jobs of other teams are shown only as the
team that holds the slice, exactly as on the page.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.views import ERRORS, PortalAPIView
from portal.jobs.capacity import cluster_capacity


class ClusterHolderJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField()
    state = serializers.CharField()


class ClusterHolderSerializer(serializers.Serializer):
    team = serializers.CharField()
    since = serializers.DateTimeField(help_text="when the job was given the slice")
    job = ClusterHolderJobSerializer(
        allow_null=True,
        help_text="null unless the job is one of your teams' (site admins: every job)",
    )


class ClusterSliceSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="GPU UUID, MIG UUID, or '<GPU UUID>/mps/<i>'")
    kind = serializers.CharField(help_text="whole, mig or mps")
    profile = serializers.CharField(help_text="the MIG profile; empty for other kinds")
    mig_uuid = serializers.CharField()
    units = serializers.FloatField(help_text="GPU units")
    status = serializers.ChoiceField(
        choices=["free", "held", "draining", "lost"],
        help_text="free; held by a job; draining: free but its node is cordoned or drained; "
        "lost: its node is lost or the device left the inventory",
    )
    holder = ClusterHolderSerializer(allow_null=True)


class ClusterGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()
    memory_mb = serializers.IntegerField(allow_null=True)
    mode = serializers.CharField(help_text="whole, mig or mps")
    present = serializers.BooleanField(help_text="false: gone from the agent's inventory")
    slices = ClusterSliceSerializer(many=True)


class ClusterSliceCountsSerializer(serializers.Serializer):
    free = serializers.IntegerField()
    held = serializers.IntegerField()
    draining = serializers.IntegerField()
    lost = serializers.IntegerField()


class ClusterNodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    state = serializers.CharField(help_text="ready, lost or drained (taken out of scheduling)")
    status = serializers.CharField(help_text="ready, lost, cordoned, draining or drained")
    cordoned_at = serializers.DateTimeField(allow_null=True)
    cordoned_by = serializers.CharField()
    drain_deadline_at = serializers.DateTimeField(allow_null=True)
    driver = serializers.CharField()
    agent_version = serializers.CharField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    heartbeat_age_s = serializers.FloatField(allow_null=True)
    heartbeat_late = serializers.BooleanField(
        help_text="no heartbeat within the lease (lease_s), or none ever"
    )
    slice_counts = ClusterSliceCountsSerializer()
    slices_total = serializers.IntegerField()
    gpus = ClusterGpuSerializer(many=True)


class ClusterUnitsSerializer(serializers.Serializer):
    free = serializers.FloatField()
    held = serializers.FloatField()
    draining = serializers.FloatField()
    lost = serializers.FloatField()
    in_service = serializers.FloatField(help_text="free + held + draining")


class ClusterFreeByKindSerializer(ClusterSliceCountsSerializer):
    kind = serializers.CharField()
    profile = serializers.CharField()
    units_each = serializers.FloatField()
    total = serializers.IntegerField()
    free_units = serializers.FloatField()


class ClusterHourSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="the last hour ends at as_of")
    held_unit_hours = serializers.FloatField()
    in_service_unit_hours = serializers.FloatField()
    ratio = serializers.FloatField(
        allow_null=True, help_text="held / in service, 0 to 1; null: nothing in service"
    )


class ClusterUtilisationSerializer(serializers.Serializer):
    hours = serializers.IntegerField()
    start = serializers.DateTimeField(help_text="the start of the first hour")
    end = serializers.DateTimeField(help_text="as_of")
    series = ClusterHourSerializer(many=True)


class ClusterSerializer(serializers.Serializer):
    as_of = serializers.DateTimeField()
    lease_s = serializers.FloatField(help_text="the agents' heartbeat lease, in seconds")
    units = ClusterUnitsSerializer(help_text="GPU units by slice status")
    free_by_kind = ClusterFreeByKindSerializer(many=True)
    nodes = ClusterNodeSerializer(many=True)
    utilisation = ClusterUtilisationSerializer()


class ClusterView(PortalAPIView):
    @extend_schema(
        summary="The cluster's capacity: nodes, GPUs, slices, free totals, utilisation",
        description="Every slice with its status (free, held, draining, lost) and, when held, "
        "the team holding it; the job only for your teams' jobs (site admins: all). Totals "
        "free by kind and MIG profile; per hour of the last 24, the GPU-unit-hours held and "
        "in service.",
        responses={200: ClusterSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        capacity = cluster_capacity(user=request.user, now=timezone.now())
        return Response(ClusterSerializer(capacity).data)

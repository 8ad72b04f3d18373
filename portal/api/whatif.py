"""``POST /api/v1/jobs/what-if/``: what the scheduler would do with a job submitted now, the
numbers the submit form shows beside the GPU request (``portal.scheduling.whatif.what_if``:
the real pass on the current snapshot plus this job, nothing written).

The body is a submit's body, checked by the same ``validate_job_request`` (a 400 names each
field, and a request no node could ever hold is refused the same way). It stores nothing, so
a token needs only the ``read`` scope.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.auth import READ
from portal.api.serializers import JobSubmitSerializer, StartBandSerializer, start_band_of
from portal.api.views import ERRORS, PortalAPIView
from portal.jobs.validation import validate_job_request
from portal.scheduling.whatif import WhatIf, what_if


class WhatIfGpuSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="whole, mig or mps")
    count = serializers.IntegerField()
    min_count = serializers.IntegerField(help_text="0 unless an elastic gang")
    profile = serializers.CharField(help_text="the MIG profile; empty for other kinds")
    model = serializers.CharField(
        help_text="the GPU model as the inventory names it (resolved from what was sent)"
    )
    multi_node = serializers.BooleanField()


class WhatIfSlicesSerializer(serializers.Serializer):
    exist = serializers.IntegerField(
        help_text="slices matching the request on the nodes the scheduler sees"
    )
    free = serializers.IntegerField(help_text="of those, free now on nodes that take work")
    largest_free_on_one_node = serializers.IntegerField(
        help_text="the most free on any one node (a gang on one node needs them there)"
    )


class WhatIfGuaranteeSerializer(serializers.Serializer):
    team = serializers.CharField()
    guaranteed_units = serializers.FloatField()
    limit_units = serializers.FloatField(allow_null=True, help_text="null: no limit")
    holds_units = serializers.FloatField(
        help_text="GPU units the team holds before this job (running, plus what this pass "
        "would place for it first)"
    )
    job_units = serializers.FloatField(help_text="GPU units the job would hold")
    from_guarantee_units = serializers.FloatField()
    borrowed_units = serializers.FloatField(help_text="above the guarantee")
    would_borrow = serializers.BooleanField()


class WhatIfVictimSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    name = serializers.CharField(help_text="empty unless you may see the team's jobs")
    user = serializers.CharField(help_text="empty unless you may see the team's jobs")
    units = serializers.FloatField()
    reason = serializers.CharField(help_text="reclaim or priority")


class WhatIfReasonSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="a pending reason code, as on a pending job")
    message = serializers.CharField()
    numbers = serializers.DictField(child=serializers.JSONField())


class WhatIfSerializer(serializers.Serializer):
    snapshot_at = serializers.DateTimeField(
        help_text="the state of the cluster the answer is about (at most a few seconds old)"
    )
    request = WhatIfGpuSerializer()
    slices = WhatIfSlicesSerializer()
    guarantee = WhatIfGuaranteeSerializer()
    preemptible = serializers.BooleanField()
    reclaimable = serializers.BooleanField(
        help_text="it would borrow and is preemptible: reclaim may stop and requeue it"
    )
    starts_now = serializers.BooleanField()
    node = serializers.CharField(help_text="where it starts now; empty otherwise")
    slice_ids = serializers.ListField(child=serializers.CharField())
    queue_position = serializers.IntegerField(
        allow_null=True, help_text="1 when it starts now; null when it would fail at once"
    )
    estimated_start_at = serializers.DateTimeField(
        allow_null=True, help_text="now when it starts now; null: unknown"
    )
    estimated_start_band = StartBandSerializer(
        allow_null=True, help_text="earliest, likely and latest start; null: unknown"
    )
    reason = WhatIfReasonSerializer(allow_null=True, help_text="why it would wait; else null")
    fails = serializers.CharField(help_text="why it would fail at once; empty otherwise")
    would_preempt = WhatIfVictimSerializer(many=True)


def what_if_data(answer: WhatIf) -> dict[str, Any]:
    gpu = answer.request
    g = answer.guarantee
    return {
        "snapshot_at": answer.snapshot_at,
        "request": {
            "kind": gpu.kind.value,
            "count": gpu.count,
            "min_count": gpu.min_count,
            "profile": gpu.profile,
            "model": gpu.model,
            "multi_node": gpu.multi_node,
        },
        "slices": {
            "exist": answer.slices.exist,
            "free": answer.slices.free,
            "largest_free_on_one_node": answer.slices.largest_free_on_one_node,
        },
        "guarantee": {
            "team": g.team,
            "guaranteed_units": g.guaranteed,
            "limit_units": g.limit,
            "holds_units": g.holds,
            "job_units": g.job_units,
            "from_guarantee_units": g.from_guarantee,
            "borrowed_units": g.borrowed,
            "would_borrow": g.would_borrow,
        },
        "preemptible": answer.preemptible,
        "reclaimable": answer.reclaimable,
        "starts_now": answer.starts_now,
        "node": answer.node,
        "slice_ids": list(answer.slice_ids),
        "queue_position": answer.position,
        "estimated_start_at": answer.start_at,
        "estimated_start_band": (
            start_band_of(answer.start_band[0], answer.start_at, answer.start_band[1])
            if answer.start_band is not None
            else None
        ),
        "reason": (
            {
                "code": answer.reason_code,
                "message": answer.reason_message,
                "numbers": answer.reason_numbers,
            }
            if answer.reason_code
            else None
        ),
        "fails": answer.fails,
        "would_preempt": [
            {
                "id": v.job_id,
                "team": v.team,
                "name": v.name,
                "user": v.user,
                "units": v.units,
                "reason": v.reason,
            }
            for v in answer.preempts
        ],
    }


class JobWhatIfView(PortalAPIView):
    # Writes nothing: a read-only token may ask.
    write_scope = READ

    @extend_schema(
        summary="What would happen to this job if submitted now",
        description="The scheduler's own pass on the current cluster with this job added, "
        "nothing stored: matching slices that exist and are free, what the job draws from its "
        "team's guarantee and whether it would borrow, its queue position and estimated start "
        "(or why it waits), and the running jobs it would preempt. The body is a submit's.",
        request=JobSubmitSerializer,
        responses={200: WhatIfSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        job_request = validate_job_request(request.data, user=request.user)
        answer = what_if(request=job_request, user=request.user)
        return Response(WhatIfSerializer(what_if_data(answer)).data)

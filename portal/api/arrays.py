"""Job arrays in the API: one array with its members' states and ids, cancel every member,
resubmit the failed ones (``portal.jobs.arrays``). An array is submitted like a job, with
``array`` in the body of ``POST /api/v1/jobs/``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.auth import SUBMIT
from portal.api.serializers import (
    ArrayCancelledSerializer,
    ArrayDetailSerializer,
    ArrayResubmittedSerializer,
    ErrorSerializer,
    array_data,
)
from portal.api.views import ERRORS, FORBIDDEN, PortalAPIView
from portal.jobs.arrays import (
    array_cancel,
    array_get_for_user,
    array_resubmit_failed,
    array_view,
)
from portal.jobs.models import JobArray

NO_SUCH_ARRAY = {
    404: OpenApiResponse(ErrorSerializer, description="no such array among your teams' arrays")
}


def _array_for(request: Request, array_id: int) -> JobArray:
    return array_get_for_user(user=request.user, array_id=array_id)


class ArrayDetailView(PortalAPIView):
    @extend_schema(
        summary="A job array: its members by state, and their job ids",
        responses={200: ArrayDetailSerializer, **ERRORS, **NO_SUCH_ARRAY},
    )
    def get(self, request: Request, array_id: int) -> Response:
        return Response(array_data(array_view(array=_array_for(request, array_id))))


class ArrayCancelView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Cancel every member of a job array that has not ended",
        description="Waiting members end CANCELLED at once; running ones are stopped by their "
        "agents (as a job's cancel). Members that ended are left as they are.",
        request=None,
        responses={200: ArrayCancelledSerializer, **ERRORS, **FORBIDDEN, **NO_SUCH_ARRAY},
    )
    def post(self, request: Request, array_id: int) -> Response:
        array = _array_for(request, array_id)
        cancelled = array_cancel(array=array, user=request.user)
        return Response({**array_data(array_view(array=array)), "cancelled": cancelled})


class ArrayResubmitFailedView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Resubmit the members of a job array that failed",
        description="A new job for each member that ended FAILED or TIMED_OUT, at the same "
        "index (it becomes the member; the old job is listed in replaced_job_ids), each "
        "request checked again like any submit. 201 when jobs were made, 200 when none "
        "had failed.",
        request=None,
        responses={
            201: ArrayResubmittedSerializer,
            200: ArrayResubmittedSerializer,
            **ERRORS,
            **FORBIDDEN,
            **NO_SUCH_ARRAY,
        },
    )
    def post(self, request: Request, array_id: int) -> Response:
        array = _array_for(request, array_id)
        done = array_resubmit_failed(array=array, user=request.user)
        resubmitted = [{"index": r.index, "from_job": r.from_job, "job": r.job} for r in done]
        return Response(
            {**array_data(array_view(array=array)), "resubmitted": resubmitted},
            status=status.HTTP_201_CREATED if done else status.HTTP_200_OK,
        )

"""The REST API (v1): thin views over the job and team services and selectors."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.auth import ADMIN, SUBMIT, PortalTokenAuthentication, TokenScopes, plan_counting
from portal.api.errors import api_exception_handler
from portal.api.guards import BIGINT_MAX, PortalJSONParser, check_query_params, whole_number
from portal.api.renderers import FastJSONRenderer
from portal.api.serializers import (
    JOB_SUMMARY_COLUMNS,
    ArrayDetailSerializer,
    ErrorSerializer,
    JobDetailSerializer,
    JobLogSerializer,
    JobSubmitSerializer,
    JobSummarySerializer,
    QuotaUpdateSerializer,
    TeamOverviewSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
    array_data,
    job_detail_data,
    job_summaries_data,
)
from portal.jobs.arrays import array_submit, array_view, validate_array_request
from portal.jobs.models import Job, JobDependency, JobEvent, JobState
from portal.jobs.selectors import (
    job_get_for_user,
    job_list_for_user,
    job_list_shape,
    job_log,
    job_log_after,
    job_slices,
    team_overviews,
)
from portal.jobs.services import (
    job_cancel,
    job_hold,
    job_release,
    job_resubmit,
    job_submit,
    submission_message,
)
from portal.jobs.validation import JobRequest, validate_job_request
from portal.tenants.models import Team
from portal.tenants.selectors import can_admin_team, is_site_admin, teams_for_user
from portal.tenants.services import quota_update
from portal.tenants.tokens import (
    token_create,
    token_get_for_user,
    token_list_for_user,
    token_revoke,
)

ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="bad input: each field with its message"),
    401: OpenApiResponse(
        ErrorSerializer, description="missing, malformed, unknown, revoked or expired token"
    ),
    403: OpenApiResponse(ErrorSerializer, description="the token lacks the scope this needs"),
}
NOT_FOUND = {404: OpenApiResponse(ErrorSerializer, description="no such job or team for you")}
FORBIDDEN = {403: OpenApiResponse(ErrorSerializer, description="you may not do this")}


class PortalAPIView(APIView):
    """Token (or session) authentication, JSON in and out, and the API's one error shape."""

    authentication_classes = [PortalTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated, TokenScopes]
    # The scope a token needs for this view's writes (reads need `read`). Admin unless a view
    # says otherwise, so a new write endpoint stays closed to lesser tokens until decided.
    write_scope = ADMIN
    # JSON, with no NUL, lone surrogate or absurd nesting anywhere in it (portal/api/guards.py).
    parser_classes = [PortalJSONParser]
    renderer_classes = [FastJSONRenderer]

    def get_exception_handler(self) -> Any:
        return api_exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Before authentication: a bad query string or path is refused whoever sends it.
        check_query_params(request.query_params)
        check_query_params(kwargs)
        super().initial(request, *args, **kwargs)

    def perform_authentication(self, request: Request) -> None:
        plan_counting(request, self)  # ApiThrottle's counters with the token's statement
        super().perform_authentication(request)


def _job_for(request: Request, job_id: int) -> Job:
    return job_get_for_user(user=request.user, job_id=job_id)


def _detail(job: Job) -> dict[str, Any]:
    """The job as it is now (re-read after an action changed it), with its dependencies,
    slices and events: four queries whatever their number."""
    return _detail_of(Job.objects.select_related("team", "user", "node").get(pk=job.pk))


def _detail_of(job: Job) -> dict[str, Any]:
    # `job` came with its team, user and node joined: no extra query per field.
    return job_detail_data(
        job,
        dependencies=job.dependencies.all(),
        events=job.events.all(),
        slices=job_slices(job=job),
    )


def _submitted_detail(job: Job, request: JobRequest) -> dict[str, Any]:
    """A job just submitted, as ``_detail`` would read it back, from what the submit stored:
    the request's dependencies, its one event (``submission_message``) and no slices."""
    return job_detail_data(
        job,
        dependencies=[
            JobDependency(job=job, depends_on_id=dependency.job_id, kind=dependency.kind)
            for dependency in request.depends_on
        ],
        events=[
            JobEvent(
                job=job,
                at=job.submitted_at,
                from_state="",
                to_state=JobState.PENDING,
                attempt=0,
                message=submission_message(user=job.user, request=request),
            )
        ],
        slices=[],
    )


class JobListView(PortalAPIView, GenericAPIView):
    write_scope = SUBMIT
    serializer_class = JobSummarySerializer
    queryset = Job.objects.none()  # the real one depends on the user: see get_queryset

    def get_queryset(self) -> Any:
        state = _states_param(self.request)
        team = _team_param(self.request)
        return job_list_for_user(
            user=self.request.user,
            state=state,
            team=team,
            mine=_mine_param(self.request),
            name_contains=self.request.query_params.get("q", "").strip(),
        )

    @extend_schema(
        summary="List the jobs of my teams",
        parameters=[
            OpenApiParameter(
                "state",
                OpenApiTypes.STR,
                description="only jobs in these states, comma-separated, e.g. PENDING,RUNNING",
            ),
            OpenApiParameter("team", OpenApiTypes.STR, description="only jobs of this team"),
            OpenApiParameter(
                "mine", OpenApiTypes.BOOL, description="true: only the jobs I submitted"
            ),
            OpenApiParameter(
                "q", OpenApiTypes.STR, description="only jobs whose name contains this, in any case"
            ),
        ],
        responses={200: JobSummarySerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        # Only the columns the summary shows, as plain rows (no model instances), from SQL
        # compiled once per shape of request (portal/compiled_queries.py).
        shape = job_list_shape(
            user=request.user,
            state=_states_param(request),
            team=_team_param(request),
            mine=_mine_param(request),
            name_contains=request.query_params.get("q", "").strip(),
        )
        page = self.paginator.paginate_compiled(
            key=("api-job-summaries", shape.key),
            build=lambda values: shape.build(values).values(*JOB_SUMMARY_COLUMNS),
            values=shape.values,
            request=request,
        )
        return self.get_paginated_response(job_summaries_data(page))

    @extend_schema(
        summary="Submit a job (or, with array, a job array)",
        request=JobSubmitSerializer,
        responses={
            201: PolymorphicProxySerializer(
                component_name="Submitted",
                serializers=[JobDetailSerializer, ArrayDetailSerializer],
                resource_type_field_name=None,
                many=False,
            ),
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        if isinstance(request.data, dict) and "array" in request.data:
            # A job array: the answer is the array, with its jobs' ids.
            array_request = validate_array_request(request.data, user=request.user)
            array, _ = array_submit(user=request.user, request=array_request)
            return Response(
                array_data(array_view(array=array)),
                status=status.HTTP_201_CREATED,
                headers={"Location": f"/api/v1/arrays/{array.pk}/"},
            )
        job_request = validate_job_request(request.data, user=request.user)
        job = job_submit(user=request.user, request=job_request)
        return Response(
            _submitted_detail(job, job_request),
            status=status.HTTP_201_CREATED,
            headers={"Location": f"/api/v1/jobs/{job.pk}/"},
        )


class JobDetailView(PortalAPIView):
    @extend_schema(
        summary="A job: state, exit code, slices, pending explanation, events",
        responses={200: JobDetailSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(_detail_of(_job_for(request, job_id)))


def _action_responses(conflict: str, *, ok: int = 200) -> dict[Any, Any]:
    return {
        ok: JobDetailSerializer,
        409: OpenApiResponse(ErrorSerializer, description=conflict),
        **ERRORS,
        **FORBIDDEN,
        **NOT_FOUND,
    }


class JobCancelView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Cancel a job",
        description="A waiting job ends CANCELLED at once; a running one is stopped by its agent "
        "(stop_requested_at is set now, the state follows when the agent reports).",
        request=None,
        responses=_action_responses("the job already ended"),
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = job_cancel(job=_job_for(request, job_id), user=request.user)
        return Response(_detail(job))


class JobHoldView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Hold a pending job",
        description="A PENDING job becomes HELD: the scheduler skips it until it is released.",
        request=None,
        responses=_action_responses("the job is not PENDING (the message names its state)"),
    )
    def post(self, request: Request, job_id: int) -> Response:
        return Response(_detail(job_hold(job=_job_for(request, job_id), user=request.user)))


class JobReleaseView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Release a held job",
        description="A HELD job goes back to PENDING, at the end of the queue.",
        request=None,
        responses=_action_responses("the job is not HELD (the message names its state)"),
    )
    def post(self, request: Request, job_id: int) -> Response:
        return Response(_detail(job_release(job=_job_for(request, job_id), user=request.user)))


class JobResubmitView(PortalAPIView):
    write_scope = SUBMIT

    @extend_schema(
        summary="Submit a new job with the request of an ended one",
        description="The request is checked again like any submit; the answer is the new job.",
        request=None,
        responses=_action_responses("the job has not ended (the message names its state)", ok=201),
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = job_resubmit(job=_job_for(request, job_id), user=request.user)
        return Response(
            _detail(job),
            status=status.HTTP_201_CREATED,
            headers={"Location": f"/api/v1/jobs/{job.pk}/"},
        )


class PlainTextRenderer(BaseRenderer):
    """A job's log as text/plain; errors as ``field: message`` lines."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> str:
        # Text, not bytes: DRF encodes it with the charset, and keeps the Content-Type even for
        # an empty log (it drops the header of an empty bytes body).
        if isinstance(data, dict) and "log" in data:
            return str(data["log"])
        if isinstance(data, dict) and isinstance(data.get("errors"), dict):
            lines = [f"{field}: {message}" for field, message in data["errors"].items()]
            return "\n".join(lines) + "\n"
        return str(data)


class JobLogView(PortalAPIView):
    # text/plain comes first, so it is what a client that accepts anything (curl) gets.
    renderer_classes = [PlainTextRenderer, FastJSONRenderer]

    @extend_schema(
        summary="A job's output",
        description="text/plain by default; JSON ({job, attempt, state, log}) with ?format=json "
        "or the header Accept: application/json. The headers X-Job-State and X-Job-Attempt "
        "tell a poller when to stop. With ?offset=N only the text after byte N, and in the JSON "
        "offset, next_offset (where the next read starts) and ended (the attempt is over: "
        "stop reading); in text/plain the headers X-Log-Next-Offset and X-Log-Ended.",
        parameters=[
            OpenApiParameter(
                "attempt", OpenApiTypes.INT, description="which attempt (default: the latest)"
            ),
            OpenApiParameter(
                "offset",
                OpenApiTypes.INT,
                description="only the text after this many bytes (UTF-8) of the log",
            ),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["txt", "json"]),
        ],
        responses={
            (200, "text/plain"): OpenApiTypes.STR,
            (200, "application/json"): JobLogSerializer,
            **ERRORS,
            **NOT_FOUND,
        },
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = _job_for(request, job_id)
        attempt = _attempt_param(request, job)
        offset = _offset_param(request)
        headers = {"X-Job-State": job.state, "X-Job-Attempt": str(attempt)}
        data: dict[str, Any] = {"job": job.pk, "attempt": attempt, "state": job.state}
        if offset is None:
            data["log"] = job_log(job=job, attempt=attempt)
            return Response(data, headers=headers)
        tail = job_log_after(job=job, attempt=attempt, offset=offset)
        if offset > tail.next_offset:
            raise ValidationError(
                {
                    "offset": f"{offset} is beyond the {tail.next_offset} bytes of attempt "
                    f"{attempt}'s log so far; allowed: 0 to {tail.next_offset}"
                }
            )
        data.update(offset=offset, next_offset=tail.next_offset, ended=tail.ended, log=tail.text)
        headers["X-Log-Next-Offset"] = str(tail.next_offset)
        headers["X-Log-Ended"] = "true" if tail.ended else "false"
        return Response(data, headers=headers)


class TeamListView(PortalAPIView):
    @extend_schema(
        summary="My teams (all teams for a site admin), with quota and use now",
        responses={200: TeamOverviewSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        teams = list(teams_for_user(user=request.user))
        return Response(TeamOverviewSerializer(_overviews(request, teams), many=True).data)


class TeamDetailView(PortalAPIView):
    @extend_schema(
        summary="One team: quota, units in use now, job counts, members",
        responses={200: TeamOverviewSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        return Response(TeamOverviewSerializer(_overviews(request, [team])[0]).data)

    @extend_schema(
        summary="Change a team's quota (site admins)",
        request=QuotaUpdateSerializer,
        responses={200: TeamOverviewSerializer, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def patch(self, request: Request, name: str) -> Response:
        team = _team_for(request, name)
        changes = _fields_of(
            request, QuotaUpdateSerializer, "send a JSON object of the fields to change"
        )
        team = quota_update(team=team, by=request.user, **changes)
        return Response(TeamOverviewSerializer(_overviews(request, [team])[0]).data)


def _fields_of(
    request: Request, serializer: type[serializers.Serializer[Any]], shape: str
) -> dict[str, Any]:
    """The request's JSON object, refused (400) when it is not one (`shape` says what to send)
    or names a field `serializer` does not have."""
    data = request.data
    if not isinstance(data, dict):
        raise ValidationError({"detail": shape})
    allowed = tuple(serializer().fields)
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ValidationError(
            {key: f"unknown field; allowed: {', '.join(allowed)}" for key in unknown}
        )
    return data


class TokenListView(PortalAPIView):
    @extend_schema(
        summary="My API tokens (never their keys)",
        responses={200: TokenSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        tokens = token_list_for_user(user=request.user)
        return Response(TokenSerializer(tokens, many=True).data)

    @extend_schema(
        summary="Create a token (session or an admin-scoped token)",
        description="The answer carries the key: the only time it is shown.",
        request=TokenCreateSerializer,
        responses={201: TokenCreatedSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _fields_of(
            request, TokenCreateSerializer, "send a JSON object: name, scopes, expires_at"
        )
        token, key = token_create(
            user=request.user,
            name=data.get("name", ""),
            scopes=data.get("scopes", []),
            expires_at=data.get("expires_at"),
        )
        return Response(
            {**TokenSerializer(token).data, "key": key},
            status=status.HTTP_201_CREATED,
            # The answer carries the key: no cache may keep it.
            headers={"Location": f"/api/v1/tokens/{token.pk}/", "Cache-Control": "no-store"},
        )


class TokenDetailView(PortalAPIView):
    @extend_schema(
        summary="One of my tokens (never its key)",
        responses={200: TokenSerializer, **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, token_id: int) -> Response:
        token = token_get_for_user(user=request.user, token_id=token_id)
        return Response(TokenSerializer(token).data)

    @extend_schema(
        summary="Revoke one of my tokens (session or an admin-scoped token)",
        description="The token is deleted: from now on it is refused with a 401.",
        request=None,
        responses={204: None, **ERRORS, **NOT_FOUND},
    )
    def delete(self, request: Request, token_id: int) -> Response:
        token_revoke(user=request.user, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _team_for(request: Request, name: str) -> Team:
    try:
        return teams_for_user(user=request.user).get(name=name)
    except Team.DoesNotExist:
        raise NotFound() from None


def _overviews(request: Request, teams: list[Team]) -> list[dict[str, Any]]:
    site_admin = is_site_admin(request.user)
    overviews = team_overviews(teams=teams)
    for team, overview in zip(teams, overviews, strict=True):
        overview["can_admin"] = site_admin or can_admin_team(user=request.user, team=team)
        overview["can_edit_quota"] = site_admin
    return overviews


# --- query parameters ------------------------------------------------------------------


def _states_param(request: Request) -> list[str] | None:
    raw = request.query_params.get("state", "").strip()
    if not raw:
        return None
    states = [part.strip().upper() for part in raw.split(",") if part.strip()]
    unknown = [state for state in states if state not in JobState.values]
    if unknown:
        raise ValidationError(
            {"state": f"unknown state {', '.join(unknown)}; allowed: {', '.join(JobState.values)}"}
        )
    return states


def _team_param(request: Request) -> str | None:
    name = request.query_params.get("team", "").strip()
    if not name:
        return None
    visible = list(teams_for_user(user=request.user).values_list("name", flat=True))
    if name not in visible:
        raise ValidationError(
            {"team": f"{name!r} is not one of your teams; allowed: {', '.join(visible) or 'none'}"}
        )
    return name


def _mine_param(request: Request) -> bool:
    raw = request.query_params.get("mine", "").strip().lower()
    if raw not in ("", "true", "false", "1", "0"):
        raise ValidationError({"mine": f"{raw!r} is not allowed; allowed: true, false"})
    return raw in ("true", "1")


def _offset_param(request: Request) -> int | None:
    raw = request.query_params.get("offset", "")
    if not raw.strip():
        return None
    allowed = "a whole number of bytes from 0 (the next_offset of the previous read)"
    return whole_number(raw, name="offset", low=0, high=BIGINT_MAX, allowed=allowed)


def _attempt_param(request: Request, job: Job) -> int:
    raw = request.query_params.get("attempt", "").strip()
    if not raw:
        return job.attempt
    allowed = f"1 to {job.attempt}" if job.attempt else "none yet (the job has not run)"
    if not raw.isdigit() or not 1 <= int(raw) <= job.attempt:
        raise ValidationError(
            {"attempt": f"{raw!r} is not an attempt of job {job.pk}; allowed: {allowed}"}
        )
    return int(raw)

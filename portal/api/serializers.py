"""How jobs and teams look in the API. Output only: input is checked by the services.

The input serializers here describe request bodies for the OpenAPI schema; the views never
validate with them (``validate_job_request`` and ``quota_update`` do, so the form and the API
accept exactly the same things).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, tzinfo
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.jobs.arrays import ArrayView
from portal.jobs.models import NOTIFY_EVENTS, GpuKind, Job, JobDependency, JobEvent, JobState
from portal.jobs.selectors import job_slices
from portal.jobs.validation import TIME_LIMIT_MAX
from portal.tenants.models import PRIORITY_CLASSES, TOKEN_NAME_MAX_CHARS, TOKEN_SCOPES, ApiToken
from portal.tenants.services import QUOTA_MAX

# --- errors ------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    errors = serializers.DictField(
        child=serializers.CharField(),
        help_text='field (dotted, e.g. "gpu.profile"; "detail" or "authorization" when no '
        "field) -> message naming the allowed values",
    )


# --- jobs: input (schema only) -----------------------------------------------------------


class GpuRequestSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=GpuKind.choices)
    # The bounds the submit checks (portal/jobs/validation.py), so the schema tells them too.
    count = serializers.IntegerField(
        min_value=1, max_value=settings.JOB_MAX_GPU_COUNT, required=False, default=1
    )
    min_count = serializers.IntegerField(
        min_value=1,
        max_value=settings.JOB_MAX_GPU_COUNT,
        required=False,
        help_text="elastic gang: start with at least this many",
    )
    profile = serializers.CharField(required=False, help_text="MIG profile, required for mig")
    model = serializers.CharField(required=False, help_text="GPU model, whole GPUs only")
    multi_node = serializers.BooleanField(required=False, default=False)


class DependencySerializer(serializers.Serializer):
    job = serializers.IntegerField(source="depends_on_id")
    kind = serializers.ChoiceField(choices=JobDependency.Kind.choices, default="after_ok")


class ArraySpecSerializer(serializers.Serializer):
    count = serializers.IntegerField(
        min_value=1, required=False, help_text="members 0..count-1 (PORTAL_ARRAY_MAX at most)"
    )
    values = serializers.DictField(
        child=serializers.ListField(child=serializers.JSONField()),
        required=False,
        help_text="a sweep: NAME -> [value, ...] (strings, numbers, booleans); one member per "
        "combination, in itertools.product order (the last name varies fastest), each "
        "with its values as env variables",
    )
    max_running = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="at most this many members hold slices at once (Slurm's %N)",
    )


class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=128)
    team = serializers.CharField(help_text="a team you are a member of")
    image = serializers.CharField(max_length=255, help_text="e.g. python:3.11-slim")
    command = serializers.ListField(
        child=serializers.CharField(), help_text="argv; a shell-like string is split too"
    )
    env = serializers.DictField(child=serializers.CharField(), required=False)
    gpu = GpuRequestSerializer()
    priority = serializers.ChoiceField(choices=PRIORITY_CLASSES, required=False)
    time_limit_s = serializers.IntegerField(min_value=1, max_value=TIME_LIMIT_MAX, required=False)
    preemptible = serializers.BooleanField(required=False, default=True)
    depends_on = DependencySerializer(many=True, required=False)
    notify = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_EVENTS),
        required=False,
        allow_null=True,
        help_text="events of this job I am told about (start, end, fail, preempt), by my "
        "notification settings' channels; absent or null: my settings' events; []: none",
    )
    array = ArraySpecSerializer(
        required=False,
        help_text="a job array: count or values (not both), optional max_running; the answer "
        "is then the array (ArrayDetail), with its jobs' ids",
    )


# --- jobs: output ------------------------------------------------------------------------


class GpuSerializer(serializers.Serializer):
    kind = serializers.CharField(source="gpu_kind")
    count = serializers.IntegerField(source="gpu_count")
    min_count = serializers.SerializerMethodField()
    profile = serializers.CharField(source="gpu_profile")
    model = serializers.CharField(source="gpu_model")
    multi_node = serializers.BooleanField()

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_min_count(self, job: Job) -> int | None:
        return job.gpu_min_count or None


class StartBandSerializer(serializers.Serializer):
    """The band around an estimated start (docs/scheduling.md, Estimates); null: unknown."""

    earliest = serializers.DateTimeField(allow_null=True)
    likely = serializers.DateTimeField(allow_null=True, help_text="= estimated_start_at")
    latest = serializers.DateTimeField(allow_null=True)


def start_band_of(
    earliest: datetime | None, likely: datetime | None, latest: datetime | None
) -> dict[str, datetime | None] | None:
    """The band as the API shows it; None when nothing at all is known."""
    if earliest is None and likely is None and latest is None:
        return None
    return {"earliest": earliest, "likely": likely, "latest": latest}


class PendingSerializer(serializers.Serializer):
    code = serializers.CharField(allow_null=True)
    message = serializers.CharField()
    numbers = serializers.DictField()
    position = serializers.IntegerField(allow_null=True)
    estimated_start_at = serializers.DateTimeField(allow_null=True)
    estimated_start_band = StartBandSerializer(
        allow_null=True, help_text="earliest, likely and latest start; null: unknown"
    )


def pending_of(row: Mapping[str, Any], zone: tzinfo | None = None) -> dict[str, Any] | None:
    """The scheduler's latest explanation of a PENDING job, as the shell stored it, from the
    job's ``JOB_SUMMARY_COLUMNS`` (``job_row``); None for a job in another state. Its times
    in ``zone`` (see ``iso_time``)."""
    if row["state"] != JobState.PENDING:
        return None
    band = start_band_of(
        row["estimated_start_earliest_at"],
        row["estimated_start_at"],
        row["estimated_start_latest_at"],
    )
    return {
        "code": row["pending_code"] or None,
        "message": row["pending_message"] or "waiting for the next scheduling pass",
        "numbers": row["pending_numbers"] or {},
        "position": row["queue_position"],
        "estimated_start_at": iso_time(row["estimated_start_at"], zone),
        "estimated_start_band": None
        if band is None
        else {name: iso_time(at, zone) for name, at in band.items()},
    }


class ArrayRefSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="the job array (GET /api/v1/arrays/<id>/)")
    index = serializers.IntegerField(help_text="its PORTAL_ARRAY_INDEX")


def array_ref_of(row: Mapping[str, Any]) -> dict[str, int] | None:
    """A job array member's array and index, from its ``JOB_SUMMARY_COLUMNS``; None."""
    if row["array_id"] is None:
        return None
    return {"id": row["array_id"], "index": row["array_index"] or 0}


class JobSummarySerializer(serializers.Serializer):
    """A job as the list shows it: everything from the job row and its team, user, node."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField(source="team.name")
    user = serializers.CharField(source="user.username")
    state = serializers.ChoiceField(choices=JobState.choices)
    attempt = serializers.IntegerField()
    gpu = GpuSerializer(source="*")
    priority = serializers.CharField()
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    pending = serializers.SerializerMethodField()
    array = serializers.SerializerMethodField()

    @extend_schema_field(PendingSerializer(allow_null=True))
    def get_pending(self, job: Job) -> dict[str, Any] | None:
        return pending_of(job_row(job))

    @extend_schema_field(ArrayRefSerializer(allow_null=True))
    def get_array(self, job: Job) -> dict[str, int] | None:
        return array_ref_of(job_row(job))


class SliceSerializer(serializers.Serializer):
    key = serializers.CharField()
    kind = serializers.CharField()
    profile = serializers.CharField()
    gpu_uuid = serializers.CharField()
    mig_uuid = serializers.CharField()
    units = serializers.FloatField()
    node = serializers.CharField()
    gpu_index = serializers.IntegerField()
    gpu_model = serializers.CharField()
    active = serializers.BooleanField(help_text="false once the job let go of the slice")


class JobEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    attempt = serializers.IntegerField()
    message = serializers.CharField()


class JobDetailSerializer(JobSummarySerializer):
    image = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    time_limit_s = serializers.IntegerField(allow_null=True)
    preemptible = serializers.BooleanField()
    borrowed = serializers.BooleanField(help_text="placed above the team's guarantee")
    queued_since = serializers.DateTimeField()
    assigned_at = serializers.DateTimeField(allow_null=True)
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    stop_reason = serializers.CharField()
    depends_on = DependencySerializer(source="dependencies.all", many=True)
    notify = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="the events its owner is told about; null: the owner's settings decide",
    )
    slices = serializers.SerializerMethodField()
    events = JobEventSerializer(source="events.all", many=True)

    @extend_schema_field(SliceSerializer(many=True))
    def get_slices(self, job: Job) -> list[dict[str, Any]]:
        return job_slices(job=job)


# --- jobs: the answers themselves -------------------------------------------------------
#
# The serializers above describe the answers in the schema; the views build the answers with
# the plain functions below, which give the same JSON (tests/portal/test_api_answers.py holds
# them to it) for a fraction of the CPU: a DRF serializer deep-copies its dozens of fields
# for each object and calls each field's to_representation, which was most of what a list
# page and a submit cost the web process.

# The columns a job's summary is made of, for ``QuerySet.values`` (a list reads only these).
JOB_SUMMARY_COLUMNS = (
    "id",
    "name",
    "team__name",
    "user__username",
    "state",
    "attempt",
    "gpu_kind",
    "gpu_count",
    "gpu_min_count",
    "gpu_profile",
    "gpu_model",
    "multi_node",
    "priority",
    "submitted_at",
    "started_at",
    "finished_at",
    "exit_code",
    "reason",
    "node__name",
    "pending_code",
    "pending_message",
    "pending_numbers",
    "queue_position",
    "estimated_start_at",
    "estimated_start_earliest_at",
    "estimated_start_latest_at",
    "array_id",
    "array_index",
)


def iso_time(value: datetime | None, zone: tzinfo | None = None) -> str | None:
    """A time as DRF's DateTimeField writes it: ISO 8601 in the current time zone (UTC), with
    ``Z`` for +00:00; None for none. ``zone``: the current time zone, read once by a caller
    that writes many times (``job_summaries_data``): looking it up took more than the rest."""
    if not value:
        return None
    if zone is None or value.tzinfo is None:  # a naive time: localtime's own error
        text = timezone.localtime(value).isoformat()
    else:
        text = value.astimezone(zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def job_row(job: Job) -> dict[str, Any]:
    """A job's ``JOB_SUMMARY_COLUMNS`` as ``values()`` would read them (its team, user and
    node should be loaded with it: select_related)."""
    row = {column: getattr(job, column) for column in JOB_SUMMARY_COLUMNS if "__" not in column}
    row["team__name"] = job.team.name
    row["user__username"] = job.user.username
    row["node__name"] = job.node.name if job.node_id is not None else None
    return row


def job_summaries_data(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``job_summary_data`` of each row (a page of the job list), the time zone read once."""
    zone = timezone.get_current_timezone()
    return [job_summary_data(row, zone) for row in rows]


def job_summary_data(row: Mapping[str, Any], zone: tzinfo | None = None) -> dict[str, Any]:
    """A job as ``JobSummarySerializer`` shows it, from its ``JOB_SUMMARY_COLUMNS``; its times
    in ``zone`` (see ``iso_time``)."""
    state = row["state"]
    return {
        "id": row["id"],
        "name": row["name"],
        "team": row["team__name"],
        "user": row["user__username"],
        "state": state,
        "attempt": row["attempt"],
        "gpu": {
            "kind": row["gpu_kind"],
            "count": row["gpu_count"],
            "min_count": row["gpu_min_count"] or None,
            "profile": row["gpu_profile"],
            "model": row["gpu_model"],
            "multi_node": bool(row["multi_node"]),
        },
        "priority": row["priority"],
        "submitted_at": iso_time(row["submitted_at"], zone),
        "started_at": iso_time(row["started_at"], zone),
        "finished_at": iso_time(row["finished_at"], zone),
        "exit_code": row["exit_code"],
        "reason": row["reason"],
        "node": row["node__name"],
        "pending": pending_of(row, zone),
        "array": array_ref_of(row),
    }


def job_detail_data(
    job: Job,
    *,
    dependencies: Iterable[JobDependency],
    events: Iterable[JobEvent],
    slices: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """A job as ``JobDetailSerializer`` shows it: ``job`` (team, user and node loaded with
    it), its dependencies, its events in order and its slices (``job_slices``)."""
    data = job_summary_data(job_row(job))
    data.update(
        image=job.image,
        command=[str(part) for part in job.command],
        env={str(name): str(value) for name, value in job.env.items()},
        time_limit_s=job.time_limit_s,
        preemptible=bool(job.preemptible),
        borrowed=bool(job.borrowed),
        queued_since=iso_time(job.queued_since),
        assigned_at=iso_time(job.assigned_at),
        stop_requested_at=iso_time(job.stop_requested_at),
        stop_reason=job.stop_reason,
        depends_on=[
            {"job": dependency.depends_on_id, "kind": dependency.kind}
            for dependency in dependencies
        ],
        notify=None if job.notify is None else [str(event) for event in job.notify],
        slices=[
            {
                "key": part["key"],
                "kind": part["kind"],
                "profile": part["profile"],
                "gpu_uuid": part["gpu_uuid"],
                "mig_uuid": part["mig_uuid"],
                "units": float(part["units"]),
                "node": part["node"],
                "gpu_index": part["gpu_index"],
                "gpu_model": part["gpu_model"],
                "active": bool(part["active"]),
            }
            for part in slices
        ],
        events=[
            {
                "at": iso_time(event.at),
                "from_state": event.from_state,
                "to_state": event.to_state,
                "attempt": event.attempt,
                "message": event.message,
            }
            for event in events
        ],
    )
    return data


class JobLogSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    attempt = serializers.IntegerField()
    state = serializers.CharField()
    log = serializers.CharField(help_text="the whole log, or with ?offset= what follows it")
    offset = serializers.IntegerField(
        required=False, help_text="only with ?offset=: the byte offset the text starts at"
    )
    next_offset = serializers.IntegerField(
        required=False, help_text="only with ?offset=: where the next read starts"
    )
    ended = serializers.BooleanField(
        required=False,
        help_text="only with ?offset=: the attempt is over and its log complete; stop reading",
    )


# --- job arrays --------------------------------------------------------------------------


class ArrayMemberSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField(source="array_index")
    state = serializers.ChoiceField(choices=JobState.choices)
    values = serializers.DictField(
        child=serializers.CharField(), help_text="its swept values; {} for a plain count"
    )
    exit_code = serializers.IntegerField(allow_null=True)
    pending_code = serializers.CharField(
        allow_null=True, help_text="while PENDING: why it waits (e.g. ARRAY_THROTTLE)"
    )


class ArrayDetailSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    user = serializers.CharField()
    size = serializers.IntegerField()
    max_running = serializers.IntegerField(allow_null=True, help_text="null: no throttle")
    values = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="the swept values in product order; {} for a plain count",
    )
    created_at = serializers.DateTimeField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="members by state (every state listed)"
    )
    job_ids = serializers.ListField(
        child=serializers.IntegerField(), help_text="the members' job ids, by index"
    )
    jobs = ArrayMemberSerializer(many=True, help_text="the members, by index")
    replaced_job_ids = serializers.ListField(
        child=serializers.IntegerField(), help_text="jobs a resubmit replaced (no longer members)"
    )


class ArrayCancelledSerializer(ArrayDetailSerializer):
    cancelled = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="jobs cancelled now, or whose agents were asked to stop them",
    )


class ResubmittedSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    from_job = serializers.IntegerField(help_text="the member that failed")
    job = serializers.IntegerField(help_text="the new job, the member from now on")


class ArrayResubmittedSerializer(ArrayDetailSerializer):
    resubmitted = ResubmittedSerializer(many=True)


def array_data(view: ArrayView) -> dict[str, Any]:
    """An array with its members as the API answers it (``ArrayDetailSerializer``)."""
    array = view.array
    data = {
        "id": array.pk,
        "name": array.name,
        "team": array.team.name,
        "user": array.user.get_username(),
        "size": array.size,
        "max_running": array.max_running,
        "values": {name: list(items) for name, items in array.values},
        "created_at": array.created_at,
        "counts": view.counts,
        "job_ids": [job.pk for job in view.members],
        "jobs": [
            {
                "id": job.pk,
                "array_index": job.array_index,
                "state": job.state,
                "values": view.values_of(job),
                "exit_code": job.exit_code,
                "pending_code": (job.pending_code or None)
                if job.state == JobState.PENDING
                else None,
            }
            for job in view.members
        ],
        "replaced_job_ids": [job.pk for job in view.replaced],
    }
    return dict(ArrayDetailSerializer(data).data)


# --- teams -------------------------------------------------------------------------------


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField()


class TeamOverviewSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    weight = serializers.FloatField()
    guaranteed_units = serializers.FloatField()
    limit_units = serializers.FloatField(allow_null=True)
    max_priority = serializers.CharField()
    member_limit_units = serializers.FloatField(allow_null=True)
    budget_gpu_hours = serializers.FloatField(allow_null=True)
    # The container policy of the team's jobs: read-only here, site admins set it.
    allowed_image_prefixes = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="images the team may run, as prefixes (docs/agent.md); empty = any image",
    )
    job_network = serializers.CharField(
        read_only=True, help_text="the Docker network its jobs join; empty = no network"
    )
    read_only_rootfs = serializers.BooleanField(
        read_only=True, help_text="its containers' root filesystem is read-only"
    )
    units_in_use = serializers.FloatField(help_text="GPU units the team's jobs hold now")
    running_jobs = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()
    held_jobs = serializers.IntegerField()
    members = MemberSerializer(many=True)
    can_admin = serializers.BooleanField(help_text="you administer this team")
    can_edit_quota = serializers.BooleanField(help_text="you may PATCH the quota (site admins)")


class QuotaUpdateSerializer(serializers.Serializer):
    # Every number from 0 to QUOTA_MAX, as quota_update checks them.
    weight = serializers.FloatField(min_value=0, max_value=QUOTA_MAX, required=False)
    guaranteed_units = serializers.FloatField(min_value=0, max_value=QUOTA_MAX, required=False)
    limit_units = serializers.FloatField(
        min_value=0, max_value=QUOTA_MAX, required=False, allow_null=True
    )
    # Plain text in the schema: the same choices as a job's priority, named once (PriorityEnum).
    max_priority = serializers.CharField(
        required=False,
        help_text=f"the team's highest priority class: {', '.join(PRIORITY_CLASSES)}",
    )
    member_limit_units = serializers.FloatField(
        min_value=0, max_value=QUOTA_MAX, required=False, allow_null=True
    )
    budget_gpu_hours = serializers.FloatField(
        min_value=0, max_value=QUOTA_MAX, required=False, allow_null=True
    )


# --- tokens ------------------------------------------------------------------------------

SCOPES_HELP = (
    f"a non-empty subset of {', '.join(TOKEN_SCOPES)}: read = every GET; submit = submit, "
    "cancel, hold, release, resubmit; admin = create and revoke tokens, change teams"
)


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=TOKEN_NAME_MAX_CHARS, help_text="e.g. the notebook")
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TOKEN_SCOPES), min_length=1, help_text=SCOPES_HELP
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="after now; null or absent: never"
    )


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="the key's first 8 characters, to tell tokens apart")
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TOKEN_SCOPES), help_text=SCOPES_HELP
    )
    expires_at = serializers.DateTimeField(allow_null=True, help_text="null: never")
    expired = serializers.SerializerMethodField(help_text="refused (401) since expires_at")
    last_used_at = serializers.DateTimeField(
        allow_null=True, help_text="the latest use, to the minute; null: never used"
    )
    created_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_expired(self, token: ApiToken) -> bool:
        return token.expired(timezone.now())


class TokenCreatedSerializer(TokenSerializer):
    key = serializers.CharField(
        help_text="the token itself, shown this once: the portal keeps only its digest"
    )

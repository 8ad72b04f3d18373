"""Jobs in the Django admin: inspect freely, change state only through the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from portal.cluster.admin import ReadOnlyAdmin
from portal.jobs.models import (
    Allocation,
    GangPart,
    Job,
    JobArray,
    JobDependency,
    JobEvent,
    JobLogChunk,
    JobState,
)
from portal.jobs.services import JobActionError, job_cancel

# Owned by the state machine, the scheduler and the agents' reports: never typed in by hand.
STATE_FIELDS = (
    "state",
    "attempt",
    "submitted_at",
    "queued_since",
    "assigned_at",
    "started_at",
    "finished_at",
    "exit_code",
    "reason",
    "node",
    "borrowed",
    "stop_requested_at",
    "stop_reason",
    "pending_code",
    "pending_message",
    "pending_numbers",
    "queue_position",
    "estimated_start_at",
    "array",
    "array_index",
)
# What the job asked for. Editable (by a site admin) only while the job is PENDING; once the
# scheduler placed it, its slices, charges and the agent's launch were made for exactly this.
JOB_FIELDS = ("name", "team", "user", "image", "command", "env")
GPU_REQUEST_FIELDS = (
    "gpu_kind",
    "gpu_count",
    "gpu_min_count",
    "gpu_profile",
    "gpu_model",
    "multi_node",
    "priority",
    "time_limit_s",
    "preemptible",
)
REQUEST_FIELDS = JOB_FIELDS + GPU_REQUEST_FIELDS


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "from_state", "to_state", "attempt", "message"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class JobDependencyInline(admin.TabularInline):
    model = JobDependency
    fk_name = "job"
    extra = 0
    can_delete = False
    readonly_fields = ["depends_on", "kind"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "team",
        "user",
        "state",
        "attempt",
        "gpu_kind",
        "gpu_count",
        "gpu_profile",
        "priority",
        "node",
        "submitted_at",
        "exit_code",
    ]
    list_filter = ["state", "gpu_kind", "priority", "team", "preemptible", "borrowed"]
    search_fields = ["=id", "name", "user__username", "team__name", "image"]
    list_select_related = ["team", "user", "node"]
    date_hierarchy = "submitted_at"
    readonly_fields = STATE_FIELDS
    inlines = [JobDependencyInline, JobEventInline]
    actions = ["cancel_jobs"]
    fieldsets = [
        (None, {"fields": JOB_FIELDS}),
        ("GPU request", {"fields": GPU_REQUEST_FIELDS}),
        ("State (changed only by the portal)", {"fields": STATE_FIELDS}),
    ]

    def get_readonly_fields(self, request: Any, obj: Job | None = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and obj.state != JobState.PENDING:
            return fields + REQUEST_FIELDS
        return fields

    def has_add_permission(self, request: Any) -> bool:
        # Jobs enter through the submit service (form or API), which validates and schedules.
        return False

    @admin.action(description="Cancel the selected jobs")
    def cancel_jobs(self, request: Any, queryset: Any) -> None:
        done = 0
        for job in queryset.select_related("team"):
            try:
                job_cancel(job=job, user=request.user)
                done += 1
            except (JobActionError, PermissionDenied) as error:
                self.message_user(request, str(error), messages.WARNING)
        if done:
            self.message_user(request, f"cancel asked for {done} job(s)", messages.SUCCESS)


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["job", "at", "from_state", "to_state", "attempt", "message"]
    list_filter = ["to_state"]
    search_fields = ["=job__id", "message"]
    list_select_related = ["job"]
    readonly_fields = ["job", "at", "from_state", "to_state", "attempt", "message"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(JobDependency)
class JobDependencyAdmin(admin.ModelAdmin):
    list_display = ["job", "depends_on", "kind"]
    list_filter = ["kind"]
    search_fields = ["=job__id", "=depends_on__id"]
    list_select_related = ["job", "depends_on"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(JobLogChunk)
class JobLogChunkAdmin(admin.ModelAdmin):
    list_display = ["job", "attempt", "part", "seq", "received_at"]
    search_fields = ["=job__id"]
    list_select_related = ["job"]
    readonly_fields = ["job", "attempt", "part", "seq", "data", "received_at"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(JobArray)
class JobArrayAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "team", "user", "size", "max_running", "created_at"]
    list_filter = ["team"]
    search_fields = ["=id", "name", "user__username", "team__name"]
    list_select_related = ["team", "user"]
    date_hierarchy = "created_at"


@admin.register(GangPart)
class GangPartAdmin(ReadOnlyAdmin):
    """Each node's part of a multi-node gang's attempts (docs/agent.md, "Multi-node gangs")."""

    list_display = ["job", "attempt", "rank", "node", "started_at", "ended_at", "outcome"]
    list_filter = ["outcome"]
    search_fields = ["=job__id", "node__name"]
    list_select_related = ["job", "node"]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt", "slice", "created_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter)]
    search_fields = ["=job__id", "slice__key"]
    list_select_related = ["job", "slice"]
    date_hierarchy = "created_at"

"""What the control plane sent to agents, and the GPU samples they reported (the latest
per job, and over time).

All are written by the portal as it talks to agents, so these pages are for looking.
"""

from __future__ import annotations

from django.contrib import admin

from portal.agents.models import DeviceGpuSample, Dispatch, JobGpuSample, JobMetrics
from portal.cluster.admin import ReadOnlyAdmin


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt", "kind", "sends", "first_sent_at", "last_sent_at"]
    list_filter = ["kind"]
    search_fields = ["=job__id"]
    list_select_related = ["job"]


@admin.register(JobMetrics)
class JobMetricsAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt", "gpu_util_pct", "memory_used_mb", "sampled_at"]
    search_fields = ["=job__id"]
    list_select_related = ["job"]


@admin.register(JobGpuSample)
class JobGpuSampleAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt", "at", "period_s", "sm_util_pct", "memory_used_mb"]
    list_filter = ["period_s"]
    search_fields = ["=job__id"]
    list_select_related = ["job"]


@admin.register(DeviceGpuSample)
class DeviceGpuSampleAdmin(ReadOnlyAdmin):
    list_display = ["node", "uuid", "at", "period_s", "sm_util_pct", "memory_used_mb", "error"]
    list_filter = ["period_s", "node"]
    search_fields = ["uuid"]
    list_select_related = ["node"]

"""What the control plane sent to agents, and the latest GPU-use samples they reported.

Both are written by the portal as it talks to agents, so these pages are for looking.
"""

from __future__ import annotations

from django.contrib import admin

from portal.agents.models import Dispatch, JobMetrics
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

"""Usage as charged: written by the portal when attempts end, never edited by hand."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.accounting.models import UsageBalance, UsageRecord


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "job",
        "attempt",
        "team",
        "user",
        "gpu_units",
        "started_at",
        "ended_at",
        "unit_seconds",
    ]
    list_filter = ["team"]
    search_fields = ["=job__id", "user__username", "team__name"]
    list_select_related = ["job", "team", "user"]
    date_hierarchy = "ended_at"


@admin.register(UsageBalance)
class UsageBalanceAdmin(ReadOnlyAdmin):
    list_display = ["team", "user", "unit_seconds", "as_of"]
    list_filter = ["team"]
    search_fields = ["team__name", "user__username"]
    list_select_related = ["team", "user"]

"""Nodes, GPUs and slices as the agents registered them.

Inventory comes from the agents, so these pages are for looking; the one operator action is
draining a node (guarded, like every state change).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from portal.cluster.models import Gpu, Node, Slice
from portal.passes import schedule_pass_on_commit


class ReadOnlyAdmin(admin.ModelAdmin):
    """For rows the portal writes (inventory, allocations, sends): look, never edit."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = readonly_fields = ["index", "uuid", "model", "memory_mb", "mode", "present"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "hostname", "state", "driver", "agent_version", "last_heartbeat_at"]
    list_filter = ["state", "driver"]
    search_fields = ["name", "hostname"]
    readonly_fields = [
        "name",
        "hostname",
        "state",
        "driver",
        "agent_version",
        "last_heartbeat_at",
        "registered_at",
    ]
    inlines = [GpuInline]
    actions = ["drain", "undrain"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # agents register their nodes

    @admin.action(description="Drain: schedule nothing new on the selected nodes")
    def drain(self, request: Any, queryset: Any) -> None:
        changed = queryset.filter(state=Node.State.READY).update(state=Node.State.DRAINED)
        self.message_user(request, f"{changed} node(s) drained", messages.SUCCESS)

    @admin.action(description="Undrain: schedule on the selected drained nodes again")
    def undrain(self, request: Any, queryset: Any) -> None:
        changed = queryset.filter(state=Node.State.DRAINED).update(state=Node.State.READY)
        if changed:
            schedule_pass_on_commit()
        self.message_user(request, f"{changed} node(s) back in scheduling", messages.SUCCESS)


@admin.register(Gpu)
class GpuAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "uuid", "model", "memory_mb", "mode", "present"]
    list_filter = ["mode", "present", "model", "node"]
    search_fields = ["uuid", "node__name", "model"]
    list_select_related = ["node"]


@admin.register(Slice)
class SliceAdmin(ReadOnlyAdmin):
    list_display = ["key", "kind", "profile", "units", "gpu", "mig_uuid", "present"]
    list_filter = ["kind", "profile", "present"]
    search_fields = ["key", "mig_uuid", "gpu__uuid", "gpu__node__name"]
    list_select_related = ["gpu__node"]

"""Nodes, GPUs and slices as the agents registered them.

Inventory comes from the agents, so these pages are for looking. Cordoning and draining a
node are on the Nodes page (/nodes/) and the API (/api/v1/nodes/), which record who did what
(``portal.agents.drain``); a node's events are shown here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.cluster.models import Gpu, InventoryVersion, Node, NodeEvent, Slice


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


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = ["at", "kind", "by", "message"]
    ordering = ["-at", "-id"]

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
        "cordoned_at",
        "cordoned_by",
        "drain_deadline_at",
    ]
    inlines = [GpuInline, NodeEventInline]

    def has_add_permission(self, request: Any) -> bool:
        return False  # agents register their nodes


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


@admin.register(NodeEvent)
class NodeEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "node", "kind", "by", "message"]
    list_filter = ["kind", "node"]
    search_fields = ["node__name", "by", "message"]
    list_select_related = ["node"]


@admin.register(InventoryVersion)
class InventoryVersionAdmin(ReadOnlyAdmin):
    """The token a process keeps derived inventory facts under (the cluster's shape): for
    looking only; every inventory change writes a new one."""

    list_display = ["token"]

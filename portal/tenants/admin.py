from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.tenants.models import AccessCounter, ApiToken, Membership, Team, TeamAuditEntry


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "weight",
        "guaranteed_units",
        "limit_units",
        "max_priority",
        "member_limit_units",
        "budget_gpu_hours",
        "job_network",
        "read_only_rootfs",
        "created_at",
    ]
    list_filter = ["max_priority", "read_only_rootfs"]
    search_fields = ["name", "description"]
    readonly_fields = ["created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "limit_units", "created_at"]
    list_filter = ["role", "team"]
    search_fields = ["team__name", "user__username"]
    autocomplete_fields = ["user", "team"]
    list_select_related = ["team", "user"]


@admin.register(TeamAuditEntry)
class TeamAuditEntryAdmin(admin.ModelAdmin):
    """The teams' audit logs, read-only: the services write them (portal/tenants/audit.py)."""

    list_display = [
        "at",
        "team",
        "actor_name",
        "action",
        "subject",
        "field",
        "old_value",
        "new_value",
    ]
    list_filter = ["action", "team"]
    search_fields = ["team__name", "actor_name", "subject"]
    list_select_related = ["team"]
    readonly_fields = list_display

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Site admins see and revoke tokens; only their users (the Tokens page, the API) and
    `manage.py issue_token` create them, since the key exists in clear only at that moment."""

    list_display = ["prefix", "name", "user", "scopes", "expires_at", "last_used_at", "created_at"]
    search_fields = ["user__username", "prefix", "name"]
    list_select_related = ["user"]
    readonly_fields = [
        "user",
        "prefix",
        "name",
        "scopes",
        "expires_at",
        "last_used_at",
        "created_at",
    ]
    exclude = ["digest"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(AccessCounter)
class AccessCounterAdmin(admin.ModelAdmin):
    """Failed-login and API-rate counters. Deleting a row with `locked until` set lifts a
    login lock at once (a user locked out by someone guessing their password)."""

    list_display = ["scope", "key", "count", "window_started_at", "locked_until"]
    list_filter = ["scope"]
    search_fields = ["key"]
    readonly_fields = ["scope", "key", "count", "window_started_at", "locked_until"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

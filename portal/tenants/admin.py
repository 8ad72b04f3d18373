from __future__ import annotations

from django.contrib import admin

from portal.tenants.models import Membership, Team


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
        "created_at",
    ]
    list_filter = ["max_priority"]
    search_fields = ["name", "description"]
    readonly_fields = ["created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "created_at"]
    list_filter = ["role", "team"]
    search_fields = ["team__name", "user__username"]
    autocomplete_fields = ["user", "team"]
    list_select_related = ["team", "user"]

from __future__ import annotations

from django.contrib import admin

from portal.notify.models import Delivery, NotificationSettings, TeamWebhook


@admin.register(NotificationSettings)
class NotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ["user", "events", "email", "webhook_url", "updated_at"]
    search_fields = ["user__username", "webhook_url"]
    # The secret signs deliveries; it is shown once to its owner, never here.
    exclude = ["webhook_secret"]
    readonly_fields = ["updated_at"]


@admin.register(TeamWebhook)
class TeamWebhookAdmin(admin.ModelAdmin):
    list_display = ["team", "url", "events", "updated_at"]
    search_fields = ["team__name", "url"]
    exclude = ["secret"]
    readonly_fields = ["updated_at"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "job",
        "event",
        "channel",
        "target",
        "status",
        "attempts",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "channel", "event"]
    search_fields = ["target", "job__name", "last_error"]
    raw_id_fields = ["job", "user", "team"]
    readonly_fields = [field.name for field in Delivery._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

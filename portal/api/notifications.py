"""Notifications in the API: my settings (``/me/notifications/``) and a team's webhook
(``/teams/<name>/webhook/``). The same services as the Notifications page
(``portal.notify.services``); writes need a token with the ``admin`` scope (a webhook URL
decides where job details go), a team's webhook an admin of the team or a site admin."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.views import ERRORS, FORBIDDEN, NOT_FOUND, PortalAPIView, _fields_of, _team_for
from portal.jobs.models import NOTIFY_EVENTS
from portal.notify.models import Delivery, NotificationSettings, TeamWebhook
from portal.notify.selectors import deliveries_for_user
from portal.notify.services import (
    NotifyError,
    Saved,
    notification_settings_get,
    notification_settings_update,
    team_webhook_get,
    team_webhook_update,
)
from portal.tenants.models import Team
from portal.tenants.selectors import can_admin_team

EVENTS_HELP = (
    f"a subset of {', '.join(NOTIFY_EVENTS)}: start = RUNNING; end = any end state; fail = "
    "FAILED or TIMED_OUT; preempt = PREEMPTED"
)
SECRET_HELP = (
    "the webhook's signing secret, only in the answer that made it (first URL, or "
    "rotate_secret): the portal never shows it again"
)


class DeliverySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    event = serializers.CharField()
    state = serializers.CharField(source="to_state")
    channel = serializers.ChoiceField(choices=Delivery.Channel.choices)
    target = serializers.CharField(help_text="the e-mail address or webhook URL")
    status = serializers.ChoiceField(choices=Delivery.Status.choices)
    attempts = serializers.IntegerField()
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class NotificationsSerializer(serializers.Serializer):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_EVENTS),
        help_text=f"the events of every job of mine I am told about ({EVENTS_HELP}); a job "
        "submitted with notify uses its own list instead",
    )
    email = serializers.BooleanField(help_text="tell me by e-mail (to email_address)")
    email_address = serializers.CharField(
        allow_null=True, help_text="my account's address (site admins set it); null: none"
    )
    webhook_url = serializers.CharField(help_text="my webhook; empty: none")
    webhook_secret_hint = serializers.CharField(
        allow_null=True, help_text="the secret's first characters, to tell secrets apart"
    )
    webhook_secret = serializers.CharField(required=False, help_text=SECRET_HELP)
    deliveries = DeliverySerializer(many=True, help_text="the latest deliveries to me")


class NotificationsUpdateSerializer(serializers.Serializer):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_EVENTS), required=False, help_text=EVENTS_HELP
    )
    email = serializers.BooleanField(required=False)
    webhook_url = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="http:// or https://; empty or null removes it",
    )
    rotate_secret = serializers.BooleanField(required=False, help_text="make a new secret")


class TeamWebhookSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="empty: the team has no webhook")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_EVENTS),
        help_text=f"the events of every job of the team sent to it ({EVENTS_HELP})",
    )
    secret_hint = serializers.CharField(allow_null=True)
    secret = serializers.CharField(required=False, help_text=SECRET_HELP)


class TeamWebhookUpdateSerializer(serializers.Serializer):
    url = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="http:// or https://; empty or null removes it",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_EVENTS), required=False, help_text=EVENTS_HELP
    )
    rotate_secret = serializers.BooleanField(required=False, help_text="make a new secret")


def secret_hint(secret: str) -> str | None:
    return f"{secret[:10]}…" if secret else None


def notifications_of(user: Any, own: NotificationSettings) -> dict[str, Any]:
    return {
        "events": list(own.events),
        "email": own.email,
        "email_address": user.email or None,
        "webhook_url": own.webhook_url,
        "webhook_secret_hint": secret_hint(own.webhook_secret),
        "deliveries": DeliverySerializer(deliveries_for_user(user=user), many=True).data,
    }


def webhook_of(hook: TeamWebhook | None) -> dict[str, Any]:
    if hook is None:
        return {"url": "", "events": [], "secret_hint": None}
    return {"url": hook.url, "events": list(hook.events), "secret_hint": secret_hint(hook.secret)}


def _shown_once(data: dict[str, Any], saved: Saved, key: str) -> Response:
    if saved.secret:
        data[key] = saved.secret
    # An answer that may carry a secret: no cache may keep it.
    return Response(data, headers={"Cache-Control": "no-store"})


class MyNotificationsView(PortalAPIView):
    @extend_schema(
        summary="What I am told about my jobs, how, and the latest deliveries",
        responses={200: NotificationsSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        own = notification_settings_get(user=request.user)
        return Response(notifications_of(request.user, own))

    @extend_schema(
        summary="Change what I am told and how (an admin-scoped token or a session)",
        description="Fields left out keep their values. The answer carries webhook_secret "
        "when a secret was made (a first webhook URL, or rotate_secret): the only time it is "
        "shown.",
        request=NotificationsUpdateSerializer,
        responses={200: NotificationsSerializer, **ERRORS},
    )
    def put(self, request: Request) -> Response:
        data = _fields_of(
            request,
            NotificationsUpdateSerializer,
            "send a JSON object: events, email, webhook_url, rotate_secret",
        )
        try:
            saved = notification_settings_update(user=request.user, **data)
        except NotifyError as error:
            raise ValidationError(error.errors) from None
        return _shown_once(notifications_of(request.user, saved.settings), saved, "webhook_secret")


class TeamWebhookView(PortalAPIView):
    @extend_schema(
        summary="The team's webhook (its admins and site admins)",
        responses={200: TeamWebhookSerializer, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        team = _admin_team(request, name)
        return Response(webhook_of(team_webhook_get(team=team)))

    @extend_schema(
        summary="Set, change or remove (empty url) the team's webhook",
        description="Fields left out keep their values. The answer carries secret when one "
        "was made (a new webhook, or rotate_secret): the only time it is shown.",
        request=TeamWebhookUpdateSerializer,
        responses={200: TeamWebhookSerializer, **ERRORS, **FORBIDDEN, **NOT_FOUND},
    )
    def put(self, request: Request, name: str) -> Response:
        team = _admin_team(request, name)
        data = _fields_of(
            request, TeamWebhookUpdateSerializer, "send a JSON object: url, events, rotate_secret"
        )
        try:
            saved = team_webhook_update(team=team, by=request.user, **data)
        except NotifyError as error:
            raise ValidationError(error.errors) from None
        return _shown_once(webhook_of(saved.settings), saved, "secret")


def _admin_team(request: Request, name: str) -> Team:
    team = _team_for(request, name)
    if not can_admin_team(user=request.user, team=team):
        raise PermissionDenied(
            f"only an admin of team {team.name} or a site admin may see or change its webhook"
        )
    return team

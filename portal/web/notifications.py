"""The Notifications page (``/settings/notifications/``): what a person is told about their
jobs and how, their team's webhook when they administer a team, and the latest deliveries.

The same services as ``/api/v1/me/notifications/`` (``portal.notify.services``). A new
webhook secret is shown in the answer that made it, once.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from portal.jobs.models import NOTIFY_EVENTS
from portal.notify.models import NotificationSettings, end_and_fail
from portal.notify.selectors import deliveries_for_user
from portal.notify.services import (
    NotifyError,
    notification_settings_get,
    notification_settings_update,
    team_webhook_update,
)
from portal.tenants.models import Membership, Team
from portal.tenants.selectors import is_site_admin
from portal.web.pages import UNPROCESSABLE, login_required

EVENT_HELP = {
    "start": "it starts running",
    "end": "it ends, however it ends",
    "fail": "it fails or runs out of time",
    "preempt": "it is preempted (and requeued)",
}


def _admin_teams(user: Any) -> QuerySet[Team]:
    if is_site_admin(user):
        return Team.objects.order_by("name")
    return Team.objects.filter(
        memberships__user=user, memberships__role=Membership.Role.ADMIN
    ).order_by("name")


def _context(
    request: HttpRequest,
    *,
    team_errors: dict[str, dict[str, str]] | None = None,
    saved_team: str = "",
    **extra: Any,
) -> dict[str, Any]:
    teams = [
        {
            "team": team,
            # Loaded with the teams (select_related): a site admin administers every team.
            "hook": getattr(team, "webhook", None),
            "errors": (team_errors or {}).get(team.name, {}),
            "saved": team.name == saved_team,
        }
        for team in _admin_teams(request.user).select_related("webhook")
    ]
    return {
        "nav": "notifications",
        "events": [(event, EVENT_HELP[event]) for event in NOTIFY_EVENTS],
        "team_default_events": end_and_fail(),
        "own": notification_settings_get(user=request.user),
        "teams": teams,
        "deliveries": list(deliveries_for_user(user=request.user)),
        "errors": {},
        **extra,
    }


@never_cache  # an answer may carry a new webhook secret: no cache may keep it
@login_required
@require_http_methods(["GET", "POST"])
def notifications_view(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "web/notifications.html", _context(request))
    post = request.POST
    rotate = post.get("rotate_secret") == "on"
    events = post.getlist("events")
    try:
        if post.get("form") == "team":
            team = _admin_teams(request.user).filter(name=post.get("team", "")).first()
            if team is None:
                raise NotifyError({"team": "not a team you administer"})
            try:
                saved = team_webhook_update(
                    team=team,
                    by=request.user,
                    url=post.get("url", ""),
                    events=events,
                    rotate_secret=rotate,
                )
            except NotifyError as error:
                context = _context(request, team_errors={team.name: error.errors})
                return render(request, "web/notifications.html", context, status=UNPROCESSABLE)
            context = _context(request, saved_team=team.name, secret=saved.secret)
            return render(request, "web/notifications.html", context)
        saved = notification_settings_update(
            user=request.user,
            events=events,
            email=post.get("email") == "on",
            webhook_url=post.get("webhook_url", ""),
            rotate_secret=rotate,
        )
    except NotifyError as error:
        # The form again as it was sent, with what is wrong next to each field.
        shown = NotificationSettings(
            user=request.user,
            events=[event for event in NOTIFY_EVENTS if event in events],
            email=post.get("email") == "on",
            webhook_url=post.get("webhook_url", ""),
            webhook_secret=notification_settings_get(user=request.user).webhook_secret,
        )
        context = _context(request, errors=error.errors, own=shown)
        return render(request, "web/notifications.html", context, status=UNPROCESSABLE)
    return render(
        request, "web/notifications.html", _context(request, saved=True, secret=saved.secret)
    )

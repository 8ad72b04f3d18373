"""The team page's member management (team admins and site admins): add a member, change
one's role or limit, remove one after a confirmation. Thin views over
``portal.tenants.members``; an htmx request gets the Members section back, a plain form
post a redirect to the team page (or the page again, with the errors, as a 422).

A member who may not manage the team gets a 403 from the service (and sees no controls);
someone outside the team a 404, as on every team page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from portal.tenants.members import (
    MemberError,
    member_add,
    member_remove,
    member_set_limit,
    member_set_role,
)
from portal.tenants.models import Membership, Team
from portal.tenants.selectors import teams_for_user
from portal.web.pages import UNPROCESSABLE, login_required
from portal.web.team_members import MEMBER_FORM_DEFAULTS, team_members_context
from portal.web.views import _team_context, _team_for

SECTION = "web/_team_members.html"


@login_required
@require_POST
def team_member_add(request: HttpRequest, name: str) -> HttpResponse:
    team = _team_for(request, name)
    values = {field: request.POST.get(field, "").strip() for field in MEMBER_FORM_DEFAULTS}
    values["role"] = values["role"] or MEMBER_FORM_DEFAULTS["role"]
    try:
        member_add(
            team=team,
            by=request.user,
            username=values["username"],
            role=values["role"],
            limit_units=values["limit_units"] or None,
        )
    except MemberError as error:
        return _problem(request, team, error, values=values)
    return _done(request, team, f"{values['username']} added to {team.name} as {values['role']}.")


@login_required
@require_POST
def team_member_role(request: HttpRequest, name: str, username: str) -> HttpResponse:
    team = _team_for(request, name)
    role = request.POST.get("role", "").strip()
    try:
        member_set_role(team=team, by=request.user, username=username, role=role)
    except MemberError as error:
        return _problem(request, team, error, error_for=username)
    shown = "a team admin" if role == Membership.Role.ADMIN else "a member"
    return _done(request, team, f"{username} is now {shown} of {team.name}.")


@login_required
@require_POST
def team_member_limit(request: HttpRequest, name: str, username: str) -> HttpResponse:
    team = _team_for(request, name)
    limit = request.POST.get("limit_units", "").strip()
    try:
        member_set_limit(team=team, by=request.user, username=username, limit_units=limit or None)
    except MemberError as error:
        return _problem(request, team, error, error_for=username)
    said = f"{limit} GPU units" if limit else "the team's per-member limit"
    return _done(request, team, f"The limit of {username} in {team.name} is now {said}.")


@login_required
@require_http_methods(["GET", "POST"])
def team_member_remove(request: HttpRequest, name: str, username: str) -> HttpResponse:
    """GET: the team page asking to confirm the removal; POST: remove."""
    team = _team_for(request, name)
    if request.method == "GET":
        context = team_members_context(request=request, team=team, confirm_remove=username)
        if request.htmx:
            return _section(request, team, context)
        return render(request, "web/team_detail.html", _team_context(request, team, **context))
    try:
        member_remove(team=team, by=request.user, username=username)
    except MemberError as error:
        return _problem(request, team, error, error_for=username)
    said = f"{username} removed from {team.name}."
    if not teams_for_user(user=request.user).filter(pk=team.pk).exists():
        # They removed themselves: the team page is no longer theirs to see.
        messages.success(request, said)
        if request.htmx:
            return HttpResponseClientRedirect("/teams/")
        return redirect("web:team_list")
    return _done(request, team, said)


def _done(request: HttpRequest, team: Team, said: str) -> HttpResponse:
    if request.htmx:
        return _section(request, team, team_members_context(request=request, team=team, done=said))
    messages.success(request, said)
    return redirect("web:team_detail", name=team.name)


def _problem(
    request: HttpRequest,
    team: Team,
    error: MemberError,
    *,
    values: dict[str, str] | None = None,
    error_for: str = "",
) -> HttpResponse:
    """The Members section (or the whole page) again, with each problem next to its input."""
    members: dict[str, Any] = team_members_context(
        request=request, team=team, errors=error.errors, error_for=error_for, values=values
    )
    if request.htmx:
        return _section(request, team, members, status=UNPROCESSABLE)
    context = _team_context(request, team, **members)
    return render(request, "web/team_detail.html", context, status=UNPROCESSABLE)


def _section(
    request: HttpRequest, team: Team, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """Only the Members section (what htmx swaps in)."""
    return render(request, SECTION, {"team": team, **context}, status=status)

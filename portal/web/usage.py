"""The Usage page (``/usage/``): one team's usage at a time, the team chosen in the page
(``?team=``); what it shows is built in ``portal.web.team_usage``."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from portal.tenants.selectors import member_teams, teams_for_user
from portal.web.pages import login_required
from portal.web.team_usage import chart_context, page_report, usage_context


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    teams = list(teams_for_user(user=request.user).order_by("name"))
    context: dict[str, Any] = {"nav": "usage", "teams": teams, "team": None}
    if not teams:
        return render(request, "web/usage.html", context)
    wanted = request.GET.get("team", "").strip()
    if wanted:
        team = next((t for t in teams if t.name == wanted), None)
        if team is None:
            # Like the team page: another team's usage looks exactly like a missing team.
            raise Http404("no such team")
    else:
        mine = set(member_teams(user=request.user).values_list("pk", flat=True))
        team = next((t for t in teams if t.pk in mine), teams[0])
    report = page_report(team=team, viewer=request.user)
    context.update(team=team, usage=usage_context(report), charts=chart_context(report))
    return render(request, "web/usage.html", context)

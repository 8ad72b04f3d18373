"""The Nodes page (site admins): every GPU host with its state, heartbeat and what it holds,
and the buttons that cordon, drain and uncordon it (``portal.agents.drain``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.agents.drain import (
    DrainError,
    node_cordon,
    node_drain,
    node_overviews,
    node_uncordon,
)
from portal.cluster.models import Node
from portal.tenants.selectors import is_site_admin
from portal.web.cluster import NODES_PER_PAGE
from portal.web.pages import (
    UNPROCESSABLE,
    login_required,
    page_number,
    page_problem,
    render_page,
)

# The drain deadlines the page offers (the API takes any number of seconds up to a week).
DRAIN_DEADLINES = [
    (0, "now (preempt at once)"),
    (300, "in 5 minutes"),
    (1800, "in 30 minutes"),
    (3600, "in 1 hour"),
    (4 * 3600, "in 4 hours"),
    (24 * 3600, "in 24 hours"),
]
DEFAULT_DRAIN_DEADLINE_S = 3600
_DONE = {
    "cordon": "Node {} cordoned: no new jobs; its jobs run on.",
    "uncordon": "Node {} is back in scheduling.",
    "drain": "Node {} is being drained.",
}


def _site_admin(request: HttpRequest) -> None:
    if not is_site_admin(request.user):
        raise PermissionDenied("the Nodes page is for site admins")


def _nodes_context(number: int | None, **extra: Any) -> dict[str, Any]:
    """The table's context: the nodes of page ``number`` (``NODES_PER_PAGE`` to a page, as on
    the Cluster page: a thousand rows of buttons take seconds to draw; a page beyond the end
    shows the last one)."""
    overviews = node_overviews()
    paginator = Paginator(overviews, NODES_PER_PAGE)
    page = paginator.page(min(number or 1, paginator.num_pages))
    return {
        "nav": "nodes",
        "nodes": [asdict(n) for n in page.object_list],
        "page": page,
        # Refresh by itself while a drain or a stop is under way (on any page), to show it end.
        "live": any(n.status == "draining" or n.jobs_stopping for n in overviews),
        "deadlines": DRAIN_DEADLINES,
        "deadline": DEFAULT_DRAIN_DEADLINE_S,
        "errors": {},
        **extra,
    }


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    _site_admin(request)
    problem = page_problem(request)
    context = _nodes_context(page_number(request), problem=f"Page: {problem}" if problem else "")
    return render_page(
        request, "web/node_list.html", "nodes", context, status=400 if problem else 200
    )


@login_required
@require_POST
def node_action(request: HttpRequest, node: str, action: str) -> HttpResponse:
    """Cordon, uncordon or drain ``node``; the answer is the node table again, at the page the
    form was on (``page`` in the form)."""
    _site_admin(request)
    number = _form_page(request)
    back = reverse("web:node_list") + (f"?page={number}" if number and number > 1 else "")
    try:
        found = Node.objects.get(name=node)
    except Node.DoesNotExist:
        raise Http404("no such node") from None
    try:
        if action == "cordon":
            node_cordon(node=found, by=request.user)
        elif action == "uncordon":
            node_uncordon(node=found, by=request.user)
        else:
            node_drain(node=found, by=request.user, deadline_s=request.POST.get("deadline_s"))
    except DrainError as error:
        if not request.htmx:
            messages.error(request, f"Node {node} not drained: {error}")
            return redirect(back)
        context = _nodes_context(number, errors={node: error.errors["deadline_s"]})
        return render(request, "web/node_list.html#nodes", context, status=UNPROCESSABLE)
    done = _DONE[action].format(node)
    if action == "uncordon" and found.state == Node.State.LOST:
        done = f"Node {node} uncordoned; its agent is silent: lost until a heartbeat arrives."
    if not request.htmx:
        messages.success(request, done)
        return redirect(back)
    context = _nodes_context(number, done=done)
    return render(request, "web/node_list.html#nodes", context)


def _form_page(request: HttpRequest) -> int | None:
    raw = request.POST.get("page", "")
    return int(raw) if raw.isdigit() and 0 < int(raw) < 10**9 else None

"""The Cluster page (``/cluster/``): nodes, GPUs and slices, free or held by which team, the
free totals and the last 24 hours' utilisation as a chart drawn on the server (an SVG in the
page: no script, nothing loaded from elsewhere) with its numbers in a table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.safestring import SafeString

from portal.jobs.capacity import cluster_capacity
from portal.tenants.selectors import is_site_admin
from portal.web.charts import Series, number, stacked_bars
from portal.web.pages import login_required, page_number, page_problem, render_page

# Nodes drawn on one page (each with its GPUs and slices); the totals count every node.
NODES_PER_PAGE = 50

_ONE_HOUR = timedelta(hours=1)


@login_required
def cluster_view(request: HttpRequest) -> HttpResponse:
    """The whole cluster's totals and utilisation, and its nodes ``NODES_PER_PAGE`` at a time
    (``?page=``): a page of a thousand nodes would take seconds to draw and megabytes to send."""
    # Only this page's nodes are spelled out (the totals count every node); a page beyond the
    # end (nodes went away while it was open) shows the last one.
    capacity = cluster_capacity(
        user=request.user,
        now=timezone.now(),
        page=page_number(request) or 1,
        per_page=NODES_PER_PAGE,
    )
    problem = page_problem(request)
    page = Paginator(range(capacity["nodes_total"]), NODES_PER_PAGE).page(capacity["nodes_page"])
    context = {
        "nav": "cluster",
        "capacity": capacity,
        "nodes": capacity["nodes"],
        "page": page,
        "problem": f"Page: {problem}" if problem else "",
        "chart": utilisation_chart(capacity["utilisation"]["series"]),
        "site_admin": is_site_admin(request.user),
    }
    status = 400 if problem else 200
    return render_page(request, "web/cluster.html", "cluster_live", context, status=status)


def utilisation_chart(series: Sequence[dict[str, Any]]) -> SafeString:
    """A bar per hour: the share of the GPU units in service that jobs held, drawn by the
    pages' one chart maker (``portal.web.charts``: each bar with its value written above it
    and a title with its unit-hours). An hour with nothing in service says so in its title
    and has no bar; the hour going on is marked "so far" and labelled "now"."""
    last = len(series) - 1
    titles = []
    for i, hour in enumerate(series):
        span = f"{hour['start']:%H:%M}–{hour['end']:%H:%M} UTC"
        if i == last and hour["end"] - hour["start"] < _ONE_HOUR:
            span += " (so far)"
        if hour["ratio"] is None:
            titles.append(f"{span}, nothing in service")
        else:
            titles.append(
                f"{span}, {number(hour['held_unit_hours'])} of "
                f"{number(hour['in_service_unit_hours'])} GPU-unit-hours held"
            )
    first = f"{series[0]['start']:%Y-%m-%d %H:%M}" if series else ""
    svg, _legend = stacked_bars(
        chart_id="utilisation-chart",
        title=f"Utilisation, last {len(series)} hours",
        description=f"Per hour from {first} UTC: the GPU units jobs held, in per cent of the "
        "units in service. The numbers are in the table beside the chart.",
        labels=["now" if i == last else f"{hour['start']:%H}h" for i, hour in enumerate(series)],
        bar_titles=titles,
        # Whole per cent: the value is written above each bar; the table has the unit-hours.
        series=[Series("held", [round(100.0 * (hour["ratio"] or 0.0)) for hour in series])],
        unit="% held",
    )
    return svg

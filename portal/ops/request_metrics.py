"""How long the portal takes to answer, per view, method and status, for /metrics.

The histogram lives in the web process's memory: with several gunicorn workers each keeps its
own, unless ``PROMETHEUS_MULTIPROC_DIR`` names a directory the workers share (prometheus_client's
multiprocess mode; docker-compose.yml sets it), in which case /metrics adds them up. No model
is imported here: the middleware must stay cheap and importable before anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Histogram

# Methods outside this set are counted as "other", so a client cannot invent label values.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# This process's own metrics. In multiprocess mode /metrics reads every worker's files instead.
REGISTRY = CollectorRegistry(auto_describe=True)

REQUEST_LATENCY = Histogram(
    "portal_http_request_duration_seconds",
    "Time from the request reaching the portal to its answer, by view name, method and status.",
    ("view", "method", "status"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)


def view_label(request: HttpRequest) -> str:
    """The URL pattern's name (``web:job_list``, ``api:job-detail``), never the raw path: paths
    hold ids and anything a client types."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match.view_name
    if request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
        return "static"
    return "unmatched"


class RequestLatencyMiddleware:
    """First in MIDDLEWARE, so the time includes every other middleware and the status is
    the one the client gets."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        began = time.perf_counter()
        response = self.get_response(request)
        method = request.method if request.method in KNOWN_METHODS else "other"
        REQUEST_LATENCY.labels(view_label(request), method, str(response.status_code)).observe(
            time.perf_counter() - began
        )
        return response

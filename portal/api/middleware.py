"""Every answer under /api/ is JSON, whatever went wrong.

- A body over PORTAL_MAX_BODY_BYTES is refused before anything reads it (413).
- The database out of reach is a 503 that says to try again (DRF views answer it in
  portal/api/errors.py; this catches it anywhere else under /api/).
- Any other exception is a JSON 500, and its traceback goes to the log.
- An error page Django rendered as HTML (an unknown URL, a bad Host header) is answered as
  JSON with the same status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.log import log_response

from portal.api.outage import DATABASE_UNAVAILABLE, database_unavailable, log_outage

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def error_json(status: int, errors: dict[str, str], **headers: str) -> JsonResponse:
    response = JsonResponse({"errors": errors}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


class ApiErrorMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not is_api(request):
            return self.get_response(request)
        too_big = _body_too_big(request)
        if too_big is not None:
            return too_big
        response = self.get_response(request)
        if response.status_code >= 400 and _is_html(response):
            return _as_json(request, response)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_api(request):
            return None
        if database_unavailable(exception):
            response = error_json(503, {"detail": DATABASE_UNAVAILABLE}, Retry_After="5")
            log_outage(request=request, response=response, exc=exception)
            return response
        response = error_json(
            500, {"detail": "internal error; it has been logged for the operators, try again later"}
        )
        # What Django does for an exception it answers itself: django.request, with the
        # traceback. Answered here, it must be logged here.
        log_response(
            "Internal Server Error: %s",
            request.path,
            response=response,
            request=request,
            exception=exception,
        )
        return response


def _body_too_big(request: HttpRequest) -> HttpResponse | None:
    raw = request.META.get("CONTENT_LENGTH") or "0"
    limit = settings.API_MAX_BODY_BYTES
    try:
        length = int(raw)
    except ValueError:
        return error_json(400, {"body": f"Content-Length {raw!r} is not a whole number"})
    if length > limit:
        return error_json(
            413,
            {
                "body": f"{length} bytes is too large; allowed: at most {limit} bytes "
                "(PORTAL_MAX_BODY_BYTES)"
            },
        )
    return None


def _is_html(response: HttpResponse) -> bool:
    # Django's own error pages. The API's answers (JSON, or a log's text/plain) stay as they are.
    return str(response.get("Content-Type", "")).startswith("text/html")


def _as_json(request: HttpRequest, response: Any) -> HttpResponse:
    if response.status_code == 404:
        detail = f"no API endpoint {request.path}; the endpoints are listed at /api/docs/"
    else:
        detail = (response.reason_phrase or "error").lower()
    replaced = error_json(response.status_code, {"detail": detail})
    for header in ("Retry-After", "Allow", "WWW-Authenticate"):
        if header in response:
            replaced[header] = response[header]
    return replaced

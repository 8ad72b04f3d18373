"""One error shape for the whole API: ``{"errors": {"<field>": "<message>"}}``.

Field names are dotted paths into the request (``gpu.profile``, ``command.0``); errors that
belong to no field use ``detail``, and authentication errors use ``authorization``. Every
message names what is allowed.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.api.auth import HOW_TO, ScopeDenied
from portal.api.outage import DATABASE_UNAVAILABLE, database_unavailable, log_outage
from portal.jobs.services import JobActionError
from portal.jobs.validation import JobRequestError
from portal.tenants.members import MemberError
from portal.tenants.services import QuotaError
from portal.tenants.tokens import TokenError


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if database_unavailable(exc):
        unavailable = Response(
            {"errors": {"detail": DATABASE_UNAVAILABLE}},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
        log_outage(request=context["request"], response=unavailable, exc=exc)
        return unavailable
    if isinstance(exc, JobRequestError | QuotaError | MemberError | TokenError):
        return Response({"errors": exc.errors}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, JobActionError):
        return Response({"errors": {"state": str(exc)}}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ObjectDoesNotExist):
        exc = Http404()
    if isinstance(exc, DjangoPermissionDenied) and exc.args:
        exc = exceptions.PermissionDenied(str(exc))
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.NotAuthenticated):
        response.data = {"errors": {"authorization": "authentication required; " + HOW_TO}}
    elif isinstance(exc, exceptions.AuthenticationFailed):
        response.data = {"errors": {"authorization": str(exc.detail)}}
    elif isinstance(exc, ScopeDenied):
        response.data = {"errors": {"scope": str(exc.detail)}}
    elif isinstance(exc, Http404 | exceptions.NotFound):
        response.data = {"errors": {"detail": _not_found(context)}}
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        response.data = {
            "errors": {
                "detail": f"{exc.detail} Send the body as JSON with the header "
                "Content-Type: application/json"
            }
        }
    elif isinstance(exc, exceptions.ParseError):
        response.data = {"errors": {"detail": f"{exc.detail}; send a JSON object"}}
    elif isinstance(exc, exceptions.Throttled):
        wait = f"; try again in {int(exc.wait)} s" if exc.wait is not None else ""
        response.data = {"errors": {"detail": f"too many requests for this user or token{wait}"}}
    elif isinstance(exc, exceptions.ValidationError):
        response.data = {"errors": flatten(exc.detail)}
    else:
        response.data = {"errors": {"detail": _text(response.data)}}
    return response


def _not_found(context: dict[str, Any]) -> str:
    kwargs = context.get("kwargs") or {}
    if "job_id" in kwargs:
        return f"no job {kwargs['job_id']} among the jobs of your teams"
    if "array_id" in kwargs:
        return f"no job array {kwargs['array_id']} among the arrays of your teams"
    if "username" in kwargs and "name" in kwargs:
        return f"no member {kwargs['username']!r} in a team {kwargs['name']!r} of yours"
    if "name" in kwargs:
        return f"no team {kwargs['name']!r} among your teams"
    if "token_id" in kwargs:
        return f"no token {kwargs['token_id']} among your tokens"
    if "node" in kwargs:
        return f"no node {kwargs['node']!r}"
    return "not found"


def flatten(detail: Any, prefix: str = "") -> dict[str, str]:
    """DRF's nested error detail as ``{"dotted.field": "message"}``."""
    if isinstance(detail, dict):
        flat: dict[str, str] = {}
        for key, value in detail.items():
            name = "detail" if key == "non_field_errors" else str(key)
            flat.update(flatten(value, f"{prefix}.{name}" if prefix else name))
        return flat
    if isinstance(detail, list) and detail and all(isinstance(i, dict | list) for i in detail):
        flat = {}
        for index, value in enumerate(detail):
            flat.update(flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return flat
    return {prefix or "detail": _text(detail)}


def _text(detail: Any) -> str:
    if isinstance(detail, dict) and "detail" in detail:
        return _text(detail["detail"])
    if isinstance(detail, list):
        return " ".join(_text(item) for item in detail)
    return str(detail)

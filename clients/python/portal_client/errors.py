"""What can go wrong talking to the portal, one exception class per thing a caller handles.

Every one is a ``PortalError``. The portal's answers carry ``{"errors": {field: message}}``
(docs/api.md); ``errors`` keeps that mapping and ``str()`` shows one ``field: message`` line
per problem.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portal_client.jobs import Job


class PortalError(Exception):
    """The portal refused a request or could not be reached.

    ``status`` is the HTTP status (None when no answer came), ``errors`` maps each field (a
    dotted path into the body such as ``gpu.profile``; ``detail`` or ``authorization`` when
    no field) to its message, ``request`` is ``"METHOD /path/"``.
    """

    def __init__(
        self, status: int | None, errors: dict[str, str], request: str = "", url: str = ""
    ) -> None:
        super().__init__(status, errors)
        self.status = status
        self.errors = errors
        self.request = request
        self.url = url

    def __str__(self) -> str:
        where = f" on {self.request}" if self.request else ""
        fields = "".join(f"\n  {field}: {message}" for field, message in self.errors.items())
        head = f"HTTP {self.status}" if self.status is not None else type(self).__name__
        return f"{head}{where}:{fields}"


class ValidationError(PortalError):
    """400: bad input; ``errors`` names every bad field with what it allows. Nothing was stored."""


class AuthenticationError(PortalError):
    """401: no token, a malformed one, or one the portal does not know (revoked, expired)."""


class PermissionDenied(PortalError):
    """403: you may see this but not do it (cancelling a team mate's job, editing a quota)."""


class NotFound(PortalError):
    """404: no such job or team among yours (another team's job looks exactly the same)."""


class Conflict(PortalError):
    """409: the job's state does not allow it; the message names the state."""


class RateLimited(PortalError):
    """429: over the request rate of your user or token; try again in ``retry_after`` s."""

    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class PortalUnavailable(PortalError):
    """The portal could not be reached or did not answer in time (connection refused, no such
    host, a timeout), or answered 502/503/504 to every retry. ``url`` is what was asked."""


class WaitTimeout(PortalError, TimeoutError):
    """``wait()`` gave up; ``job`` is the job as last seen (its state and why it waits)."""

    def __init__(self, message: str, job: Job) -> None:
        super().__init__(None, {"detail": message})
        self.job = job

    def __str__(self) -> str:
        return self.errors["detail"]


_BY_STATUS: dict[int, type[PortalError]] = {
    400: ValidationError,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


def error_for(
    status: int,
    body: bytes,
    *,
    request: str,
    url: str,
    retry_after: str | None = None,
) -> PortalError:
    """The exception for an HTTP error answer (the portal's JSON, or any other page)."""
    errors = errors_of(body, status)
    if status == 429:
        return RateLimited(status, errors, request, url, retry_after=_seconds_or_none(retry_after))
    if status in (502, 503, 504):
        return PortalUnavailable(status, errors, request, url)
    return _BY_STATUS.get(status, PortalError)(status, errors, request, url)


def errors_of(body: bytes, status: int) -> dict[str, str]:
    """The API's ``{"errors": {...}}``; any other answer (a proxy's page) as ``detail``."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("errors"), dict):
        return {str(field): str(message) for field, message in payload["errors"].items()}
    text = body.decode(errors="replace").strip()
    return {"detail": text[:500] or f"HTTP {status} with an empty body"}


def _seconds_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

"""What the API says when the database is out of reach."""

from __future__ import annotations

from typing import Any

from django.db import InterfaceError, OperationalError
from django.utils.log import log_response

DATABASE_UNAVAILABLE = "database unavailable, try again"


def database_unavailable(exc: BaseException) -> bool:
    """Django's errors for a database it cannot reach (down, restarting, out of connections)."""
    return isinstance(exc, OperationalError | InterfaceError)


def log_outage(*, request: Any, response: Any, exc: BaseException) -> None:
    """One warning line per refused request, naming the cause; Django then leaves the 503
    alone (it would log it again as an error, without the cause)."""
    log_response(
        "%s %s: %s (%s)",
        request.method,
        request.path,
        DATABASE_UNAVAILABLE,
        str(exc),
        response=response,
        request=request,
        level="warning",
    )

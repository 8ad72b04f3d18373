"""The control plane's task for the agents' reports (queue ``control``)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from portal.celery import app
from portal.cluster.services import handle_report
from workers.protocol import TASK_AGENT_REPORT, ProtocolError, parse

log = logging.getLogger("portal.cluster")


@app.task(
    name=TASK_AGENT_REPORT,
    ignore_result=True,
    # A database hiccup is worth a few retries; every handler is idempotent.
    autoretry_for=(DatabaseError,),
    max_retries=5,
    retry_backoff=True,
    retry_backoff_max=30,
)
def agent_report(message: Any) -> str:
    """Validate and apply one report. A malformed one is logged with its error and dropped:
    retrying cannot make it valid."""
    try:
        parsed = parse(message)
    except (ProtocolError, TypeError, ValueError) as error:
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        node = message.get("node") if isinstance(message, dict) else None
        log.warning("dropped a bad %s report from %s: %s", kind, node or "an agent", error)
        return "dropped"
    handle_report(parsed)
    return parsed.TYPE

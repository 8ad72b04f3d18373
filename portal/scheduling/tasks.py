"""The Celery task of the scheduling loop (beat runs it on a timer; triggers ask for it)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from portal.celery import app
from portal.passes import request_schedule_pass
from portal.scheduling.service import (
    count_pass_request,
    last_snapshot_at,
    pass_requests,
    run_schedule_pass,
)

log = logging.getLogger("portal.scheduling")


# Passes one request-driven task runs back to back before it hands the rest to a new task.
FOLLOW_UPS_PER_TASK = 5


@app.task(name="portal.schedule_pass", bind=True, ignore_result=True)
def schedule_pass(self: Any, requested_at: float | None = None) -> str:
    """Run a scheduling pass.

    Debounced: a request (``requested_at``, epoch seconds, sent after the commit that needs
    a pass) is already covered when a pass took its snapshot after it, so a burst of submits
    costs one pass, not one each. A request that finds another pass running leaves it to
    that pass's task: it counts itself (``count_pass_request``) before it tries the lock,
    and each task that ran a pass reads the count before its pass and after it, and runs
    again when the count grew (``_passes_asked_for_meanwhile``). So no request falls between
    a pass's snapshot and the end of its lock. Beat sends no ``requested_at``: it always runs
    (or skips).
    """
    if requested_at is not None:
        covered = last_snapshot_at()
        if covered is not None and covered >= datetime.fromtimestamp(requested_at, tz=UTC):
            return "covered"
        count_pass_request()
    before = pass_requests()
    result = run_schedule_pass()
    if result.status == "skipped":
        # The pass holding the lock runs again after it for this request.
        return "deferred" if requested_at is not None else "skipped"
    return _passes_asked_for_meanwhile(before)


def _passes_asked_for_meanwhile(before: int) -> str:
    """After a pass, the passes asked for while it ran (by requests that found it running):
    ``before`` is the count of requests read before it took the lock."""
    for _ in range(FOLLOW_UPS_PER_TASK):
        after = pass_requests()
        if after == before:
            return "ran"
        before = after
        if run_schedule_pass().status == "skipped":
            # Another pass took the lock after this one released it, so after those
            # requests were counted: its snapshot covers them.
            return "ran"
    if pass_requests() != before:
        # Still asked for: a new task, so that this thread serves the reports behind it.
        request_schedule_pass()
    return "ran"

"""The Celery task of the scheduling loop (beat runs it on a timer; triggers ask for it)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from time import sleep
from typing import Any

from django.conf import settings
from django.utils import timezone

from portal.celery import app
from portal.passes import request_schedule_pass
from portal.scheduling.service import (
    count_pass_request,
    last_snapshot_at,
    pace_passes,
    pass_requests,
    run_schedule_pass,
)

log = logging.getLogger("portal.scheduling")


# Passes one task runs after its own before it hands the rest to a new task.
FOLLOW_UPS_PER_TASK = 5
# The longest a follow-up pass waits (PORTAL_SCHEDULE_FOLLOW_UP_GAP x the last pass's time).
MAX_FOLLOW_UP_WAIT_S = 2.0
# A request ignores a pacing this long past its end: the task that set it died waiting.
PACING_SLACK = timedelta(seconds=5)


@app.task(name="portal.schedule_pass", bind=True, ignore_result=True)
def schedule_pass(self: Any, requested_at: float | None = None) -> str:
    """Run a scheduling pass.

    Debounced: a request (``requested_at``, epoch seconds, sent after the commit that needs
    a pass) is already covered when a pass took its snapshot after it, so a burst of submits
    costs one pass, not one each. Otherwise it counts itself (``count_pass_request``) and
    runs a pass, unless the passes are paced (then, or when the lock is held, it leaves the
    request to the task of the pass before: ``"deferred"``). Each task that ran a pass
    reads the count before its pass and again after it (and after its pacing wait), and
    runs again when the count grew (``_passes_asked_for_meanwhile``). Counted before the
    lock is tried, read after it is released: no request falls in between. Beat sends no
    ``requested_at``: it always runs (or skips).
    """
    if requested_at is not None:
        covered = last_snapshot_at()
        if covered is not None and covered >= datetime.fromtimestamp(requested_at, tz=UTC):
            return "covered"
        before, paced_until = count_pass_request()
        if paced_until is not None and timezone.now() < paced_until + PACING_SLACK:
            return "deferred"  # the pacing task runs the pass after its wait
    else:
        before = pass_requests()
    result = run_schedule_pass()
    if result.status == "skipped":
        # The pass holding the lock runs again after it for this request.
        return "deferred" if requested_at is not None else "skipped"
    return _passes_asked_for_meanwhile(before, result.total_ms)


def _passes_asked_for_meanwhile(before: int, last_ms: float) -> str:
    """After a pass that took ``last_ms``, the passes asked for while it ran or while this
    task waited: ``before`` is the count of requests read before the pass took the lock.

    The wait: ``PORTAL_SCHEDULE_FOLLOW_UP_GAP`` times the last pass's duration (at most
    ``MAX_FOLLOW_UP_WAIT_S``), with the passes paced meanwhile (the requests that come are
    counted and left to this task). Under a steady stream of submits the passes would
    otherwise run back to back, a whole core of the control plane's (and a good part of the
    database's) re-deciding a queue that grows by a few jobs each time. With the default of
    1 they take at most half of it, and a job submitted meanwhile waits at most one pass
    longer."""
    gap = settings.SCHEDULE_FOLLOW_UP_GAP
    for _ in range(FOLLOW_UPS_PER_TASK):
        if gap:
            wait = min(gap * last_ms / 1000, MAX_FOLLOW_UP_WAIT_S)
            pace_passes(timezone.now() + timedelta(seconds=wait))
            sleep(wait)
            pace_passes(None)  # before the count is read: see count_pass_request
        after = pass_requests()
        if after == before:
            return "ran"
        before = after
        result = run_schedule_pass()
        if result.status == "skipped":
            # Another pass took the lock after this one released it, so after those
            # requests were counted: its snapshot covers them.
            return "ran"
        last_ms = result.total_ms
    if pass_requests() != before:
        # Still asked for: a new task, so that this thread serves the reports behind it.
        request_schedule_pass()
    return "ran"

"""The Celery task of the scheduling loop (beat runs it on a timer; triggers ask for it)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from portal.celery import app
from portal.scheduling.service import last_snapshot_at, run_schedule_pass

log = logging.getLogger("portal.scheduling")


@app.task(name="portal.schedule_pass", bind=True, max_retries=20, ignore_result=True)
def schedule_pass(self: Any, requested_at: float | None = None) -> str:
    """Run a scheduling pass.

    Debounced: a request (``requested_at``, epoch seconds, sent by the on-commit trigger) is
    already covered when a pass took its snapshot after it, so a burst of submits costs one
    pass, not one each. A request that finds another pass running retries shortly: that pass's
    snapshot may predate it. Beat sends no ``requested_at``: it always runs (or skips).
    """
    if requested_at is not None:
        covered = last_snapshot_at()
        if covered is not None and covered >= datetime.fromtimestamp(requested_at, tz=UTC):
            return "covered"
    result = run_schedule_pass()
    if result.status == "skipped" and requested_at is not None:
        if self.request.retries >= self.max_retries:
            return "skipped"  # the beat loop's next pass covers it
        raise self.retry(countdown=settings.SCHEDULE_RETRY_S)
    return result.status

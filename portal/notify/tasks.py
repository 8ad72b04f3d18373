"""The control plane's notification tasks (queue ``control``): one try of a delivery, and
the sweep that beat runs every PORTAL_NOTIFY_SWEEP_S for deliveries whose message was lost."""

from __future__ import annotations

from typing import Any

from portal.celery import app
from portal.notify.delivery import attempt_delivery


@app.task(name="portal.notify.deliver", bind=True, ignore_result=True, max_retries=None)
def deliver(self: Any, delivery_id: int, attempts: int = 0) -> str:
    """Make the next try of a delivery; a failure worth retrying comes back after a wait that
    doubles each time (the delivery row counts the tries and stops them)."""
    outcome = attempt_delivery(delivery_id, attempts=attempts)
    if outcome.retry_in is not None:
        raise self.retry(
            args=[delivery_id, outcome.attempts], countdown=outcome.retry_in, queue="control"
        )
    return outcome.status


@app.task(name="portal.notify.sweep", ignore_result=True)
def sweep() -> int:
    """Send again the deliveries whose message was lost."""
    from portal.notify.services import resend_overdue

    return resend_overdue()

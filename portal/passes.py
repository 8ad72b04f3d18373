"""Ask for a scheduling pass soon, without ever scheduling inside a web request.

It lives outside the apps because apps below ``portal.scheduling`` ask for passes (a submit,
a finished attempt, a quota change, an undrained node): it sends a Celery message by task
name and imports no app.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction

from portal.celery import app

log = logging.getLogger("portal.scheduling")

SCHEDULE_PASS_TASK = "portal.schedule_pass"


def request_schedule_pass() -> None:
    """Send one 'schedule now' message to the control plane.

    Best effort: when the broker is away the beat loop's next pass (every
    PORTAL_SCHEDULE_INTERVAL_S) does the same work, so a failed send is only logged.
    """
    try:
        # requested_at lets the task see that a later pass already covered this request.
        app.send_task(
            SCHEDULE_PASS_TASK, kwargs={"requested_at": time.time()}, queue="control", expires=30
        )
    except Exception as error:  # noqa: BLE001 - any broker failure is the same to us
        log.warning("could not ask for a scheduling pass (the beat loop will run it): %s", error)


def schedule_pass_on_commit() -> None:
    """After the current transaction commits, ask for a scheduling pass."""
    transaction.on_commit(request_schedule_pass)

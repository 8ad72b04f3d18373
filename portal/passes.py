"""Ask for a scheduling pass soon, without ever scheduling inside a web request.

It lives outside the apps because apps below ``portal.scheduling`` ask for passes (a submit,
a finished attempt, a quota change, an undrained node): it sends a Celery message by task
name and imports no app.

A process sends at most one request per ``PORTAL_SCHEDULE_REQUEST_COALESCE_S`` (250 ms): the
first at once, and the ones asked for within that time after it as one message at its end.
One pass covers every job committed before its snapshot, so a burst of 400 submits a second
costs 4 messages a second per process, not 400: each is a task for the control worker (a
few statements: covered? counted, paced?). At 50 ms, the five web processes of a 2-core
machine taking 400 submits a second cost the control worker 0.14 of a core in these tasks
alone (`make bench-api`, its CPU by role); a pass under such a stream is paced at about
one per pass duration anyway (``portal.scheduling.tasks``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from django.conf import settings
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


class Coalescer:
    """Calls ``send`` for each ``ask``, but at most once per ``window()`` seconds: an ask
    within the window after a send is sent once, at the window's end, for all the asks of
    that window. A window of 0 sends every ask at once.

    The late sends come from one thread per process that lives as long as the process (a
    process forked from one starts afresh: no send due, its own thread when it needs one;
    a send due in the parent at the fork was dropped in the child before, and with it every
    later request of the child). Not a timer thread per window:
    Celery keeps its result backend per thread, so each new thread that sent built it
    again, scanning the installed packages' entry points (at 400 submits a second, a seventh
    of the web processes' time, holding the GIL).
    """

    def __init__(
        self,
        send: Callable[[], None],
        *,
        window: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._window = window
        self._clock = clock
        self._changed = threading.Condition()
        self._last_sent = float("-inf")
        self._due_in: float | None = None  # seconds to wait before the late send, when due
        self._sender_pid: int | None = None
        # A process forked from this one has neither its sender thread nor, maybe, a usable
        # lock (held by a thread that is not in the child): it starts afresh.
        os.register_at_fork(after_in_child=self._start_afresh)

    def _start_afresh(self) -> None:
        self._changed = threading.Condition()
        self._last_sent = float("-inf")
        self._due_in = None
        self._sender_pid = None

    def ask(self) -> None:
        with self._changed:
            if self._due_in is not None:
                return  # a send is due at the end of this window: it covers this ask
            now = self._clock()
            wait = self._last_sent + self._window() - now
            if wait > 0:
                self._due_in = wait
                self._start_sender()
                self._changed.notify()
                return
            self._last_sent = now
        self._send()

    def _start_sender(self) -> None:
        if self._sender_pid == os.getpid():
            return
        self._sender_pid = os.getpid()
        threading.Thread(target=self._send_late, name="schedule-requests", daemon=True).start()

    def _send_late(self) -> None:
        while True:
            with self._changed:
                while self._due_in is None:
                    self._changed.wait()
                wait = self._due_in
            time.sleep(wait)
            with self._changed:
                self._due_in = None
                self._last_sent = self._clock()
            try:
                self._send()
            except Exception:  # noqa: BLE001 - the thread must outlive one failed send
                log.exception("could not send a coalesced scheduling request")


# `request_schedule_pass` looked up at each send, so a test may patch it.
_coalescer = Coalescer(
    lambda: request_schedule_pass(), window=lambda: settings.SCHEDULE_REQUEST_COALESCE_S
)


def schedule_pass_on_commit() -> None:
    """After the current transaction commits, ask for a scheduling pass (coalesced: see the
    module's docstring)."""
    transaction.on_commit(_coalescer.ask)

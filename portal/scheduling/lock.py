"""One scheduler at a time.

PostgreSQL: a transaction-level advisory lock, tried (never waited for) right after the pass's
transaction begins; it is released by the commit, so the next pass's snapshot sees every
row this pass wrote. SQLite: an ``flock`` on a file in PORTAL_VAR_DIR, taken *before* the
transaction (an IMMEDIATE transaction would otherwise wait up to 30 s for the write lock
instead of skipping) and released after the commit.

A pass that does not get the lock is skipped: another pass is running and the next trigger
or beat covers whatever it missed.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

# An arbitrary constant shared by every control-plane process ("portal sched" in ASCII).
ADVISORY_LOCK_KEY = 0x706F7274616C5343
LOCK_FILE_NAME = "scheduler.lock"


@contextmanager
def scheduler_file_lock() -> Iterator[bool]:
    """On SQLite, yield whether this process got the scheduler's file lock; elsewhere True."""
    if connection.vendor != "sqlite":
        yield True
        return
    path = settings.VAR_DIR / LOCK_FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            # flock locks belong to the open file, so two threads of one process exclude
            # each other too (fcntl/lockf locks would not).
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def try_advisory_lock() -> bool:
    """On PostgreSQL, try the transaction-level lock (call inside the pass's transaction)."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        (got,) = cursor.fetchone()
    return bool(got)


def wait_for_running_pass() -> None:
    """Inside a transaction: wait until a pass that is running commits, and keep passes out
    until this transaction ends, so a change a pass must see whole (a node cordoned) never
    lands between a pass's snapshot and its writes. PostgreSQL: the pass's advisory lock,
    waited for; SQLite: the transaction's write lock (IMMEDIATE) already does this."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])

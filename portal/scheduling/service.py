"""One scheduling pass: lock, snapshot, decide, apply, commit, then tell the agents.

1. Lock      - one scheduler at a time (``portal.scheduling.lock``); a pass that does not
               get the lock is skipped, not queued.
2. Snapshot  - ``load_snapshot``: a fixed number of queries, inside the pass's transaction.
3. Decide    - ``scheduler.schedule(snapshot, now=..., config=...)``, the pure core.
4. Apply     - ``apply_decisions``: guarded updates, allocations, explanations.
5. Commit    - the transaction ends; PostgreSQL releases the advisory lock.
6. Dispatch  - after commit, one launch per placed job and one stop per preempted job.
               Never before: an agent must not start a job the database does not hold.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from portal import agent_messages
from portal.policy import scheduler_config
from portal.scheduling.apply import Applied, apply_decisions
from portal.scheduling.lock import scheduler_file_lock, try_advisory_lock
from portal.scheduling.models import PASS_TIMINGS_KEPT, PassRequests, PassTiming, SchedulerState
from portal.scheduling.snapshot import load_snapshot
from scheduler import Carry, schedule

log = logging.getLogger("portal.scheduling")


@dataclass(frozen=True, slots=True)
class PassResult:
    status: Literal["ran", "skipped"]
    assigned: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    conflicts: tuple[int, ...] = ()  # placed by the core, left pending by a conflict
    pending: int = 0
    explanations_written: int = 0
    load_ms: float = 0.0
    decide_ms: float = 0.0
    apply_ms: float = 0.0
    total_ms: float = 0.0


SKIPPED = PassResult(status="skipped")

# What this process's passes learnt about single pending jobs, for the next one
# (``scheduler.Carry``: each job's candidate, by the identity of its core job). The snapshot
# hands the core the same job objects for rows that did not change (``snapshot._job_cache``),
# so most of a queue is nominated once, not every pass. Passes of one process run one at a
# time (the scheduling lock); a pass that failed leaves nothing wrong here: a candidate is
# what a job's own request makes of the cluster's shape, whatever the pass decided.
_carry = Carry()


def run_schedule_pass(*, now: datetime | None = None) -> PassResult:
    """Run one pass now, unless another pass holds the scheduler lock (then "skipped")."""
    config = scheduler_config()
    began = time.perf_counter()
    with scheduler_file_lock() as got_file_lock:
        if not got_file_lock:
            return SKIPPED
        with transaction.atomic():
            if not try_advisory_lock():
                return SKIPPED
            when = now or timezone.now()
            locked_at = time.perf_counter()
            loaded = load_snapshot(now=when, config=config)
            loaded_at = time.perf_counter()
            decisions = schedule(loaded.snapshot, now=when.timestamp(), config=config, carry=_carry)
            decided_at = time.perf_counter()
            # Dated when written (the clock now, after the snapshot), unless the caller set
            # the time: see apply_decisions.
            applied = apply_decisions(decisions, loaded=loaded, at=now or timezone.now())
            applied_at = time.perf_counter()
            _record_pass(
                when,
                applied,
                duration_ms=(applied_at - began) * 1000,
                phases_ms=(
                    (loaded_at - locked_at) * 1000,
                    (decided_at - loaded_at) * 1000,
                    (applied_at - decided_at) * 1000,
                ),
            )
            assigned, preempted = list(applied.assigned), list(applied.preempted)
            transaction.on_commit(lambda: dispatch_after_pass(assigned, preempted), robust=True)
    result = PassResult(
        status="ran",
        assigned=tuple(applied.assigned),
        preempted=tuple(applied.preempted),
        failed=tuple(applied.failed),
        conflicts=tuple(applied.conflicts),
        pending=applied.pending,
        explanations_written=applied.explanations_written,
        load_ms=(loaded_at - began) * 1000,
        decide_ms=(decided_at - loaded_at) * 1000,
        apply_ms=(applied_at - decided_at) * 1000,
        total_ms=(time.perf_counter() - began) * 1000,
    )
    if result.assigned or result.preempted or result.failed or result.conflicts:
        log.info(
            "pass: %d assigned, %d preempted, %d failed, %d conflicts, %d pending in %.0f ms",
            len(result.assigned),
            len(result.preempted),
            len(result.failed),
            len(result.conflicts),
            result.pending,
            result.total_ms,
        )
    return result


def dispatch_after_pass(assigned: list[int], preempted: list[int]) -> None:
    """Launch the placed jobs and stop the victims; a failure here is repaired by the reaper."""
    if assigned:
        agent_messages.send_launches(assigned)
    if preempted:
        agent_messages.request_stops(preempted)


def _record_pass(
    when: datetime,
    applied: Applied,
    *,
    duration_ms: float,
    phases_ms: tuple[float, float, float],
) -> None:
    """The singleton state row, and this pass's phase timings (snapshot, decide, apply) for
    /metrics, pruning all but the latest ``PASS_TIMINGS_KEPT``."""
    finished_at = timezone.now()
    snapshot_ms, decide_ms, apply_ms = phases_ms
    timing = PassTiming.objects.create(
        finished_at=finished_at, snapshot_ms=snapshot_ms, decide_ms=decide_ms, apply_ms=apply_ms
    )
    # Ids only grow, and passes run one at a time (the lock): one DELETE keeps the window.
    PassTiming.objects.filter(pk__lte=timing.pk - PASS_TIMINGS_KEPT).delete()
    state, _ = SchedulerState.objects.get_or_create(pk=1)
    state.snapshot_at = when
    state.finished_at = finished_at
    state.duration_ms = duration_ms
    state.passes += 1
    state.assigned = len(applied.assigned)
    state.preempted = len(applied.preempted)
    state.pending = applied.pending
    state.save()


def last_snapshot_at() -> datetime | None:
    """When the latest committed pass took its snapshot (for coalescing triggers)."""
    return SchedulerState.objects.filter(pk=1).values_list("snapshot_at", flat=True).first()


def count_pass_request() -> tuple[int, datetime | None]:
    """Count a request for a pass (``PassRequests``), in its own statement outside any
    pass's transaction; then read the count and until when the passes are paced (None: not
    paced). In that order: a task clears the pacing before it reads the count, so a request
    that sees the passes paced has been counted before that task looks."""
    _change_pass_requests(count=F("count") + 1)
    return PassRequests.objects.filter(pk=1).values_list("count", "paced_until").get()


def pass_requests() -> int:
    """How many requests for a pass have been counted so far."""
    return PassRequests.objects.filter(pk=1).values_list("count", flat=True).first() or 0


def pace_passes(until: datetime | None) -> None:
    """Say that the passes are paced until ``until`` (a task waits before its follow-up
    pass, and the requests counted meanwhile are left to it), or no longer (None)."""
    _change_pass_requests(paced_until=until)


def _change_pass_requests(**changes: Any) -> None:
    """UPDATE the one ``PassRequests`` row (its migration makes it). A database emptied by
    hand gets it back, counted once: two requests at once may count once, which still
    changes the count a running pass compares."""
    if not PassRequests.objects.filter(pk=1).update(**changes):
        count = 1 if "count" in changes else 0
        paced_until = changes.get("paced_until")
        PassRequests.objects.bulk_create(
            [PassRequests(pk=1, count=count, paced_until=paced_until)], ignore_conflicts=True
        )

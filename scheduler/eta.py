"""Start estimates as a band (earliest, likely, latest), with the queue ahead counted.

``Explainer`` (``scheduler.explain``) first finds, for each pending job, the earliest time its
request fits and what else holds it back (its team's quota, its array's throttle, the job it
waits behind), from the running jobs' time limits. That ignores the jobs ahead of it in the
queue, which will take the capacity first. ``QueuePlan`` adds them: it walks the pending jobs
in their order (position 1 first) and books each one, per pool, at the first moment enough
slices have come free, for as long as it is expected to run; a job's start is that moment,
and never before what else holds it back.

Two plans run side by side:

- *likely*: running jobs end at their likely end and planned jobs run their likely time
  (``scheduler.runtimes``: the history's median, never past the time limit; the limit
  without history);
- *latest*: running jobs end at their time limits and planned jobs run theirs (without a
  limit, the history's 90th percentile).

The band of a job is then ``earliest`` = when its request first fits on the likely ends if
the jobs ahead left it room (never after ``likely``), ``likely`` = the likely plan, and
``latest`` = the latest plan (never before the estimate from the time limits). A job with
no known end ahead of it has ``None`` where the plan meets it: unknown only when nothing at
all is known.

The plan counts slices per pool, not per node, so it is optimistic for a single-node gang in a
fragmented cluster; the node-aware earliest fit bounds it from below. An estimate, never a
decision: nothing here changes what the pass does.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.backfill import Release, Timeline
from scheduler.cluster import Pool
from scheduler.model import SliceKind

# (latest pass-known end, slices count): what a planned job gives back, and when.
_Booking = tuple[float, int]


@dataclass(slots=True)
class _PoolPlan:
    events: list[Release]  # the running jobs' ends in this pool, sorted
    free: int  # slices free at ``at``
    at: float  # the plan's clock in this pool: starts are booked in order, never earlier
    next_event: int = 0
    booked: list[_Booking] | None = None  # planned jobs' ends (a heap)

    def __post_init__(self) -> None:
        self.booked = []

    def book(self, need: int, run_s: float | None, not_before: float) -> float | None:
        """Book ``need`` slices for ``run_s`` (None: without end) at the first moment they are
        free; the start, or None when they never come free."""
        events, booked = self.events, self.booked
        assert booked is not None
        while self.free < need:
            event_end = events[self.next_event][0] if self.next_event < len(events) else None
            booked_end = booked[0][0] if booked else None
            if event_end is None and booked_end is None:
                return None  # what it needs is held without a known end
            if booked_end is None or (event_end is not None and event_end <= booked_end):
                assert event_end is not None
                self.free += len(events[self.next_event][3])
                self.next_event += 1
                end = event_end
            else:
                end, count = heapq.heappop(booked)
                self.free += count
            if end > self.at:
                self.at = end
        start = max(self.at, not_before)
        self.free -= need
        if run_s is not None:
            heapq.heappush(booked, (start + run_s, need))
        return start


class QueuePlan:
    """The pending jobs booked in order onto one time line of ends (see the module doc)."""

    def __init__(self, timeline: Timeline, free_now: Mapping[Pool, int], now: float) -> None:
        self._timeline = timeline
        self._free_now = free_now
        self._now = now
        self._pools: dict[Pool, _PoolPlan] = {}

    def _pool(self, pool: Pool) -> _PoolPlan:
        plan = self._pools.get(pool)
        if plan is None:
            events = self._timeline.events(pool)
            plan = self._pools[pool] = _PoolPlan(events, self._free_now.get(pool, 0), self._now)
        return plan

    def book(
        self, pools: Sequence[Pool], need: int, run_s: float | None, not_before: float
    ) -> float | None:
        """Book a job asking ``need`` slices of one of ``pools`` (the one with the most free,
        then the first); its planned start, or None. MPS shares are not planned (their GPUs
        serve one team at a time): None."""
        if not pools or pools[0][0] is SliceKind.MPS:
            return None
        best = self._pool(pools[0])
        for pool in pools[1:]:
            plan = self._pool(pool)
            if plan.free > best.free:
                best = plan
        return best.book(need, run_s, not_before)


def later(a: float | None, b: float | None) -> float | None:
    """The later of two estimates; unknown when either is."""
    if a is None or b is None:
        return None
    return a if a >= b else b

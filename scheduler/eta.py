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

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.backfill import Release, Timeline
from scheduler.cluster import Pool
from scheduler.model import SliceKind

# (time, 0 = slices come free / 1 = the planned reservation takes them, count), in order.
_Change = tuple[float, int, int]


@dataclass(slots=True)
class _PoolPlan:
    """One pool's plan, in the spirit of EASY backfill: the plan's clock ``at`` with the
    slices ``free`` then; a job that fits now starts now unless it would delay the planned
    reservation (the first job that did not fit, at ``shadow_at``, leaving ``spare`` slices
    beside it); the first job that does not fit becomes that reservation; a later one that
    does not fit moves the clock on until it does."""

    events: list[Release]  # the running jobs' ends in this pool, sorted
    free: int
    at: float
    next_event: int = 0
    changes: list[_Change] = field(default_factory=list)  # planned jobs' ends, sorted
    next_change: int = 0
    shadow_at: float | None = None
    spare: int = 0

    def _when_free(self, need: int) -> tuple[float, int] | None:
        """When ``need`` slices are first free (and how many are then), looking ahead."""
        free, event, change = self.free, self.next_event, self.next_change
        at = self.at
        events, changes = self.events, self.changes
        while free < need:
            ahead = events[event][0] if event < len(events) else None
            later_change = changes[change] if change < len(changes) else None
            if ahead is None and later_change is None:
                return None
            if later_change is None or (ahead is not None and ahead <= later_change[0]):
                assert ahead is not None
                free += len(events[event][3])
                event += 1
                at = max(at, ahead)
            else:
                free += later_change[2] if later_change[1] == 0 else -later_change[2]
                change += 1
                at = max(at, later_change[0])
        return at, free

    def book(self, need: int, run_s: float | None, not_before: float) -> float | None:
        """Book ``need`` slices for ``run_s`` (None: without end); its start, or None when
        they never come free.

        One loop over the plan's changes in time order (a running job's end before a planned
        change at the same time, and before a planned end of as many slices or more), the
        state kept in locals: it runs for every pending job of a pass."""
        events, changes = self.events, self.changes
        free, at = self.free, self.at
        while True:
            if free >= need:
                start = at if at >= not_before else not_before
                end = None if run_s is None else start + run_s
                shadow = self.shadow_at
                past = shadow is not None and (end is None or end > shadow)
                if not past or need <= self.spare:
                    self.free, self.at = free - need, at
                    if past:
                        self.spare -= need
                    if end is not None:
                        bisect.insort(changes, (end, 0, need), lo=self.next_change)
                    return start
            if self.shadow_at is None:
                self.free, self.at = free, at
                found = self._when_free(need)
                if found is None:
                    return None
                start = max(found[0], not_before)
                self.shadow_at, self.spare = start, found[1] - need
                bisect.insort(changes, (start, 1, need), lo=self.next_change)
                if run_s is not None:
                    bisect.insort(changes, (start + run_s, 0, need), lo=self.next_change)
                return start
            # Move the clock to the next change (with none left, they never come free).
            next_event, next_change = self.next_event, self.next_change
            if next_event < len(events):
                event = events[next_event]
                when = event[0]
                change = changes[next_change] if next_change < len(changes) else None
                if change is None or (
                    when < change[0]
                    or (when == change[0] and (change[1] == 1 or len(event[3]) <= change[2]))
                ):
                    self.next_event = next_event + 1
                    free += len(event[3])
                    if when > at:
                        at = when
                    continue
            elif next_change >= len(changes):
                self.free, self.at = free, at
                return None
            when, kind, count = changes[next_change]
            self.next_change = next_change + 1
            if when > at:
                at = when
            if kind == 1:  # the planned reservation starts: its slices are taken
                free -= count
                self.shadow_at = None
            else:
                free += count


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
        known = self._pools
        best: _PoolPlan | None = None
        for pool in pools:
            plan = known.get(pool)
            if plan is None:
                plan = self._pool(pool)
            if best is None or plan.free > best.free:
                best = plan
        assert best is not None
        return best.book(need, run_s, not_before)


def later(a: float | None, b: float | None) -> float | None:
    """The later of two estimates; unknown when either is."""
    if a is None or b is None:
        return None
    return a if a >= b else b

"""Start estimates as a band (earliest, likely, latest), with the queue ahead counted.

``Explainer`` (``scheduler.explain``) first finds, for each pending job, the earliest time its
request fits and what else holds it back (its team's quota, its array's throttle, the job it
waits behind), from the running jobs' time limits. That ignores the jobs ahead of it in the
queue, which will take the capacity first. ``QueuePlan`` adds them, node by node, the way the
passes to come would, in the spirit of EASY backfill:

1. every pending job is booked in queue order (position 1 first) onto the free slices of each
   node: a job that fits on one node (best fit; a spread gang: on the nodes with the most
   free) starts now unless it would delay the plan's reservation; the first that does not
   fit becomes the reservation, on the node that first has room for it, at that time; the
   others wait in the plan, without holding back the jobs behind them;
2. ``finish`` then moves the plan's clock on, change by change (running jobs' ends, planned
   jobs' ends, the reservation's start): at each moment the waiting jobs that fit start in
   queue order and the first one that does not is the next reservation.

A job's start is when the plan starts it, and never before what else holds it back. A job
running past the reservation may take the reservation node's slices only beyond what the
reservation needs there (other nodes are no matter to it), so a gang that needs a whole node
is not booked onto slices scattered over several, and single GPUs run in the holes it leaves.

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

The plan knows nothing of quotas and fair share to come (a job held back by its quota or
array starts no earlier than that allows, from the limits) and keeps one reservation per pool:
where the pass keeps more (``max_reservations`` above 1, or jobs past ``max_wait_s``), it is
optimistic for the jobs behind them. An estimate, never a decision: nothing here
changes what the pass does.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.backfill import Release, Timeline
from scheduler.cluster import FreeIndex, Pool
from scheduler.model import SliceKind

# A planned job's end: (time, node, slices it gives back), in time order.
_End = tuple[float, int, int]
# A job waiting in the plan: (handle = its place in the queue, run time, not before).
_Waiting = tuple[int, float | None, float]


@dataclass(slots=True)
class _Reservation:
    """The plan's reservation (EASY: one per pool): ``need`` slices on ``node`` (None: spread
    over nodes) from ``start``; ``spare`` slices beside it there, which a job running past
    ``start`` may take."""

    handle: int
    start: float
    node: int | None
    need: int
    run_s: float | None
    spare: int


class _PoolPlan:
    """One pool's plan: the free slices of each node at the plan's clock ``at``, the running
    jobs' ends and the planned jobs' ends ahead of it, the reservation, and the jobs waiting
    for room, by request (see the module doc)."""

    __slots__ = (
        "at",
        "ends",
        "events",
        "free",
        "levels",
        "next_end",
        "next_event",
        "reserved",
        "starts",
        "top",
        "total",
        "waiting",
    )

    def __init__(
        self, events: list[Release], free: dict[int, int], now: float, starts: list[float | None]
    ) -> None:
        self.events = events  # the running jobs' ends in this pool, sorted
        self.next_event = 0
        self.ends: list[_End] = []
        self.next_end = 0
        self.free = free
        self.levels: dict[int, set[int]] = {}  # free count -> nodes with exactly that many
        for node, count in free.items():
            if count > 0:
                self.levels.setdefault(count, set()).add(node)
        self.top = max(self.levels, default=0)
        self.total = sum(free.values())
        self.at = now
        self.reserved: _Reservation | None = None
        self.waiting: dict[tuple[int, bool], deque[_Waiting]] = {}
        self.starts = starts

    def _set(self, node: int, old: int, count: int) -> None:
        """Node ``node`` goes from ``old`` free slices to ``count``."""
        levels = self.levels
        if old > 0:
            levels[old].discard(node)
        if count > 0:
            found = levels.get(count)
            if found is None:
                levels[count] = {node}
            else:
                found.add(node)
            if count > self.top:
                self.top = count
        self.free[node] = count
        self.total += count - old
        if count < old == self.top and not levels[old]:  # the top level emptied
            top = old - 1
            while top > 0 and not levels.get(top):
                top -= 1
            self.top = top

    def _place(self, need: int, spread: bool, run_s: float | None, not_before: float) -> bool:
        """Start a job at the plan's clock if it fits there without delaying the reservation
        (best fit: the node with the fewest free slices that holds it; spread: the nodes
        with the most free first). It runs for every pending job of a pass: a request
        larger than what is free is turned away first."""
        if need > (self.total if spread else self.top):
            return False
        at = self.at
        start = at if at >= not_before else not_before
        end = None if run_s is None else start + run_s
        # The node it may not use, so as not to delay the reservation (a spread reservation
        # counts the pool's slices: it may not start at all).
        r = self.reserved
        blocked: int | None = None
        if r is not None and (end is None or end > r.start):
            if need > r.spare:
                if r.node is None:
                    return False
                blocked = r.node
        else:
            r = None  # it ends before the reservation starts: no matter to it
        levels, free = self.levels, self.free
        if not spread:
            for level in range(need, self.top + 1):
                nodes = levels.get(level)
                if nodes:
                    for node in nodes:
                        if node != blocked:
                            break
                    else:
                        continue
                    self._set(node, level, level - need)
                    if r is not None and (node == r.node or r.node is None):
                        r.spare -= need
                    if end is not None:
                        bisect.insort(self.ends, (end, node, need), lo=self.next_end)
                    return True
            return False
        usable = self.total - (free.get(blocked, 0) if blocked is not None else 0)
        if usable < need:
            return False
        taken: list[tuple[int, int]] = []
        left = need
        for level in range(self.top, 0, -1):
            for node in levels.get(level, ()):
                if node != blocked and left:
                    count = min(level, left)
                    taken.append((node, count))
                    left -= count
            if not left:
                break
        for node, count in taken:
            self._set(node, free[node], free[node] - count)
            if r is not None and node == r.node:
                r.spare -= count
            if end is not None:
                bisect.insort(self.ends, (end, node, count), lo=self.next_end)
        if r is not None and r.node is None:
            r.spare -= need
        return True

    def _lookahead(self, need: int, spread: bool) -> tuple[float, int | None, int] | None:
        """When ``need`` slices are first free on one node (spread: in the pool), looking
        ahead over the ends: (time, node, its free slices then), or None."""
        free, events, ends = self.free, self.events, self.ends
        event, end = self.next_event, self.next_end
        at = self.at
        gained: dict[int, int] = {}
        total = self.total
        while True:
            if event < len(events) and (end >= len(ends) or events[event][0] <= ends[end][0]):
                when, node, _, items = events[event]
                count = len(items)
                event += 1
            elif end < len(ends):
                when, node, count = ends[end]
                end += 1
            else:
                return None
            if when > at:
                at = when
            if spread:
                total += count
                if total >= need:
                    return at, None, total
                continue
            now_free = gained.get(node, free.get(node, 0)) + count
            gained[node] = now_free
            if now_free >= need:
                return at, node, now_free

    def _reserve(
        self, handle: int, need: int, spread: bool, run_s: float | None, nb: float
    ) -> None:
        found = self._lookahead(need, spread)
        if found is None:  # it never fits on the known ends: unknown
            self.starts[handle] = None
            return
        when, node, free_then = found
        start = when if when >= nb else nb
        self.reserved = _Reservation(handle, start, node, need, run_s, free_then - need)
        self.starts[handle] = start

    def book(
        self, handle: int, need: int, spread: bool, run_s: float | None, not_before: float
    ) -> None:
        """Book a job in queue order: it starts now if it fits without delaying the
        reservation, becomes the reservation if there is none, or waits for ``finish``."""
        if self._place(need, spread, run_s, not_before):
            at = self.at
            self.starts[handle] = at if at >= not_before else not_before
        elif self.reserved is None:
            self._reserve(handle, need, spread, run_s, not_before)
        else:
            key = (need, spread)
            queue = self.waiting.get(key)
            if queue is None:
                queue = self.waiting[key] = deque()
            queue.append((handle, run_s, not_before))

    def finish(self) -> None:
        """Move the clock on, change by change, until every waiting job has a start: at each
        moment the reservation takes its slices when its time comes, then the waiting jobs
        that fit start in queue order, and the first that does not fit is the next
        reservation (as each pass of the scheduler would do then)."""
        waiting = self.waiting
        # The requests waiting, in the queue order of their first jobs (a request's jobs
        # wait in queue order, so only its first one is tried).
        order = sorted((queue[0][0], key) for key, queue in waiting.items() if queue)
        order_version, needs_at = 0, -1
        single = spread = None
        while True:
            r = self.reserved
            if r is not None and r.start <= self.at:
                self._apply(self.at)  # (ends already past count first)
                self._take(r)
            if not order and self.reserved is None:
                return
            placed = -1
            top, total = self.top, self.total
            for i, (handle, key) in enumerate(order):
                need = key[0]
                if need > (total if key[1] else top):
                    continue
                _, run_s, not_before = waiting[key][0]
                if self._place(need, key[1], run_s, not_before):
                    at = self.at
                    self.starts[handle] = at if at >= not_before else not_before
                    placed = i
                    break
            if placed < 0 and self.reserved is None and order:
                placed = 0
                handle, key = order[0]
                _, run_s, not_before = waiting[key][0]
                self._reserve(handle, key[0], key[1], run_s, not_before)
            if placed >= 0:
                handle, key = order.pop(placed)
                queue = waiting[key]
                queue.popleft()
                if queue:
                    bisect.insort(order, (queue[0][0], key))
                else:
                    order_version += 1
                continue
            # Nothing more starts now: move on to the next change that could let a waiting
            # request fit (or the reservation start).
            if needs_at != order_version:  # (the requests waiting changed)
                single = min((key[0] for _, key in order if not key[1]), default=None)
                spread = min((key[0] for _, key in order if key[1]), default=None)
                needs_at = order_version
            if not self._advance(single, spread):
                for queue in waiting.values():
                    for handle, _, _ in queue:
                        self.starts[handle] = None
                return

    def _take(self, r: _Reservation) -> None:
        """The reservation starts: its slices are taken (they were kept for it)."""
        self.reserved = None
        free = self.free
        end = None if r.run_s is None else r.start + r.run_s
        if r.node is not None:
            taken = [(r.node, min(r.need, free.get(r.node, 0)))]
        else:
            taken, left = [], r.need
            for level in range(self.top, 0, -1):
                for node in list(self.levels.get(level, ())):
                    if left:
                        count = min(level, left)
                        taken.append((node, count))
                        left -= count
        for node, count in taken:
            have = free.get(node, 0)
            self._set(node, have, have - count)
            if end is not None:
                bisect.insort(self.ends, (end, node, count), lo=self.next_end)

    def _advance(self, single: int | None, spread: int | None) -> bool:
        """Move the clock on, change time by change time, applying every change then, at least
        once and until a node has ``single`` slices free, the pool ``spread``, or the
        reservation's time comes; False when nothing is left to change."""
        events, ends = self.events, self.ends
        r = self.reserved
        reserved_at = r.start if r is not None and r.start > self.at else None
        single_need = single if single is not None else 1 << 30
        spread_need = spread if spread is not None else 1 << 30
        while True:
            when = events[self.next_event][0] if self.next_event < len(events) else None
            if self.next_end < len(ends):
                end_at = ends[self.next_end][0]
                if when is None or end_at < when:
                    when = end_at
            if reserved_at is not None and (when is None or reserved_at <= when):
                when = reserved_at
            if when is None:
                return False
            if when > self.at:
                self.at = when
            self._apply(when)
            if (
                self.top >= single_need
                or self.total >= spread_need
                or (reserved_at is not None and when >= reserved_at)
            ):
                return True

    def _apply(self, when: float) -> None:
        """Give back the slices of every end up to ``when``."""
        events, ends, free = self.events, self.ends, self.free
        while self.next_event < len(events) and events[self.next_event][0] <= when:
            _, node, _, items = events[self.next_event]
            self.next_event += 1
            have = free.get(node, 0)
            self._set(node, have, have + len(items))
        while self.next_end < len(ends) and ends[self.next_end][0] <= when:
            _, node, count = ends[self.next_end]
            self.next_end += 1
            have = free.get(node, 0)
            self._set(node, have, have + count)


class QueuePlan:
    """The pending jobs booked in order onto the running jobs' ends, node by node (see the
    module doc). ``book`` each job in queue order, then ``finish``; ``start(handle)``."""

    def __init__(
        self,
        timeline: Timeline,
        index: FreeIndex,
        set_aside: Mapping[tuple[Pool, int], int],
        now: float,
    ) -> None:
        self._timeline = timeline
        self._index = index
        self._set_aside = set_aside
        self._now = now
        self._pools: dict[Pool, _PoolPlan] = {}
        self.starts: list[float | None] = []

    def _pool(self, pool: Pool) -> _PoolPlan:
        plan = self._pools.get(pool)
        if plan is None:
            buckets = self._index.buckets.get(pool)
            free = dict(buckets.count) if buckets is not None else {}
            for (kept_pool, node), kept in self._set_aside.items():
                if kept_pool == pool:
                    free[node] = free.get(node, 0) + kept
            events = self._timeline.events(pool)
            plan = self._pools[pool] = _PoolPlan(events, free, self._now, self.starts)
        return plan

    def book(
        self,
        pools: Sequence[Pool],
        need: int,
        spread: bool,
        run_s: float | None,
        not_before: float,
    ) -> int:
        """Book a job asking ``need`` slices of one of ``pools`` (the one with the most free,
        then the first); a handle for its start. MPS shares are not planned (their GPUs serve
        one team at a time): their start is None."""
        starts = self.starts
        handle = len(starts)
        starts.append(None)
        if not pools or pools[0][0] is SliceKind.MPS:
            return handle
        known = self._pools
        best: _PoolPlan | None = None
        for pool in pools:
            plan = known.get(pool)
            if plan is None:
                plan = self._pool(pool)
            if best is None or plan.total > best.total:
                best = plan
        assert best is not None
        best.book(handle, need, spread, run_s, not_before)
        return handle

    def finish(self) -> list[float | None]:
        """Every booked job's planned start, by handle (None: unknown)."""
        for plan in self._pools.values():
            plan.finish()
        return self.starts


def later(a: float | None, b: float | None) -> float | None:
    """The later of two estimates; unknown when either is."""
    if a is None or b is None:
        return None
    return a if a >= b else b

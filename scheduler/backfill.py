"""Reservations for blocked jobs, and start-time estimates, from the holders' time limits.

A running job holding slices ends at the latest at ``started_at + time_limit_s`` (a victim in
its grace period at ``preempting_since + grace_period_s``); a job with no time limit has no
known end. Sweeping those ends in time order tells when a request would first fit.

A reservation (EASY backfill) is the earliest such time ``at`` and the slices the blocked job
would take then. It prefers slices that are *held now* and come free by ``at``, so slices
that are free now stay usable. The free-now slices it does need are set aside: a later job
may use them only if its own time limit ends by ``at``. With no known end, the reservation
sets aside the free slices of the node closest to fitting and keeps them until it fits.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.cluster import FreeIndex, Placement, Pool
from scheduler.model import Slice, SliceKind
from scheduler.quota import Held

# (end time, node number, sequence number, slices of one pool that come free then); the
# sequence number keeps tuples comparable without ever comparing slices.
Release = tuple[float, int, int, tuple[Slice, ...]]
# Where a one-node sweep for a need stopped (``_earliest``): the event's position, each
# node's count up to there, the free slices each count began with, and the free counts
# (``FreeIndex.buckets``) they were read from, with how many of their changes had been read
# (``_Buckets.changed``).
Sweep = tuple[int, dict[int, int], dict[int, int], object, int]


class Timeline:
    """When held slices come free, per pool. Built lazily: many passes never ask."""

    def __init__(
        self,
        index: FreeIndex,
        held: Sequence[tuple[float | None, Sequence[Slice]]] = (),
        *,
        sweeps: bool = True,
    ) -> None:
        """``held``: (end or None, slices) of the running jobs."""
        self._index = index
        self._pending: list[tuple[float, Sequence[Slice]]] = [
            (end, slices) for end, slices in held if end is not None and slices
        ]
        self._events: dict[Pool, list[Release]] | None = None
        self._seq = itertools.count()
        # Per pool and need, where the last one-node sweep of ``_earliest`` stopped: the
        # position it found, each node's count up to it and the free slices that count
        # began with. Kept while the pool's events stay as they are (``add`` drops them).
        # (None: ``Cache.SWEEPS`` off.)
        self._sweeps: dict[Pool, dict[int, Sweep]] | None = {} if sweeps else None
        # Per pool, the positions of each node's events in ``events(pool)``, for the events
        # indexed so far (how many: the second item), for ``released_on``; ``add`` drops a
        # pool's, as its events move.
        self._on_node: dict[Pool, tuple[dict[int, list[int]], int]] = {}

    @classmethod
    def of_held(cls, index: FreeIndex, held: Sequence[Held], *, sweeps: bool = True) -> Timeline:
        """The time line of the running jobs as ``quota.hold`` lists them (their latest
        ends), without an intermediate list: a pass meets every running job."""
        timeline = cls(index, sweeps=sweeps)
        timeline._pending = [
            (end, slices) for _, slices, _, end in held if end is not None and slices
        ]
        return timeline

    def add(self, end: float | None, slices: Sequence[Slice]) -> None:
        """Slices held until ``end`` (None: no known end, so never listed)."""
        if end is None or not slices:
            return
        if self._events is None:
            self._pending.append((end, slices))
            return
        for pool, release in self._releases(end, slices, next(self._seq)):
            bisect.insort(self._events.setdefault(pool, []), release)
            self._on_node.pop(pool, None)
            if self._sweeps is not None:
                self._sweeps.pop(pool, None)

    def forget_sweeps(self) -> None:
        """Free slices came back within the pass (a reservation let go): a kept sweep may
        have stopped past where the next one should (``_earliest``)."""
        if self._sweeps is not None:
            self._sweeps.clear()

    def _releases(
        self, end: float, slices: Sequence[Slice], seq: int
    ) -> list[tuple[Pool, Release]]:
        shape = self._index.shape
        node_of, pool_of_id = shape.slice_node, shape.slice_pool
        first = slices[0].id
        pool, node = pool_of_id[first], node_of[first]
        # The usual: one pool, one node (a plain loop: a third of the cost of mapping the
        # tuples' and ints' ``__eq__`` over the ids).
        for item in slices:
            item_id = item.id
            if pool_of_id[item_id] != pool or node_of[item_id] != node:
                break
        else:
            return [(pool, (end, node, seq, tuple(slices)))]
        groups: dict[tuple[Pool, int], list[Slice]] = {}
        for item in slices:
            groups.setdefault((pool_of_id[item.id], node_of[item.id]), []).append(item)
        return [(p, (end, n, seq, tuple(items))) for (p, n), items in groups.items()]

    def events(self, pool: Pool) -> list[Release]:
        if self._events is None:
            events: dict[Pool, list[Release]] = {}
            shape = self._index.shape
            node_of, pool_of_id = shape.slice_node, shape.slice_pool
            pending = self._pending
            # Each held entry takes the next sequence number, in the order they came.
            first = next(self._seq)
            for seq, (end, slices) in enumerate(pending, start=first):
                if len(slices) == 1:  # the usual case, without the general grouping
                    only = slices[0].id
                    release = (end, node_of[only], seq, tuple(slices))
                    found = events.get(pool_of_id[only])
                    if found is None:
                        events[pool_of_id[only]] = [release]
                    else:
                        found.append(release)
                    continue
                for key, grouped in self._releases(end, slices, seq):
                    events.setdefault(key, []).append(grouped)
            self._seq = itertools.count(first + len(pending))
            for releases in events.values():
                releases.sort()
            self._events = events
            self._pending = []
        return self._events.get(pool, [])

    def released_on(self, pool: Pool, last: int, node: int, need: int) -> list[Slice]:
        """The first ``need`` slices released on ``node`` by the event at ``last`` of
        ``events(pool)``. Each node's events are indexed as far as a call has asked, so a
        pass's many calls (one per reservation) read each event of the pool once, not once
        per call."""
        events = self.events(pool)
        on_node, indexed = self._on_node.get(pool) or ({}, 0)
        if indexed <= last:
            for at in range(indexed, last + 1):
                at_node = events[at][1]
                found = on_node.get(at_node)
                if found is None:
                    on_node[at_node] = [at]
                else:
                    found.append(at)
            indexed = last + 1
        self._on_node[pool] = (on_node, indexed)
        out: list[Slice] = []
        for at in on_node.get(node, ()):
            if at > last:
                break
            out += events[at][3]
            if len(out) >= need:
                break
        return out[:need]


@dataclass(slots=True)
class Reservation:
    job_id: str
    at: float | None  # None: no known time (some holders have no time limit)
    set_aside: list[Slice]  # free-now slices kept for it (taken out of the index)
    nodes: frozenset[int]
    pools: frozenset[Pool]
    by_node: dict[tuple[Pool, int], int] = field(default_factory=dict)  # set-aside counts

    def lets(self, ends_at: float | None) -> bool:
        """May a job ending at ``ends_at`` use the set-aside slices?"""
        return self.at is not None and ends_at is not None and ends_at <= self.at


def _free_now(index: FreeIndex, pool: Pool, team: str, node: int) -> int:
    return index.node_free(pool, team, node)


def reserve(
    index: FreeIndex,
    timeline: Timeline,
    *,
    job_id: str,
    pools: Sequence[Pool],
    team: str,
    need: int,
    multi_node: bool,
) -> Reservation:
    """The reservation of a blocked job; its set-aside slices are removed from ``index``."""
    best = _first_fit(index, timeline, pools, team, need, multi_node)
    if best is not None:
        at, node, pool, released = best
        placement = _top_up(index, pool, team, node, need - len(released), multi_node)
        # (the slices released on one node are that node's; a multi-node gang's, any)
        on = {node} if node >= 0 and released else None
        return _set_aside(index, job_id, at, pool, placement, team, released, on)
    return _reserve_unknown(index, job_id, pools, team, need, multi_node)


def earliest_fit(
    index: FreeIndex,
    timeline: Timeline,
    *,
    pools: Sequence[Pool],
    team: str,
    need: int,
    multi_node: bool,
) -> float | None:
    """When ``need`` slices of one of ``pools`` first fit (on one node unless ``multi_node``)
    as the running jobs reach their time limits; None when no known end makes room."""
    best = _first_fit(index, timeline, pools, team, need, multi_node)
    return None if best is None else best[0]


def _first_fit(
    index: FreeIndex,
    timeline: Timeline,
    pools: Sequence[Pool],
    team: str,
    need: int,
    multi_node: bool,
) -> tuple[float, int, Pool, list[Slice]] | None:
    """Over ``pools``, the earliest fit (then the lowest node): (at, node, pool, the slices
    released by then); None when no known end makes room."""
    best: tuple[float, int, Pool, list[Slice]] | None = None
    for pool in pools:
        found = _earliest(index, timeline, pool, team, need, multi_node)
        if found is not None and (best is None or found[:2] < best[:2]):
            best = (found[0], found[1], pool, found[2])
    return best


def _earliest(
    index: FreeIndex, timeline: Timeline, pool: Pool, team: str, need: int, multi_node: bool
) -> tuple[float, int, list[Slice]] | None:
    """(time, node, slices released there by then) when ``need`` first fit in ``pool``."""
    events = timeline.events(pool)
    if multi_node:
        total = index.total_free([pool])
        for at, (end, _, _, items) in enumerate(events):
            total += len(items)
            if total >= need:
                released: dict[int, list[Slice]] = {}
                for _, node, _, got in events[: at + 1]:
                    released.setdefault(node, []).extend(got)
                every = [s for n in sorted(released) for s in released[n]]
                return (end, -1, every[:need])
        return None
    # One node: count what each node has free now plus what comes free there, and gather
    # the slices of the node that fits only once it does (a sweep meets many nodes).
    counts: dict[int, int] = {}
    get = counts.get
    if pool[0] is SliceKind.MPS:
        for at, (end, node, _, items) in enumerate(events):
            had = get(node)
            if had is None:
                had = _free_now(index, pool, team, node)
            had += len(items)
            counts[node] = had
            if had >= need:
                return (end, node, timeline.released_on(pool, at, node, need))
        return None
    # Within a pass no node gains free slices and no node's count at an event grows (a
    # placed job's release comes with the slices it took; ``Timeline.add`` drops the sweeps
    # of a pool whose events change, as a job on set-aside slices would break this), so the
    # next sweep for the same need can only stop at or after where the last one did: it
    # goes on from there, each node's count corrected by what it has free now, and checks
    # that event's node again.
    if not events:
        return None
    buckets = index.buckets.get(pool)
    free_on = {} if buckets is None else buckets.count
    sweeps = None if timeline._sweeps is None else timeline._sweeps.setdefault(pool, {})
    kept = None if sweeps is None else sweeps.get(need)
    frees: dict[int, int] = {}  # each node's free slices as its count took them
    start = 0
    read = 0 if buckets is None else len(buckets.changed)
    if kept is not None:
        start, counts, frees, seen, mark = kept
        get = counts.get
        # Only the nodes whose free count changed since (each node of the sweep when the
        # counts are a new object): the correction is by difference, so a node changed twice
        # is corrected once and then found equal.
        changed = frees if seen is not buckets or buckets is None else buckets.changed[mark:]
        for node in changed:
            had_free = frees.get(node)
            if had_free is None:
                continue
            now_free = free_on.get(node, 0)
            if now_free != had_free:
                counts[node] += now_free - had_free
                frees[node] = now_free
        end, node, _, _ = events[start]
        if counts[node] >= need:
            if sweeps is not None:
                sweeps[need] = (start, counts, frees, buckets, read)
            return (end, node, timeline.released_on(pool, start, node, need))
        start += 1
    for at in range(start, len(events)):
        end, node, _, items = events[at]
        had = get(node)
        if had is None:
            had = frees[node] = free_on.get(node, 0)
        had += len(items)
        counts[node] = had
        if had >= need:
            if sweeps is not None:
                sweeps[need] = (at, counts, frees, buckets, read)
            return (end, node, timeline.released_on(pool, at, node, need))
    if sweeps is not None:
        sweeps[need] = (len(events) - 1, counts, frees, buckets, read)
    return None


def _top_up(
    index: FreeIndex, pool: Pool, team: str, node: int, missing: int, multi_node: bool
) -> Placement:
    """The free-now slices a reservation needs beyond what comes free."""
    if missing <= 0:
        return []
    if node < 0:  # multi-node: from the nodes with the most free
        found = index.find_spread([pool], team, missing, missing)
        return found or []
    return [(node, index.pick(pool, team, node, missing))]


def _set_aside(
    index: FreeIndex,
    job_id: str,
    at: float | None,
    pool: Pool,
    placement: Placement,
    team: str,
    released: Sequence[Slice],
    released_on: set[int] | None = None,
) -> Reservation:
    """The reservation of ``placement`` (free now, taken out of ``index``) and ``released``
    (the slices coming free by ``at``; ``released_on``: their nodes, when the caller knows).
    ``pool``: the pool it waits in (a placement of more than one pool counts each slice in
    its own)."""
    kept: list[Slice] = []
    by_node: dict[tuple[Pool, int], int] = {}
    if released_on is not None:
        nodes = released_on
    else:
        node_of = index.shape.slice_node
        nodes = {node_of[s.id] for s in released}
    pool_of = index.shape.slice_pool
    for node, items in placement:
        for item in items:
            index.remove(item, team)
            kept.append(item)
            key = (pool_of[item.id], node)
            by_node[key] = by_node.get(key, 0) + 1
        nodes.add(node)
    pools = frozenset([pool, *(p for p, _ in by_node)])
    return Reservation(job_id, at, kept, frozenset(nodes), pools, by_node)


def hold_now(
    index: FreeIndex, job_id: str, now: float, placement: Placement, team: str
) -> Reservation:
    """The reservation of a job that fits now: ``placement``'s slices taken out of ``index``
    and set aside, starting ``now`` (so no other job may use them: none ends by then)."""
    pool = index.shape.slice_pool[placement[0][1][0].id]
    return _set_aside(index, job_id, now, pool, placement, team, [], set())


def _reserve_unknown(
    index: FreeIndex,
    job_id: str,
    pools: Sequence[Pool],
    team: str,
    need: int,
    multi_node: bool,
) -> Reservation:
    """No known time: keep the free slices of the node (or nodes) closest to fitting."""
    shape = index.shape
    best: tuple[int, int, Pool] | None = None  # (-free, node, pool)
    for pool in pools:
        for node, capacity in shape.pool_capacity.get(pool, {}).items():
            if (capacity < need and not multi_node) or not shape.nodes[node].schedulable:
                continue
            free = _free_now(index, pool, team, node)
            if free > 0 and (best is None or (-free, node) < best[:2]):
                best = (-free, node, pool)
    if best is None:
        return Reservation(job_id, None, [], frozenset(), frozenset(pools))
    _, node, pool = best
    if multi_node:
        placement = index.find_spread([pool], team, 1, need) or []
    else:
        placement = [(node, index.pick(pool, team, node, min(need, -best[0])))]
    return _set_aside(index, job_id, None, pool, placement, team, [])


def give_back(index: FreeIndex, reservation: Reservation) -> list[Slice]:
    """Put the set-aside slices back into ``index`` (MPS shares stay out: owners differ)."""
    back = [s for s in reservation.set_aside if s.kind is not SliceKind.MPS]
    for item in back:
        index.restore(item)
    return back


def set_aside_again(index: FreeIndex, reservation: Reservation, back: Sequence[Slice]) -> None:
    """After a short job had its chance at them, keep what it left for the reservation."""
    still: list[Slice] = []
    for item in back:
        pool = index.shape.slice_pool[item.id]
        node = index.shape.slice_node[item.id]
        if index.holds(item):
            index.remove(item, "")
            still.append(item)
        else:
            key = (pool, node)
            reservation.by_node[key] = reservation.by_node.get(key, 1) - 1
    mps = [s for s in reservation.set_aside if s.kind is SliceKind.MPS]
    reservation.set_aside = mps + still


# --- estimates ------------------------------------------------------------------------------


class Estimator:
    """Earliest times a request could fit, from the free state at the end of a pass."""

    def __init__(
        self,
        index: FreeIndex,
        timeline: Timeline,
        now: float,
        *,
        remember: bool = True,
        set_aside: Mapping[tuple[Pool, int], int] | None = None,
    ) -> None:
        """``set_aside``: slices out of ``index`` that count as free all the same, per pool
        and node (a reservation's, for the band of ``scheduler.eta``)."""
        self._index = index
        self._set_aside = set_aside or {}
        self._timeline = timeline
        self._now = now
        # The levels of each pool, once computed (``Cache.ESTIMATES``).
        self._remember = remember
        self._single: dict[Pool, list[tuple[int, float]]] = {}
        self._spread: dict[Pool, list[tuple[int, float]]] = {}

    def earliest(self, pools: Sequence[Pool], need: int, multi_node: bool) -> float | None:
        best: float | None = None
        for pool in pools:
            levels = self._levels(pool, multi_node)
            for level, at in levels:
                if level >= need:
                    if best is None or at < best:
                        best = at
                    break
        return best

    def _levels(self, pool: Pool, multi_node: bool) -> list[tuple[int, float]]:
        """(level, time) each time the most free on one node (or in all) grew."""
        cache = self._spread if multi_node else self._single
        found = cache.get(pool)
        if found is not None:
            return found
        counts = self._free_counts(pool)
        now = self._now
        levels = [(sum(counts.values()) if multi_node else max(counts.values(), default=0), now)]
        level = levels[0][0]
        append = levels.append
        # (one loop per kind, with no calls per end: it meets every held slice's end)
        if multi_node:
            for end, _, _, items in self._timeline.events(pool):
                if items:
                    level += len(items)
                    append((level, end if end >= now else now))
        else:
            get = counts.get
            for end, node, _, items in self._timeline.events(pool):
                count = counts[node] = get(node, 0) + len(items)
                if count > level:
                    level = count
                    append((level, end if end >= now else now))
        if self._remember:
            cache[pool] = levels
        return levels

    def _free_counts(self, pool: Pool) -> dict[int, int]:
        index = self._index
        counts: dict[int, int]
        if pool[0] is not SliceKind.MPS:
            buckets = index.buckets.get(pool)
            counts = dict(buckets.count) if buckets is not None else {}
            for (kept_pool, node), kept in self._set_aside.items():
                if kept_pool == pool:
                    counts[node] = counts.get(node, 0) + kept
            return counts
        counts = {}
        for (node, _gpu), free in index.gpu_free.items():
            if free and index.shape.slice_pool[next(iter(free))] == pool:
                counts[node] = counts.get(node, 0) + len(free)
        return counts

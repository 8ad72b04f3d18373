"""Where free capacity is, indexed so one pass never scans every node for every job.

Slices are grouped into *pools*: one pool per (kind, MIG profile, GPU model). A request
matches the pools of its kind and profile, restricted to its model when it names one. For each
pool the index keeps, per node, the free slices and their count, and buckets of nodes by free
count (heaps of node numbers, cleaned lazily), so "the node with the fewest free slices that
still fits ``k``" - best fit - costs a few heap peeks instead of a scan.

MPS shares are special: the shares of one GPU may only go to one team, so an MPS GPU is
either *unowned* (no job on it: all its shares free, any team may open it) or *owned* by the
team whose jobs run on it (only that team may use its free shares). The index keeps both views.

``ClusterShape`` is the part that only depends on the node list; it is cached by the identity
of the ``nodes`` tuple (the simulator passes the same tuple again and again) and kept while the
portal's shell passes a new tuple equal to the last one (it reads the nodes every pass, and
they seldom change). The cache never changes a result, only its cost.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.model import GpuRequest, Node, Slice, SliceKind

Pool = tuple[SliceKind, str, str]  # (kind, MIG profile or "", GPU model or "")
GpuKey = tuple[int, str]  # (node number, gpu id)

# The owner of an MPS GPU whose shares already serve two teams (left by an older pass or put
# there by hand): nobody may add to it.
_CONFLICT = "\x00conflict"


def pool_of(item: Slice) -> Pool:
    profile = item.profile.strip().lower() if item.kind is SliceKind.MIG else ""
    return (item.kind, profile, item.model)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    pools: tuple[Pool, ...]  # the matching pools
    minimum: int  # slices it needs at least
    unit: float  # units of one slice, the smallest among its pools (for quota checks)
    could_ever_fit: bool  # on the empty cluster (one node unless multi-node)
    largest_node: int  # the most matching slices any one node has


@dataclass(slots=True)
class ClusterShape:
    """The static facts about a node list: pools, capacities, GPUs."""

    nodes: list[Node]  # sorted by name, so node numbers break ties by name
    names: list[str]
    node_number: dict[str, int]
    slice_node: dict[str, int]
    slice_by_id: dict[str, Slice]
    slice_pool: dict[str, Pool]
    gpu_slices: dict[GpuKey, list[Slice]]
    mixed_gpus: frozenset[GpuKey]  # GPUs exposing a whole slice and partial slices at once
    pool_capacity: dict[Pool, dict[int, int]]  # node -> slices of the pool (all nodes)
    pool_max_node: dict[Pool, int]  # the most slices of the pool any one node has
    pool_slice_units: dict[Pool, float]  # the smallest units of one slice of the pool
    pools_by_kind: dict[tuple[SliceKind, str], list[Pool]]
    total_units: float  # on schedulable nodes
    # Slices of schedulable nodes, as the free index starts from them: pool -> node -> slices
    # (whole GPUs and MIG instances not on a mixed GPU), and MPS GPUs with their shares.
    plain: dict[Pool, dict[int, list[Slice]]]
    mps: list[tuple[GpuKey, Pool, list[Slice]]]
    _request_pools: dict[tuple[SliceKind, str, str], tuple[Pool, ...]] = field(default_factory=dict)
    _requests: dict[tuple[object, ...], RequestInfo] = field(default_factory=dict)

    def request_info(self, request: GpuRequest) -> RequestInfo:
        """What the cluster offers ``request``, memoised per distinct request."""
        # Keyed by the fields (a tuple hashes faster than the dataclass).
        memo_key = (
            request.kind,
            request.count,
            request.profile,
            request.model,
            request.min_count,
            request.multi_node,
        )
        found = self._requests.get(memo_key)
        if found is None:
            found = self._requests[memo_key] = self.describe(request, self.pools_for(request))
        return found

    def describe(self, request: GpuRequest, pools: tuple[Pool, ...] | None = None) -> RequestInfo:
        """What the cluster offers ``request``, computed afresh (``request_info`` memoises)."""
        if pools is None:
            pools = self._matching_pools(request)
        minimum = request.minimum
        largest = max((self.pool_max_node[p] for p in pools), default=0)
        if not pools:
            ever = False
        elif request.multi_node:
            ever = sum(sum(self.pool_capacity[p].values()) for p in pools) >= minimum
        else:
            ever = largest >= minimum
        unit = min((self.pool_slice_units[p] for p in pools), default=1.0)
        return RequestInfo(pools, minimum, unit, ever, largest)

    def pools_for(self, request: GpuRequest) -> tuple[Pool, ...]:
        """The pools whose slices match ``request`` (kind, MIG profile, model if named)."""
        profile = request.profile.strip().lower() if request.kind is SliceKind.MIG else ""
        key = (request.kind, profile, request.model)
        found = self._request_pools.get(key)
        if found is None:
            found = self._request_pools[key] = self._matching_pools(request)
        return found

    def _matching_pools(self, request: GpuRequest) -> tuple[Pool, ...]:
        profile = request.profile.strip().lower() if request.kind is SliceKind.MIG else ""
        candidates = self.pools_by_kind.get((request.kind, profile), [])
        return tuple(p for p in candidates if not request.model or p[2] == request.model)


def build_shape(nodes: Sequence[Node]) -> ClusterShape:
    ordered = sorted(nodes, key=lambda n: n.name)
    slice_node: dict[str, int] = {}
    slice_by_id: dict[str, Slice] = {}
    slice_pool: dict[str, Pool] = {}
    gpu_slices: dict[GpuKey, list[Slice]] = {}
    pool_capacity: dict[Pool, dict[int, int]] = {}
    pool_slice_units: dict[Pool, float] = {}
    pools: dict[tuple[SliceKind, str, str], Pool] = {}  # (kind, raw profile, model) -> pool
    for number, node in enumerate(ordered):
        for item in node.slices:
            item_id = item.id
            slice_node[item_id] = number
            slice_by_id[item_id] = item
            key = (number, item.gpu)
            found = gpu_slices.get(key)
            if found is None:
                gpu_slices[key] = [item]
            else:
                found.append(item)
            raw = (item.kind, item.profile, item.model)
            pool = pools.get(raw)
            if pool is None:
                pool = pools[raw] = pool_of(item)
            slice_pool[item_id] = pool
            per_node = pool_capacity.get(pool)
            if per_node is None:
                per_node = pool_capacity[pool] = {}
                pool_slice_units[pool] = item.units
            per_node[number] = per_node.get(number, 0) + 1
            if item.units < pool_slice_units[pool]:
                pool_slice_units[pool] = item.units
    mixed: set[GpuKey] = set()
    plain: dict[Pool, dict[int, list[Slice]]] = {}
    mps: list[tuple[GpuKey, Pool, list[Slice]]] = []
    total_units = 0.0
    for key in sorted(gpu_slices):
        items = gpu_slices[key]
        if len(items) > 1 and any(item.kind is SliceKind.WHOLE for item in items):
            mixed.add(key)  # a whole slice next to partial ones: they overlap
        if not ordered[key[0]].schedulable:
            continue
        if key in mixed:
            total_units += 1.0  # a mixed GPU counts once, as its whole slice
            continue
        total_units += sum(item.units for item in items)
        if items[0].kind is SliceKind.MPS:
            mps.append((key, slice_pool[items[0].id], items))
            continue
        for item in items:
            by_node = plain.get(slice_pool[item.id])
            if by_node is None:
                by_node = plain[slice_pool[item.id]] = {}
            on_node = by_node.get(key[0])
            if on_node is None:
                by_node[key[0]] = [item]
            else:
                on_node.append(item)
    pools_by_kind: dict[tuple[SliceKind, str], list[Pool]] = {}
    for pool in sorted(pool_capacity):
        pools_by_kind.setdefault((pool[0], pool[1]), []).append(pool)
    return ClusterShape(
        nodes=ordered,
        names=[n.name for n in ordered],
        node_number={n.name: i for i, n in enumerate(ordered)},
        slice_node=slice_node,
        slice_by_id=slice_by_id,
        slice_pool=slice_pool,
        gpu_slices=gpu_slices,
        mixed_gpus=frozenset(mixed),
        pool_capacity=pool_capacity,
        pool_max_node={p: max(c.values()) for p, c in pool_capacity.items()},
        pool_slice_units=pool_slice_units,
        pools_by_kind=pools_by_kind,
        total_units=total_units,
        plain=plain,
        mps=mps,
    )


_SHAPES: dict[int, tuple[tuple[Node, ...], ClusterShape]] = {}
_SHAPES_KEPT = 4


def shape_of(nodes: tuple[Node, ...], *, remember: bool = True) -> ClusterShape:
    """The shape of ``nodes``, from the cache when the caller passes the same tuple again, or
    a tuple equal to the last one it passed (``remember=False``: built afresh,
    ``Cache.NODE_LIST`` switched off).

    The portal's shell reads the nodes from the database every pass, so it passes a new tuple
    of equal nodes: comparing it with the last one (about 3 ms for 1,000 nodes of 8 GPUs, every
    slice compared field by field) is much cheaper than building the shape again (about
    25 ms). The cache keeps each tuple alive next to its shape, so an ``id`` is never reused
    for a different tuple while its entry exists; tuples and nodes are immutable, so the shape
    stays true.
    """
    if not remember:
        return build_shape(nodes)
    entry = _SHAPES.get(id(nodes))
    if entry is not None and entry[0] is nodes:
        return entry[1]
    last = next(reversed(_SHAPES.values()), None)
    shape = last[1] if last is not None and last[0] == nodes else build_shape(nodes)
    if len(_SHAPES) >= _SHAPES_KEPT:
        _SHAPES.pop(next(iter(_SHAPES)))
    _SHAPES[id(nodes)] = (nodes, shape)
    return shape


# --- the free capacity of one pass ---------------------------------------------------------

Placement = list[tuple[int, list[Slice]]]  # (node number, slices taken there)


class _Buckets:
    """Nodes by free count: ``heaps[c]`` holds node numbers whose count was ``c`` when pushed.

    An entry is live only while the node's count is still ``c``; stale ones are dropped when
    they reach the top. Best fit for ``k`` = the smallest live ``c >= k``, lowest node number.
    """

    __slots__ = ("count", "heaps", "top", "changed")

    def __init__(self, count: dict[int, int]) -> None:
        self.count = count
        # Every node whose count was set, in order (a sweep kept between calls reads only
        # those since it last looked: ``scheduler.backfill._earliest``).
        self.changed: list[int] = []
        self.heaps: dict[int, list[int]] = {}
        for node in sorted(count):
            if count[node] > 0:
                self.heaps.setdefault(count[node], []).append(node)
        self.top = max(self.heaps, default=0)

    def set(self, node: int, value: int) -> None:
        self.count[node] = value
        self.changed.append(node)
        if value > 0:
            heapq.heappush(self.heaps.setdefault(value, []), node)
            if value > self.top:
                self.top = value

    def _live(self, c: int) -> int | None:
        heap = self.heaps.get(c)
        count = self.count
        while heap:
            node = heap[0]
            if count.get(node, 0) == c:
                return node
            heapq.heappop(heap)
        return None

    def largest(self) -> int:
        """The largest free count of any node (0 when none)."""
        while self.top > 0 and self._live(self.top) is None:
            self.top -= 1
        return self.top

    def best_fit(self, need: int) -> tuple[int, int] | None:
        """(count, node) of the node with the fewest free slices that still fits ``need``."""
        for c in range(max(need, 1), self.largest() + 1):
            node = self._live(c)
            if node is not None:
                return c, node
        return None

    def descending(self) -> list[tuple[int, int]]:
        """(count, node) of every node with free slices, most free first (for spreading)."""
        live = [(-c, node) for node, c in self.count.items() if c > 0]
        live.sort()
        return [(-c, node) for c, node in live]


class FreeIndex:
    """The free slices of one pass; ``take`` and ``remove`` keep every view in step.

    Free slices are kept in insertion-ordered dicts (id -> slice), so taking one out costs
    the same whatever the node size.
    """

    def __init__(self, shape: ClusterShape, holders: dict[str, str]) -> None:
        """``holders``: slice id -> team of the running job holding it."""
        self.shape = shape
        # Whole GPUs and MIG instances: pool -> node -> free slices, and their buckets.
        self.free: dict[Pool, dict[int, dict[str, Slice]]] = {}
        self.buckets: dict[Pool, _Buckets] = {}
        self.pool_free_total: dict[Pool, int] = {}
        self.free_ids: set[str] = set()  # ids of the free whole GPUs and MIG instances
        # MPS pools.
        self.gpu_free: dict[GpuKey, dict[str, Slice]] = {}  # free shares of each MPS GPU
        self.gpu_owner: dict[GpuKey, str] = {}  # team on the GPU; absent = unowned
        self.unowned: dict[Pool, dict[int, list[GpuKey]]] = {}  # fully free GPUs per node
        self.unowned_buckets: dict[Pool, _Buckets] = {}  # node -> shares on unowned GPUs
        self.owned: dict[Pool, dict[str, dict[int, list[GpuKey]]]] = {}  # team -> node -> GPUs
        self.owned_count: dict[Pool, dict[str, dict[int, int]]] = {}  # free shares of those
        # Teams that took slices any team could have used (MPS: opened an unowned GPU).
        self.takers: dict[Pool, set[str]] = {}
        self._build(holders)

    # -- building ---------------------------------------------------------------------------

    def _build(self, holders: dict[str, str]) -> None:
        shape = self.shape
        free_ids = self.free_ids
        for pool, per_node in shape.plain.items():
            free: dict[int, dict[str, Slice]] = {}
            for node, items in per_node.items():
                left = {s.id: s for s in items if s.id not in holders}
                if left:
                    free[node] = left
                    free_ids.update(left)
            self.free[pool] = free
        for key in sorted(shape.mixed_gpus):
            if shape.nodes[key[0]].schedulable:
                self._build_mixed(key, holders)
        for pool, free in self.free.items():
            counts = {node: len(items) for node, items in free.items()}
            self.buckets[pool] = _Buckets(counts)
            self.pool_free_total[pool] = sum(counts.values())
        self._build_mps(holders)

    def _build_mixed(self, key: GpuKey, holders: dict[str, str]) -> None:
        """A GPU exposing a whole slice and partial ones: what is free depends on what is used."""
        items = self.shape.gpu_slices[key]
        taken = [item for item in items if item.id in holders]
        if any(item.kind is SliceKind.WHOLE for item in taken):
            return  # the whole GPU is in use: nothing else on it is free
        for item in items:
            if item.id in holders or item.kind is SliceKind.MPS:
                continue  # (MPS shares on a mixed GPU are never offered)
            if item.kind is SliceKind.WHOLE and taken:
                continue  # part of it is in use: the whole slice is not free
            pool = self.shape.slice_pool[item.id]
            self.free.setdefault(pool, {}).setdefault(key[0], {})[item.id] = item
            self.free_ids.add(item.id)

    def _build_mps(self, holders: dict[str, str]) -> None:
        unowned_counts: dict[Pool, dict[int, int]] = {}
        totals = self.pool_free_total
        for key, pool, shares in self.shape.mps:
            free = {s.id: s for s in shares if s.id not in holders}
            self.gpu_free[key] = free
            number = key[0]
            if len(free) == len(shares):
                self.unowned.setdefault(pool, {}).setdefault(number, []).append(key)
                per_node = unowned_counts.setdefault(pool, {})
                per_node[number] = per_node.get(number, 0) + len(free)
                totals[pool] = totals.get(pool, 0) + len(free)
                continue
            teams = {holders[s.id] for s in shares if s.id in holders}
            owner = teams.pop() if len(teams) == 1 else _CONFLICT
            self.gpu_owner[key] = owner
            if free and owner != _CONFLICT:
                self._own(pool, owner, number, key, len(free))
                totals[pool] = totals.get(pool, 0) + len(free)
        for pool in self.unowned:
            self.unowned_buckets[pool] = _Buckets(unowned_counts.get(pool, {}))

    def _own(self, pool: Pool, team: str, node: int, key: GpuKey, free: int) -> None:
        self.owned.setdefault(pool, {}).setdefault(team, {}).setdefault(node, []).append(key)
        counts = self.owned_count.setdefault(pool, {}).setdefault(team, {})
        counts[node] = counts.get(node, 0) + free

    # -- questions ----------------------------------------------------------------------------

    def largest_free(self, pools: Iterable[Pool], team: str) -> int:
        """The most matching slices free on any one node for ``team``."""
        best = 0
        for pool in pools:
            if pool[0] is SliceKind.MPS:
                best = max(best, self._mps_largest(pool, team))
            else:
                buckets = self.buckets.get(pool)
                if buckets is not None:
                    best = max(best, buckets.largest())
        return best

    def total_free(self, pools: Sequence[Pool]) -> int:
        """Free matching slices over all nodes (an upper bound for MPS, ignoring owners)."""
        if len(pools) == 1:
            return self.pool_free_total.get(pools[0], 0)
        return sum(self.pool_free_total.get(pool, 0) for pool in pools)

    def _mps_avail(self, pool: Pool, team: str, node: int) -> int:
        buckets = self.unowned_buckets.get(pool)
        total = buckets.count.get(node, 0) if buckets is not None else 0
        return total + self.owned_count.get(pool, {}).get(team, {}).get(node, 0)

    def _mps_largest(self, pool: Pool, team: str) -> int:
        buckets = self.unowned_buckets.get(pool)
        best = buckets.largest() if buckets is not None else 0
        for node in self.owned_count.get(pool, {}).get(team, {}):
            best = max(best, self._mps_avail(pool, team, node))
        return best

    def node_free(self, pool: Pool, team: str, node: int) -> int:
        """Free slices of ``pool`` on ``node`` that ``team`` may use."""
        if pool[0] is SliceKind.MPS:
            return self._mps_avail(pool, team, node)
        buckets = self.buckets.get(pool)
        return buckets.count.get(node, 0) if buckets is not None else 0

    # -- finding a place --------------------------------------------------------------------

    def find(
        self,
        pools: Sequence[Pool],
        team: str,
        minimum: int,
        count: int,
        multi_node: bool,
        cap: int | None = None,
    ) -> Placement | None:
        """Where ``minimum``..``count`` matching slices would go, best fit; None if nowhere.

        ``cap`` limits how many an elastic gang may take (its quota room). Nothing is taken;
        call ``take`` with the result.
        """
        want = count if cap is None else max(minimum, min(count, cap))
        if self.total_free(pools) < minimum:
            return None
        single = self._find_single(pools, team, minimum, want)
        if single is not None or not multi_node:
            return single
        return self.find_spread(pools, team, minimum, want)

    def _find_single(
        self, pools: Sequence[Pool], team: str, minimum: int, want: int
    ) -> Placement | None:
        # Prefer a node that gives the whole ``want``; an elastic gang settles for the node
        # with the most free when none does.
        for need in (want, minimum) if want > minimum else (want,):
            best: tuple[int, int, int] | None = None  # (rank, count, node)
            best_pool = pools[0]
            for pool in pools:
                found = self._best_node(pool, team, need)
                if found is not None and (best is None or found < best):
                    best, best_pool = found, pool
            if best is not None:
                _, free, node = best
                take = min(want, free) if need < want else need
                return [(node, self.pick(best_pool, team, node, take))]
        return None

    def _best_node(self, pool: Pool, team: str, need: int) -> tuple[int, int, int] | None:
        """(rank, free count, node) of the best-fit node of ``pool`` for ``need`` slices."""
        if pool[0] is not SliceKind.MPS:
            buckets = self.buckets.get(pool)
            if buckets is None:
                return None
            found = buckets.best_fit(need)
            return None if found is None else (0, found[0], found[1])
        # MPS: a node where the team's own GPUs suffice ranks first (rank 0), so a team's
        # shares pack onto the GPUs it already uses and other GPUs stay whole for others.
        best: tuple[int, int, int] | None = None
        buckets = self.unowned_buckets.get(pool)
        unowned = buckets.count if buckets is not None else {}
        for node, own in self.owned_count.get(pool, {}).get(team, {}).items():
            avail = own + unowned.get(node, 0)
            if avail >= need:
                candidate = (0 if own >= need else 1, avail, node)
                if best is None or candidate < best:
                    best = candidate
        if buckets is not None and (best is None or best[0] > 0):
            found = buckets.best_fit(need)
            if found is not None:
                candidate = (1, self._mps_avail(pool, team, found[1]), found[1])
                if best is None or candidate < best:
                    best = candidate
        return best

    def find_spread(
        self, pools: Sequence[Pool], team: str, minimum: int, want: int
    ) -> Placement | None:
        """A multi-node gang: fill the nodes with the most free first, so it spans few nodes."""
        options: list[tuple[int, int, Pool]] = []  # (-free, node, pool)
        for pool in pools:
            if pool[0] is SliceKind.MPS:
                nodes = set(self.unowned.get(pool, {})) | set(
                    self.owned_count.get(pool, {}).get(team, {})
                )
                for node in nodes:
                    free = self._mps_avail(pool, team, node)
                    if free > 0:
                        options.append((-free, node, pool))
            else:
                buckets = self.buckets.get(pool)
                if buckets is not None:
                    options.extend((-c, node, pool) for c, node in buckets.descending())
        options.sort()
        if sum(-free for free, _, _ in options) < minimum:
            return None
        placement: Placement = []
        left = want
        for free, node, pool in options:
            if left <= 0:
                break
            take = min(-free, left)
            placement.append((node, self.pick(pool, team, node, take)))
            left -= take
        return placement if want - left >= minimum else None

    def pick(self, pool: Pool, team: str, node: int, take: int) -> list[Slice]:
        """Which ``take`` free slices of ``pool`` on ``node``: fullest GPUs first (best fit)."""
        if pool[0] is SliceKind.MPS:
            return self._pick_mps(pool, team, node, take)
        items = list(self.free[pool][node].values())
        if len(items) == take:
            return items
        # Best fit inside the node: the GPUs with the least free capacity (all pools) first,
        # so a GPU that is still wholly free stays so.
        gpus = {item.gpu for item in items}
        if len(gpus) == len(items) and pool[0] is SliceKind.WHOLE:
            return items[:take]  # one whole slice per GPU: every GPU is equally full
        gpu_slices = self.shape.gpu_slices
        free_ids = self.free_ids
        gpu_free = {
            gpu: sum(s.units for s in gpu_slices[(node, gpu)] if s.id in free_ids) for gpu in gpus
        }
        ranked = sorted(items, key=lambda s: (gpu_free[s.gpu], s.gpu, s.id))
        return ranked[:take]

    def _pick_mps(self, pool: Pool, team: str, node: int, take: int) -> list[Slice]:
        chosen: list[Slice] = []
        gpu_free = self.gpu_free
        own = sorted(
            self.owned.get(pool, {}).get(team, {}).get(node, ()),
            key=lambda k: (len(gpu_free[k]), k),
        )
        for key in own:
            chosen.extend(list(gpu_free[key].values())[: take - len(chosen)])
            if len(chosen) >= take:
                return chosen
        # Open unowned GPUs: the smallest one that holds the rest, else the largest first.
        spare = sorted(
            self.unowned.get(pool, {}).get(node, ()), key=lambda k: (len(gpu_free[k]), k)
        )
        while len(chosen) < take and spare:
            left = take - len(chosen)
            fits = [k for k in spare if len(gpu_free[k]) >= left]
            key = fits[0] if fits else spare[-1]
            spare.remove(key)
            chosen.extend(list(gpu_free[key].values())[:left])
        return chosen

    # -- changing ---------------------------------------------------------------------------

    def take(self, placement: Placement, team: str) -> None:
        """Mark the slices of ``placement`` as used by ``team``."""
        mixed = self.shape.mixed_gpus
        slice_pool = self.shape.slice_pool
        for node, items in placement:
            for item in items:
                if item.kind is not SliceKind.MPS:
                    self.takers.setdefault(slice_pool[item.id], set()).add(team)
                self.remove(item, team)
                if mixed and (node, item.gpu) in mixed:
                    self._block_overlaps((node, item.gpu), item)

    def remove(self, item: Slice, team: str) -> None:
        """Take one free slice out of every view (used, reserved or blocked)."""
        if item.kind is SliceKind.MPS:
            self._remove_share(item, team)
            return
        if item.id not in self.free_ids:
            return
        number = self.shape.slice_node[item.id]
        pool = self.shape.slice_pool[item.id]
        items = self.free[pool][number]
        del items[item.id]
        self.free_ids.discard(item.id)
        self.buckets[pool].set(number, len(items))
        self.pool_free_total[pool] -= 1

    def _remove_share(self, item: Slice, team: str) -> None:
        number = self.shape.slice_node[item.id]
        key = (number, item.gpu)
        free = self.gpu_free.get(key)
        if free is None or item.id not in free:
            return
        pool = self.shape.slice_pool[item.id]
        owner = self.gpu_owner.get(key)
        if owner is None:
            # Opening an unowned GPU: it now belongs to ``team``.
            self.unowned[pool][number].remove(key)
            buckets = self.unowned_buckets[pool]
            buckets.set(number, buckets.count[number] - len(free))
            self.gpu_owner[key] = owner = team
            self._own(pool, team, number, key, len(free))
            if team not in ("", _CONFLICT):
                self.takers.setdefault(pool, set()).add(team)
        del free[item.id]
        self.pool_free_total[pool] -= 1
        counts = self.owned_count[pool][owner]
        counts[number] -= 1
        if not free:
            by_node = self.owned[pool][owner]
            by_node[number].remove(key)
            if not by_node[number]:
                del by_node[number]
                del counts[number]

    def _block_overlaps(self, key: GpuKey, used: Slice) -> None:
        """On a GPU exposing a whole slice and partial ones, using one kind blocks the other."""
        for other in self.shape.gpu_slices[key]:
            if other.id == used.id:
                continue
            if used.kind is SliceKind.WHOLE or other.kind is SliceKind.WHOLE:
                self.remove(other, _CONFLICT)

    def holds(self, item: Slice) -> bool:
        """Is ``item`` (a whole GPU or MIG instance) free in the index?"""
        return item.id in self.free_ids

    def restore(self, item: Slice) -> None:
        """Put back a whole GPU or MIG instance taken by ``remove`` (for what-if questions)."""
        number = self.shape.slice_node[item.id]
        pool = self.shape.slice_pool[item.id]
        items = self.free.setdefault(pool, {}).setdefault(number, {})
        items[item.id] = item
        self.free_ids.add(item.id)
        if pool not in self.buckets:
            self.buckets[pool] = _Buckets({})
        self.buckets[pool].set(number, len(items))
        self.pool_free_total[pool] = self.pool_free_total.get(pool, 0) + 1

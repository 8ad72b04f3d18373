"""Choosing victims: the fewest, least important, most recently started preemptible jobs.

A victim must be preemptible, have run at least ``min_run_time_s`` and not already be in its
grace period; which jobs qualify beyond that (reclaim of borrowed capacity, lower priority
class) is the caller's rule, passed in as a predicate. Slices of jobs already in their grace
period count as *freeing soon*: a job entitled to preempt claims them before choosing new
victims, so one shortage never costs two victims.

MPS shares are not reclaimed by preemption: a GPU's shares serve one team, so freeing some
of them would not let another team in. Whole GPUs and MIG instances are.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler.cluster import FreeIndex, Pool
from scheduler.model import RunningJob, Slice, SliceKind


@dataclass(slots=True)
class Holder:
    """A running job as the preemption step sees it."""

    run: RunningJob
    rank: int  # priority class rank (0 = lowest)
    slices: Sequence[Slice]
    units: float
    team: str
    chosen: bool = False

    def victim_order(self) -> tuple[int, float, str]:
        # Lowest class first, then the most recently started (it loses the least work).
        return (self.rank, -self.run.started_at, self.run.job.id)


# Rule, given a possible victim and what its team would hold without the victims already
# picked on that node: may it be preempted?
Eligible = Callable[[Holder, float], bool]
# Rule at team level: could any job of this team be a victim at all? (None: no team is
# ruled out up front.)
TeamMay = Callable[[str], bool]


@dataclass(slots=True)
class Choice:
    victims: list[Holder]
    freed_soon: list[Slice]  # slices already in a grace period that this job claims


# (victim order, node, slices freed there, holder): unique before the holder, so tuples
# compare without ever comparing holders.
_Candidate = tuple[tuple[int, float, str], int, int, Holder]


class Preemptor:
    def __init__(
        self, index: FreeIndex, holders: Sequence[Holder], *, now: float, min_run_time_s: float
    ) -> None:
        self._index = index
        node_of = index.shape.slice_node
        slice_pool = index.shape.slice_pool
        self.soon: dict[Pool, dict[int, list[Slice]]] = {}  # pool -> node -> slices
        # Per pool and team, every possible victim in victim order, with the node it holds
        # slices on and how many slices of the pool it frees there.
        self._candidates: dict[Pool, dict[str, list[_Candidate]]] = {}
        # Searches that found nothing: (pools, team, rank, rule) -> the smallest failed need.
        # Within a pass victims only get fewer, so a bigger need would fail as well.
        self._failed: dict[tuple[tuple[Pool, ...], str, int, str], int] = {}
        # Claims that found nothing, by (pools, team) -> smallest failed need, valid while no
        # slice was added to ``soon`` (free slices only get fewer within a pass).
        self._claims_failed: dict[tuple[tuple[Pool, ...], str], int] = {}
        ordered = sorted((h.victim_order(), h) for h in holders if h.slices)
        for order, holder in ordered:
            run = holder.run
            if run.preempting_since is not None:
                for item in holder.slices:
                    if item.kind is not SliceKind.MPS:
                        by_node = self.soon.setdefault(slice_pool[item.id], {})
                        by_node.setdefault(node_of[item.id], []).append(item)
                continue
            if not run.job.preemptible or now - run.started_at < min_run_time_s:
                continue
            first = holder.slices[0]
            if first.kind is SliceKind.MPS:
                continue
            if len(holder.slices) == 1:
                counts = {(slice_pool[first.id], node_of[first.id]): 1}
            else:
                counts = {}
                for item in holder.slices:
                    key = (slice_pool[item.id], node_of[item.id])
                    counts[key] = counts.get(key, 0) + 1
            for (pool, node), count in counts.items():
                by_team = self._candidates.setdefault(pool, {})
                by_team.setdefault(holder.team, []).append((order, node, count, holder))

    def claim_soon(self, pools: Sequence[Pool], team: str, need: int) -> list[Slice] | None:
        """Slices freeing soon that, with the free ones, fit ``need`` on one node."""
        failed_key = (tuple(pools), team)
        if self._claims_failed.get(failed_key, need + 1) <= need:
            return None
        best: tuple[int, Pool, int] | None = None
        for pool in pools:
            for node, items in self.soon.get(pool, {}).items():
                if not items:
                    continue
                fits = self._index.node_free(pool, team, node) + len(items) >= need
                if fits and (best is None or (len(items), node) < (best[0], best[2])):
                    best = (len(items), pool, node)
        if best is None:
            self._claims_failed[failed_key] = need
            return None
        _, pool, node = best
        missing = need - self._index.node_free(pool, team, node)
        by_node = self.soon[pool]
        claimed, by_node[node] = by_node[node][:missing], by_node[node][missing:]
        return claimed

    def choose(
        self,
        pools: Sequence[Pool],
        team: str,
        need: int,
        eligible: Eligible,
        team_units: dict[str, float],
        *,
        rule: tuple[int, str],
        team_may: TeamMay | None = None,
    ) -> Choice | None:
        """Victims on one node that, with its free and freeing slices, fit ``need``.

        Walks the possible victims in victim order (lowest class, most recently started) and
        stops at the first node where the ones met so far make room, so the victims are the
        first ones the rule names, and few of them.
        """
        failed_key = (tuple(pools), team, rule[0], rule[1])
        if self._failed.get(failed_key, need + 1) <= need:
            return None
        for pool in pools:
            found = self._walk(pool, team, need, eligible, team_units, team_may)
            if found is not None:
                node, victims = found
                return self._commit(pool, node, team, need, victims)
        self._failed[failed_key] = min(need, self._failed.get(failed_key, need))
        return None

    def _walk(
        self,
        pool: Pool,
        team: str,
        need: int,
        eligible: Eligible,
        team_units: dict[str, float],
        team_may: TeamMay | None,
    ) -> tuple[int, list[Holder]] | None:
        by_team = self._candidates.get(pool, {})
        lists = [victims for name, victims in by_team.items() if team_may is None or team_may(name)]
        # The teams' lists are each in victim order; merge them lazily.
        walk = heapq.merge(*lists) if len(lists) > 1 else iter(lists[0] if lists else ())
        have: dict[int, int] = {}
        picked: dict[int, list[Holder]] = {}
        removed: dict[tuple[int, str], float] = {}  # units picked per (node, team)
        index = self._index
        soon = self.soon.get(pool, {})
        for _, node, count, holder in walk:
            if holder.chosen:
                continue
            if node not in have:
                have[node] = index.node_free(pool, team, node) + len(soon.get(node, ()))
            gone = removed.get((node, holder.team), 0.0)
            if not eligible(holder, team_units.get(holder.team, 0.0) - gone):
                continue
            removed[(node, holder.team)] = gone + holder.units
            picked.setdefault(node, []).append(holder)
            have[node] += count
            if have[node] >= need:
                return node, picked[node]
        return None

    def _commit(self, pool: Pool, node: int, team: str, need: int, victims: list[Holder]) -> Choice:
        node_of = self._index.shape.slice_node
        self._claims_failed.clear()  # more slices are freeing now
        for victim in victims:
            victim.chosen = True
            for item in victim.slices:
                if item.kind is not SliceKind.MPS:
                    by_node = self.soon.setdefault(self._index.shape.slice_pool[item.id], {})
                    by_node.setdefault(node_of[item.id], []).append(item)
        claimed = self.claim_soon([pool], team, need) or []
        return Choice(victims, claimed)

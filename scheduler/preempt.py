"""Preemption: who may preempt, whom, and the fewest, least important victims.

The rules (``Preemption``): a job whose team stays within its guarantee reclaims borrowed
capacity, taking only from teams that hold more than their own guarantee (counted without
their jobs already being stopped) and sparing jobs that have run longer than
``reclaim_max_run_s``; with ``preempt_by_priority`` a job preempts jobs of lower classes.
Never a job that is not preemptible or has run less than ``min_run_time_s``. A job that
started past ``max_wait_s`` is never a victim by class; reclaim takes it, last (without
preemption by class it goes after the work within guarantees, so its room stays with the job
that reclaimed it: ``order.FairShareRules.rounds``).

Jobs larger than their team's whole guarantee (*oversized*: they can only ever run on
borrowed capacity) are reclaimed last, and counting the work thrown away
(``reclaim_wait_s``): reclaim takes other borrowed work first; when only victims that include
an oversized job make room, the reclaiming job waits instead if the room it needs comes free,
by the running jobs' time limits, within ``reclaim_wait_s`` of when it was queued and before
waiting would cost its team more GPU time (units x seconds) than the victims would lose (their
units x the time they have run).

Choosing (``Preemptor``): a victim must also not already be in its grace period. Slices of
jobs in their grace period count as *freeing soon*: a job entitled to preempt claims them
before choosing new victims, so one shortage never costs two victims. Victims go lowest
class first, then most recently started, and the search stops at the first node where they
make room; a multi-node gang that no one node's victims make room for takes them over the
nodes of one pool.

MPS shares are not reclaimed by preemption: a GPU's shares serve one team, so freeing some
of them would not let another team in. Whole GPUs and MIG instances are.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from scheduler.backfill import Timeline, earliest_fit
from scheduler.cluster import FreeIndex, Pool
from scheduler.config import SchedulerConfig
from scheduler.model import Job, RunningJob, Slice, SliceKind, Team
from scheduler.order import Candidate, queued_at
from scheduler.quota import EPS, Held, Ledger, guaranteed, within_guarantee


@dataclass(slots=True)
class Holder:
    """A running job as the preemption step sees it."""

    run: RunningJob
    rank: int  # priority class rank (0 = lowest)
    slices: Sequence[Slice]
    units: float
    team: str
    oversized: bool = False  # larger than its team's whole guarantee: it only ever borrows
    # It started past ``max_wait_s``: never a victim by class, and reclaimed last of its class.
    started_starving: bool = False
    chosen: bool = False

    def victim_order(self) -> tuple[int, bool, float, str]:
        # Lowest class first, then the most recently started (it loses the least work); a job
        # that started past the maximum wait after all others of its class (it waited long).
        return (self.rank, self.started_starving, -self.run.started_at, self.run.job.id)


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
_Candidate = tuple[tuple[int, bool, float, str], int, int, Holder]


class Preemption:
    """The preemption rules of one pass, over a ``Preemptor`` built when first needed."""

    def __init__(
        self,
        index: FreeIndex,
        held: Sequence[Held],
        *,
        config: SchedulerConfig,
        now: float,
        teams: Mapping[str, Team],
        classes: Mapping[str, int],
        pending: Sequence[Job],
        timeline: Timeline,
    ) -> None:
        self._index = index
        self._timeline = timeline
        self._held = held
        self._config = config
        self._now = now
        self._teams = teams
        self._classes = classes
        self._pending = pending
        self._preemptor: Preemptor | None = None
        # Set when the last ``victims_for`` let its job wait for room rather than reclaim:
        # that choice depends on the job's own age, so a job alike waits as well only if it
        # was queued after this (``Verdict.queued_after``); None otherwise.
        self.waiting_after: float | None = None
        limit = config.reclaim_max_run_s
        # Started before this: run too long to lose to a reclaim (``reclaim_max_run_s``).
        self._protected = -math.inf if limit is None else now - limit

    def victims_for(
        self, c: Candidate, ledger: Ledger, avoid: frozenset[int] = frozenset()
    ) -> list[tuple[Holder, str]] | None:
        """Victims that make room for ``c``, each with why ("reclaim" or "priority"); [] when
        slices already freeing soon make the room; None when no rule lets ``c`` preempt or
        no victims would make room, or when ``c`` waits for room instead
        (``waiting_after``). Nothing on the nodes ``avoid`` names is taken or claimed for it:
        what it would free there is not ``c``'s to take (``Cycle.preempt_for``)."""
        self.waiting_after = None
        config, job = self._config, c.job
        reclaim = config.reclaim and within_guarantee(c, ledger.team.get(job.team, 0.0))
        by_priority = config.preempt_by_priority and c.rank > 0
        if not (reclaim or by_priority):
            return None
        preemptor = self._preemptor
        if preemptor is None:
            preemptor = self._preemptor = Preemptor(
                self._index,
                self._holders(ledger),
                now=self._now,
                min_run_time_s=config.min_run_time_s,
            )
        multi_node = job.request.multi_node
        if preemptor.claim_soon(c.pools, job.team, c.minimum, multi_node, avoid) is not None:
            return []
        teams, protected = self._teams, self._protected

        def eligible(holder: Holder, held: float) -> bool:
            if (
                reclaim
                and holder.team != job.team
                and held > guaranteed(teams, holder.team) + EPS
                and holder.run.started_at >= protected
            ):
                return True
            return by_priority and holder.rank < c.rank and not holder.started_starving

        kept = ledger.kept()

        def team_may(team: str) -> bool:
            # Reclaim only takes from teams borrowing now; by class, any team may lose.
            borrowing = team != job.team and kept.get(team, 0.0) > guaranteed(teams, team) + EPS
            return by_priority or borrowing

        patient = reclaim and not by_priority and config.reclaim_wait_s is not None
        found = None
        if patient:
            # Borrowed work that fits its team's guarantee goes first: its team can run it
            # again within its guarantee; an oversized job can only ever borrow.
            def fits_guarantee(holder: Holder, held: float) -> bool:
                return not holder.oversized and eligible(holder, held)

            found = preemptor.find(
                c.pools, job.team, c.minimum, fits_guarantee, kept, team_may, multi_node, avoid
            )
        if found is None:
            found = preemptor.find(
                c.pools, job.team, c.minimum, eligible, kept, team_may, multi_node, avoid
            )
            if found is None:
                return None
            if patient and any(v.oversized for v in found[1]):
                self.waiting_after = self._waits(c, found[1])
                if self.waiting_after is not None:
                    return None
        pool, victims = found
        preemptor.commit(pool, job.team, c.minimum, victims, multi_node, avoid)
        return [
            (victim, "reclaim" if reclaim and victim.team != job.team else "priority")
            for victim in victims
        ]

    def _waits(self, c: Candidate, victims: Sequence[Holder]) -> float | None:
        """Reclaim counts the work it throws away: ``c`` waits instead of taking ``victims``
        (among them an oversized job) when the room it needs comes free (by the running jobs'
        time limits) before ``reclaim_wait_s`` since it was queued runs out, and waiting until
        then costs its team no more GPU time than the victims would lose.

        None when ``c`` reclaims; else the time a job alike must have been queued after to
        wait as well (the room's time less ``reclaim_wait_s``)."""
        patience = self._config.reclaim_wait_s
        if patience is None:
            return None
        job, now = c.job, self._now
        queued = queued_at(job)
        if queued + patience <= now:
            return None
        at = earliest_fit(
            self._index,
            self._timeline,
            pools=c.pools,
            team=job.team,
            need=c.minimum,
            multi_node=job.request.multi_node,
        )
        if at is None:
            return None
        room = max(at, now)
        if queued + patience <= room:
            return None  # its reclaim_wait_s runs out first
        lost = sum(victim.units * (now - victim.run.started_at) for victim in victims)
        if (room - now) * c.minimum * c.unit > lost:
            return None
        return room - patience

    def _holders(self, ledger: Ledger) -> list[Holder]:
        """The running jobs preemption may look at: victims in their grace period (their
        slices free soon) and jobs some rule could pick (a team borrowing now for reclaim,
        a class below the highest pending one for priority)."""
        config, classes, teams = self._config, self._classes, self._teams
        borrowing = {
            name for name, units in ledger.kept().items() if units > guaranteed(teams, name) + EPS
        }
        top = max((classes.get(j.priority, 0) for j in self._pending), default=0)
        oldest = self._now - config.min_run_time_s
        max_wait = config.max_wait_s
        out = []
        for run, held, units, _ in self._held:
            rank = classes.get(run.job.priority, 0)
            starved = max_wait is not None and _waited(run) >= max_wait
            if run.preempting_since is None:
                if not run.job.preemptible or run.started_at > oldest:
                    continue
                if starved and never_victim_once_starved(config):
                    continue
                by_reclaim = (
                    config.reclaim
                    and run.job.team in borrowing
                    and run.started_at >= self._protected
                )
                if not (by_reclaim or (config.preempt_by_priority and rank < top)):
                    continue
            team = run.job.team
            smallest = units * run.job.request.minimum / len(held) if held else 0.0
            oversized = smallest > guaranteed(teams, team) + EPS
            out.append(Holder(run, rank, held, units, team, oversized, starved))
        return out


class Preemptor:
    def __init__(
        self,
        index: FreeIndex,
        holders: Sequence[Holder],
        *,
        now: float,
        min_run_time_s: float,
    ) -> None:
        self._index = index
        node_of = index.shape.slice_node
        slice_pool = index.shape.slice_pool
        self.soon: dict[Pool, dict[int, list[Slice]]] = {}  # pool -> node -> slices
        # Per pool and team, every possible victim in victim order, with the node it holds
        # slices on and how many slices of the pool it frees there.
        self._candidates: dict[Pool, dict[str, list[_Candidate]]] = {}
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

    def claim_soon(
        self,
        pools: Sequence[Pool],
        team: str,
        need: int,
        multi_node: bool = False,
        avoid: frozenset[int] = frozenset(),
    ) -> list[Slice] | None:
        """Slices freeing soon that, with the free ones, fit ``need`` on one node (or, for a
        multi-node gang that fits no node, over the nodes of one pool).

        The free slices counted are taken out of the index for the rest of the pass: they are
        the claiming job's as much as the slices freeing soon, so no job after it may take
        them (else, when its victims stop, it is still short and preempts again, while the
        victims, restarted, take their own slices back: a loop)."""
        best: tuple[int, Pool, int] | None = None
        for pool in pools:
            for node, items in self.soon.get(pool, {}).items():
                if not items or node in avoid:
                    continue
                fits = self._index.node_free(pool, team, node) + len(items) >= need
                if fits and (best is None or (len(items), node) < (best[0], best[2])):
                    best = (len(items), pool, node)
        if best is None:
            return self._claim_spread(pools, team, need, avoid) if multi_node else None
        _, pool, node = best
        index = self._index
        missing = need - index.node_free(pool, team, node)
        by_node = self.soon[pool]
        claimed, by_node[node] = by_node[node][:missing], by_node[node][missing:]
        kept = need - len(claimed)
        if kept > 0:
            index.take([(node, index.pick(pool, team, node, kept))], team)
        return claimed

    def _claim_spread(
        self, pools: Sequence[Pool], team: str, need: int, avoid: frozenset[int]
    ) -> list[Slice] | None:
        """A multi-node gang: slices freeing soon on any nodes of one pool that, with the free
        ones there, make ``need`` (MPS shares are never claimed across nodes)."""
        index = self._index
        for pool in pools:
            by_node = self.soon.get(pool)
            if pool[0] is SliceKind.MPS or not by_node:
                continue
            free = index.total_free((pool,))
            nodes = sorted(node for node in by_node if node not in avoid)
            if free + sum(len(by_node[node]) for node in nodes) < need:
                continue
            claimed: list[Slice] = []
            for node in nodes:
                missing = need - free - len(claimed)
                if missing <= 0:
                    break
                claimed += by_node[node][:missing]
                by_node[node] = by_node[node][missing:]
            kept = need - len(claimed)
            if kept > 0:
                index.take(index.find_spread([pool], team, kept, kept) or [], team)
            return claimed
        return None

    def find(
        self,
        pools: Sequence[Pool],
        team: str,
        need: int,
        eligible: Eligible,
        team_units: dict[str, float],
        team_may: TeamMay | None = None,
        multi_node: bool = False,
        avoid: frozenset[int] = frozenset(),
    ) -> tuple[Pool, list[Holder]] | None:
        """Victims on one node that, with its free and freeing slices, fit ``need``: the pool
        and the victims, not yet taken (``commit`` takes them). A multi-node gang that no
        node's victims make room for takes victims over the nodes of one pool.

        Walks the possible victims in victim order (lowest class, most recently started) and
        stops at the first node where the ones met so far make room (for a multi-node gang:
        once they make room in all), so the victims are the first ones the rule names, and
        few of them.
        """
        for pool in pools:
            found = self._walk(pool, team, need, eligible, team_units, team_may, avoid)
            if found is not None:
                return pool, found
        if multi_node:
            for pool in pools:
                if pool[0] is SliceKind.MPS:
                    continue
                spread = self._walk_spread(pool, need, eligible, team_units, team_may, avoid)
                if spread is not None:
                    return pool, spread
        return None

    def _merged(self, pool: Pool, team_may: TeamMay | None) -> Iterator[_Candidate]:
        """The possible victims of ``pool``, of the teams ``team_may`` allows, in victim
        order (each team's list already is; merged lazily)."""
        by_team = self._candidates.get(pool, {})
        lists = [victims for name, victims in by_team.items() if team_may is None or team_may(name)]
        return heapq.merge(*lists) if len(lists) > 1 else iter(lists[0] if lists else ())

    def _walk_spread(
        self,
        pool: Pool,
        need: int,
        eligible: Eligible,
        team_units: dict[str, float],
        team_may: TeamMay | None,
        avoid: frozenset[int],
    ) -> list[Holder] | None:
        slice_pool = self._index.shape.slice_pool
        node_of = self._index.shape.slice_node
        have = self._index.total_free((pool,))
        have += sum(len(items) for items in self.soon.get(pool, {}).values())
        picked: list[Holder] = []
        taken: set[int] = set()  # ids of ``picked``: a victim on several nodes is met per node
        removed: dict[str, float] = {}  # units picked per team
        for _, _, _, holder in self._merged(pool, team_may):
            if holder.chosen or id(holder) in taken:
                continue
            if avoid and any(node_of[item.id] in avoid for item in holder.slices):
                continue
            gone = removed.get(holder.team, 0.0)
            if not eligible(holder, team_units.get(holder.team, 0.0) - gone):
                continue
            removed[holder.team] = gone + holder.units
            picked.append(holder)
            taken.add(id(holder))
            have += sum(1 for item in holder.slices if slice_pool[item.id] == pool)
            if have >= need:
                return picked
        return None

    def _walk(
        self,
        pool: Pool,
        team: str,
        need: int,
        eligible: Eligible,
        team_units: dict[str, float],
        team_may: TeamMay | None,
        avoid: frozenset[int],
    ) -> list[Holder] | None:
        walk = self._merged(pool, team_may)
        have: dict[int, int] = {}
        picked: dict[int, list[Holder]] = {}
        removed: dict[tuple[int, str], float] = {}  # units picked per (node, team)
        index = self._index
        soon = self.soon.get(pool, {})
        for _, node, count, holder in walk:
            if holder.chosen or node in avoid:
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
                return picked[node]
        return None

    def commit(
        self,
        pool: Pool,
        team: str,
        need: int,
        victims: list[Holder],
        multi_node: bool = False,
        avoid: frozenset[int] = frozenset(),
    ) -> Choice:
        """Take the victims ``find`` named: their slices free soon, claimed for ``team``."""
        node_of = self._index.shape.slice_node
        for victim in victims:
            victim.chosen = True
            for item in victim.slices:
                if item.kind is not SliceKind.MPS:
                    by_node = self.soon.setdefault(self._index.shape.slice_pool[item.id], {})
                    by_node.setdefault(node_of[item.id], []).append(item)
        claimed = self.claim_soon([pool], team, need, multi_node, avoid) or []
        return Choice(victims, claimed)


def never_victim_once_starved(config: SchedulerConfig) -> bool:
    """Whether a job that started past ``max_wait_s`` is no victim at all. With preemption by
    class, yes: starving jobs go before every class (``FairShareRules.rounds``), so requeued
    it would take its room back at once (a loop) and void the bound. Without it, starving
    jobs that borrow go after the work within guarantees, and reclaim may take it (last)."""
    return config.preempt_by_priority


def _waited(run: RunningJob) -> float:
    """How long a running job had queued when it started (since ``queued_since``)."""
    return run.started_at - queued_at(run.job)

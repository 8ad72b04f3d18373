"""Which jobs of a pass may still change a decision, when nobody reads the rest.

With explanations off and no pending list (the simulator, and the portal's passes that list
nothing), a pass need not walk jobs whose outcome can only be "wait". Free slices only get
fewer within a pass and a team only holds more, so:

- once no slice is free (and no set-aside slice is usable), only a job that may preempt can
  still act: with reclaim, the teams under their guarantee (the pass's ``scope``); otherwise
  nobody, and the pass is ``SETTLED`` (``check_settled``, ``narrow``);
- once a borrowing round of fair share has no reservation left to give, only the jobs that
  might still fit what is free, or may reclaim, are walked (``thinnable``, ``thin``).

Each is an upper bound of what the job could do, so the decisions are those of walking
every job; ``tests/scheduler/test_core_properties.py`` checks that a pass with a pending
list decides as one without.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster import Pool
from scheduler.order import Candidate, like
from scheduler.quota import EPS, guarantee_figures, under_guarantee

if TYPE_CHECKING:
    from scheduler.core import Cycle

SETTLED: frozenset[str] = frozenset()  # the scope once no job can change a decision any more


def thinnable(cycle: Cycle) -> bool:
    """Whether a job of this round that fits nowhere now can change nothing more: with no
    pending list (nobody reads its wait), in a borrowing round of fair share without
    preemption by class, once no reservation is left to the round. Such a job cannot fit
    later in the pass (free slices only get fewer), cannot reclaim (a team that borrows
    only holds more as the pass goes on), and asks for no reservation."""
    if cycle.listing or cycle.first_round or cycle.starving:
        return False
    rules = cycle.rules
    if rules.submit_order or rules.by_priority:
        return False
    config = cycle.config
    return not config.backfill or cycle.round_reservations[False] >= config.max_reservations


def thin(cycle: Cycle, jobs: Sequence[Candidate]) -> list[Candidate]:
    """The jobs that may still act once the round is ``thinnable``: those that might fit
    what is free (on one node unless multi-node, each pool's best node counted, plus every
    slice set aside in their pools by a reservation they may use: an upper bound of what
    ``Cycle._place`` offers) or may reclaim (within their team's guarantee)."""
    index = cycle.index
    team_held = cycle.ledger.team
    # The teams under their guarantee, whose jobs may reclaim (from this pass's records: a
    # carried candidate's own may be the last pass's, ``Nominator.every``).
    bounds: dict[str, tuple[float, float]] = {}
    if cycle.config.reclaim:
        bounds = guarantee_figures(cycle.pending_teams, team_held, cycle.teams)
    # (only set-aside slices with a known start are ever usable: none, nothing to count)
    aside = None if cycle.aside_latest is None else _aside_by_end(cycle)
    free: dict[tuple[tuple[Pool, ...], str, bool], int] = {}
    kept: list[Candidate] = []
    for c in jobs:
        job = c.job
        found = bounds.get(job.team)
        if found is not None and found[0] + c.least <= found[1] + EPS:
            kept.append(c)
            continue
        pools = c.pools
        multi_node = job.request.multi_node
        key = (pools, job.team, multi_node)
        most = free.get(key)
        if most is None:
            if multi_node:
                most = index.total_free(pools)
            else:
                most = sum(index.largest_free([pool], job.team) for pool in pools)
            free[key] = most
        if aside is not None and most < c.minimum:
            most += aside(c)
        if most >= c.minimum:
            kept.append(c)
    return kept


def _aside_by_end(cycle: Cycle) -> Callable[[Candidate], int]:
    """``c`` -> how many set-aside slices ``c`` may use, as
    ``sum(len(r.set_aside) for r in cycle._usable_reservations(c))`` but in O(log n) per
    job: per set of pools, the reservations sorted by start with suffix sums (a queue of
    starving jobs holds one reservation each, so the plain sum was jobs x reservations)."""
    by_pools: dict[tuple[Pool, ...], tuple[list[float], list[int]]] = {}

    def usable(c: Candidate) -> int:
        limit = c.job.time_limit_s
        if limit is None:
            return 0  # ``Reservation.lets``: no end, no set-aside slices
        found = by_pools.get(c.pools)
        if found is None:
            pools = frozenset(c.pools)
            starts = sorted(
                (r.at, len(r.set_aside))
                for r in cycle.reservations
                if r.set_aside and r.at is not None and not r.pools.isdisjoint(pools)
            )
            suffix = [0] * (len(starts) + 1)
            for i in range(len(starts) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + starts[i][1]
            found = by_pools[c.pools] = ([at for at, _ in starts], suffix)
        ats, suffix = found
        return suffix[bisect_left(ats, cycle.now + limit)]

    return usable


def check_settled(cycle: Cycle) -> None:
    """With explanations off, stop considering jobs that can no longer change anything.

    Once no slice is free, only a job that may preempt can still lead to a decision. If
    nothing may preempt, the pass is settled; if only reclaim may, only the teams under
    their guarantee still matter, and the queue is narrowed to them (a team's jobs keep
    their relative order whichever other teams are in the queue).
    """
    if cycle.config.explain or cycle.early or any(cycle.index.pool_free_total.values()):
        return  # (what the starving jobs set aside early comes back in their round)
    if set_aside_usable(cycle):
        return  # a short job may still use what a reservation set aside
    rules = cycle.rules
    if not (rules.reclaim or rules.by_priority):
        cycle.scope = SETTLED
        return
    if rules.by_priority:
        return
    cycle.under_guarantee = under_guarantee(cycle.under_guarantee, cycle.ledger.team, cycle.teams)
    if not cycle.under_guarantee:
        cycle.scope = SETTLED
    elif cycle.scope is None or cycle.under_guarantee != cycle.scope:
        cycle.scope = frozenset(cycle.under_guarantee)


def set_aside_usable(cycle: Cycle) -> bool:
    """Whether some pending job may still take slices a reservation set aside: one whose
    time limit ends by the reservation's start (``Reservation.lets``). None may when even
    the shortest time limit of the pass's pending jobs ends after the latest such start,
    and then the slices set aside are as good as held."""
    latest = cycle.aside_latest
    if latest is None:
        return False
    shortest = cycle.shortest_limit
    if shortest is None:
        limits = [j.time_limit_s for j in cycle.snapshot.pending if j.time_limit_s is not None]
        shortest = cycle.shortest_limit = min(limits) if limits else math.inf
    return cycle.now + shortest <= latest


def narrow(cycle: Cycle, jobs: Sequence[Candidate]) -> Sequence[Candidate]:
    """The jobs of a round that may still matter (all, unless narrowed)."""
    scope = cycle.scope
    if scope is None:
        return jobs
    inside = like(jobs)
    outside: list[Candidate] = []
    for c in jobs:
        (inside if c.job.team in scope else outside).append(c)
    cycle.record_rest(outside)
    return inside

"""One scheduling pass: ``schedule(snapshot, *, now, config) -> Decisions``.

The pass reads like Kueue's scheduling cycle, in numbered steps:

1. Snapshot   - index the free capacity (per pool, per node) and who holds what.
2. Nominate   - fail jobs whose ``after_ok`` dependency failed; park jobs that cannot be
                considered now (dependency, class not allowed, no such slices anywhere;
                ``scheduler.nominate``).
3. Order      - priority class, then the team's and the user's fair-share factor, then age
                (``scheduler.order``), in two rounds per class: within guarantees first.
4. Admit      - per job in order: its job array's throttle (``scheduler.arrays``), quota and
                budget (``scheduler.quota``), best-fit placement
                (``scheduler.cluster``), else preemption (``scheduler.preempt``), else a
                backfill reservation (``scheduler.backfill``), else wait.
5. Explain    - a reason with numbers, a 1-based position and an estimated start for every
                job left pending (``scheduler.explain``; bare codes when ``explain`` is off).

This module holds the cycle. A policy's ``Rules`` give it the order of the queue and what a
job that fits nowhere may do: the portal's fair share (``scheduler.order.FairShareRules``) or
the FIFO baselines (``scheduler.baselines``). The pass's caches live in ``scheduler.memo``;
which jobs may still change a decision, once nobody reads the rest, in ``scheduler.settle``.
Pure and deterministic: no clock but ``now``, no randomness, every tie broken by a stable
key (age, then job id; node name; slice id).
"""

from __future__ import annotations

import bisect
import gc
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

from scheduler.arrays import ArrayThrottle
from scheduler.backfill import (
    Reservation,
    Timeline,
    give_back,
    hold_now,
    reserve,
    set_aside_again,
)
from scheduler.baselines import Fifo
from scheduler.cluster import FreeIndex, Placement, Pool, shape_of
from scheduler.config import Cache, Policy, SchedulerConfig
from scheduler.explain import Explainer, Left, Placed, capacity_reason, no_fit_numbers
from scheduler.memo import Carry, Key, PassMemo, Stamp, Verdict
from scheduler.model import (
    Assign,
    Decisions,
    Fail,
    PendingCode,
    Preempt,
    SliceKind,
    Snapshot,
    Team,
)
from scheduler.nominate import InSubmitOrder, Nominator
from scheduler.order import (
    AgeKey,
    Candidate,
    FairShare,
    FairShareRules,
    Ordered,
    age_key,
    by_age,
    least_units,
)
from scheduler.preempt import Preemption
from scheduler.quota import (
    EPS,
    Blocked,
    Numbers,
    fits_guarantee,
    hold,
    over_limit,
    room,
    under_guarantee,
    within_guarantee,
)
from scheduler.settle import SETTLED, check_settled, narrow, thin, thinnable
from scheduler.standing import standing_of


def schedule(
    snapshot: Snapshot, *, now: float, config: SchedulerConfig, carry: Carry | None = None
) -> Decisions:
    """Decide which pending jobs start where, which running jobs are preempted, and why the
    others wait. See the module docstring for the steps and ``docs/scheduling.md`` for the
    policy.

    ``carry``: what the last pass given the same object learnt about single jobs, for a
    caller that runs pass after pass (``scheduler.memo.Carry``); the decisions are the same
    with it, with a new one or with none."""
    # The pass allocates many short-lived objects next to a large snapshot; the cyclic
    # garbage collector would walk the snapshot again and again for nothing (it holds no
    # cycles we make), so it pauses for the pass and resumes as the caller had it.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _schedule(snapshot, now, config, carry)
    finally:
        if paused:
            gc.enable()


def _schedule(
    snapshot: Snapshot, now: float, config: SchedulerConfig, carry: Carry | None
) -> Decisions:
    cycle = Cycle(snapshot, now, config, carry)
    # 1. Snapshot: free capacity and holdings.
    cycle.index_cluster()
    # 2. Nominate: settle dependencies, classes and impossible requests.
    candidates = cycle.nominate()
    # 3 + 4. Order and admit, round by round: the order is dynamic (a placed job lowers its
    # team's standing at once), so ordering and admission run together.
    check_settled(cycle)
    for jobs in cycle.rules.rounds(cycle, candidates):
        cycle.admit_round(jobs)
    # 5. Explain: reasons, positions and estimates for everything left pending.
    return cycle.decisions()


class Rules(Protocol):
    """What a policy decides around placement: the order of the queue and what a job that
    fits nowhere may do. ``order.FairShareRules`` is the portal's policy; the FIFO
    baselines are in ``scheduler.baselines``."""

    classes: bool  # priority classes gate the queue (PRIORITY_NOT_ALLOWED)
    fair_order: bool  # fair-share order: a job overtaken by other teams waits FAIR_SHARE
    reclaim: bool  # a job may reclaim borrowed capacity
    by_priority: bool  # a job may preempt lower classes
    # the queue is strict submit order and no job's guarantee is asked for: without a pending
    # list, candidates may be made as the queue reaches them (``nominate.InSubmitOrder``)
    submit_order: bool

    def rounds(
        self, cycle: Cycle, candidates: Sequence[Candidate]
    ) -> Iterator[Sequence[Candidate]]:
        """The candidates in the rounds they are admitted in (lazily: a round may depend on
        what the ones before placed)."""
        ...

    def order(self, cycle: Cycle, jobs: Sequence[Candidate]) -> Ordered: ...

    def blocked(self, cycle: Cycle, c: Candidate) -> bool:
        """``c`` fits nowhere now: preempt or reserve for it (True), or let it wait (False)."""
        ...


class Cycle:
    """The state of one pass. Steps 1 and 2 build it; ``admit`` changes it job by job."""

    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        config: SchedulerConfig,
        carry: Carry | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.now = now
        self.config = config
        self.rules: Rules = (
            FairShareRules(config)
            if config.policy is Policy.FAIRSHARE
            else Fifo(backfill=config.policy is Policy.FIFO_BACKFILL)
        )
        caches = config.caches
        self.classes = {name: rank for rank, name in enumerate(config.priority_classes)}
        self.shape = shape_of(snapshot.nodes, remember=Cache.NODE_LIST in caches)
        self.carry = carry
        if carry is not None:
            carry.begin(self.shape, config, snapshot.teams)
        self.teams: dict[str, Team] = dict(snapshot.teams)  # plus unknown ones, by default
        self.fair = FairShare({}, {}, {}, {})  # the fair-share standing (FairShareRules)
        self.assign: list[Assign] = []
        self.preempt: list[Preempt] = []
        self.fail: list[Fail] = []
        self.left: list[Left] = []  # considered and left pending, in order
        # Whether the jobs left pending are listed at all (``SchedulerConfig.list_pending``).
        self.listing = config.explain or config.list_pending
        self.parked: list[Left] = []  # never considered (dependency, class, no such slice)
        self.placed: list[Placed] = []
        self.placed_teams: set[str] = set()
        self.reservations: list[Reservation] = []
        # Of their set-aside slices with a known start (the only ones a job may use): the
        # latest start, and how many per pool (an upper bound when a reservation spans
        # pools). ``_add_aside`` and ``_count_aside`` keep them, recounting when a job takes
        # set-aside slices: a stale latest start keeps a FIFO + backfill pass from settling
        # (tried as a bare upper bound: 8,000 Philly jobs at 200 GPUs, 8.5 -> 29.0 s).
        self.aside_latest: float | None = None
        self.aside_by_pool: dict[Pool, int] = {}
        # Reservations made in the second and first rounds (of all classes): each round kind
        # reserves for its own first blocked job, so work within guarantees cannot take the
        # reservation from a long-waiting job that borrows.
        self.round_reservations = [0, 0]
        self.first_round = False
        self.starving = False  # the round of jobs past ``max_wait_s`` (FairShareRules)
        # What the starving jobs that borrow set aside before the first rounds, with each
        # job, by job id, until their round reaches them (``reserve_early``).
        self.early: dict[str, tuple[Reservation, Candidate]] = {}
        # Per team, the ages of its starving jobs that would borrow, oldest first, and the
        # nodes where each gathers its room, until the starving round (``reserve_early``,
        # ``_gathering``).
        self.gathering: dict[str, tuple[list[AgeKey], list[frozenset[int]]]] = {}
        self.deferred: list[Candidate] = []  # first-round jobs that would borrow after all
        # Per team of the round, the fewest units any of its jobs still in the round was
        # seen to need (``_defer_team``).
        self.round_least: dict[str, float] = {}
        self.pending_teams: set[str] = set()  # the teams of the candidates (a listed queue)
        # Each of those teams' users with candidates, and the classes of the candidates.
        self.pending_users: dict[str, set[str]] = {}
        self.pending_ranks: set[int] = set()
        self.under_guarantee: set[str] = set()  # teams with pending work, under guarantee
        # The teams whose jobs may still change a decision: None = all; SETTLED = none, and
        # the rest of the queue is only recorded, waiting with ``behind``.
        self.scope: frozenset[str] | None = None
        self.behind: Blocked = (PendingCode.NOT_EXPLAINED, {})
        # The shortest time limit among the pending jobs, once asked (``settle.set_aside_usable``).
        self.shortest_limit: float | None = None

    def team(self, name: str) -> Team:
        team = self.teams.get(name)
        if team is None:
            # An unknown team gets the neutral defaults rather than stopping the pass.
            team = self.teams[name] = Team(name=name)
        return team

    # -- 1. snapshot ---------------------------------------------------------------------------

    def index_cluster(self) -> None:
        self.ledger, held_list, holders = hold(
            self.snapshot.running,
            self.shape.slice_by_id,
            grace_period_s=self.config.grace_period_s,
            weights=self.config.model_weights,
        )
        self.held = held_list
        self.memo = PassMemo(self.config.caches, self.now, self.reservations, self.ledger)
        self.index = FreeIndex(self.shape, holders)
        self.timeline = Timeline.of_held(
            self.index, held_list, sweeps=Cache.SWEEPS in self.config.caches
        )
        self.start_largest = {
            pool: buckets.largest() for pool, buckets in self.index.buckets.items()
        }
        self.arrays = ArrayThrottle(self.snapshot.array_limits, held_list)
        for pool, buckets in self.index.unowned_buckets.items():
            self.start_largest[pool] = buckets.largest()
        self.preemption = Preemption(
            self.index,
            held_list,
            config=self.config,
            now=self.now,
            teams=self.snapshot.teams,
            classes=self.classes,
            pending=self.snapshot.pending,
            timeline=self.timeline,
        )

    # -- 2. nominate ---------------------------------------------------------------------------

    def nominate(self) -> Sequence[Candidate]:
        """The pending jobs that may be considered now, in the snapshot's order."""
        caches = self.config.caches
        shape = self.shape
        carried = None
        if self.carry is not None:
            self.carry.forget_gone(self.snapshot.pending)
            carried = self.carry.candidates(caches)
        nominate = Nominator(
            config=self.config,
            classes=self.classes,
            teams=self.teams,
            team_of=self.team,
            request_info=shape.request_info if Cache.REQUESTS in caches else shape.describe,
            dependency_states=self.snapshot.dependency_states,
            gate_classes=self.rules.classes,
            carried=carried,
        )
        self.fail, self.parked = nominate.fail, nominate.parked
        if not self.listing and self.rules.submit_order:
            # No pending list: candidates are made as the queue reaches them.
            return InSubmitOrder(
                nominate, self.snapshot.pending, in_order=self.snapshot.pending_in_submit_order
            )
        candidates = nominate.every(self.snapshot.pending)
        # Each team with candidates, its users with some (fair share's standing asks for
        # both) and the classes present: from the shell's index when every pending job is a
        # candidate, else in one walk.
        users_of: dict[str, set[str]] = {}
        ranks: set[int] = set()
        groups = self.snapshot.pending_groups
        if groups is not None and len(candidates) == len(self.snapshot.pending):
            for team_name, user, priority in groups:  # (a few per team: no walk)
                users_of.setdefault(team_name, set()).add(user)
                rank = nominate.rank_of(self.team(team_name), priority)
                if rank is not None:  # (None only in a false index: no job was parked)
                    ranks.add(rank)
        else:
            for c in candidates:
                job = c.job
                users = users_of.get(job.team)
                if users is None:
                    users_of[job.team] = {job.user}
                else:
                    users.add(job.user)
                ranks.add(c.rank)
        self.pending_users, self.pending_ranks = users_of, ranks
        self.pending_teams = set(users_of)
        for name in self.pending_teams - self.teams.keys():
            self.team(name)  # (an unknown team whose jobs were all carried: its defaults)
        self.under_guarantee = under_guarantee(self.pending_teams, self.ledger.team, self.teams)
        return candidates

    # -- 3 + 4. order and admit ----------------------------------------------------------------

    def admit_round(self, jobs: Sequence[Candidate]) -> None:
        """Admit one round's jobs in order, until nothing further down can change a decision
        (then the rest is only recorded as pending)."""
        if self.scope is SETTLED:
            self.record_rest(jobs)
            return
        jobs = narrow(self, jobs)
        thinned = thinnable(self)
        self.round_least = {}
        self._admit_in_order(thin(self, jobs) if thinned else jobs, thinned)

    def _admit_in_order(self, jobs: Sequence[Candidate], thinned: bool) -> None:
        ordered = self.rules.order(self, jobs)
        admit = self.admit
        scope = self.scope
        # A first round may let go of a team at once (``_defer_team``) where nothing records
        # the order each job was met in: no pending list, no fair-share journal.
        defer_teams = self.first_round and not self.listing and self.fair.journal is None
        for candidate in ordered:
            admit(candidate)
            if defer_teams and self.deferred and self.deferred[-1] is candidate:
                self._defer_team(ordered, candidate.job.team)
            if self.scope is not scope:
                scope = self.scope
                if scope is SETTLED:
                    if self.listing:  # (the rest of the queue may not be nominated yet)
                        self.record_rest(ordered.rest())
                    return
                assert scope is not None
                self.record_rest(ordered.keep_teams(scope))
            if not thinned and thinnable(self):
                # The round's last reservation is taken: go on with the jobs that may still
                # act, in the same order (a fair queue built anew over them with the
                # standing as it is now yields them as the old one would have).
                self._admit_in_order(thin(self, ordered.rest()), True)
                return

    def _defer_team(self, ordered: Ordered, team: str) -> None:
        """The first round deferred a job of ``team``: once none of the team's jobs left in
        the round keeps it within its guarantee, defer them all at once instead of one by
        one as the order reaches them (a team's units only grow within a pass, so none of
        them could come back into the round)."""
        held = self.ledger.team.get(team, 0.0)
        least = self.round_least.get(team)
        record = self.team(team)
        if least is not None and fits_guarantee(held, least, record):
            return  # a job that small was in the round when last looked: look again later
        rest = ordered.team_rest(team)
        least = min(map(least_units, rest), default=math.inf)
        self.round_least[team] = least
        if not fits_guarantee(held, least, record):
            self.deferred += ordered.keep_teams(self.pending_teams - {team})

    def admit(self, c: Candidate) -> None:
        job = c.job
        # This pass's record of the team (a carried candidate keeps the last pass's until
        # the pass considers it: ``Nominator.every``). Every check that reads ``c.team``
        # (room, guarantee, verdicts, victims) comes after this line. (``self.team`` only for
        # a team not listed yet: a call per job considered cost 0.6% of a pass's instructions
        # late in the whole Philly trace.)
        c.team = self.teams.get(job.team) or self.team(job.team)
        if self.first_round and not within_guarantee(c, self.ledger.team.get(job.team, 0.0)):
            self.deferred.append(c)  # it would borrow after all: second round
            return
        if self.early and self.starving:
            kept = self.early.pop(job.id, None)
            if kept is not None:
                self._let_go(kept[0])  # its own slices back, for its turn
        if job.array:
            # Its array runs as many members as it may: the array's own limit, not a
            # shortage, so it neither preempts nor reserves (and is never remembered as a
            # verdict: jobs shaped alike in other arrays are free to go).
            throttled = self.arrays.blocked(job)
            if throttled is not None:
                self.wait(c, *throttled)
                return
        # A job shaped like one that just failed, with nothing changed since, fails the same
        # way: say so without looking again (most of a long queue in a full cluster).
        key, stamp, verdict = self.memo.verdict(c, self.starving)
        if verdict is not None:
            if self.listing:  # (positional: most of a long queue takes this path)
                self.left.append(Left(job, verdict.code, verdict.numbers, c, None, False, verdict))
            return
        allowed = room(c, self.ledger)  # units its limits leave, or why it may take none
        if isinstance(allowed, tuple):
            self.wait(c, *allowed).verdict = self.memo.keep_verdict(c, key, stamp, allowed)
            return
        cap = _cap(c, allowed)
        placement = self._place(c, cap)
        if placement is None and self.early and self.first_round:
            # A guarantee comes first: what the starving jobs set aside before the round,
            # rather than nothing or a reclaim (``_early_for``).
            placement = self._place(c, cap, early=True)
        if placement is not None:
            if placement:
                self._assign(c, placement)
            return  # an empty placement: it fitted, but not within the limits (recorded)
        if self.rules.blocked(self, c):
            return
        # Why it does not fit depends on its team, request and the stamp, not on its user or
        # class: jobs that differ only there share the answer.
        why_key, why = self.memo.why_not(c, stamp)
        if why is None:
            why = self._capacity_reason(c)
            self.memo.keep_why_not(why_key, stamp, why)
        self.wait(c, *why).verdict = self._keep_unplaced(c, key, stamp, why)

    def _keep_unplaced(self, c: Candidate, key: Key, stamp: Stamp, why: Blocked) -> Verdict | None:
        """Keep ``why`` as the verdict of the jobs alike after ``c``, which fitted nowhere and
        could not preempt. A job that waits for room rather than reclaim chose so by its own
        age: the verdict holds only for jobs alike queued after the time ``waiting_after``
        says."""
        after = self.preemption.waiting_after
        return self.memo.keep_verdict(
            c, key, stamp, why, queued_after=-math.inf if after is None else after
        )

    def _place(self, c: Candidate, cap: int | None, *, early: bool = False) -> Placement | None:
        """Best-fit slices for ``c``, taken from the index; [] when they break a limit;
        None when nothing fits. Set-aside slices of a reservation are offered only to jobs
        that end before it (``early``: and those the starving jobs set aside before the
        first rounds, ``_early_for``)."""
        index = self.index
        job = c.job
        free = index.total_free(c.pools)
        usable: list[Reservation] = []
        latest, limit = self.aside_latest, job.time_limit_s
        if early:
            usable = self._early_for(c)
            usable += [r for r in self._usable_reservations(c) if r.job_id not in self.early]
            free += sum(len(r.set_aside) for r in usable)
        # Set-aside slices only for a job that ends by the latest start among them, and only
        # when those of its pools could make it fit (each a count kept as they change: a
        # queue of starving jobs holds one reservation each, so a scan was jobs x them).
        elif latest is not None and limit is not None and self.now + limit <= latest:
            aside = self.aside_by_pool
            if free + sum(aside.get(pool, 0) for pool in c.pools) >= c.minimum:
                usable = self._usable_reservations(c)
                free += sum(len(r.set_aside) for r in usable)
        if free < c.minimum:
            return None  # the common case once the cluster is full: nothing to look at
        before = [len(r.set_aside) for r in usable] if usable else None
        back = [give_back(index, r) for r in usable]
        placement = index.find(
            c.pools, job.team, c.minimum, c.count, job.request.multi_node, cap=cap
        )
        if placement is not None:
            over = over_limit(c, placement, self.ledger)
            if over is None:
                index.take(placement, job.team)
            else:
                self.wait(c, *over)
                placement = []
        if before is not None:
            for reservation, returned in zip(usable, back, strict=True):
                set_aside_again(index, reservation, returned)
            if any(len(r.set_aside) != n for r, n in zip(usable, before, strict=True)):
                self._count_aside()  # the job took some of them
        return placement

    def reserve_early(self, jobs: Sequence[Candidate]) -> None:
        """Before the first rounds: for each starving job that would borrow, oldest first,
        set aside the free slices it would take now, or those its reservation would. Work
        within guarantees takes them only when it fits nowhere else, and never a team's
        younger work from its older job (``_place``, from ``admit``); each job gets its own
        back when its round reaches it (``admit``), where it is placed or reserved as before. So the
        room a long-waiting job gathers is not taken from it, pass after pass, by work that
        had somewhere else to go. Where each gathers its room, set aside or not (nothing
        free), is noted for its team's younger work not to free by reclaim (``_gathering``)."""
        index = self.index
        # Where a job finds nothing free, where it would gather its room depends on its
        # shape alone: nothing of its pools is free (whole GPUs and MIG: no team's own), and
        # the running jobs' ends do not change here.
        by_shape: dict[tuple[tuple[Pool, ...], int, bool], frozenset[int]] = {}
        for c in jobs:
            if any(pool[0] is SliceKind.MPS for pool in c.pools):
                continue  # (shares cannot be put back: ``give_back``)
            job = c.job
            multi_node = job.request.multi_node
            if not index.total_free(c.pools):
                # (the common case on a full cluster: nothing to set aside, and the
                # reservation only names its nodes)
                shape = (tuple(c.pools), c.minimum, multi_node)
                nodes = by_shape.get(shape)
                if nodes is None:
                    nodes = by_shape[shape] = self._reservation(c).nodes
                self._gather(c, nodes)
                continue
            c.team = self.teams.get(job.team) or self.team(job.team)
            if job.array and self.arrays.blocked(job) is not None:
                continue
            allowed = room(c, self.ledger)
            if isinstance(allowed, tuple):
                continue
            cap = _cap(c, allowed)
            placement = index.find(c.pools, job.team, c.minimum, c.count, multi_node, cap=cap)
            if placement is not None:
                if over_limit(c, placement, self.ledger) is not None:
                    continue
                reservation = hold_now(index, job.id, self.now, placement, job.team)
            else:
                reservation = self._reservation(c)
            if reservation.set_aside:
                self.early[job.id] = (reservation, c)
                self.reservations.append(reservation)
                self._add_aside(reservation)
            self._gather(c, reservation.nodes)
        if self.early:
            self.memo.changed_all()

    def _gather(self, c: Candidate, nodes: frozenset[int]) -> None:
        """Note where ``c`` gathers its room (``_gathering``)."""
        ages, gathered = self.gathering.setdefault(c.job.team, ([], []))
        ages.append(c.age)
        gathered.append(nodes)

    def let_go_early(self) -> None:
        """What the starving jobs set aside before the first rounds and their round did not
        take back (a job it never reached) goes back to the pass."""
        for reservation, _ in self.early.values():
            self._let_go(reservation)
        self.early, self.gathering = {}, {}

    def _let_go(self, reservation: Reservation) -> None:
        give_back(self.index, reservation)
        # (kept in the list, emptied: the pass's caches count its reservations as they grow)
        reservation.set_aside, reservation.by_node = [], {}
        self._count_aside()
        self.timeline.forget_sweeps()  # free slices came back
        self.memo.changed_all()

    def _early_for(self, c: Candidate) -> list[Reservation]:
        """What the starving jobs set aside before the first rounds that ``c`` may take when
        nothing else makes room (to place it or, failing that, to reserve for it): all but
        what its team's older jobs set aside (a team's younger work does not take the room
        its older job waits for)."""
        return [
            r
            for r, owner in self.early.values()
            if not r.pools.isdisjoint(c.pools) and not _older_of_team(owner, c)
        ]

    def _gathering(self, c: Candidate) -> frozenset[int]:
        """The nodes where the older starving jobs of ``c``'s team that would borrow gather
        their room: those of what they set aside before the round, or of where they would
        have, had anything been free (``reserve_early``)."""
        found = self.gathering.get(c.job.team)
        if found is None:
            return frozenset()
        ages, gathered = found
        return frozenset().union(*gathered[: bisect.bisect_left(ages, c.age)])

    def _count_aside(self) -> None:
        """``aside_latest`` and ``aside_by_pool`` from the reservations as they are now."""
        self.aside_latest, self.aside_by_pool = None, {}
        for reservation in self.reservations:
            self._add_aside(reservation)

    def _add_aside(self, r: Reservation) -> None:
        """Count ``r``'s set-aside slices: only those with a known start are ever usable
        (``Reservation.lets``)."""
        if not r.set_aside or r.at is None:
            return
        if self.aside_latest is None or r.at > self.aside_latest:
            self.aside_latest = r.at
        aside = self.aside_by_pool
        for pool in r.pools:
            aside[pool] = aside.get(pool, 0) + len(r.set_aside)

    def _usable_reservations(self, c: Candidate) -> list[Reservation]:
        """The reservations whose set-aside slices ``c`` may use: in its pools, starting
        after its time limit ends (``Reservation.lets``)."""
        limit = c.job.time_limit_s
        ends = None if limit is None else self.now + limit
        return [
            r
            for r in self.reservations
            if r.set_aside and r.lets(ends) and not r.pools.isdisjoint(c.pools)
        ]

    def _assign(self, c: Candidate, placement: Placement) -> None:
        job = c.job
        weights = self.config.model_weights
        slices = [item for _, items in placement for item in items]
        units = sum(item.units for item in slices)
        billed = sum(item.units * weights.get(item.model, 1.0) for item in slices)
        self.ledger.add(job, units, billed)
        self.fair.charge(job.team, job.user, billed)
        end = None if job.time_limit_s is None else self.now + job.time_limit_s
        self.timeline.add(end, slices)
        self.placed.append((job, units, end))
        self.arrays.placed(job, end)
        held = self.ledger.team.get(job.team, 0.0)
        self.placed_teams.add(job.team)
        self.memo.took(job.team, placement, self.shape)
        check_settled(self)
        names = self.shape.names
        nodes = tuple(names[node] for node, _ in placement)
        self.assign.append(
            Assign(
                job_id=job.id,
                node=nodes[0],
                slice_ids=tuple(item.id for item in slices),
                borrowed=held > c.team.guaranteed + EPS,
                nodes=nodes if len(nodes) > 1 else (),
            )
        )

    def preempt_for(self, c: Candidate) -> bool:
        """Preempt for ``c`` if a rule lets it and victims make room; it then waits for them."""
        # Not on the nodes where its team's older starving jobs gather room: they would set
        # the freed slices aside again in the next pass, out of its reach, and the victims,
        # restarted there, be preempted again (a loop).
        avoid = self._gathering(c)
        victims = self.preemption.victims_for(c, self.ledger, avoid)
        if victims is None:
            return False
        self.memo.changed_all()
        job = c.job
        for victim, why in victims:
            self.preempt.append(Preempt(victim.run.job.id, why, for_job_id=job.id))
            # Still held (and charged to its team and member) through its grace period.
            self.ledger.stop(victim.team, victim.units)
        self.ledger.add(job, c.least)
        grace = self.config.grace_period_s
        numbers: Numbers = {"victims": len(victims), "grace_period_s": grace}
        entry = self.wait(c, PendingCode.WAITING_FOR_PREEMPTION, numbers)
        entry.eta, entry.eta_known = self.now + grace, True
        check_settled(self)
        return True

    def reserve(self, c: Candidate, *, starving: bool = False) -> bool:
        """Give ``c`` a backfill reservation if its round kind has one left (a starving job
        always gets one). In a first round, what the starving jobs set aside before it is
        free to the reservation as to a placement (``_early_for``): a guarantee comes first,
        so their room goes to it, and they keep what it leaves."""
        made = self.round_reservations
        if not starving:
            if made[self.first_round] >= self.config.max_reservations:
                return False
            made[self.first_round] += 1
        usable = self._early_for(c) if self.early and self.first_round else []
        back = [give_back(self.index, r) for r in usable]
        if not any(back):
            return self._reserve(c, starving)
        self.timeline.forget_sweeps()  # free slices came back
        try:
            return self._reserve(c, starving)
        finally:
            for reservation, returned in zip(usable, back, strict=True):
                set_aside_again(self.index, reservation, returned)
            self._count_aside()
            self.timeline.forget_sweeps()

    def _reserve(self, c: Candidate, starving: bool) -> bool:
        if not self.listing and not self.index.total_free(c.pools):
            # Nothing of its pools is free, so it would set nothing aside: its start time
            # would only be told (nobody asks, with no pending list), and the sweep of the
            # running jobs' ends is the cost of a pass full of starving jobs. (Free slices
            # never come back within a pass, so none of its kind could set any aside later.)
            entry = self.wait(c, PendingCode.RESERVED, {"at": "unknown"})
            if starving:
                # A starving job alike after it, with nothing changed since, could neither
                # preempt nor set anything aside: the same outcome, as a verdict (its key
                # marked starving, ``scheduler.memo.STARVING``).
                key, stamp, _ = self.memo.verdict(c, starving=True)
                entry.verdict = self._keep_unplaced(c, key, stamp, (entry.code, entry.numbers))
            check_settled(self)
            return True
        reservation = self._reservation(c)
        self.reservations.append(reservation)
        self._add_aside(reservation)
        numbers: Numbers = {"at": "unknown"}
        if reservation.at is not None:
            # "at" on the caller's clock; "in_s" so a person reads "in about 20 min".
            numbers = {"at": reservation.at, "in_s": max(0.0, reservation.at - self.now)}
        entry = self.wait(c, PendingCode.RESERVED, numbers)
        entry.eta, entry.eta_known = reservation.at, True
        self.memo.changed_all()
        check_settled(self)
        return True

    def _reservation(self, c: Candidate) -> Reservation:
        """``c``'s reservation, its set-aside slices taken out of the index (none when
        nothing of its pools is free: it then only names the nodes it would gather on)."""
        job = c.job
        return reserve(
            self.index,
            self.timeline,
            job_id=job.id,
            pools=c.pools,
            team=job.team,
            need=c.minimum,
            multi_node=job.request.multi_node,
        )

    def block_queue(self, c: Candidate) -> bool:
        """``c`` waits, and every job after it waits behind it (plain FIFO)."""
        self.wait(c, PendingCode.NO_FIT, no_fit_numbers(c))
        if self.config.explain:
            self.behind = (PendingCode.WAITING_FOR_RESERVATION, {"blocked_by": c.job.id})
        self.scope = SETTLED
        return True

    def _capacity_reason(self, c: Candidate) -> Blocked:
        if not self.config.explain:
            return (PendingCode.NOT_EXPLAINED, {})
        return capacity_reason(
            c,
            reservations=self.reservations,
            index=self.index,
            start_largest=self.start_largest,
            fair_order=self.rules.fair_order,
        )

    def wait(self, c: Candidate, code: PendingCode, numbers: Numbers) -> Left:
        entry = Left(c.job, code, numbers, c)  # numbers may be shared: copy before changing
        self.left.append(entry)
        return entry

    def record_rest(self, rest: Sequence[Candidate]) -> None:
        """Jobs left after the pass settled: pending in submit order, with ``behind``."""
        if not self.listing:
            return
        code, numbers = self.behind
        for c in sorted(rest, key=by_age):
            self.wait(c, code, numbers)

    # -- 5. explain ----------------------------------------------------------------------------

    def decisions(self) -> Decisions:
        classes = self.classes
        parked = sorted(
            self.parked, key=lambda e: (-classes.get(e.job.priority, 0), age_key(e.job))
        )
        explainer = Explainer(
            config=self.config,
            now=self.now,
            index=self.index,
            timeline=self.timeline,
            held=self.held,
            placed=self.placed,
            fair=self.fair,
            placed_teams=self.placed_teams,
            memo=self.memo,
            arrays=self.arrays,
            run_times=self.snapshot.run_times,
            assigned=self.assign,
            reservations=self.reservations,
        )
        return Decisions(
            assign=tuple(self.assign),
            preempt=tuple(self.preempt),
            pending=tuple(explainer.pending([*self.left, *parked])) if self.listing else (),
            fail=tuple(self.fail),
            standing=standing_of(
                self.fair,
                teams=self.teams,
                user_usage=self.snapshot.user_usage,
                capacity=self.shape.total_units,
                classes=self.config.priority_classes,
                aging_per_hour=self.config.aging_per_hour,
            ),
        )


def _older_of_team(owner: Candidate, c: Candidate) -> bool:
    """``owner`` is an older job of ``c``'s team: the room it set aside before the first
    rounds is not for ``c`` (``Cycle.reserve_early``)."""
    return owner.job.team == c.job.team and owner.age < c.age


def _cap(c: Candidate, allowed: float) -> int | None:
    """How many slices the units ``allowed`` leave ``c`` (None: no limit)."""
    return None if allowed == math.inf else int((allowed + EPS) / c.unit)

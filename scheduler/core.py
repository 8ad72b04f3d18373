"""One scheduling pass: ``schedule(snapshot, *, now, config) -> Decisions``.

The pass reads like Kueue's scheduling cycle, in numbered steps:

1. Snapshot   - index the free capacity (per pool, per node) and who holds what.
2. Nominate   - fail jobs whose ``after_ok`` dependency failed; park jobs that cannot be
                considered now (dependency, class not allowed, no such slices anywhere).
3. Order      - priority class, then the team's and the user's fair-share factor, then age
                (``scheduler.order``); FIFO baselines use submit order.
4. Admit      - per job in order: quota and budget, best-fit placement, else preemption
                (reclaim / priority), else a backfill reservation, else wait.
5. Explain    - a reason with numbers, a 1-based position and an estimated start for every
                job left pending (cheap codes only when ``config.explain`` is off).

Pure and deterministic: no clock but ``now``, no randomness, every tie broken by a stable key
(age, then job id; node name; slice id).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType

from scheduler.backfill import (
    Estimator,
    Reservation,
    Timeline,
    give_back,
    reserve,
    set_aside_again,
)
from scheduler.cluster import FreeIndex, Placement, Pool, shape_of
from scheduler.config import Policy, SchedulerConfig
from scheduler.model import (
    Assign,
    Decisions,
    DependencyKind,
    DependencyState,
    Fail,
    Job,
    Pending,
    PendingCode,
    Preempt,
    Reason,
    RunningJob,
    Slice,
    SliceKind,
    Snapshot,
    Team,
)
from scheduler.order import FairQueue, FairShare, age_key, fair_share, leading_team
from scheduler.preempt import Holder, Preemptor
from scheduler.units import decayed_rate

_EPS = 1e-9
Numbers = dict[str, float | str]
_Known = tuple[Reason, float | None]  # an explained reason and estimated start


def schedule(snapshot: Snapshot, *, now: float, config: SchedulerConfig) -> Decisions:
    """Decide which pending jobs start where, which running jobs are preempted, and why the
    others wait. See the module docstring for the steps and ``docs/scheduling.md`` for the
    policy."""
    # The pass allocates many short-lived objects next to a large snapshot; the cyclic
    # garbage collector would walk the snapshot again and again for nothing (it holds no
    # cycles we make), so it pauses for the pass and resumes as the caller had it.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _schedule(snapshot, now, config)
    finally:
        if paused:
            gc.enable()


def _schedule(snapshot: Snapshot, now: float, config: SchedulerConfig) -> Decisions:
    cycle = _Cycle(snapshot, now, config)
    # 1. Snapshot: free capacity and holdings.
    cycle.index_cluster()
    # 2. Nominate: settle dependencies, classes and impossible requests.
    classes = cycle.nominate()
    # 3 + 4. Order and admit: the order is dynamic (a placed job lowers its team's standing at
    # once), so ordering and admission run together, class by class, highest first. Once
    # nothing further down can change a decision (and nobody asked for explanations), the
    # rest is only recorded as pending.
    cycle.check_settled()
    for group in classes:
        for jobs in cycle.phases(group):
            if cycle.settled:
                cycle.record_rest(jobs)
                continue
            ordered = cycle.order(cycle.narrow(jobs))
            admit = cycle.admit
            for candidate in ordered:
                admit(candidate)
                if cycle.settled:
                    cycle.record_rest(ordered.rest())
                    break
                if cycle.just_narrowed:
                    cycle.just_narrowed = False
                    cycle.record_rest(ordered.keep_teams(cycle.narrowed))
    # 5. Explain: reasons, positions and estimates for everything left pending.
    return cycle.decisions()


@dataclass(slots=True)
class _Candidate:
    job: Job
    team: Team
    rank: int
    pools: tuple[Pool, ...]
    unit: float  # units of one slice (the smallest among its pools), for quota checks
    minimum: int
    count: int
    # What decides whether it finds room, besides the state of the pass (see admit).
    shape: tuple[object, ...] = ()


@dataclass(slots=True)
class _Left:
    """A job left pending, in the order it was considered."""

    job: Job
    code: PendingCode
    numbers: dict[str, float | str] = field(default_factory=dict)
    candidate: _Candidate | None = None
    eta: float | None = None
    eta_known: bool = False


@dataclass(slots=True)
class _Ledger:
    """GPU units held per team and per user, as the pass places and preempts.

    A job being stopped (a victim in its grace period, or one this pass preempts) holds its
    units until its agent reports it stopped: they stay in ``team`` and ``user``, which the
    limits check, and are also counted in ``stopping``, so that reclaim sees what a team
    keeps once its stops are done (``kept``) and never takes twice for one shortage."""

    team: dict[str, float] = field(default_factory=dict)
    user: dict[tuple[str, str], float] = field(default_factory=dict)
    team_billed: dict[str, float] = field(default_factory=dict)
    user_billed: dict[tuple[str, str], float] = field(default_factory=dict)
    stopping: dict[str, float] = field(default_factory=dict)

    def add(self, job: Job, units: float, billed: float = 0.0) -> None:
        self.team[job.team] = self.team.get(job.team, 0.0) + units
        key = (job.team, job.user)
        self.user[key] = self.user.get(key, 0.0) + units
        self.team_billed[job.team] = self.team_billed.get(job.team, 0.0) + billed
        self.user_billed[key] = self.user_billed.get(key, 0.0) + billed

    def stop(self, team: str, units: float) -> None:
        self.stopping[team] = self.stopping.get(team, 0.0) + units

    def kept(self) -> dict[str, float]:
        """Units per team once the jobs being stopped have stopped."""
        if not self.stopping:
            return self.team
        stopping = self.stopping
        return {name: units - stopping.get(name, 0.0) for name, units in self.team.items()}


class _Cycle:
    def __init__(self, snapshot: Snapshot, now: float, config: SchedulerConfig) -> None:
        self.snapshot = snapshot
        self.now = now
        self.config = config
        self.fifo = config.policy is not Policy.FAIRSHARE
        self.classes = {name: rank for rank, name in enumerate(config.priority_classes)}
        self.shape = shape_of(snapshot.nodes)
        self.ledger = _Ledger()
        self.assign: list[Assign] = []
        self.preempt: list[Preempt] = []
        self.fail: list[Fail] = []
        self.left: list[_Left] = []  # considered and left pending, in order
        self.parked: list[_Left] = []  # never considered (dependency, class, no such slice)
        self.reservations: list[Reservation] = []
        self.fifo_head: Job | None = None
        self.under_guarantee: set[str] = set()
        self.fair: FairShare = FairShare({}, {}, {}, {})
        self._team_cache: dict[str, Team] = {}
        self._teams = snapshot.teams
        self.placed_teams: set[str] = set()
        self._leader: tuple[str, float] | None = None
        self._etas: dict[str, float | None] = {}
        self._largest_cache: dict[tuple[tuple[Pool, ...], str], int] = {}
        self._release_cache: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        self._by_team_ends: dict[str, list[tuple[float, float, str]]] = {}
        self.settled = False
        self.narrowed: set[str] = set()  # when set: only these teams' jobs still matter
        self.just_narrowed = False
        self.first_round = False
        # Reservations made in the second and first rounds (of all classes): each round kind
        # reserves for its own first blocked job, so work within guarantees cannot take the
        # reservation from a long-waiting job that borrows.
        self.round_reservations = [0, 0]
        self.deferred: list[_Candidate] = []
        # Versions of what a verdict depends on: bumped when the pass takes slices of a pool,
        # changes what a team holds, or reserves / preempts (everything).
        self.version = 0
        self.pool_version: dict[Pool, int] = {}
        self.team_version: dict[str, int] = {}
        self._verdicts: dict[tuple[object, ...], tuple[object, PendingCode, Numbers]] = {}
        self._no_room: dict[tuple[object, ...], tuple[object, PendingCode, Numbers]] = {}
        self.placed_ends: list[tuple[Job, float, float | None]] = []

    # -- 1. snapshot ---------------------------------------------------------------------------

    def index_cluster(self) -> None:
        shape = self.shape
        slices = shape.slice_by_id
        grace = self.config.grace_period_s
        holders: dict[str, str] = {}
        team_units = self.ledger.team
        user_units = self.ledger.user
        held_list: list[tuple[RunningJob, tuple[Slice, ...], float, float | None]] = []
        # One tight loop over the running jobs: what they hold, what it is worth, when it
        # ends (the time limit; for a victim in its grace period, the end of the grace).
        for run in self.snapshot.running:
            ids = run.slice_ids
            job = run.job
            held: tuple[Slice, ...]
            team = job.team
            if len(ids) == 1:
                first = slices.get(ids[0])
                held = (first,) if first is not None else ()
                units = first.units if first is not None else 0.0
                holders[ids[0]] = team
            else:
                # (tuples, so the timeline keeps them as they are instead of copying)
                held = tuple([slices[i] for i in ids if i in slices])
                units = sum(item.units for item in held)
                holders.update(dict.fromkeys(ids, team))
            team_units[team] = team_units.get(team, 0.0) + units
            user = (team, job.user)
            user_units[user] = user_units.get(user, 0.0) + units
            limit = job.time_limit_s
            end = None if limit is None else run.started_at + limit
            if run.preempting_since is not None:
                stop = run.preempting_since + grace
                end = stop if end is None or stop < end else end
                self.ledger.stop(team, units)
            held_list.append((run, held, units, end))
        self.held = held_list
        self._charge_billed(self.config.model_weights)
        self.index = FreeIndex(shape, holders)
        self.timeline = Timeline(self.index, [(end, held) for _, held, _, end in held_list])
        self.start_largest = {
            pool: buckets.largest() for pool, buckets in self.index.buckets.items()
        }
        for pool, buckets in self.index.unowned_buckets.items():
            self.start_largest[pool] = buckets.largest()
        self.preemptor: Preemptor | None = None

    def _charge_billed(self, weights: Mapping[str, float]) -> None:
        """Billed units held per team and user (the fair-share currency)."""
        ledger = self.ledger
        if not weights:
            ledger.team_billed = dict(ledger.team)
            ledger.user_billed = dict(ledger.user)
            return
        for run, held, _, _ in self.held:
            billed = sum(item.units * weights.get(item.model, 1.0) for item in held)
            team, key = run.job.team, (run.job.team, run.job.user)
            ledger.team_billed[team] = ledger.team_billed.get(team, 0.0) + billed
            ledger.user_billed[key] = ledger.user_billed.get(key, 0.0) + billed

    def _holders(self) -> list[Holder]:
        """The running jobs preemption may look at: victims in their grace period (their
        slices free soon) and jobs some rule could pick (a team borrowing now for reclaim,
        a class below the highest pending one for priority)."""
        config = self.config
        teams, ledger = self._teams, self.ledger.kept()
        borrowing = {
            name
            for name, units in ledger.items()
            if units > (teams[name].guaranteed if name in teams else 0.0) + _EPS
        }
        top = max((self._rank(j.priority) for j in self.snapshot.pending), default=0)
        oldest = self.now - config.min_run_time_s
        # Started before this: run too long to lose to a reclaim (``reclaim_max_run_s``).
        protected = (
            -math.inf if config.reclaim_max_run_s is None else self.now - config.reclaim_max_run_s
        )
        out = []
        for run, held, units, _ in self.held:
            rank = self._rank(run.job.priority)
            if run.preempting_since is None:
                if not run.job.preemptible or run.started_at > oldest:
                    continue
                by_reclaim = (
                    config.reclaim and run.job.team in borrowing and run.started_at >= protected
                )
                if not (by_reclaim or (config.preempt_by_priority and rank < top)):
                    continue
            out.append(Holder(run, rank, held, units, run.job.team))
        return out

    def _rank(self, priority: str) -> int:
        return self.classes.get(priority, 0)

    def _team(self, name: str) -> Team:
        team = self._teams.get(name)
        if team is None:
            team = self._team_cache.get(name)
            if team is None:
                # An unknown team gets the neutral defaults rather than stopping the pass.
                team = self._team_cache[name] = Team(name=name)
        return team

    # -- 2. nominate ---------------------------------------------------------------------------

    def nominate(self) -> list[list[_Candidate]]:
        """Candidates grouped by class, highest class first (one group for FIFO baselines)."""
        by_rank: dict[int, list[_Candidate]] = {}
        nominate, fifo = self._nominate, self.fifo
        for job in self.snapshot.pending:
            candidate = nominate(job)
            if candidate is not None:
                rank = 0 if fifo else candidate.rank
                group = by_rank.get(rank)
                if group is None:
                    group = by_rank[rank] = []
                group.append(candidate)
        active: dict[str, set[str]] = {}
        for group in by_rank.values():
            for c in group:
                job = c.job
                users = active.get(job.team)
                if users is None:
                    users = active[job.team] = set()
                users.add(job.user)
        for name in active:
            team = self._team(name)
            if self.ledger.team.get(name, 0.0) < team.guaranteed - _EPS:
                self.under_guarantee.add(name)
        if not self.fifo:
            config = self.config
            history = config.history_weight * decayed_rate(1.0, config.usage_half_life_s)
            self.fair = fair_share(
                teams=self.snapshot.teams,
                active=active,
                team_held=self.ledger.team_billed,
                user_held=self.ledger.user_billed,
                user_usage=self.snapshot.user_usage,
                history_per_unit=history,
                capacity=self.shape.total_units,
            )
        return [by_rank[rank] for rank in sorted(by_rank, reverse=True)]

    def _nominate(self, job: Job) -> _Candidate | None:
        request = job.request
        if request.count < 1:
            self.fail.append(Fail(job.id, f"request.count must be at least 1, got {request.count}"))
            return None
        if job.depends_on:
            waiting = self._dependency(job)
            if waiting is False:
                return None
            if waiting is not None:
                self.parked.append(_Left(job, PendingCode.DEPENDENCY, {"waiting_for": waiting}))
                return None
        team = self._team(job.team)
        rank = self.classes.get(job.priority, 0)
        if not self.fifo:
            allowed = self.classes.get(team.max_priority, 0)
            if rank > allowed or job.priority not in self.classes:
                if job.priority not in self.classes or not self.config.clamp_priority:
                    numbers: dict[str, float | str] = {
                        "priority": job.priority,
                        "max_priority": team.max_priority,
                    }
                    self.parked.append(_Left(job, PendingCode.PRIORITY_NOT_ALLOWED, numbers))
                    return None
                rank = allowed
        info = self.shape.request_info(request)
        if not info.could_ever_fit:
            numbers = {"needs": info.minimum, "largest_node": info.largest_node}
            self.parked.append(_Left(job, PendingCode.NO_MATCHING_SLICES, numbers))
            return None
        user = job.user if team.member_limit is not None else ""
        # The class matters to a verdict only when it may preempt by class; leaving it out
        # otherwise lets jobs of all classes share verdicts (half as many misses).
        by_class = rank if self.config.preempt_by_priority else 0
        shape = (job.team, user, info.pools, info.minimum, by_class, request.multi_node)
        return _Candidate(
            job, team, rank, info.pools, info.unit, info.minimum, request.count, shape
        )

    def _dependency(self, job: Job) -> str | None | bool:
        """None: free to go; a job id: still waiting for it; False: failed for good."""
        states = self.snapshot.dependency_states
        waiting: str | None = None
        for dep in job.depends_on:
            state = states.get(dep.job_id, DependencyState.WAITING)
            if state is DependencyState.WAITING:
                waiting = waiting or dep.job_id
            elif state is DependencyState.FAILED and dep.kind is DependencyKind.AFTER_OK:
                self.fail.append(Fail(job.id, f"dependency {dep.job_id} did not succeed"))
                return False
        return waiting

    # -- 3. order ------------------------------------------------------------------------------

    def order(self, group: list[_Candidate]) -> _Ordered:
        if self.fifo:
            return _Ordered(sorted(group, key=lambda c: age_key(c.job)), None)
        queue = FairQueue(
            ((c.job, c) for c in group),
            self.fair,
            now=self.now,
            aging_per_hour=self.config.aging_per_hour,
        )
        return _Ordered(group, queue)

    def phases(self, group: list[_Candidate]) -> Iterator[list[_Candidate]]:
        """The candidates of one class in two rounds (FAIRSHARE): first the jobs that stay
        within their team's guarantee, then everything else, in fair-share order each.

        So freed capacity goes to a team under its guarantee before any team borrows it; a
        job the first round finds borrowing after all (its team got capacity meanwhile)
        moves to the second round.
        """
        if self.fifo:
            yield group
            return
        ledger = self.ledger.team
        room = {  # teams with room left in their guarantee
            name
            for name in {c.job.team for c in group}
            if ledger.get(name, 0.0) < self._team(name).guaranteed - _EPS
        }
        inside = [
            c
            for c in group
            if c.job.team in room and self._within_guarantee(c, ledger.get(c.job.team, 0.0))
        ]
        if inside:
            self.first_round = True
            yield inside
            self.first_round = False
        chosen = {id(c) for c in inside}
        yield [c for c in group if id(c) not in chosen] + self.deferred
        self.deferred = []

    @staticmethod
    def _within_guarantee(c: _Candidate, held: float) -> bool:
        return held + c.minimum * c.unit <= c.team.guaranteed + _EPS

    def record_rest(self, rest: Sequence[_Candidate]) -> None:
        """Jobs left after the pass settled: pending, in submit order, nothing to explain."""
        for c in sorted(rest, key=lambda c: age_key(c.job)):
            self._wait(c, PendingCode.NOT_EXPLAINED, {})

    # -- 4. admit ------------------------------------------------------------------------------

    def admit(self, c: _Candidate) -> None:
        job = c.job
        if self.first_round and not self._within_guarantee(c, self.ledger.team.get(job.team, 0.0)):
            self.deferred.append(c)  # it would borrow after all: second round
            return
        if self.fifo_head is not None:
            self._wait(c, PendingCode.WAITING_FOR_RESERVATION, {"blocked_by": self.fifo_head.id})
            return
        # A job shaped like one that just failed, with nothing changed since, fails the same
        # way: say so without looking again (most of a long queue in a full cluster). This is
        # the path most jobs of a long queue take, so its key and stamp are computed inline:
        # the key is the shape plus which reservations the job may use, the stamp the
        # versions of everything, its team and its pools.
        verdict_key = c.shape
        reservations = self.reservations
        if reservations and job.time_limit_s is not None:
            ends = self.now + job.time_limit_s
            if len(reservations) == 1:
                verdict_key = (*verdict_key, reservations[0].lets(ends))
            else:
                verdict_key = (*verdict_key, *[r.lets(ends) for r in reservations])
        pools = c.pools
        versions = self.pool_version
        stamp = (
            self.version,
            self.team_version.get(job.team, 0),
            versions.get(pools[0], 0)
            if len(pools) == 1
            else tuple(versions.get(p, 0) for p in pools),
        )
        verdict = self._verdicts.get(verdict_key)
        if verdict is not None and verdict[0] == stamp:
            self.left.append(_Left(job, verdict[1], verdict[2], c))
            return
        room = self._quota_room(c)
        if room is None:
            entry = self.left[-1]
            self._verdicts[verdict_key] = (stamp, entry.code, entry.numbers)
            return
        cap = None if room == math.inf else int((room + _EPS) / c.unit)
        placement = self._place(c, cap)
        if placement is not None:
            if placement:
                self._assign(c, placement)
            return  # an empty placement: it fitted, but not within the limits (recorded)
        if not self.fifo and self._try_preemption(c):
            self.check_settled()
            return
        if self.config.policy is Policy.FIFO:
            self.fifo_head = job
            self._wait(c, PendingCode.NO_FIT, self._no_fit_numbers(c))
            self.settled = not self.config.explain
            return
        backfill = self.config.policy is Policy.FIFO_BACKFILL or self.config.backfill
        made = self.round_reservations
        if backfill and made[self.first_round] < self.config.max_reservations:
            made[self.first_round] += 1
            reservation = reserve(
                self.index,
                self.timeline,
                job_id=job.id,
                pools=c.pools,
                team=job.team,
                need=c.minimum,
                multi_node=job.request.multi_node,
            )
            self.reservations.append(reservation)
            numbers: dict[str, float | str] = {"at": "unknown"}
            if reservation.at is not None:
                # "at" on the caller's clock; "in_s" so a person reads "in about 20 min".
                numbers = {"at": reservation.at, "in_s": max(0.0, reservation.at - self.now)}
            entry = self._wait(c, PendingCode.RESERVED, numbers)
            entry.eta, entry.eta_known = reservation.at, True
            self.version += 1
            self.check_settled()
            return
        # Why it does not fit depends on its team, request and the versions in the stamp,
        # not on its user or class: jobs that differ only there share the answer.
        request = job.request
        why_key = (job.team, pools, c.minimum, request.multi_node, request.profile)
        why = self._no_room.get(why_key)
        if why is not None and why[0] == stamp:
            entry = self._wait(c, why[1], why[2])
        else:
            entry = self._wait_for_capacity(c)
            self._no_room[why_key] = (stamp, entry.code, entry.numbers)
        self._verdicts[verdict_key] = (stamp, entry.code, entry.numbers)

    def _quota_room(self, c: _Candidate) -> float | None:
        """Units the job may still take, or None (and a recorded reason) when blocked."""
        team, job = c.team, c.job
        if team.budget_gpu_hours is not None and team.used_gpu_hours >= team.budget_gpu_hours:
            spent: Numbers = {
                "used_gpu_hours": team.used_gpu_hours,
                "budget": team.budget_gpu_hours,
            }
            self._wait(c, PendingCode.BUDGET_EXHAUSTED, spent)
            return None
        needs = c.minimum * c.unit
        room = math.inf
        if team.limit is not None:
            used = self.ledger.team.get(job.team, 0.0)
            if used + needs > team.limit + _EPS:
                over: Numbers = {"used": used, "limit": team.limit, "needs": needs}
                self._wait(c, PendingCode.QUOTA_LIMIT, over)
                return None
            room = team.limit - used
        if team.member_limit is not None:
            used = self.ledger.user.get((job.team, job.user), 0.0)
            if used + needs > team.member_limit + _EPS:
                mine: Numbers = {"used": used, "limit": team.member_limit, "needs": needs}
                self._wait(c, PendingCode.MEMBER_LIMIT, mine)
                return None
            room = min(room, team.member_limit - used)
        return room

    def _fits_quota(self, c: _Candidate, placement: Placement) -> bool:
        """The exact units of a placement (MPS shares may differ in size) against the limits."""
        team, job = c.team, c.job
        units = sum(item.units for _, items in placement for item in items)
        checks = (
            (team.limit, self.ledger.team.get(job.team, 0.0), PendingCode.QUOTA_LIMIT),
            (
                team.member_limit,
                self.ledger.user.get((job.team, job.user), 0.0),
                PendingCode.MEMBER_LIMIT,
            ),
        )
        for limit, used, code in checks:
            if limit is not None and used + units > limit + _EPS:
                self._wait(c, code, {"used": used, "limit": limit, "needs": units})
                return False
        return True

    def _ends_at(self, job: Job) -> float | None:
        limit = job.time_limit_s
        return None if limit is None else self.now + limit

    def _place(self, c: _Candidate, cap: int | None) -> Placement | None:
        """Best-fit slices for ``c``, taken from the index; [] when they break a limit;
        None when nothing fits. Set-aside slices of a reservation are offered only to jobs
        that end before it."""
        index = self.index
        job = c.job
        usable = [
            r
            for r in self.reservations
            if r.set_aside and r.lets(self._ends_at(job)) and not r.pools.isdisjoint(c.pools)
        ]
        if index.total_free(c.pools) + sum(len(r.set_aside) for r in usable) < c.minimum:
            return None  # the common case once the cluster is full: nothing to look at
        back = [give_back(index, r) for r in usable]
        placement = index.find(
            c.pools, job.team, c.minimum, c.count, job.request.multi_node, cap=cap
        )
        if placement is not None:
            if self._fits_quota(c, placement):
                index.take(placement, job.team)
            else:
                placement = []
        for reservation, returned in zip(usable, back, strict=True):
            set_aside_again(index, reservation, returned)
        return placement

    def _assign(self, c: _Candidate, placement: Placement) -> None:
        job = c.job
        weights = self.config.model_weights
        slices = [item for _, items in placement for item in items]
        units = sum(item.units for item in slices)
        billed = sum(item.units * weights.get(item.model, 1.0) for item in slices)
        self.ledger.add(job, units, billed)
        self.fair.charge(job.team, job.user, billed)
        end = self._ends_at(job)
        self.timeline.add(end, slices)
        self.placed_ends.append((job, units, end))
        held = self.ledger.team.get(job.team, 0.0)
        self.placed_teams.add(job.team)
        self.team_version[job.team] = self.team_version.get(job.team, 0) + 1
        for pool in {self.shape.slice_pool[item.id] for item in slices}:
            self.pool_version[pool] = self.pool_version.get(pool, 0) + 1
        self.check_settled()
        names = self.shape.names
        nodes = tuple(names[node] for node, _ in placement)
        self.assign.append(
            Assign(
                job_id=job.id,
                node=nodes[0],
                slice_ids=tuple(item.id for item in slices),
                borrowed=held > c.team.guaranteed + _EPS,
                nodes=nodes if len(nodes) > 1 else (),
            )
        )

    def _try_preemption(self, c: _Candidate) -> bool:
        """Reclaim for a team under its guarantee, or preempt a lower class when allowed."""
        config = self.config
        job, team = c.job, c.team
        needs = c.minimum * c.unit
        held = self.ledger.team.get(job.team, 0.0)
        reclaim = config.reclaim and held + needs <= team.guaranteed + _EPS
        by_priority = config.preempt_by_priority and c.rank > 0
        if not (reclaim or by_priority):
            return False
        if self.preemptor is None:
            self.preemptor = Preemptor(
                self.index, self._holders(), now=self.now, min_run_time_s=config.min_run_time_s
            )
        claimed = self.preemptor.claim_soon(c.pools, job.team, c.minimum)
        victims: list[Holder] = []
        if claimed is None:
            guarantees = self.snapshot.teams

            def guaranteed(team: str) -> float:
                owner = guarantees.get(team)
                return owner.guaranteed if owner is not None else 0.0

            limit = config.reclaim_max_run_s
            protected = -math.inf if limit is None else self.now - limit

            def eligible(holder: Holder, held: float) -> bool:
                if (
                    reclaim
                    and holder.team != job.team
                    and held > guaranteed(holder.team) + _EPS
                    and holder.run.started_at >= protected
                ):
                    return True
                return by_priority and holder.rank < c.rank

            kept = self.ledger.kept()

            def team_may(team: str) -> bool:
                # Reclaim only takes from teams borrowing now; by class, any team may lose.
                borrowing = team != job.team and kept.get(team, 0.0) > guaranteed(team) + _EPS
                return by_priority or borrowing

            rule = (c.rank, ("r" if reclaim else "") + ("p" if by_priority else ""))
            choice = self.preemptor.choose(
                c.pools, job.team, c.minimum, eligible, kept, rule=rule, team_may=team_may
            )
            if choice is None:
                return False
            victims = choice.victims
        self.version += 1
        for victim in victims:
            why = "reclaim" if reclaim and victim.team != job.team else "priority"
            self.preempt.append(Preempt(victim.run.job.id, why, for_job_id=job.id))
            # Still held (and charged to its team and member) through its grace period.
            self.ledger.stop(victim.team, victim.units)
        self.ledger.add(job, needs)
        numbers: dict[str, float | str] = {
            "victims": len(victims),
            "grace_period_s": config.grace_period_s,
        }
        entry = self._wait(c, PendingCode.WAITING_FOR_PREEMPTION, numbers)
        entry.eta, entry.eta_known = self.now + config.grace_period_s, True
        return True

    def _wait_for_capacity(self, c: _Candidate) -> _Left:
        """Record a job that does not fit, and tell apart why when explaining."""
        if not self.config.explain:
            return self._wait(c, PendingCode.NOT_EXPLAINED, {})
        blocking = self._blocking_reservation(c)
        if blocking is not None:
            numbers: dict[str, float | str] = {"reserved_for": blocking.job_id}
            if blocking.at is not None:
                numbers["at"] = blocking.at
            return self._wait(c, PendingCode.WAITING_FOR_RESERVATION, numbers)
        start = max((self.start_largest.get(p, 0) for p in c.pools), default=0)
        # It fitted when the pass began and other teams' jobs, ahead in fair-share order,
        # took the room (the factors are filled in when explaining, as they end the pass).
        takers = self.index.takers
        team = c.job.team
        others = any(len(takers.get(p, ())) > (team in takers.get(p, ())) for p in c.pools)
        if start >= c.minimum and not c.job.request.multi_node and others and not self.fifo:
            return self._wait(c, PendingCode.FAIR_SHARE, self._no_fit_numbers(c))
        return self._wait(c, PendingCode.NO_FIT, self._no_fit_numbers(c))

    def _blocking_reservation(self, c: _Candidate) -> Reservation | None:
        team = c.job.team
        for reservation in self.reservations:
            for (pool, node), kept in reservation.by_node.items():
                if pool in c.pools and self.index.node_free(pool, team, node) + kept >= c.minimum:
                    return reservation
        return None

    def _no_fit_numbers(self, c: _Candidate) -> dict[str, float | str]:
        request = c.job.request
        return {
            "needs": c.minimum,
            "largest_free": 0,  # filled in when explaining, from the end of the pass
            "kind": request.profile or request.kind.value,
        }

    def _wait(self, c: _Candidate, code: PendingCode, numbers: Numbers) -> _Left:
        entry = _Left(c.job, code, numbers, c)  # numbers may be shared: copy before changing
        self.left.append(entry)
        return entry

    def check_settled(self) -> None:
        """With explanations off, stop considering jobs that can no longer change anything.

        Once no slice is free, only a job that may preempt can still lead to a decision. If
        nothing may preempt, the pass is settled; if only reclaim may, only the teams under
        their guarantee still matter, and the queue is narrowed to them (a team's jobs keep
        their relative order whichever other teams are in the queue).
        """
        if self.config.explain or any(self.index.pool_free_total.values()):
            return
        if any(r.set_aside for r in self.reservations):
            return  # a short job may still use what a reservation set aside
        if self.fifo or not (self.config.reclaim or self.config.preempt_by_priority):
            self.settled = True
            return
        if self.config.preempt_by_priority:
            return
        ledger = self.ledger.team
        self.under_guarantee = {
            t for t in self.under_guarantee if ledger.get(t, 0.0) < self._team(t).guaranteed - _EPS
        }
        if not self.under_guarantee:
            self.settled = True
        elif self.under_guarantee != self.narrowed:
            self.narrowed = set(self.under_guarantee)
            self.just_narrowed = True

    def narrow(self, group: list[_Candidate]) -> list[_Candidate]:
        """The candidates of a class that may still matter (all, unless narrowed)."""
        if not self.narrowed:
            return group
        keep = [c for c in group if c.job.team in self.narrowed]
        self.record_rest([c for c in group if c.job.team not in self.narrowed])
        return keep

    # -- 5. explain ----------------------------------------------------------------------------

    def decisions(self) -> Decisions:
        parked = sorted(self.parked, key=lambda e: (-self._rank(e.job.priority), age_key(e.job)))
        explain = self.config.explain
        estimator = Estimator(self.index, self.timeline, self.now) if explain else None
        pending: list[Pending] = []
        # Jobs alike in what explains them share one reason and estimate (a long queue has
        # many: same team, same request, same verdict).
        alike: dict[tuple[object, ...], tuple[Reason, float | None]] = {}
        same_numbers: dict[int, tuple[Numbers, PendingCode, str, int, object, str, _Known]]
        same_numbers = {}
        etas = self._etas
        for position, entry in enumerate([*self.left, *parked], start=1):
            c = entry.candidate
            if not explain:
                reason, eta = _bare_reason(entry.code), entry.eta
            elif c is None and not entry.eta_known:
                # Parked jobs: the reason is all there is, alike for alike numbers (and for
                # NO_MATCHING_SLICES the same request).
                what = _request_text(entry.job) if entry.code is NO_MATCHING else ""
                key: tuple[object, ...] = (entry.code, what, *entry.numbers.values())
                known = alike.get(key)
                if known is None:
                    known = alike[key] = self._explain(entry, estimator)
                reason, eta = known
            elif c is None or entry.eta_known or c.job.request.multi_node:
                reason, eta = self._explain(entry, estimator)
            else:
                # Jobs that took a shared verdict share its numbers object (shared only among
                # jobs of one team, request and verdict): one look-up by identity (checked)
                # instead of building the full key for each.
                numbers = entry.numbers
                code = entry.code
                job = c.job
                seen = same_numbers.get(id(numbers))
                if (
                    seen is not None
                    and seen[0] is numbers
                    and seen[1] is code
                    and seen[2] == job.team
                    and seen[3] == c.minimum
                    and seen[4] == c.pools
                    and (code is not MEMBER or seen[5] == job.user)
                ):
                    reason, eta = seen[6]
                    etas[entry.job.id] = eta
                    pending.append(Pending(entry.job.id, reason, position, eta))
                    continue
                user = c.job.user if code is PendingCode.MEMBER_LIMIT else ""
                team = c.job.team
                if code is PendingCode.NO_FIT and not any(p[0] is MPS for p in c.pools):
                    team = ""  # what is free, and when, is the same for every team
                key = (code, team, user, c.pools, c.minimum, *numbers.values())
                known = alike.get(key)
                if known is None:
                    known = alike[key] = self._explain(entry, estimator)
                same_numbers[id(numbers)] = (
                    numbers,
                    code,
                    job.team,
                    c.minimum,
                    c.pools,
                    job.user,
                    known,
                )
                reason, eta = known
            etas[entry.job.id] = eta
            pending.append(Pending(entry.job.id, reason, position, eta))
        return Decisions(
            assign=tuple(self.assign),
            preempt=tuple(self.preempt),
            pending=tuple(pending),
            fail=tuple(self.fail),
        )

    def _explain(self, entry: _Left, estimator: Estimator | None) -> tuple[Reason, float | None]:
        """The reason (with end-of-pass numbers) and estimated start of one pending job."""
        c = entry.candidate
        if c is not None and not entry.eta_known:
            numbers = entry.numbers = dict(entry.numbers)  # (shared with alike jobs)
            if "largest_free" in numbers:
                # Say what is free when the pass ends, not when the job was considered.
                numbers["largest_free"] = self._largest_free(c)
            if entry.code is PendingCode.FAIR_SHARE:
                numbers.update(self._fair_share_numbers(c.job.team))
            return _reason(entry), self._eta(entry, estimator)
        return _reason(entry), entry.eta if entry.eta_known else None

    def _fair_share_numbers(self, team: str) -> dict[str, float | str]:
        """The team's fair-share factor and the leading team's, as the pass ends."""
        if self._leader is None:
            others = self.placed_teams - {team} or self.placed_teams
            self._leader = leading_team(self.fair, others)
        name, factor = self._leader
        if name == team:
            name, factor = leading_team(self.fair, self.placed_teams - {team})
        return {
            "team_factor": round(self.fair.team_factor(team), 4),
            "leading_team": name,
            "leading_factor": round(factor, 4),
        }

    def _largest_free(self, c: _Candidate) -> int:
        key = (c.pools, c.job.team)
        found = self._largest_cache.get(key)
        if found is None:
            found = self._largest_cache[key] = self.index.largest_free(c.pools, c.job.team)
        return found

    def _eta(self, entry: _Left, estimator: Estimator | None) -> float | None:
        c = entry.candidate
        if c is None or estimator is None:
            return None
        code = entry.code
        if code in (PendingCode.BUDGET_EXHAUSTED, PendingCode.PRIORITY_NOT_ALLOWED):
            return None
        fit = estimator.earliest(c.pools, c.minimum, c.job.request.multi_node)
        if fit is None:
            return None
        if code in (PendingCode.QUOTA_LIMIT, PendingCode.MEMBER_LIMIT):
            room = self._quota_free_at(entry)
            return None if room is None else max(fit, room)
        # Behind a FIFO head or a reservation: not before the job it waits for.
        ahead = entry.numbers.get("blocked_by") or entry.numbers.get("reserved_for")
        if ahead is not None:
            before = self._etas.get(str(ahead))
            return None if before is None else max(fit, before)
        return fit

    def _quota_free_at(self, entry: _Left) -> float | None:
        """When enough of the team's (or user's) own jobs end for this one to fit its limit."""
        used = float(entry.numbers.get("used", 0.0))
        limit = float(entry.numbers.get("limit", 0.0))
        needs = float(entry.numbers.get("needs", 0.0))
        missing = used + needs - limit - _EPS
        if missing <= 0:
            return self.now
        job = entry.job
        user = job.user if entry.code is PendingCode.MEMBER_LIMIT else ""
        ends, freed = self._releases(job.team, user)
        at = bisect.bisect_left(freed, missing)
        return ends[at] if at < len(ends) and ends[at] != math.inf else None

    def _releases(self, team: str, user: str) -> tuple[list[float], list[float]]:
        """End times of a team's (or one member's) jobs, and the units freed by each time."""
        found = self._release_cache.get((team, user))
        if found is not None:
            return found
        if not self._by_team_ends:
            self._group_releases()
        releases = self._by_team_ends.get(team, [])
        if user:
            # Split the team's list by member in one sweep (it stays sorted), once per team.
            members: dict[str, list[tuple[float, float, str]]] = {}
            for item in releases:
                mine = members.get(item[2])
                if mine is None:
                    members[item[2]] = [item]
                else:
                    mine.append(item)
            for name, mine in members.items():
                self._release_cache[(team, name)] = _cumulative(mine)
            found = self._release_cache.get((team, user))
            if found is None:
                found = self._release_cache[(team, user)] = ([], [])
            return found
        found = self._release_cache[(team, user)] = _cumulative(releases)
        return found

    def _group_releases(self) -> None:
        """Every holding's (end, units, user) per team, sorted by end once (a member's list
        is the team's, filtered, so it stays sorted)."""
        by_team = self._by_team_ends
        inf = math.inf
        for run, _, units, end in self.held:
            job = run.job
            release = (inf if end is None else end, units, job.user)
            found = by_team.get(job.team)
            if found is None:
                by_team[job.team] = [release]
            else:
                found.append(release)
        for job, units, end in self.placed_ends:
            by_team.setdefault(job.team, []).append((inf if end is None else end, units, job.user))
        by_end = itemgetter(0)  # (equal ends free together: their order does not matter)
        for releases in by_team.values():
            releases.sort(key=by_end)


def _cumulative(releases: list[tuple[float, float, str]]) -> tuple[list[float], list[float]]:
    """End times, and the units freed by each of them, of releases sorted by end."""
    return [end for end, _, _ in releases], list(itertools.accumulate(u for _, u, _ in releases))


class _Ordered:
    """The candidates of one class in order: a fair queue, or a fixed list (FIFO)."""

    def __init__(self, group: Sequence[_Candidate], queue: FairQueue[_Candidate] | None) -> None:
        self._group = group
        self._queue = queue
        self._yielded = 0

    def __iter__(self) -> Iterator[_Candidate]:
        if self._queue is not None:
            return iter(self._queue)
        return self._fixed()

    def _fixed(self) -> Iterator[_Candidate]:
        for c in self._group:
            self._yielded += 1
            yield c

    def keep_teams(self, teams: set[str]) -> list[_Candidate]:
        """Keep only ``teams`` in the queue; the candidates dropped."""
        if self._queue is not None:
            return self._queue.keep_teams(teams)
        rest = self.rest()
        self._group = [*self._group[: self._yielded], *(c for c in rest if c.job.team in teams)]
        return [c for c in rest if c.job.team not in teams]

    def rest(self) -> list[_Candidate]:
        """The candidates not yielded yet."""
        if self._queue is not None:
            return self._queue.rest()
        return list(self._group[self._yielded :])


# --- reasons ---------------------------------------------------------------------------------

_BARE: dict[PendingCode, Reason] = {}
NO_MATCHING = PendingCode.NO_MATCHING_SLICES
MEMBER = PendingCode.MEMBER_LIMIT
MPS = SliceKind.MPS


def _bare_reason(code: PendingCode) -> Reason:
    reason = _BARE.get(code)
    if reason is None:
        reason = _BARE[code] = Reason(code, "")
    return reason


def _fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"


def _duration(seconds: float | str) -> str:
    """A span for people: 40 s, 12 min, 3.5 h, 2.1 days."""
    if isinstance(seconds, str):
        return seconds
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _reason(entry: _Left) -> Reason:
    n = entry.numbers
    code = entry.code
    job = entry.job
    if code is PendingCode.QUOTA_LIMIT:
        text = (
            f"team uses {_fmt(n['used'])} of {_fmt(n['limit'])} units, job needs {_fmt(n['needs'])}"
        )
    elif code is PendingCode.MEMBER_LIMIT:
        text = (
            f"{job.user} uses {_fmt(n['used'])} of the {_fmt(n['limit'])} units a member may "
            f"hold, job needs {_fmt(n['needs'])}"
        )
    elif code is PendingCode.BUDGET_EXHAUSTED:
        text = f"team used {_fmt(n['used_gpu_hours'])} of its {_fmt(n['budget'])} GPU-hours"
    elif code is PendingCode.NO_FIT:
        text = f"needs {n['needs']} x {n['kind']}, at most {n['largest_free']} free on any node"
    elif code is PendingCode.NO_MATCHING_SLICES:
        what = _request_text(job)
        if n["largest_node"]:
            text = f"no node has {n['needs']} x {what}; the largest has {n['largest_node']}"
        else:
            text = f"the cluster has no {what} slices"
    elif code is PendingCode.DEPENDENCY:
        text = f"waiting for dependency {n['waiting_for']}"
    elif code is PendingCode.PRIORITY_NOT_ALLOWED:
        text = f"class {n['priority']!r} is above the team's highest allowed class {n['max_priority']!r}"
    elif code is PendingCode.RESERVED:
        in_s = n.get("in_s")
        when = "when running jobs end" if in_s is None else f"in about {_duration(in_s)}"
        text = f"holds the reservation: starts {when}"
    elif code is PendingCode.WAITING_FOR_RESERVATION:
        if "reserved_for" in n:
            text = f"would delay the reservation of job {n['reserved_for']}"
        else:
            text = f"behind job {n['blocked_by']} in submit order"
    elif code is PendingCode.WAITING_FOR_PREEMPTION:
        text = f"capacity is being freed ({n['victims']} new victims, grace {_fmt(n['grace_period_s'])} s)"
    elif code is PendingCode.FAIR_SHARE:
        text = (
            f"jobs of teams further below their fair share came first (team factor "
            f"{_fmt(n['team_factor'])}, leading team {n['leading_team']} "
            f"{_fmt(n['leading_factor'])}); at most {n['largest_free']} free on any node now"
        )
    else:
        text = ""
    return Reason(code, text, MappingProxyType(dict(n)))


def _request_text(job: Job) -> str:
    request = job.request
    what = request.profile if request.profile else request.kind.value
    return f"{request.model} {what}" if request.model else what

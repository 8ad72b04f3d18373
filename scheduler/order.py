"""The order in which one pass considers pending jobs.

FAIRSHARE: priority class first (highest first). Inside a class, a two-level fair tree in the
spirit of Slurm's Fair Tree: the team against its sibling teams, then the user against team
mates, then age. Each level ranks by *factor + aging*:

    factor F = 2 ** (-E / fair)        in (0, 1]; 1 = nothing used, 0.5 = exactly its share
    E        = billed units held now + history_weight * decayed_rate(decayed usage)
    fair     = team:  weight / sum(weights of teams with pending work) * max(capacity, sum E)
               user:  max(team fair, team E) / users of the team with pending work
    key      = F + aging_per_hour * hours the candidate job has waited

The order is *dynamic*: each time a job is placed its team's and user's E grow at once, so
within one pass the next free GPU goes to whoever is then furthest below its share (water
filling), not to whoever was lowest when the pass began.

``FairShareRules`` are the portal's policy as the pass (``scheduler.core``) asks for it: each
class in two rounds (jobs within their team's guarantee first, then the rest), each round
one ``FairQueue``; a job that fits nowhere preempts when a rule lets it, else reserves.
Without preemption by class (the default) the rounds within guarantees of all classes go
before the borrowing rounds, as reclaim would settle it anyway (``FairShareRules.rounds``).
The FIFO baselines answer the same questions in ``scheduler.baselines``.

Aging: F lies in (0, 1], so a job that has waited 2 / aging_per_hour hours longer than
another job of its class and round (1,000 h with the default 0.002) is considered before
it, whatever the teams' usage. That is long on purpose: strong aging turns a long queue into
FIFO and undoes fair share. The bound a user can rely on is ``max_wait_s``: jobs queued that
long go first, before every class and round, oldest first, each with a reservation of its own
(``FairShareRules.rounds``; docs/scheduling.md#starvation); one that would borrow goes after
the work within guarantees, unless ``preempt_by_priority``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from scheduler.cluster import Pool
from scheduler.config import Cache, SchedulerConfig
from scheduler.model import Job, Team
from scheduler.quota import EPS, guarantee_figures
from scheduler.units import decayed_rate

if TYPE_CHECKING:
    from scheduler.core import Cycle

AgeKey = tuple[float, float, str]


@dataclass(slots=True, eq=False)
class Candidate:
    """A pending job as one pass considers it (made in step 2, nominate). Each is its own:
    two candidates are equal only if they are the same object (no comparison field by
    field)."""

    job: Job
    team: Team
    rank: int  # priority class rank (0 = lowest)
    pools: tuple[Pool, ...]
    unit: float  # units of one slice (the smallest among its pools), for quota checks
    minimum: int
    count: int
    # What decides whether it finds room, besides the state of the pass (the verdict key,
    # see ``scheduler.memo``).
    shape: tuple[object, ...]
    age: AgeKey  # ``age_key(job)``, in submit order
    least: float  # units of its smallest request (``minimum * unit``): what quota checks add


# The units of a candidate's smallest request (``Candidate.least``).
least_units: Callable[[Candidate], float] = attrgetter("least")


class SubmitOrdered(list[Candidate]):
    """Candidates known to be in submit order (by ``Candidate.age``): a queue the snapshot
    promises in that order (``Snapshot.pending_in_submit_order``), or a part of one taken in
    its order. A fair queue built over it takes each user's jobs as they come instead of
    sorting them (``FairQueue``'s ``in_order``)."""

    __slots__ = ()


def like(jobs: Sequence[Candidate], items: Iterable[Candidate] = ()) -> list[Candidate]:
    """A new list of ``items``, marked ``SubmitOrdered`` when ``jobs`` is (for a part of
    ``jobs`` taken in its order)."""
    return SubmitOrdered(items) if isinstance(jobs, SubmitOrdered) else list(items)


# A candidate's submit order as a sort key (``Candidate.age``, ``age_key`` of its job).
by_age: Callable[[Candidate], AgeKey] = attrgetter("age")


def _queued(c: Candidate) -> float:
    return c.age[0]


def age_key(job: Job) -> AgeKey:
    """Submit order: when the job started queueing (kept across requeues), then its id."""
    queued = job.queued_since if job.queued_since is not None else job.submitted_at
    return (queued, job.submitted_at, job.id)


@dataclass(slots=True)
class Journal:
    """What one pass did to the fair-share standing, kept when the pass explains, for
    ``scheduler.standing`` to report: E as the pass began, every job in the order the fair
    queues yielded it, and each charge and each round at its place in that order (the
    number of jobs yielded before it). Appending is all the pass does with it."""

    team_e: dict[str, float]  # E as the pass began
    user_e: dict[tuple[str, str], float]
    held: dict[str, float]  # GPU units held as the pass began (what quota counts)
    user_held: dict[tuple[str, str], float]
    history_per_unit: float
    # (aging boost, age key, candidate), as the queues yielded them.
    yielded: list[_Entry[Candidate]] = field(default_factory=list)
    # (place, team, user, billed units): FairShare.charge's arguments.
    charges: list[tuple[int, str, str, float]] = field(default_factory=list)
    # (place, class rank, first round: within the guarantees), one per queue.
    rounds: list[tuple[int, int, bool]] = field(default_factory=list)


@dataclass(slots=True)
class FairShare:
    """The fair-share standing of teams and users during one pass (E grows as jobs land)."""

    team_e: dict[str, float]
    team_fair: dict[str, float]
    user_e: dict[tuple[str, str], float]
    user_fair: dict[tuple[str, str], float]
    # Factors computed since the last charge of their team or user (``Cache.FACTORS``).
    remember: bool = True
    _team_f: dict[str, float] = field(default_factory=dict)
    _user_f: dict[tuple[str, str], float] = field(default_factory=dict)
    scale: float = 0.0  # what the teams' fair shares divide: max(capacity, sum of their E)
    journal: Journal | None = None  # kept when the pass explains (``scheduler.standing``)

    def team_factor(self, team: str) -> float:
        found = self._team_f.get(team)
        if found is None:
            found = _factor(self.team_e.get(team, 0.0), self.team_fair.get(team, 0.0))
            if self.remember:
                self._team_f[team] = found
        return found

    def user_factor(self, team: str, user: str) -> float:
        key = (team, user)
        found = self._user_f.get(key)
        if found is None:
            found = _factor(self.user_e.get(key, 0.0), self.user_fair.get(key, 0.0))
            if self.remember:
                self._user_f[key] = found
        return found

    def charge(self, team: str, user: str, billed: float) -> None:
        key = (team, user)
        self.team_e[team] = self.team_e.get(team, 0.0) + billed
        self.user_e[key] = self.user_e.get(key, 0.0) + billed
        self._team_f.pop(team, None)
        self._user_f.pop(key, None)
        journal = self.journal
        if journal is not None:
            journal.charges.append((len(journal.yielded), team, user, billed))


def _factor(e: float, fair: float) -> float:
    if fair <= 0:
        return 0.0 if e > 0 else 1.0
    return math.pow(2.0, -e / fair)


def fair_share(
    *,
    teams: Mapping[str, Team],
    active: Mapping[str, set[str]],
    team_held: Mapping[str, float],
    user_held: Mapping[tuple[str, str], float],
    user_usage: Mapping[tuple[str, str], float],
    history_per_unit: float,
    capacity: float,
    remember: bool = True,
) -> FairShare:
    """Fair-share standing at the start of a pass.

    ``active``: team -> users with pending work. ``history_per_unit`` turns decayed unit-seconds
    into units (history_weight * ln 2 / half-life).
    """
    team_e: dict[str, float] = {}
    for name in set(team_held) | set(active):
        team = teams.get(name)
        usage = team.usage if team is not None else 0.0
        team_e[name] = team_held.get(name, 0.0) + history_per_unit * usage
    user_e: dict[tuple[str, str], float] = {}
    for key in set(user_held) | {(t, u) for t, users in active.items() for u in users}:
        user_e[key] = user_held.get(key, 0.0) + history_per_unit * user_usage.get(key, 0.0)
    weights = {name: _weight(teams, name) for name in active}
    total_weight = sum(weights.values())
    scale = max(capacity, sum(team_e[name] for name in active))
    team_fair: dict[str, float] = {}
    user_fair: dict[tuple[str, str], float] = {}
    for name, users in active.items():
        fair = scale * weights[name] / total_weight if total_weight > 0 else 0.0
        team_fair[name] = fair
        per_user = max(fair, team_e[name]) / len(users)
        for user in users:
            user_fair[(name, user)] = per_user
    return FairShare(team_e, team_fair, user_e, user_fair, remember, scale=scale)


def _weight(teams: Mapping[str, Team], name: str) -> float:
    team = teams.get(name)
    return max(team.weight, 0.0) if team is not None else 1.0


T = TypeVar("T")

# (aging boost, age key, item): a user's queue is in age order, so its head is its oldest.
_Entry = tuple[float, AgeKey, T]


@dataclass(slots=True)
class _UserQueue:
    name: str
    jobs: deque[Candidate]  # oldest first


@dataclass(slots=True)
class _TeamQueue:
    name: str
    users: dict[str, _UserQueue]
    heap: list[tuple[float, AgeKey, str]] = field(default_factory=list)


class FairQueue:
    """The candidates of one round, yielded in fair-tree order.

    Iterating yields one candidate at a time; the caller charges a placed job to ``fair``
    before asking for the next one, and the keys of that team and user are recomputed then.
    A job's age boost is worked out only when it heads its user's queue.
    """

    def __init__(
        self,
        candidates: Iterable[Candidate],
        fair: FairShare,
        *,
        now: float,
        aging_per_hour: float,
        yielded: list[_Entry[Candidate]] | None = None,
        in_order: bool = False,
    ) -> None:
        self._fair = fair
        self._yielded = yielded  # each entry as it is yielded, when given (a ``Journal``)
        self._now = now
        self._aging = aging_per_hour / 3600.0
        teams: dict[str, _TeamQueue] = {}
        for c in candidates:  # (this runs once per pending job and round)
            job = c.job
            team = teams.get(job.team)
            if team is None:
                team = teams[job.team] = _TeamQueue(job.team, {})
            user = team.users.get(job.user)
            if user is None:
                user = team.users[job.user] = _UserQueue(job.user, deque())
            user.jobs.append(c)
        # Each user's jobs oldest first (age keys end with the job id: no two are equal), as
        # they came when the candidates are in submit order.
        if not in_order:
            for team in teams.values():
                for user in team.users.values():
                    user.jobs = deque(sorted(user.jobs, key=by_age))
        self._teams = teams
        self._heap: list[tuple[float, AgeKey, str]] = []
        for team in teams.values():
            for user in team.users.values():
                team.heap.append(self._user_entry(team.name, user))
            heapq.heapify(team.heap)
            self._heap.append(self._team_entry(team))
        heapq.heapify(self._heap)

    def _user_entry(self, team: str, user: _UserQueue) -> tuple[float, AgeKey, str]:
        head = user.jobs[0]
        factor = self._fair.user_factor(team, user.name)
        return (-(factor + age_boost(self._aging, self._now, head)), head.age, user.name)

    def _team_entry(self, team: _TeamQueue) -> tuple[float, AgeKey, str]:
        head = team.users[team.heap[0][2]].jobs[0]
        factor = self._fair.team_factor(team.name)
        return (-(factor + age_boost(self._aging, self._now, head)), head.age, team.name)

    def __iter__(self) -> Iterator[Candidate]:
        heap = self._heap
        teams = self._teams
        fair = self._fair
        now, aging = self._now, self._aging
        # The factor caches, read directly: a factor is recomputed only after a charge.
        team_f, user_f = fair._team_f, fair._user_f
        heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
        yielded = self._yielded
        stays: _TeamQueue | None = None  # the team that is still first after its turn
        while stays is not None or heap:
            if stays is None:
                team = teams[heappop(heap)[2]]
            else:
                team, stays = stays, None
            users = team.heap
            user = team.users[users[0][2]]
            jobs = user.jobs
            c = jobs.popleft()
            if yielded is not None:
                yielded.append((age_boost(aging, now, c), c.age, c))
            yield c
            # The caller has charged the job if it was placed: re-rank its user and team
            # (one heap operation each). Team mates' keys depend only on their own E.
            # (``age_boost`` written out below: this loop runs for every job a pass considers)
            name = team.name
            if jobs:
                key = jobs[0].age
                queued = key[0]
                boost = aging * (now - queued) if now > queued else 0.0
                factor = user_f.get((name, user.name))
                if factor is None:
                    factor = fair.user_factor(name, user.name)
                heapreplace(users, (-(factor + boost), key, user.name))
            else:
                heappop(users)
            if users and name in self._teams:  # (keep_teams may have dropped it)
                key = team.users[users[0][2]].jobs[0].age
                queued = key[0]
                boost = aging * (now - queued) if now > queued else 0.0
                factor = team_f.get(name)
                if factor is None:
                    factor = fair.team_factor(name)
                rank = (-(factor + boost), key, name)
                # Still ahead of every other team (keys never tie: they end with a job's age
                # key): its next job comes next, without a push and a pop.
                if heap and heap[0] < rank:
                    heappush(heap, rank)
                else:
                    stays = team

    def keep_teams(self, teams: Set[str]) -> list[Candidate]:
        """Drop every team but ``teams`` from the queue; the candidates dropped.

        The kept teams' jobs come in the same relative order as before: a team's keys depend
        only on its own standing and its own jobs.
        """
        dropped = _jobs_of(team for name, team in self._teams.items() if name not in teams)
        self._teams = {name: team for name, team in self._teams.items() if name in teams}
        self._heap[:] = [entry for entry in self._heap if entry[2] in teams]
        heapq.heapify(self._heap)
        return dropped

    def rest(self) -> list[Candidate]:
        """The candidates not yielded yet (in no particular order)."""
        return _jobs_of(self._teams.values())

    def team_rest(self, name: str) -> list[Candidate]:
        """Team ``name``'s candidates not yielded yet (in no particular order)."""
        team = self._teams.get(name)
        return [] if team is None else _jobs_of([team])


def _jobs_of(teams: Iterable[_TeamQueue]) -> list[Candidate]:
    """The jobs still in ``teams``' queues, a user's queue at a time (``list +=`` of a deque,
    not a step per job)."""
    jobs: list[Candidate] = []
    for team in teams:
        for user in team.users.values():
            jobs += user.jobs
    return jobs


def leading_teams(fair: FairShare, teams: Iterable[str], count: int) -> list[tuple[str, float]]:
    """The ``count`` teams with the highest factors among ``teams`` (ties by name), highest
    first, with their factors."""
    ranked = sorted((-fair.team_factor(name), name) for name in teams)
    return [(name, -negative) for negative, name in ranked[:count]]


class Ordered:
    """The candidates of one round in order: a fair queue, or a fixed list (submit order)."""

    def __init__(
        self,
        group: Sequence[Candidate],
        queue: FairQueue | None,
        *,
        record: Callable[[Candidate], None] | None = None,
    ) -> None:
        self._group = group
        self._queue = queue
        self._yielded = 0
        self._record = record  # told each candidate of a fixed list as it is yielded

    def __iter__(self) -> Iterator[Candidate]:
        if self._queue is not None:
            return iter(self._queue)
        return self._fixed()

    def _fixed(self) -> Iterator[Candidate]:
        # By position in ``self._group`` as it is at each step: ``keep_teams`` replaces the
        # list mid-round (keeping what was yielded), and the jobs it drops must not come.
        # (Not by its length: a queue in submit order nominates its jobs only as far as it is
        # read, ``nominate.InSubmitOrder``, and its length would nominate them all.)
        record = self._record
        while True:
            try:
                c = self._group[self._yielded]
            except IndexError:
                return
            self._yielded += 1
            if record is not None:
                record(c)
            yield c

    def keep_teams(self, teams: Set[str]) -> list[Candidate]:
        """Keep only ``teams`` in the queue; the candidates dropped."""
        if self._queue is not None:
            return self._queue.keep_teams(teams)
        rest = self.rest()
        self._group = [*self._group[: self._yielded], *(c for c in rest if c.job.team in teams)]
        return [c for c in rest if c.job.team not in teams]

    def rest(self) -> list[Candidate]:
        """The candidates not yielded yet."""
        if self._queue is not None:
            return self._queue.rest()
        return list(self._group[self._yielded :])

    def team_rest(self, name: str) -> list[Candidate]:
        """Team ``name``'s candidates not yielded yet."""
        if self._queue is not None:
            return self._queue.team_rest(name)
        return [c for c in self._group[self._yielded :] if c.job.team == name]


# --- the rules of the portal's policy ---------------------------------------------------------


class FairShareRules:
    """The portal's policy: priority classes, highest first; inside a class two rounds, the
    jobs within their team's guarantee first, each in fair-share order; a job that fits
    nowhere preempts when a rule lets it, else gets a backfill reservation. Jobs past the
    maximum wait go before the jobs that borrow (see ``rounds``)."""

    classes = True
    fair_order = True
    submit_order = False

    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self.reclaim = config.reclaim
        self.by_priority = config.preempt_by_priority

    def rounds(
        self, cycle: Cycle, candidates: Sequence[Candidate]
    ) -> Iterator[Sequence[Candidate]]:
        """The rounds, in the order the policy's preemption rules would settle them anyway.

        Without preemption by class (the default), work that keeps its team within its
        guarantee goes first, whatever its class, since reclaim would take borrowed capacity
        of any class back for it; then the jobs past ``max_wait_s``, oldest first, each with
        a reservation; then the borrowing rounds, class by class. (A starving job that keeps
        its team within its guarantee goes first of all.) So capacity a reclaim frees goes to
        the job that reclaimed it, and a starving job that borrows is reclaimable like any
        borrowed work (``scheduler.preempt``) without a loop: requeued, it no longer goes
        before the job that took its room back.

        With ``preempt_by_priority`` a class takes room from the classes below it, work within
        a guarantee included: classes go first, and starving jobs before them all (and, once
        started, are no victims at all).
        """
        # The jobs queued by ``since`` (now less ``max_wait_s``), and the others by class,
        # each in the queue's order. (Every class present keeps its group, though only
        # starving jobs may be of it: ``Cycle.nominate`` found the classes, and each team's
        # users with pending work for the standing, in its walk over the queue.)
        max_wait_s = self._config.max_wait_s
        since = None if max_wait_s is None else cycle.now - max_wait_s
        starving: list[Candidate]
        in_order = cycle.snapshot.pending_in_submit_order
        if since is None:
            starving, others = [], candidates
        elif in_order:
            # The candidates are in the queue's order, so the jobs queued by ``since`` come
            # first.
            first = bisect.bisect_right(candidates, since, key=_queued)
            starving, others = list(candidates[:first]), candidates[first:]
        else:
            starving = [c for c in candidates if c.age[0] <= since]
            others = [c for c in candidates if c.age[0] > since]
        starving.sort(key=by_age)  # oldest first
        group = SubmitOrdered if in_order else list
        by_rank: dict[int, list[Candidate]] = {rank: group() for rank in cycle.pending_ranks}
        if len(by_rank) == 1:
            by_rank[next(iter(by_rank))] = group(others)
        else:
            for c in others:
                found = by_rank.get(c.rank)
                if found is None:  # (a class the shell's index left out: a false index)
                    found = by_rank[c.rank] = group()
                found.append(c)
        cycle.fair = self._standing(cycle, cycle.pending_users)
        ranks = sorted(by_rank, reverse=True)
        if self.by_priority:
            if starving:
                yield from self._starving(cycle, starving)
            for rank in ranks:
                yield from self._phases(cycle, by_rank[rank])
            return
        borrowing: list[Candidate] = []
        if starving:
            # Starving jobs within their team's guarantee first (a job the round finds
            # borrowing after all joins the starving jobs that borrow).
            inside, borrowing = self._split(cycle, starving)
            if borrowing:
                cycle.reserve_early(borrowing)
            if inside:
                cycle.first_round = True
                yield from self._starving(cycle, inside)
                cycle.first_round = False
            borrowing += cycle.deferred
            borrowing.sort(key=by_age)
            cycle.deferred = []
        rest: dict[int, list[Candidate]] = {}
        for rank in ranks:
            rest[rank] = yield from self._first_round(cycle, by_rank[rank])
        if borrowing:
            yield from self._starving(cycle, borrowing)
            cycle.let_go_early()
        for rank in ranks:
            yield rest[rank]

    def _starving(self, cycle: Cycle, jobs: list[Candidate]) -> Iterator[list[Candidate]]:
        """One round of jobs past the maximum wait: oldest first, each with a reservation."""
        cycle.starving = True
        yield jobs
        cycle.starving = False

    @staticmethod
    def _split(cycle: Cycle, group: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """The jobs of ``group`` that keep their team within its guarantee, as of now, and
        the others (each in ``group``'s order)."""
        # (the teams of every pending job: a superset of the group's, checked team by team)
        bounds = guarantee_figures(cycle.pending_teams, cycle.ledger.team, cycle.teams)
        if not bounds:
            return [], like(group, group)
        inside, rest = like(group), like(group)
        for c in group:
            found = bounds.get(c.job.team)
            if found is not None and found[0] + c.least <= found[1] + EPS:
                inside.append(c)
            else:
                rest.append(c)
        return inside, rest

    def _standing(self, cycle: Cycle, active: dict[str, set[str]]) -> FairShare:
        """The fair-share standing of ``active``: the teams with pending work, each with its
        users that have some."""
        config = self._config
        history_per_unit = config.history_weight * decayed_rate(1.0, config.usage_half_life_s)
        ledger = cycle.ledger
        fair = fair_share(
            teams=cycle.snapshot.teams,
            active=active,
            team_held=ledger.team_billed,
            user_held=ledger.user_billed,
            user_usage=cycle.snapshot.user_usage,
            history_per_unit=history_per_unit,
            capacity=cycle.shape.total_units,
            remember=Cache.FACTORS in config.caches,
        )
        if config.explain:
            # For the pass's fair-share report (``scheduler.standing``): the standing as it
            # begins (a few entries per team and user, copied once).
            fair.journal = Journal(
                team_e=dict(fair.team_e),
                user_e=dict(fair.user_e),
                held=dict(ledger.team),
                user_held=dict(ledger.user),
                history_per_unit=history_per_unit,
            )
        return fair

    def _phases(self, cycle: Cycle, group: list[Candidate]) -> Iterator[list[Candidate]]:
        """One class in two rounds: first the jobs that stay within their team's guarantee,
        then everything else. So freed capacity goes to a team under its guarantee before
        any team borrows it; a job the first round finds borrowing after all (its team got
        capacity meanwhile) moves to the second round."""
        yield (yield from self._first_round(cycle, group))

    def _first_round(
        self, cycle: Cycle, group: list[Candidate]
    ) -> Generator[list[Candidate], None, list[Candidate]]:
        """The round of ``group``'s jobs that keep their team within its guarantee; returns
        the rest, with the jobs that round found borrowing after all (``cycle.deferred``)."""
        inside, rest = self._split(cycle, group)
        if inside:
            cycle.first_round = True
            yield inside
            cycle.first_round = False
        if cycle.deferred:
            rest = [*rest, *cycle.deferred]  # (no longer in submit order)
            cycle.deferred = []
        return rest

    def order(self, cycle: Cycle, jobs: Sequence[Candidate]) -> Ordered:
        journal = cycle.fair.journal
        if cycle.starving:  # (already oldest first)
            if journal is None:
                return Ordered(jobs, None)
            return Ordered(jobs, None, record=self._journal_starving(cycle, journal))
        if journal is not None and jobs:
            journal.rounds.append((len(journal.yielded), jobs[0].rank, cycle.first_round))
        queue = FairQueue(
            jobs,
            cycle.fair,
            now=cycle.now,
            aging_per_hour=self._config.aging_per_hour,
            yielded=journal.yielded if journal is not None else None,
            in_order=isinstance(jobs, SubmitOrdered),
        )
        return Ordered(jobs, queue)

    def _journal_starving(self, cycle: Cycle, journal: Journal) -> Callable[[Candidate], None]:
        """Records the jobs past the maximum wait in the journal as they are yielded, as a
        fair queue records its own (each in its class, in the first round when its round is
        the starving jobs within their guarantees, with the age boost it has), so the
        standing's report has their parts too."""
        aging = self._config.aging_per_hour / 3600.0
        now = cycle.now
        within = cycle.first_round

        def record(c: Candidate) -> None:
            journal.rounds.append((len(journal.yielded), c.rank, within))
            journal.yielded.append((age_boost(aging, now, c), c.age, c))

        return record

    def blocked(self, cycle: Cycle, c: Candidate) -> bool:
        if cycle.preempt_for(c):
            return True
        if cycle.starving:
            return cycle.reserve(c, starving=True)
        return self._config.backfill and cycle.reserve(c)


def age_boost(aging_per_s: float, now: float, c: Candidate) -> float:
    """What ``c``'s wait adds to its team's and user's keys (``aging_per_hour``, per second)."""
    queued = c.age[0]
    return aging_per_s * (now - queued) if now > queued else 0.0


def queued_at(job: Job) -> float:
    """When ``job`` started queueing (kept across requeues), else when it was submitted."""
    return job.queued_since if job.queued_since is not None else job.submitted_at

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

The core runs each class in two rounds (jobs within their team's guarantee first, then the
rest), each round one ``FairQueue``.

Starvation bound: F lies in (0, 1], so a job that has waited 2 / aging_per_hour hours longer
than another job of its class and round (1,000 h, about six weeks, with the default 0.002)
is considered before it, whatever the teams' usage (one hour-budget of the bound for the
team level, one for the user level). Once a job leads its class it gets the backfill
reservation, so it starts at the latest when the running jobs on the reserved slices reach
their time limits, unless jobs of a higher class keep arriving or work within other teams'
guarantees (bounded by those guarantees) takes the capacity. The bound is long on purpose:
strong aging turns a long queue into FIFO and undoes fair share (a job waits longest when
its team is above its share, which is fair).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Generic, TypeVar

from scheduler.model import Job, Team

AgeKey = tuple[float, float, str]


def age_key(job: Job) -> AgeKey:
    """Submit order: when the job started queueing (kept across requeues), then its id."""
    queued = job.queued_since if job.queued_since is not None else job.submitted_at
    return (queued, job.submitted_at, job.id)


@dataclass(slots=True)
class FairShare:
    """The fair-share standing of teams and users during one pass (E grows as jobs land)."""

    team_e: dict[str, float]
    team_fair: dict[str, float]
    user_e: dict[tuple[str, str], float]
    user_fair: dict[tuple[str, str], float]
    _team_f: dict[str, float] = field(default_factory=dict)
    _user_f: dict[tuple[str, str], float] = field(default_factory=dict)

    def team_factor(self, team: str) -> float:
        found = self._team_f.get(team)
        if found is None:
            found = _factor(self.team_e.get(team, 0.0), self.team_fair.get(team, 0.0))
            self._team_f[team] = found
        return found

    def user_factor(self, team: str, user: str) -> float:
        key = (team, user)
        found = self._user_f.get(key)
        if found is None:
            found = _factor(self.user_e.get(key, 0.0), self.user_fair.get(key, 0.0))
            self._user_f[key] = found
        return found

    def charge(self, team: str, user: str, billed: float) -> None:
        key = (team, user)
        self.team_e[team] = self.team_e.get(team, 0.0) + billed
        self.user_e[key] = self.user_e.get(key, 0.0) + billed
        self._team_f.pop(team, None)
        self._user_f.pop(key, None)


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
    return FairShare(team_e, team_fair, user_e, user_fair)


def _weight(teams: Mapping[str, Team], name: str) -> float:
    team = teams.get(name)
    return max(team.weight, 0.0) if team is not None else 1.0


T = TypeVar("T")

# (aging boost, age key, item): a user's queue is in age order, so its head is its oldest.
_Entry = tuple[float, AgeKey, T]


@dataclass(slots=True)
class _UserQueue(Generic[T]):
    name: str
    jobs: deque[_Entry[T]]


@dataclass(slots=True)
class _TeamQueue(Generic[T]):
    name: str
    users: dict[str, _UserQueue[T]]
    heap: list[tuple[float, AgeKey, str]] = field(default_factory=list)


class FairQueue(Generic[T]):
    """The jobs of one priority class, yielded in fair-tree order.

    ``items`` pairs each job with what the caller wants back for it. Iterating yields one item
    at a time; the caller charges a placed job to ``fair`` before asking for the next one, and
    the keys of that team and user are recomputed then.
    """

    def __init__(
        self,
        items: Iterable[tuple[Job, T]],
        fair: FairShare,
        *,
        now: float,
        aging_per_hour: float,
    ) -> None:
        self._fair = fair
        aging = aging_per_hour / 3600.0
        entries: list[tuple[AgeKey, str, str, float, T]] = []
        append = entries.append
        for job, item in items:  # (age_key inlined: this runs once per pending job)
            submitted = job.submitted_at
            queued = job.queued_since
            if queued is None:
                queued = submitted
            boost = aging * (now - queued) if now > queued else 0.0
            append(((queued, submitted, job.id), job.team, job.user, boost, item))
        entries.sort(key=itemgetter(0))
        teams: dict[str, _TeamQueue[T]] = {}
        for key, team_name, user_name, boost, item in entries:
            team = teams.get(team_name)
            if team is None:
                team = teams[team_name] = _TeamQueue(team_name, {})
            user = team.users.get(user_name)
            if user is None:
                user = team.users[user_name] = _UserQueue(user_name, deque())
            user.jobs.append((boost, key, item))
        self._teams = teams
        self._heap: list[tuple[float, AgeKey, str]] = []
        for team in teams.values():
            for user in team.users.values():
                team.heap.append(self._user_entry(team.name, user))
            heapq.heapify(team.heap)
            self._heap.append(self._team_entry(team))
        heapq.heapify(self._heap)

    def _user_entry(self, team: str, user: _UserQueue[T]) -> tuple[float, AgeKey, str]:
        boost, key, _ = user.jobs[0]
        return (-(self._fair.user_factor(team, user.name) + boost), key, user.name)

    def _team_entry(self, team: _TeamQueue[T]) -> tuple[float, AgeKey, str]:
        boost, key, _ = team.users[team.heap[0][2]].jobs[0]
        return (-(self._fair.team_factor(team.name) + boost), key, team.name)

    def __iter__(self) -> Iterator[T]:
        heap = self._heap
        teams = self._teams
        fair = self._fair
        # The factor caches, read directly: a factor is recomputed only after a charge.
        team_f, user_f = fair._team_f, fair._user_f
        heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
        while heap:
            team = teams[heappop(heap)[2]]
            users = team.heap
            user = team.users[users[0][2]]
            jobs = user.jobs
            yield jobs.popleft()[2]
            # The caller has charged the job if it was placed: re-rank its user and team
            # (one heap operation each). Team mates' keys depend only on their own E.
            name = team.name
            if jobs:
                boost, key, _ = jobs[0]
                factor = user_f.get((name, user.name))
                if factor is None:
                    factor = fair.user_factor(name, user.name)
                heapreplace(users, (-(factor + boost), key, user.name))
            else:
                heappop(users)
            if users and name in self._teams:  # (keep_teams may have dropped it)
                boost, key, _ = team.users[users[0][2]].jobs[0]
                factor = team_f.get(name)
                if factor is None:
                    factor = fair.team_factor(name)
                heappush(heap, (-(factor + boost), key, name))

    def keep_teams(self, teams: set[str]) -> list[T]:
        """Drop every team but ``teams`` from the queue; the items dropped.

        The kept teams' jobs come in the same relative order as before: a team's keys depend
        only on its own standing and its own jobs.
        """
        dropped = [
            entry[2]
            for name, team in self._teams.items()
            if name not in teams
            for user in team.users.values()
            for entry in user.jobs
        ]
        self._teams = {name: team for name, team in self._teams.items() if name in teams}
        self._heap[:] = [entry for entry in self._heap if entry[2] in teams]
        heapq.heapify(self._heap)
        return dropped

    def rest(self) -> list[T]:
        """The items not yielded yet (in no particular order)."""
        return [
            entry[2]
            for team in self._teams.values()
            for user in team.users.values()
            for entry in user.jobs
        ]


def leading_team(fair: FairShare, teams: Iterable[str]) -> tuple[str, float]:
    """The team with the highest factor among ``teams`` (ties by name)."""
    best = ("", -1.0)
    for name in sorted(teams):
        factor = fair.team_factor(name)
        if factor > best[1]:
            best = (name, factor)
    return best

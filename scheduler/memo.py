"""The memoisation of one pass: one object that owns the cache keys and the versions.

Most of a long queue in a full cluster cannot start, and many of its jobs are alike: the
same team asks for the same request again and again. A pass therefore remembers answers,
in two kinds of tables with two contracts.

**While jobs are admitted (step 4)** the state changes, so answers carry a *stamp*: the
version of everything, of the job's team and of each of its pools. An answer is reused only
while its stamp still matches.

- ``Cache.VERDICTS``: a job that could not start leaves its verdict (reason code and
  numbers) under its key: its shape (team; pools; minimum count; class when classes may
  preempt; multi-node) plus which of the pass's reservations it may use (by its time limit).
  The next job with that key takes the verdict at once. Most of a long queue takes this
  path. In a round of jobs past ``max_wait_s`` the key also says so (``STARVING``): there a
  job that fits nowhere gets a reservation of its own, and with no pending list one that
  could set nothing aside (nothing of its pools is free) is a verdict too. (A job that
  waited for room rather than reclaim leaves a verdict only for jobs queued after a time:
  ``Verdict.queued_after``.) In a team with member limits the members
  share it too: a quota or budget verdict holds for all of them, one reached after the
  member check (it fitted nowhere) for each member whose own limit leaves room then
  (``Verdict.member_checked``), and a MEMBER_LIMIT verdict is kept apart, under the key
  and its member.
- ``Cache.WHY_NOT``: why a job fits nowhere (no fit, below fair share, behind a reservation)
  depends on its team, its request and the state, not on its user, class or time limit:
  one answer per (team, request), shared by the jobs that differ only there.

Invalidation contract. The cycle calls

- ``took(team, placement, shape)`` after every placement: what the team holds changed, and
  what is free in the pools of the slices taken (on a GPU that exposes a whole slice next
  to partial ones, using one blocks the other: every pool of that GPU);
- ``changed_all()`` after every reservation (slices set aside, a new key part) and every
  preemption (victims chosen, the ledger changed).

Nothing else changes what a verdict depends on: limits, budgets, classes and time limits
are fixed for the pass, and a short job trying set-aside slices puts back what it does not
take. Only failures are remembered; a job that starts changes the state, and with it the
stamp.

**Once admission is over (step 5)** nothing changes any more, so answers need no stamp;
``seal()`` marks that moment and they may not be asked for before it:

- ``Cache.RELEASES``: when a team's (or member's) own jobs end and how many units each end
  frees, for estimates of quota waits.

The other caches live next to what they remember, each switchable the same way
(``SchedulerConfig.caches``): ``NODE_LIST`` and ``REQUESTS`` (``scheduler.cluster``, across
passes), ``FACTORS`` (``scheduler.order``), ``ESTIMATES`` and ``SWEEPS`` (``scheduler.backfill``),
``SHARED_REASONS`` and ``SHARED_VERDICTS`` (``scheduler.explain``). None of them changes a
decision; ``tests/scheduler`` checks that with every cache switched off, and
docs/scheduling.md#speed has what each one gains (caches that gained nothing measurable were
removed: the largest free count per request at the end of the pass, failed victim searches).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.backfill import Reservation
from scheduler.cluster import ClusterShape, Placement, Pool
from scheduler.config import Cache, SchedulerConfig
from scheduler.model import Job, PendingCode, Reason, Team
from scheduler.order import Candidate
from scheduler.quota import Blocked, Ledger, Numbers, member_room

Key = tuple[object, ...]
# The last part of a verdict's key in a round of jobs past ``max_wait_s``: there a job that
# fits nowhere holds a reservation of its own, where a job alike in another round waits
# otherwise (and may take its round's one reservation).
STARVING = "starving"
Stamp = tuple[int, int, object]
# End times of a team's (or member's) jobs, sorted, and the units freed by each of them.
Releases = tuple[list[float], list[float]]


@dataclass(slots=True)
class Verdict:
    """A remembered verdict (``Cache.VERDICTS``): why the jobs of one key may not start.

    The jobs that share it are alike in all that explains them (team, request, member where
    members have limits), so once the first of them is explained, ``scheduler.explain`` keeps
    the reason and estimate here for the others (``Cache.SHARED_VERDICTS``)."""

    code: PendingCode
    numbers: Numbers
    explained: tuple[Reason, float | None] | None = None
    # Only jobs queued after this take it: the first job waited for room rather than reclaim
    # (``scheduler.preempt``), which a job queued earlier would not, its ``reclaim_wait_s``
    # running out before the room comes.
    queued_after: float = -math.inf
    # In a team with member limits, a verdict reached after the member check (it fitted
    # nowhere) holds for every member whose limit leaves room. (A team's quota or budget
    # holds for all of its members; a MEMBER_LIMIT verdict is kept for its member alone.)
    member_checked: bool = False


class PassMemo:
    """The caches of one pass (see the module docstring for what each keeps and when)."""

    def __init__(
        self,
        caches: frozenset[Cache],
        now: float,
        reservations: Sequence[Reservation],
        ledger: Ledger,
    ) -> None:
        self._now = now
        self._ledger = ledger  # the pass's, as it changes (a member's room, for verdicts)
        self._reservations = reservations  # the pass's, as it makes them (part of every key)
        self._verdicts: dict[Key, tuple[Stamp, Verdict]] | None = (
            {} if Cache.VERDICTS in caches else None
        )
        self._why_not: dict[Key, tuple[Stamp, Blocked]] | None = (
            {} if Cache.WHY_NOT in caches else None
        )
        self._version = 0
        self._team_version: dict[str, int] = {}
        self._pool_version: dict[Pool, int] = {}
        self._sealed = False
        self._releases: dict[tuple[str, str], Releases] | None = (
            {} if Cache.RELEASES in caches else None
        )
        # The distinct start times of the reservations, sorted, and how many reservations
        # there were then (``verdict``).
        self._starts: list[float] = []
        self._starts_of = 0

    # -- step 4: answers under a stamp ---------------------------------------------------------

    def took(self, team: str, placement: Placement, shape: ClusterShape) -> None:
        """``team`` took the slices of ``placement``: what it holds changed, and what is free
        in their pools and, on a GPU that exposes a whole slice next to partial ones (using
        one blocks the other), in every pool of that GPU."""
        self._team_version[team] = self._team_version.get(team, 0) + 1
        pool_of = shape.slice_pool
        pools = {pool_of[item.id] for _, items in placement for item in items}
        if shape.mixed_gpus:
            for node, items in placement:
                for item in items:
                    if (node, item.gpu) in shape.mixed_gpus:
                        pools.update(pool_of[s.id] for s in shape.gpu_slices[(node, item.gpu)])
        versions = self._pool_version
        for pool in pools:
            versions[pool] = versions.get(pool, 0) + 1

    def changed_all(self) -> None:
        """A reservation or a preemption: no earlier answer holds any more."""
        self._version += 1

    def verdict(self, c: Candidate, starving: bool = False) -> tuple[Key, Stamp, Verdict | None]:
        """The key and stamp of ``c`` now, and the verdict remembered under them (or None).
        ``starving``: ``c`` is in a round of jobs past ``max_wait_s``, whose verdicts (a
        reservation) are kept apart from the other rounds' (``STARVING``).

        This is the path most jobs of a long queue take, so it is kept tight."""
        key = c.shape if not starving else (*c.shape, STARVING)
        limit = c.job.time_limit_s
        reservations = self._reservations
        if reservations and limit is not None:
            # Which reservations' set-aside slices it may use (``Reservation.lets``): the
            # reservations that start at or after it ends. The list only grows, and every
            # reservation changes the stamp, so under one stamp that set is told by how
            # many distinct start times come before its end (one bisection, not one call
            # per reservation).
            if self._starts_of != len(reservations):
                # (only the reservations made since: the starving jobs' round makes one
                # per job, and sorting them all again each time was quadratic)
                starts = self._starts
                for r in reservations[self._starts_of :]:
                    if r.at is not None:
                        at = bisect_left(starts, r.at)
                        if at == len(starts) or starts[at] != r.at:
                            starts.insert(at, r.at)
                self._starts_of = len(reservations)
            key = (*key, bisect_left(self._starts, self._now + limit))
        pools = c.pools
        get = self._pool_version.get
        if len(pools) == 1:
            pooled: object = get(pools[0], 0)
        elif len(pools) == 2:  # (a whole GPU of any model: one pool per model)
            pooled = (get(pools[0], 0), get(pools[1], 0))
        else:
            pooled = tuple([get(p, 0) for p in pools])
        stamp = (self._version, self._team_version.get(c.job.team, 0), pooled)
        verdicts = self._verdicts
        if verdicts is not None:
            found = verdicts.get(key)
            if found is not None and found[0] == stamp:
                kept = found[1]
                taken = kept.queued_after == -math.inf or c.age[0] > kept.queued_after
                if taken and kept.member_checked:
                    taken = not isinstance(member_room(c, self._ledger), tuple)
                if taken:
                    return key, stamp, kept
            if c.team.limits_members():  # its member's own limit, if that is what stops it
                found = verdicts.get((*key, c.job.user))
                if found is not None and found[0] == stamp:
                    return key, stamp, found[1]
        return key, stamp, None

    def keep_verdict(
        self,
        c: Candidate,
        key: Key,
        stamp: Stamp,
        verdict: Blocked,
        *,
        queued_after: float = -math.inf,
    ) -> Verdict | None:
        """Remember ``c``'s ``verdict`` under ``key`` and ``stamp``, for the jobs queued after
        ``queued_after`` (and, in a team with member limits, the members it holds for); the
        record the jobs that take it will share (None with ``Cache.VERDICTS`` off)."""
        if self._verdicts is None:
            return None
        kept = Verdict(*verdict, queued_after=queued_after)
        if c.team.limits_members():
            code = verdict[0]
            if code is PendingCode.MEMBER_LIMIT:
                key = (*key, c.job.user)  # (beside the verdict its team mates share)
            elif code is not PendingCode.QUOTA_LIMIT and code is not PendingCode.BUDGET_EXHAUSTED:
                kept.member_checked = True  # (room's checks passed: it fitted nowhere)
        self._verdicts[key] = (stamp, kept)
        return kept

    def why_not(self, c: Candidate, stamp: Stamp) -> tuple[Key, Blocked | None]:
        """The key of ``c``'s team and request, and why a job alike it (differing at most in
        user, class or time limit) fitted nowhere under ``stamp`` (or None)."""
        if self._why_not is None:
            return (), None
        request = c.job.request
        key = (c.job.team, c.pools, c.minimum, request.multi_node, request.profile)
        found = self._why_not.get(key)
        return key, found[1] if found is not None and found[0] == stamp else None

    def keep_why_not(self, key: Key, stamp: Stamp, why: Blocked) -> None:
        if self._why_not is not None:
            self._why_not[key] = (stamp, why)

    # -- step 5: answers about the final state -------------------------------------------------

    def seal(self) -> None:
        """Admission is over: from now on the state of the pass no longer changes."""
        self._sealed = True

    def releases(self, team: str, user: str) -> Releases | None:
        assert self._sealed, "releases are known once admission is over"
        return None if self._releases is None else self._releases.get((team, user))

    def keep_releases(self, team: str, user: str, releases: Releases) -> None:
        if self._releases is not None:
            self._releases[(team, user)] = releases

    @property
    def remembers_releases(self) -> bool:
        return self._releases is not None


class Carry:
    """What one pass leaves to the next: facts about single jobs that do not depend on the
    state of the cluster, for a caller that runs pass after pass and keeps this object
    between them: ``schedule(..., carry=carry)`` (the simulator, which hands the core the
    same ``Job`` objects pass after pass: ``scheduler.sim.runner.carrying``). The core
    stays pure: the caller owns the object, and a pass given a new one (or none) decides the
    same, only at the cost of working the facts out again.

    - ``Cache.CARRIED_CANDIDATES``: each pending job as the last pass made it a candidate
      (``scheduler.nominate``: its class, matching pools, minimum, unit and verdict shape),
      by the job's identity, while the teams' highest classes are the same. Its team record
      (usage and limits change between passes) is replaced by the pass's own when the pass
      considers the job (``Cycle.admit``, before any check reads it); a job the pass never
      reaches keeps the last pass's, which nothing reads.

    Invalidation contract. A candidate is kept under the ``id`` of its job object, and holds
    the object itself (``Candidate.job``): while the entry exists the object stays alive, so
    no other object can have that ``id``, and an entry found under a job's ``id`` is that
    very job's (no check per job). Jobs are frozen, so an object that is still the same
    holds the same values. A job whose row changed is a
    new object (a requeued or changed job; a shell that builds new objects each pass gains
    nothing) and is nominated afresh. What a candidate
    depends on besides its job is checked per pass: the cluster's shape (a new
    ``ClusterShape`` when the node list changes), the classes, ``clamp_priority``,
    ``preempt_by_priority``, the policy (whether classes gate the queue) and every team's
    ``max_priority``, and a pass that meets any of these changed drops every candidate (so
    a pass takes carried candidates without a check per job: ``Nominator.every``). Jobs
    with dependencies (whose states change), jobs that fail and jobs that are parked are
    not kept. The candidates of jobs that left the queue are forgotten once they could
    outnumber the pending ones (``forget_gone``), so the mapping stays within a few times
    the queue's length.
    """

    __slots__ = ("_shape", "_config", "_candidates")

    def __init__(self) -> None:
        self._shape: ClusterShape | None = None
        self._config: tuple[object, ...] = ()
        self._candidates: dict[int, Candidate] = {}

    def begin(
        self, shape: ClusterShape, config: SchedulerConfig, teams: Mapping[str, Team]
    ) -> None:
        """A pass over ``shape`` with ``config`` and ``teams`` begins: what was kept for
        others is void."""
        depends = (
            config.priority_classes,
            config.clamp_priority,
            config.preempt_by_priority,
            config.policy,
            {name: team.max_priority for name, team in teams.items()},
        )
        if shape is not self._shape or depends != self._config:
            self._shape, self._config = shape, depends
            self._candidates = {}

    def __len__(self) -> int:
        """How many candidates are kept."""
        return len(self._candidates)

    def candidates(self, caches: frozenset[Cache]) -> dict[int, Candidate] | None:
        """The candidates kept so far, where this pass takes and keeps them (None with
        ``Cache.CARRIED_CANDIDATES`` off)."""
        if Cache.CARRIED_CANDIDATES not in caches:
            return None
        return self._candidates

    def forget_gone(self, pending: Sequence[Job]) -> None:
        """Drop the candidates of jobs no longer ``pending`` once they could outnumber the
        pending ones (a pass adds the arrivals and drops nothing: dropping as jobs leave
        would build the mapping anew each pass)."""
        kept = self._candidates
        if len(kept) <= 2 * len(pending) + 256:
            return
        fresh: dict[int, Candidate] = {}
        for job in pending:
            found = kept.get(id(job))
            if found is not None:
                fresh[id(job)] = found
        self._candidates = fresh

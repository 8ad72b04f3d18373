"""Step 2, nominate: which pending jobs a pass considers, and as what.

A job whose ``after_ok`` dependency ended without success fails (``Fail``), as does a job
asking for fewer than one slice. A job that cannot be considered now is *parked* with its
reason: a dependency that has not ended (``DEPENDENCY``), a class above its team's highest
(``PRIORITY_NOT_ALLOWED``, unless ``clamp_priority`` runs it at the team's highest), a
request no node of the cluster could ever hold (``NO_MATCHING_SLICES``). Every other job
becomes a ``Candidate``: its team, class, matching pools, minimum and the shape its verdict
is remembered under (``scheduler.memo``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

from scheduler.cluster import RequestInfo
from scheduler.config import SchedulerConfig
from scheduler.explain import Left
from scheduler.model import (
    DependencyKind,
    DependencyState,
    Fail,
    GpuRequest,
    Job,
    PendingCode,
    Team,
)
from scheduler.order import Candidate, age_key
from scheduler.quota import Numbers


class Nominator:
    """Turns pending jobs into candidates; keeps the failed and the parked ones."""

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        classes: Mapping[str, int],
        teams: Mapping[str, Team],
        team_of: Callable[[str], Team],
        request_info: Callable[[GpuRequest], RequestInfo],
        dependency_states: Mapping[str, DependencyState],
        gate_classes: bool,
        carried: dict[int, Candidate] | None = None,
    ) -> None:
        self.fail: list[Fail] = []
        self.parked: list[Left] = []
        self._classes = classes
        self._teams = teams
        self._team_of = team_of
        self._request_info = request_info
        self._states = dependency_states
        self._gate_classes = gate_classes  # (the FIFO baselines let every class in)
        self._clamp = config.clamp_priority
        self._by_class = config.preempt_by_priority
        # Each job as the last pass over the same cluster, with the same classes, made it a
        # candidate, by the job's identity (``scheduler.memo.Carry``), and for the next one.
        self._carried = carried

    def candidate(self, job: Job) -> Candidate | None:
        """``job`` as a candidate, or None (then it failed or is parked)."""
        request = job.request
        if request.count < 1:
            self.fail.append(Fail(job.id, f"request.count must be at least 1, got {request.count}"))
            return None
        if job.depends_on:
            waiting = self._dependency(job)
            if waiting is False:
                return None
            if waiting is not None:
                self.parked.append(Left(job, PendingCode.DEPENDENCY, {"waiting_for": waiting}))
                return None
        carried = self._carried
        if carried is not None:
            found = carried.get(id(job))
            # The same job object (then the same values), over the same cluster, with the
            # same class rules (``scheduler.memo.Carry``): the same candidate. (Its team
            # record is the last pass's until ``Cycle.admit`` puts this pass's in.)
            if found is not None:
                return found
        team = self._teams.get(job.team)
        if team is None:
            team = self._team_of(job.team)  # (an unknown team: the neutral defaults)
        rank = self.rank_of(team, job.priority)
        if rank is None:
            numbers: Numbers = {"priority": job.priority, "max_priority": team.max_priority}
            self.parked.append(Left(job, PendingCode.PRIORITY_NOT_ALLOWED, numbers))
            return None
        info = self._request_info(request)
        if not info.could_ever_fit:
            numbers = {"needs": info.minimum, "largest_node": info.largest_node}
            self.parked.append(Left(job, PendingCode.NO_MATCHING_SLICES, numbers))
            return None
        # The class matters to a verdict only when it may preempt by class; leaving it out
        # otherwise lets jobs of all classes share verdicts (half as many misses).
        by_class = rank if self._by_class else 0
        # (no member: a verdict records which members it holds for, ``scheduler.memo``)
        shape = (job.team, info.pools, info.minimum, by_class, request.multi_node)
        age = age_key(job)
        least = info.minimum * info.unit
        c = Candidate(
            job, team, rank, info.pools, info.unit, info.minimum, request.count, shape, age, least
        )
        if carried is not None and not job.depends_on:
            # (a job with dependencies is nominated afresh each pass: their states change)
            carried[id(job)] = c
        return c

    def rank_of(self, team: Team, priority: str) -> int | None:
        """The class rank a job of ``team`` asking for ``priority`` is ordered in; None when
        its team may not use that class (and it is not clamped to the team's highest)."""
        classes = self._classes
        rank = classes.get(priority, 0)
        if self._gate_classes:
            allowed = classes.get(team.max_priority, 0)
            if rank > allowed or priority not in classes:
                if priority not in classes or not self._clamp:
                    return None
                rank = allowed
        return rank

    def every(self, jobs: Sequence[Job]) -> list[Candidate]:
        """The candidates of ``jobs``, in their order (``candidate`` for each).

        The jobs the last pass kept are taken as they are, without a call per job: in a long
        queue nearly every job is one (only the arrivals since the last pass are not). The
        checks ``candidate`` makes first hold for them (jobs with dependencies are never
        kept), and their team records, whose usage and limits are each pass's own, are put
        in only for the jobs the pass considers (``Cycle.admit``): most of a long queue is
        never considered."""
        carried = self._carried
        candidate = self.candidate
        if carried is None:
            return [c for c in map(candidate, jobs) if c is not None]
        carried_get = carried.get
        # Every job carried (no arrival since the last pass, none parked): the candidates
        # without a Python step per job. (``filter(None, ...)`` drops the misses: a candidate
        # is never false, as it has neither ``__bool__`` nor ``__len__``.)
        found = list(map(carried_get, map(id, jobs)))
        made = list(filter(None, found))
        missing = len(found) - len(made)
        if not missing:
            return made
        # The arrivals since the last pass come last in a queue in submit order: when the
        # jobs not carried are the last ones, only those are nominated (in a replay at 400
        # GPUs, 14,598 of 14,707 passes with any).
        if found[-missing:].count(None) == missing:
            for job in jobs[-missing:]:
                c = candidate(job)
                if c is not None:
                    made.append(c)
            return made
        made = []
        for job in jobs:
            c = carried_get(id(job))
            if c is None:
                c = candidate(job)  # (kept for the next pass if it may be)
                if c is None:
                    continue
            made.append(c)
        return made

    def _dependency(self, job: Job) -> str | None | bool:
        """None: free to go; a job id: still waiting for it; False: failed for good."""
        waiting: str | None = None
        for dep in job.depends_on:
            state = self._states.get(dep.job_id, DependencyState.WAITING)
            if state is DependencyState.WAITING:
                waiting = waiting or dep.job_id
            elif state is DependencyState.FAILED and dep.kind is DependencyKind.AFTER_OK:
                self.fail.append(Fail(job.id, f"dependency {dep.job_id} did not succeed"))
                return False
        return waiting


class InSubmitOrder(Sequence[Candidate]):
    """The candidates of ``jobs`` in submit order (``order.age_key``), each made only when
    the queue reaches it: a FIFO pass that lists no pending job
    (``SchedulerConfig.list_pending`` off) stops considering jobs once nothing further down
    can change a decision, and the jobs behind need no candidate at all.

    The same candidates, in the same order, as nominating every job and sorting: a job that
    fails or waits for a dependency is nominated at once, in the snapshot's order (the
    only ones ``Nominator.candidate`` can fail), so ``Nominator.fail`` is complete from the
    start; parked jobs are skipped where the queue reaches them. Asking for its length or
    an item nominates every job. ``in_order``: ``jobs`` are in submit order already
    (``Snapshot.pending_in_submit_order``), and are not sorted again.
    """

    def __init__(self, nominate: Nominator, jobs: Sequence[Job], *, in_order: bool) -> None:
        self._nominate = nominate
        early: dict[str, Candidate | None] = {}
        for job in jobs:
            if job.request.count < 1 or job.depends_on:
                early[job.id] = nominate.candidate(job)
        self._early = early
        self._jobs = jobs if in_order else sorted(jobs, key=age_key)
        self._next = 0  # the first job of ``_jobs`` not nominated yet
        self._made: list[Candidate] = []

    def _more(self) -> bool:
        """Nominate jobs until one more candidate is made; False once none is left."""
        jobs, early, candidate = self._jobs, self._early, self._nominate.candidate
        while self._next < len(jobs):
            job = jobs[self._next]
            self._next += 1
            c = early[job.id] if job.id in early else candidate(job)
            if c is not None:
                self._made.append(c)
                return True
        return False

    def __iter__(self) -> Iterator[Candidate]:
        made = self._made
        at = 0
        while at < len(made) or self._more():
            yield made[at]
            at += 1

    def _all(self) -> list[Candidate]:
        while self._more():
            pass
        return self._made

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | Sequence[Candidate]:
        if isinstance(index, int) and index >= 0:
            # Only as far as the index: a round walks its queue by position
            # (``order.Ordered``), and the jobs past where it stops need no candidate.
            while index >= len(self._made) and self._more():
                pass
            return self._made[index]  # (IndexError past the last candidate)
        return self._all()[index]

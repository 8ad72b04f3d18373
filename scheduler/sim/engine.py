"""The discrete-event replay: a trace through ``schedule()`` on a simulated clock.

Events are arrivals, completions, the end of a victim's grace period and, only where a rule
needs time to pass, a tick (the moment a possible victim of a reclaim reaches the minimum run
time, or a queued job that may reclaim reaches its ``reclaim_wait_s``; each pass plans the
next one anew, ``_plan_tick``). All events at one instant are applied before the core is
asked, so a burst of arrivals costs one pass.

The simulator holds no policy of its own: whatever the core decides is applied as is, and
checked (a slice given twice, a job assigned twice or a gang of the wrong size stops the
replay with ``SimulationError``). It skips a pass only when no pass could change anything:
nothing is pending, or no pending job fits what is free and no preemption rule can fire
(``_could_place``: no node has as many free slices of a job's kind as the job needs at
least, nor the whole cluster for a multi-node gang; a pass that cannot place, preempt or
fail decides nothing, and the replay's jobs have no dependencies that could fail).

Each trace job runs as a rigid gang. By default its ``time_limit_s`` is its true duration, so
the core's backfill reserves with exact run times (the best case for backfill, the same for
every policy). With ``hide_durations`` the limit is what a user would ask for instead: the
duration rounded up to 1 h, 4 h, 24 h or 7 days (beyond, whole weeks), as production sees
it: the core never learns a true duration, only the run times of finished jobs
(``Snapshot.run_times``, in the passes that explain).

With ``record_etas`` the replay also keeps, for every job, the start estimate of the first
pass that left it pending: those passes run with explanations on (and a pass the replay
would skip because it cannot change anything runs all the same, its decisions unused), so
the decisions are exactly those of the replay without it. A preempted job keeps running for the grace period, then stops, loses its work and
is requeued with its original ``queued_since``; it must run its full duration again.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol, TypeVar

from scheduler.config import Policy, SchedulerConfig
from scheduler.model import (
    NO_RUN_TIMES,
    Decisions,
    GpuRequest,
    Job,
    Node,
    RunningJob,
    RunTime,
    RunTimes,
    SliceKind,
    Snapshot,
    Team,
)
from scheduler.order import age_key, queued_at
from scheduler.preempt import never_victim_once_starved
from scheduler.runtimes import RECENT_RUNS, run_time_of, shape_of_job, team_key, user_key
from scheduler.sim.cluster import TeamSpec, mig_compute_slices
from scheduler.sim.records import JobRecord, Segment
from scheduler.sim.trace import TraceJob
from scheduler.units import decay, mig_units

# More passes than this at one instant means the core and the simulator are in a loop
# (for example assigning and preempting the same job back and forth).
MAX_PASSES_PER_INSTANT = 1000
# A job preempted this often means the core keeps taking back what it just gave (a
# preemption loop): the replay would never end, so it stops with an error instead.
MAX_PREEMPTIONS_PER_JOB = 1000


# Called every PROGRESS_EVERY instants with (simulated now, jobs finished, jobs pending).
ProgressFn = Callable[[float, int, int], None]
PROGRESS_EVERY = 5000


class ScheduleFn(Protocol):
    def __call__(
        self, snapshot: Snapshot, /, *, now: float, config: SchedulerConfig
    ) -> Decisions: ...


class SimulationError(RuntimeError):
    """The core returned a decision that cannot be applied to the simulated cluster."""


@dataclass(slots=True)
class _LiveJob:
    trace: TraceJob
    job: Job
    asks_units: float  # what the request is worth in GPU units
    units: float = 0.0  # what it holds while running
    attempt: int = 0
    segments: list[Segment] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SimResult:
    records: tuple[JobRecord, ...]  # every replayed job, finished or not
    excluded: tuple[TraceJob, ...]  # could never fit this cluster; left out
    failed: tuple[str, ...]  # jobs the core failed
    capacity: float  # GPU units of the cluster
    passes: int  # schedule() calls
    skipped: int  # instants with pending work where no pass could change anything
    ticks: int  # instants added only because a rule needed time to pass
    # job id -> the estimate of its first pending pass (``record_etas``; else empty).
    etas: Mapping[str, Estimate] = field(default_factory=dict)

    @property
    def unfinished(self) -> tuple[JobRecord, ...]:
        return tuple(r for r in self.records if not r.finished)


# The time limits a user picks from when the true duration is hidden (``hide_durations``).
LIMIT_STEPS_S = (3600.0, 4 * 3600.0, 24 * 3600.0, 7 * 86400.0)


def user_limit(duration_s: float) -> float:
    """A user-style time limit for a job that runs ``duration_s``: the duration rounded up to
    1 h, 4 h, 24 h or 7 days, and beyond 7 days to whole weeks."""
    for step in LIMIT_STEPS_S:
        if duration_s <= step:
            return step
    week = LIMIT_STEPS_S[-1]
    return week * math.ceil(duration_s / week)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The start estimate of a job's first pending pass (``record_etas``)."""

    at_s: float  # the pass
    earliest_s: float | None
    likely_s: float | None
    latest_s: float | None


def core_job(
    trace: TraceJob, gpus_per_node: int, user: str, *, hide_durations: bool = False
) -> Job:
    """The core's view of a trace job: a rigid gang, time limit = true duration (or, with
    ``hide_durations``, the user-style limit above it)."""
    kind = SliceKind.MIG if trace.mig_profile else SliceKind.WHOLE
    request = GpuRequest(
        kind=kind,
        count=trace.gpus,
        profile=trace.mig_profile,
        multi_node=kind is SliceKind.WHOLE and trace.gpus > gpus_per_node,
    )
    return Job(
        id=trace.id,
        team=trace.tenant,
        user=user,
        request=request,
        submitted_at=trace.submit_s,
        time_limit_s=user_limit(trace.duration_s) if hide_durations else trace.duration_s,
        queued_since=trace.submit_s,
    )


def job_units(trace: TraceJob) -> float:
    if not trace.mig_profile:
        return float(trace.gpus)
    mig_compute_slices(trace.mig_profile)  # a clear error for an unknown profile
    return trace.gpus * mig_units(trace.mig_profile)


def _pool_of(kind: SliceKind, profile: str) -> tuple[SliceKind, str]:
    """The slices a request of ``kind`` and ``profile`` may take (as ``_could_place`` counts
    them): its kind, and for MIG its profile."""
    return (kind, profile.strip().lower() if kind is SliceKind.MIG else "")


def _wants(job: Job) -> tuple[tuple[SliceKind, str], bool, int]:
    """What ``job`` needs at least to be placed: its pool, multi-node or not, slices."""
    request = job.request
    return (_pool_of(request.kind, request.profile), request.multi_node, request.minimum)


_K = TypeVar("_K")


def _drop_one(counts: Counter[_K], key: _K) -> None:
    """One fewer of ``key`` in ``counts``; the key goes at zero (so the counts' keys are what is
    queued)."""
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


class _Room:
    """How much of each slice type the empty cluster has, to spot jobs that never fit."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        per_node: list[Counter[str]] = [
            Counter(s.profile if s.kind is SliceKind.MIG else "" for s in n.slices) for n in nodes
        ]
        self._largest: Counter[str] = Counter()
        self._total: Counter[str] = Counter()
        for counts in per_node:
            self._total.update(counts)
            for key, count in counts.items():
                self._largest[key] = max(self._largest[key], count)

    def fits(self, trace: TraceJob, gpus_per_node: int) -> bool:
        """Whether the empty cluster could ever hold the job (else it would wait forever)."""
        if not trace.mig_profile and trace.gpus > gpus_per_node:  # may spread over nodes
            return self._total[""] >= trace.gpus
        return self._largest[trace.mig_profile] >= trace.gpus


class Replay:
    """One replay's state. Build it, call ``run()`` once."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        *,
        nodes: tuple[Node, ...],
        teams: Mapping[str, TeamSpec],
        config: SchedulerConfig,
        schedule: ScheduleFn,
        gpus_per_node: int = 8,
        progress: ProgressFn | None = None,
        hide_durations: bool = False,
        record_etas: bool = False,
    ) -> None:
        missing = sorted({j.tenant for j in jobs} - set(teams))
        if missing:
            raise SimulationError(f"trace tenants without a team: {', '.join(missing)}")
        self._nodes = nodes  # immutable, shared by every snapshot
        self._config = config
        self._schedule = schedule
        self._teams = dict(teams)
        self._slice_units = {s.id: s.units for n in nodes for s in n.slices}
        # Free slices per pool (kind and MIG profile) and node, and how many pending jobs ask
        # for each (pool, multi-node, least slices): whether any pending job could be placed
        # at all (``_could_place``).
        self._slice_pool = {
            s.id: (_pool_of(s.kind, s.profile), n.name) for n in nodes for s in n.slices
        }
        self._free: dict[tuple[SliceKind, str], dict[str, int]] = {}
        for pool, node in self._slice_pool.values():
            per_node = self._free.setdefault(pool, {})
            per_node[node] = per_node.get(node, 0) + 1
        self._wanted: Counter[tuple[tuple[SliceKind, str], bool, int]] = Counter()
        self._capacity = sum(self._slice_units.values())
        # No team limit: a team may borrow up to the whole cluster. (None rather than the
        # capacity, so that a job too big for what is free reads as "no fit", not as "over
        # quota": the core lets a FIFO queue pass a job blocked by its team's quota.)
        self._team_limit: float | None = None
        room = _Room(nodes)
        fitting = [j for j in jobs if room.fits(j, gpus_per_node)]
        self._excluded = tuple(j for j in jobs if not room.fits(j, gpus_per_node))
        self._arrivals = fitting
        self._live = {
            j.id: _LiveJob(
                j,
                core_job(j, gpus_per_node, j.user or j.tenant, hide_durations=hide_durations),
                job_units(j),
                job_units(j),
            )
            for j in fitting
        }
        self._record_etas = record_etas
        self._etas: dict[str, Estimate] = {}
        self._unseen: set[str] = set()  # arrived, never yet left pending by a pass
        self._history = _History()
        # In submit order (``order.age_key``), so the snapshot can say so
        # (``Snapshot.pending_in_submit_order``): each instant's arrivals come after every
        # job queued before it; a requeued victim keeps its first queueing time and is put
        # back in its place before the next pass (``_in_order`` is off until then).
        self._pending: dict[str, Job] = {}
        self._in_order = True
        self._running: dict[str, RunningJob] = {}
        self._owner: dict[str, str] = {}  # slice id -> job id
        self._held: dict[str, float] = dict.fromkeys(teams, 0.0)
        self._held_by_user: dict[tuple[str, str], float] = {}
        # GPU units of each team's pending jobs (how many of each size), to tell cheaply
        # whether a pending job would keep its team within its guarantee.
        self._queued_sizes: dict[str, Counter[float]] = {team: Counter() for team in teams}
        # (team, user, priority) of the pending jobs: ``Snapshot.pending_groups``.
        self._groups: Counter[tuple[str, str, str]] = Counter()
        self._usage: dict[str, float] = dict.fromkeys(teams, 0.0)
        self._user_usage: dict[tuple[str, str], float] = {}
        self._completions: list[tuple[float, int, str, int]] = []
        self._stops: list[tuple[float, int, str, int]] = []
        # The one tick the latest pass planned (``_plan_tick``); every pass plans it anew, so
        # a tick planned for a state that has changed since never causes a pass.
        self._tick: float | None = None
        self._again = False  # pass again at this instant (a victim stopped at once)
        # Per (team, GPU units asked), (when its reclaim_wait_s runs out, job id) of queued
        # jobs: a job that waits for room rather than reclaim reclaims then, so a pass must
        # run at that moment if it could reclaim (its team stays within its guarantee).
        self._patience: dict[tuple[str, float], list[tuple[float, str]]] = {}
        # (started at, job id) of the jobs started less than min_run_time_s ago, oldest first:
        # the only running jobs that may still become victims later (``_plan_tick``).
        self._recent: deque[tuple[float, str]] = deque()
        self._seq = 0
        self._clock = jobs[0].submit_s if jobs else 0.0
        self._failed: list[str] = []
        self._passes = 0
        self._skipped = 0
        self._tick_count = 0
        self._progress = progress
        self._finished = 0

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> SimResult:
        next_arrival = 0
        passes_now = 0
        last_instant = None
        instants = 0
        while True:
            now = self._next_instant(next_arrival)
            if now is None:
                break
            instants += 1
            if self._progress is not None and instants % PROGRESS_EVERY == 0:
                self._progress(now, self._finished, len(self._pending))
            passes_now = passes_now + 1 if now == last_instant else 1
            if passes_now > MAX_PASSES_PER_INSTANT:
                raise SimulationError(f"the core did not settle at t={now:g}s")
            last_instant = now
            self._advance_usage(now)
            self._finish_completions(now)
            self._stop_victims(now)
            next_arrival = self._admit_arrivals(now, next_arrival)
            self._pop_tick(now)
            self._pass(now)
        return self._result()

    def _next_instant(self, next_arrival: int) -> float | None:
        candidates = []
        if next_arrival < len(self._arrivals):
            candidates.append(self._arrivals[next_arrival].submit_s)
        if self._completions:
            candidates.append(self._completions[0][0])
        if self._stops:
            candidates.append(self._stops[0][0])
        if self._tick is not None:
            candidates.append(self._tick)
        if self._again:
            candidates.append(self._clock)
        return min(candidates) if candidates else None

    def _advance_usage(self, now: float) -> None:
        """Charge what every team and user held since the last instant, as the shell does.

        ``U <- decay(U, dt, T_half) + held * dt``: running jobs are charged as they run, so
        each snapshot's usage includes the GPU time used up to that moment.
        """
        elapsed = now - self._clock
        if elapsed <= 0:
            return
        factor = decay(1.0, elapsed, self._config.usage_half_life_s)  # the same for everyone
        for team, usage in self._usage.items():
            self._usage[team] = usage * factor + self._held[team] * elapsed
        for key, usage in self._user_usage.items():
            held = self._held_by_user.get(key, 0.0)
            self._user_usage[key] = usage * factor + held * elapsed
        self._clock = now

    def _finish_completions(self, now: float) -> None:
        while self._completions and self._completions[0][0] <= now:
            _, _, job_id, attempt = heapq.heappop(self._completions)
            live = self._live[job_id]
            if attempt == live.attempt and job_id in self._running:
                self._release(job_id, now, preempted=False)
                self._finished += 1
                if self._record_etas:
                    self._history.add(live.job, live.trace.duration_s)

    def _stop_victims(self, now: float) -> None:
        while self._stops and self._stops[0][0] <= now:
            _, _, job_id, attempt = heapq.heappop(self._stops)
            live = self._live[job_id]
            if attempt == live.attempt and job_id in self._running:
                self._requeue_victim(job_id, now)

    def _admit_arrivals(self, now: float, next_arrival: int) -> int:
        arrived: list[Job] = []
        while next_arrival < len(self._arrivals) and self._arrivals[next_arrival].submit_s <= now:
            arrived.append(self._live[self._arrivals[next_arrival].id].job)
            next_arrival += 1
        if len(arrived) > 1:
            arrived.sort(key=age_key)  # (the trace's order breaks ties by line, not job id)
        for job in arrived:
            self._enqueue(job)
            if self._record_etas:
                self._unseen.add(job.id)
        return next_arrival

    def _pop_tick(self, now: float) -> None:
        self._again = False
        if self._tick is not None and self._tick <= now:
            self._tick = None
            self._tick_count += 1

    # --- one scheduling pass ---------------------------------------------------------------

    def _pass(self, now: float) -> None:
        # Whatever tick an earlier pass planned, this instant's pass plans anew: the state it
        # was planned for may have changed.
        self._tick = None
        if not self._pending:
            return
        explain = self._record_etas and bool(self._unseen)
        skip = not self._could_place() and not self._preemption_possible()
        if skip:
            self._skipped += 1
            if not explain:
                return
        if not self._in_order:
            self._pending = {job.id: job for job in sorted(self._pending.values(), key=age_key)}
            self._in_order = True
        snapshot = Snapshot(
            nodes=self._nodes,
            teams=self._snapshot_teams(),
            pending=tuple(self._pending.values()),
            pending_in_submit_order=True,
            pending_groups=tuple(self._groups),
            running=tuple(self._running.values()),
            user_usage=dict(self._user_usage),
            run_times=self._history.run_times() if explain else NO_RUN_TIMES,
        )
        config = replace(self._config, explain=True) if explain else self._config
        decisions = self._schedule(snapshot, now=now, config=config)
        if explain:
            self._keep_estimates(decisions, now)
        if skip:
            return  # run only for its estimates: a skipped pass decides nothing
        self._passes += 1
        self._apply(decisions, now)
        self._plan_tick(now)

    def _keep_estimates(self, decisions: Decisions, now: float) -> None:
        unseen = self._unseen
        for pending in decisions.pending:
            if pending.job_id in unseen:
                unseen.discard(pending.job_id)
                self._etas[pending.job_id] = Estimate(
                    now, pending.eta_earliest, pending.eta, pending.eta_latest
                )
        for assign in decisions.assign:
            unseen.discard(assign.job_id)

    def _snapshot_teams(self) -> dict[str, Team]:
        return {
            name: Team(
                name=name,
                weight=spec.weight,
                guaranteed=float(spec.guaranteed_gpus),
                limit=self._team_limit,
                usage=self._usage[name],
            )
            for name, spec in self._teams.items()
        }

    def _could_place(self) -> bool:
        """Whether a pending job could be given slices now: a node with at least as many
        free slices of its kind as it needs at least (for a multi-node gang, the whole
        cluster). A necessary condition of any placement: the core places only on free
        slices of the job's kind (a slice set aside for a reservation is free here too)."""
        if len(self._owner) == len(self._slice_units):
            return False
        free = self._free
        for (pool, multi_node, least), count in self._wanted.items():
            if not count:
                continue
            per_node = free.get(pool)
            if per_node is None:
                continue
            if least <= (sum(per_node.values()) if multi_node else max(per_node.values())):
                return True
        return False

    def _reclaim_on(self) -> bool:
        return self._config.policy is Policy.FAIRSHARE and self._config.reclaim

    def _preemption_possible(self) -> bool:
        """Whether a pass with no free slice could still preempt (then it must run)."""
        if self._config.policy is not Policy.FAIRSHARE:
            return False
        if self._config.preempt_by_priority:
            return True
        # Only a job that keeps its team within its guarantee makes the core reclaim; a job
        # that borrows never preempts.
        return self._reclaim_on() and bool(self._reclaimers())

    def _plan_tick(self, now: float) -> None:
        """Tick at the first moment a reclaim that cannot happen now may become possible with
        no other event in between: a running job that may become a victim reaches the
        minimum run time, or a queued job that may reclaim reaches its ``reclaim_wait_s``
        (it may reclaim then instead of waiting for room).

        Until the next event nothing else changes, so only these can: a reclaim needs a job
        that keeps its team within its guarantee (``_reclaimers``), and a victim of another
        team that borrows now (counted with its jobs being stopped, a superset of the core's
        rule), that is preemptible and not exempt for having started past ``max_wait_s``
        (``scheduler.preempt.never_victim_once_starved``). Ticks for anything else could
        change no decision, so none are planned.
        """
        if not self._pending or not self._reclaim_on():
            return
        reclaimers = self._reclaimers()
        if not reclaimers:
            return
        eligible_at = [self._next_victim_at(now, reclaimers)]
        eligible_at.extend(self._patience_ends(now, reclaimers))
        at = min((t for t in eligible_at if t is not None), default=None)
        if at is not None:
            self._tick = at

    def _reclaimers(self) -> dict[str, float]:
        """Teams with a queued job that keeps them within their guarantee: the units of
        guarantee each has left."""
        out = {}
        for team, sizes in self._queued_sizes.items():
            if not sizes:
                continue
            left = self._teams[team].guaranteed_gpus - self._held[team]
            if min(sizes) <= left + 1e-9:
                out[team] = left
        return out

    def _next_victim_at(self, now: float, reclaimers: Mapping[str, float]) -> float | None:
        """When the first running job that may become a victim of a reclaim by one of
        ``reclaimers`` reaches the minimum run time (None: none will before an event)."""
        min_run = self._config.min_run_time_s
        recent = self._recent
        while recent and recent[0][0] + min_run <= now:
            recent.popleft()
        max_wait = self._config.max_wait_s
        for started_at, job_id in recent:
            running = self._running.get(job_id)
            if running is None or running.started_at != started_at:
                continue  # finished or stopped since (or started again)
            job = running.job
            team = job.team
            if running.preempting_since is not None or not job.preemptible:
                continue
            if self._held[team] <= self._teams[team].guaranteed_gpus + 1e-9:
                continue  # its team borrows nothing now
            if not any(other != team for other in reclaimers):
                continue  # only its own team could reclaim, and never from itself
            if (
                max_wait is not None
                and started_at - queued_at(job) >= max_wait
                and never_victim_once_starved(self._config)
            ):
                continue
            return started_at + min_run  # the oldest such start reaches it first
        return None

    def _patience_ends(self, now: float, reclaimers: Mapping[str, float]) -> list[float]:
        """For each (team, size) that could reclaim, when the first queued job's
        ``reclaim_wait_s`` still to come runs out."""
        out = []
        for (team, units), heap in self._patience.items():
            left = reclaimers.get(team)
            if left is None or units > left + 1e-9:
                continue
            while heap and (heap[0][0] <= now or heap[0][1] not in self._pending):
                heapq.heappop(heap)
            if heap:
                out.append(heap[0][0])
        return out

    # --- applying decisions -------------------------------------------------------------

    def _apply(self, decisions: Decisions, now: float) -> None:
        for fail in decisions.fail:
            if self._pending.pop(fail.job_id, None) is None:
                raise SimulationError(f"core failed job {fail.job_id}, which is not pending")
            self._dequeue(self._live[fail.job_id])
            self._failed.append(fail.job_id)
        for preempt in decisions.preempt:
            self._begin_preemption(preempt.job_id, now)
        for assign in decisions.assign:
            self._start(assign.job_id, assign.slice_ids, assign.borrowed, now)

    def _begin_preemption(self, job_id: str, now: float) -> None:
        running = self._running.get(job_id)
        if running is None:
            raise SimulationError(f"core preempted job {job_id}, which is not running")
        if running.preempting_since is not None:
            return  # already in its grace period
        grace = self._config.grace_period_s
        live = self._live[job_id]
        if grace <= 0:  # stops at once, so its slices are free for this pass's assignments
            self._requeue_victim(job_id, now)
            self._again = True  # and another pass now may use what it freed
            return
        self._running[job_id] = replace(running, preempting_since=now)
        self._seq += 1
        heapq.heappush(self._stops, (now + grace, self._seq, job_id, live.attempt))

    def _start(self, job_id: str, slice_ids: tuple[str, ...], borrowed: bool, now: float) -> None:
        job = self._pending.pop(job_id, None)
        if job is None:
            raise SimulationError(f"core assigned job {job_id}, which is not pending")
        self._claim(job, slice_ids)
        live = self._live[job_id]
        self._dequeue(live)
        units = sum(self._slice_units[s] for s in slice_ids)
        live.units = units
        node = self._owner_node(slice_ids)
        self._running[job_id] = RunningJob(job, node, slice_ids, now, borrowed=borrowed)
        self._recent.append((now, job_id))
        live.segments.append(Segment(now, now, False, slice_ids))  # end filled in on release
        team, user_key = job.team, (job.team, job.user)
        self._held[team] += units
        self._held_by_user[user_key] = self._held_by_user.get(user_key, 0.0) + units
        self._user_usage.setdefault(user_key, 0.0)
        self._seq += 1
        end = now + live.trace.duration_s
        heapq.heappush(self._completions, (end, self._seq, job_id, live.attempt))

    def _claim(self, job: Job, slice_ids: tuple[str, ...]) -> None:
        """Check the core's placement and mark its slices taken."""
        request = job.request
        if not request.minimum <= len(slice_ids) <= request.count:
            raise SimulationError(
                f"core gave job {job.id} {len(slice_ids)} slices; it asks for "
                f"{request.minimum}..{request.count}"
            )
        for slice_id in slice_ids:
            if slice_id not in self._slice_units:
                raise SimulationError(f"core gave job {job.id} unknown slice {slice_id}")
            if slice_id in self._owner:
                raise SimulationError(
                    f"core gave slice {slice_id} to {job.id}; {self._owner[slice_id]} holds it"
                )
            self._owner[slice_id] = job.id
            pool, node = self._slice_pool[slice_id]
            self._free[pool][node] -= 1

    def _owner_node(self, slice_ids: tuple[str, ...]) -> str:
        return slice_ids[0].split("/", 1)[0] if slice_ids else ""

    def _release(self, job_id: str, now: float, *, preempted: bool) -> None:
        running = self._running.pop(job_id)
        for slice_id in running.slice_ids:
            del self._owner[slice_id]
            pool, node = self._slice_pool[slice_id]
            self._free[pool][node] += 1
        live = self._live[job_id]
        live.segments[-1] = replace(live.segments[-1], end_s=now, preempted=preempted)
        job = running.job
        self._held[job.team] -= live.units
        self._held_by_user[(job.team, job.user)] -= live.units

    def _dequeue(self, live: _LiveJob) -> None:
        job = live.job
        self._wanted[_wants(job)] -= 1
        _drop_one(self._groups, (job.team, job.user, job.priority))
        _drop_one(self._queued_sizes[live.trace.tenant], live.asks_units)

    def _requeue_victim(self, job_id: str, now: float) -> None:
        self._release(job_id, now, preempted=True)
        live = self._live[job_id]
        live.attempt += 1
        if live.attempt > MAX_PREEMPTIONS_PER_JOB:
            raise SimulationError(
                f"job {job_id} was preempted {live.attempt} times by t={now:g}s: the core is "
                "in a preemption loop"
            )
        self._enqueue(live.job)
        self._in_order = False  # (put behind jobs that queued after it)

    def _enqueue(self, job: Job) -> None:
        self._pending[job.id] = job
        wait = self._config.reclaim_wait_s
        if wait is not None and self._reclaim_on():
            key = (job.team, self._live[job.id].asks_units)
            heapq.heappush(self._patience.setdefault(key, []), (queued_at(job) + wait, job.id))
        self._queued_sizes[job.team][self._live[job.id].asks_units] += 1
        self._wanted[_wants(job)] += 1
        self._groups[(job.team, job.user, job.priority)] += 1
        self._user_usage.setdefault((job.team, job.user), 0.0)

    def _result(self) -> SimResult:
        records = tuple(
            JobRecord(
                job_id=live.trace.id,
                tenant=live.trace.tenant,
                gpus=live.units,
                submit_s=live.trace.submit_s,
                duration_s=live.trace.duration_s,
                segments=tuple(live.segments),
            )
            for live in self._live.values()
        )
        return SimResult(
            records=records,
            excluded=self._excluded,
            failed=tuple(self._failed),
            capacity=self._capacity,
            passes=self._passes,
            skipped=self._skipped,
            ticks=self._tick_count,
            etas=dict(self._etas),
        )


# Run times kept per key (the most recent, as ``scheduler.runtimes`` summarises them).
HISTORY_PER_KEY = RECENT_RUNS


class _History:
    """Run times of the jobs the replay has finished, as ``scheduler.runtimes`` keys them."""

    def __init__(self) -> None:
        self._levels: tuple[dict[str, deque[float]], ...] = ({}, {}, {})
        self._summaries: tuple[dict[str, RunTime], ...] = ({}, {}, {})
        self._dirty: tuple[set[str], ...] = (set(), set(), set())
        self._built: RunTimes = NO_RUN_TIMES

    def add(self, job: Job, duration_s: float) -> None:
        shape = shape_of_job(job)
        keys = (user_key(job.team, job.user, shape), team_key(job.team, shape), shape)
        for level, dirty, key in zip(self._levels, self._dirty, keys, strict=True):
            found = level.get(key)
            if found is None:
                found = level[key] = deque(maxlen=HISTORY_PER_KEY)
            found.append(duration_s)
            dirty.add(key)

    def run_times(self) -> RunTimes:
        if not any(self._dirty):
            return self._built
        for level, summaries, dirty in zip(self._levels, self._summaries, self._dirty, strict=True):
            for key in dirty:
                summary = run_time_of(level[key])
                if summary is not None:
                    summaries[key] = summary
            dirty.clear()
        users, teams, shapes = (MappingProxyType(dict(s)) for s in self._summaries)
        self._built = RunTimes(users, teams, shapes)
        return self._built


def replay(
    jobs: Sequence[TraceJob],
    *,
    nodes: tuple[Node, ...],
    teams: Mapping[str, TeamSpec],
    config: SchedulerConfig,
    schedule: ScheduleFn,
    gpus_per_node: int = 8,
    progress: ProgressFn | None = None,
    hide_durations: bool = False,
    record_etas: bool = False,
) -> SimResult:
    """Replay ``jobs`` (sorted by submit time) through ``schedule`` on ``nodes``."""
    return Replay(
        jobs,
        nodes=nodes,
        teams=teams,
        config=config,
        schedule=schedule,
        gpus_per_node=gpus_per_node,
        progress=progress,
        hide_durations=hide_durations,
        record_etas=record_etas,
    ).run()

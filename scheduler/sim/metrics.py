"""Metric definitions, computed from job records alone (so they compare across tools).

- *wait* = end - submit - duration (work lost to preemption counts as waiting);
  *JCT* = end - submit. Percentiles interpolate linearly between order statistics.
- *utilisation* = useful GPU-seconds / (capacity x [first submit, last completion]).
  Its *bound* = total work / (capacity x (makespan lower bound - first submit)), where the
  makespan lower bound is the larger of max(submit + duration) and, over every submit time t,
  t + (work submitted at or after t) / capacity.
- *offered load* = work / (capacity x [first submit, last submit]).
- *ETA error* of a job that waited at least ``ETA_MIN_WAIT_S`` before it first started:
  |first start - the likely start its first pending pass estimated| / (first start - submit);
  median and p90 over those jobs. Jobs whose estimate was unknown are counted apart.
- *fairness*: at every moment the teams with demand (held + queued GPUs) get a weighted
  max-min fair share of the cluster (water-filling by weight, each capped at its demand).
  A team's ratio = min(1, held / fair share), time-averaged over the periods when it has
  queued work; ``jain_waiting`` = Jain's index over those ratios (teams that never queued
  are left out). A team's *entitlement* is its fair share integrated over the run and its
  *share* what it held, both as fractions of capacity x [first submit, last completion].
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from scheduler.runtimes import percentile as quantile
from scheduler.sim.engine import Estimate
from scheduler.sim.records import JobRecord, Segment

# The sharing-incentive check: with the shared policy every team's mean wait is at most
# this factor times its mean wait on a private partition, plus this slack.
SHARING_FACTOR = 1.05
SHARING_SLACK_S = 120.0
_EPSILON = 1e-9


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly; 0.0 for no values."""
    if not values:
        return 0.0
    return quantile(sorted(values), q / 100.0)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def makespan_lower_bound(records: Sequence[JobRecord], capacity: float) -> float:
    """No schedule of these jobs on ``capacity`` units can end before this time."""
    longest = max((r.submit_s + r.duration_s for r in records), default=0.0)
    by_submit = sorted(records, key=lambda r: r.submit_s)
    bound = longest
    work_from_here = sum(r.work for r in records)
    index = 0
    while index < len(by_submit):
        submit = by_submit[index].submit_s
        bound = max(bound, submit + work_from_here / capacity)
        while index < len(by_submit) and by_submit[index].submit_s == submit:
            work_from_here -= by_submit[index].work
            index += 1
    return bound


@dataclass(frozen=True, slots=True)
class Summary:
    jobs: int
    mean_wait_s: float
    p50_wait_s: float
    p99_wait_s: float
    mean_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    mean_duration_s: float  # the bound of mean JCT
    makespan_s: float
    makespan_lower_bound_s: float
    utilisation: float
    utilisation_bound: float
    offered_load: float


def summarise(records: Sequence[JobRecord], capacity: float) -> Summary:
    """Queueing, completion and utilisation figures of the finished jobs."""
    done = [r for r in records if r.finished]
    if not done:
        return Summary(0, *([0.0] * 12))
    waits = [r.wait_s for r in done]
    jcts = [r.jct_s for r in done]
    first_submit = min(r.submit_s for r in done)
    last_submit = max(r.submit_s for r in done)
    last_end = max(r.end_s for r in done)
    work = sum(r.work for r in done)
    lower = makespan_lower_bound(done, capacity)
    return Summary(
        jobs=len(done),
        mean_wait_s=mean(waits),
        p50_wait_s=percentile(waits, 50),
        p99_wait_s=percentile(waits, 99),
        mean_jct_s=mean(jcts),
        p50_jct_s=percentile(jcts, 50),
        p99_jct_s=percentile(jcts, 99),
        mean_duration_s=mean([r.duration_s for r in done]),
        makespan_s=last_end - first_submit,
        makespan_lower_bound_s=lower - first_submit,
        utilisation=_ratio(work, capacity * (last_end - first_submit)),
        utilisation_bound=_ratio(work, capacity * (lower - first_submit)),
        offered_load=_ratio(work, capacity * (last_submit - first_submit)),
    )


def _ratio(numerator: float, denominator: float) -> float:
    """A ratio that reads 1.0 where no time passed (nothing to wait for, nothing idle)."""
    return numerator / denominator if denominator > 0 else 1.0


def water_fill(
    demands: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity``, each capped at the team's demand."""
    shares = dict.fromkeys(demands, 0.0)
    active = {team for team, demand in demands.items() if demand > _EPSILON}
    left = capacity
    while active and left > _EPSILON:
        total_weight = sum(weights[team] for team in active)
        capped = {t for t in active if demands[t] <= left * weights[t] / total_weight + _EPSILON}
        if not capped:
            for team in active:
                shares[team] = left * weights[team] / total_weight
            return shares
        for team in capped:
            shares[team] = demands[team]
            left -= demands[team]
        active -= capped
    return shares


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n * sum x^2); 1.0 when all are equal, including all zero."""
    squares = sum(v * v for v in values)
    if not values or squares <= 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


@dataclass(frozen=True, slots=True)
class TeamFairness:
    ratio: float | None  # time-averaged min(1, held / fair share) while queued; None: never
    queued_s: float  # how long the team had queued work
    held_unit_s: float  # GPU-unit-seconds held (including work later lost)
    fair_unit_s: float  # its fair share integrated over the run


@dataclass(frozen=True, slots=True)
class Fairness:
    teams: dict[str, TeamFairness]
    jain_waiting: float


@dataclass(frozen=True, slots=True)
class Span:
    """One stretch of the fairness sweep: from ``start`` for ``elapsed`` seconds every team
    held ``held`` and queued ``queued`` units and was due ``fair`` (water-filled; empty
    when ``elapsed`` is 0); at its end the ``change`` (time, team, change in held, change in
    queued, job id) applies. The dicts are the sweep's own, updated after each span."""

    start: float
    elapsed: float
    held: Mapping[str, float]
    queued: Mapping[str, float]
    fair: Mapping[str, float]
    change: tuple[float, str, float, float, str]


def share_sweep(
    records: Sequence[JobRecord], weights: Mapping[str, float], capacity: float
) -> Iterator[Span]:
    """Held and queued GPUs per team over time, with their water-filled shares."""
    changes = sorted(_demand_changes(records), key=lambda change: change[0])
    teams = sorted({r.tenant for r in records})
    held = dict.fromkeys(teams, 0.0)
    queued = dict.fromkeys(teams, 0.0)
    previous = changes[0][0] if changes else 0.0
    for change in changes:
        time, team, d_held, d_queued, _ = change
        elapsed = time - previous
        fair: Mapping[str, float] = {}
        if elapsed > 0:
            demand = {t: held[t] + queued[t] for t in teams}
            fair = _fair_shares(demand, weights, capacity)
        yield Span(previous, max(elapsed, 0.0), held, queued, fair, change)
        if elapsed > 0:
            previous = time
        held[team] += d_held
        queued[team] += d_queued


def share_ratio(held: float, fair: float) -> float:
    """min(1, held / fair share); 1.0 where the share is nothing."""
    return min(1.0, held / fair) if fair > _EPSILON else 1.0


def fairness(
    records: Sequence[JobRecord], weights: Mapping[str, float], capacity: float
) -> Fairness:
    """Sweep held and queued GPUs per team over time against their water-filled share."""
    teams = sorted({r.tenant for r in records})
    ratio_s = dict.fromkeys(teams, 0.0)
    queued_s = dict.fromkeys(teams, 0.0)
    held_s = dict.fromkeys(teams, 0.0)
    fair_s = dict.fromkeys(teams, 0.0)
    for span in share_sweep(records, weights, capacity):
        if span.elapsed <= 0:
            continue
        for t in teams:
            held_s[t] += span.held[t] * span.elapsed
            fair_s[t] += span.fair[t] * span.elapsed
            if span.queued[t] > _EPSILON:
                queued_s[t] += span.elapsed
                ratio_s[t] += share_ratio(span.held[t], span.fair[t]) * span.elapsed
    result = {
        t: TeamFairness(
            ratio=ratio_s[t] / queued_s[t] if queued_s[t] > 0 else None,
            queued_s=queued_s[t],
            held_unit_s=held_s[t],
            fair_unit_s=fair_s[t],
        )
        for t in teams
    }
    ratios = [f.ratio for f in result.values() if f.ratio is not None]
    return Fairness(result, jain_index(ratios))


def _fair_shares(
    demand: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    if sum(demand.values()) <= capacity:  # no contention: everyone's share is its demand
        return dict(demand)
    return water_fill(demand, weights, capacity)


def _demand_changes(records: Iterable[JobRecord]) -> list[tuple[float, str, float, float, str]]:
    """(time, team, change in held, change in queued, job id) for every job's queue and run
    spans."""
    horizon = max((s.end_s for r in records for s in r.segments), default=0.0)
    horizon = max([horizon, *(r.submit_s for r in records)])
    changes: list[tuple[float, str, float, float, str]] = []
    for record in records:
        team, units, job = record.tenant, record.gpus, record.job_id
        queued_from = record.submit_s
        for segment in record.segments:
            changes.append((queued_from, team, 0.0, units, job))
            changes.append((segment.start_s, team, units, -units, job))
            changes.append((segment.end_s, team, -units, 0.0, job))
            queued_from = segment.end_s
        if not record.finished:  # still queued when the replay ended
            changes.append((queued_from, team, 0.0, units, job))
            changes.append((horizon, team, 0.0, -units, job))
    return changes


@dataclass(frozen=True, slots=True)
class TeamResult:
    jobs: int
    mean_wait_s: float
    share: float
    entitlement: float
    fair_ratio: float | None


def per_team(
    records: Sequence[JobRecord], weights: Mapping[str, float], capacity: float
) -> tuple[dict[str, TeamResult], float]:
    """Each team's waits, share and entitlement, and the run's ``jain_waiting``."""
    measured = fairness(records, weights, capacity)
    done = [r for r in records if r.finished]
    span = capacity * (
        max((r.end_s for r in done), default=0.0) - min((r.submit_s for r in done), default=0.0)
    )
    waits: dict[str, list[float]] = defaultdict(list)
    for record in done:
        waits[record.tenant].append(record.wait_s)
    teams = {
        team: TeamResult(
            jobs=len(waits[team]),
            mean_wait_s=mean(waits[team]),
            share=_ratio(f.held_unit_s, span) if span > 0 else 0.0,
            entitlement=_ratio(f.fair_unit_s, span) if span > 0 else 0.0,
            fair_ratio=f.ratio,
        )
        for team, f in measured.teams.items()
    }
    return teams, measured.jain_waiting


@dataclass(frozen=True, slots=True)
class SharingCheck:
    jobs: int  # the team's jobs that ran in both (jobs left out of its partition are not)
    mean_wait_s: float  # with the shared policy, over those jobs
    private_mean_wait_s: float
    holds: bool | None  # None: no job of the team could run on its partition


def sharing_incentive(
    shared: Sequence[JobRecord], private: Sequence[JobRecord]
) -> dict[str, SharingCheck]:
    """Per team: mean wait shared <= 1.05 x mean wait on its private partition + 120 s."""
    shared_by_id = {r.job_id: r for r in shared if r.finished}
    by_team: dict[str, list[tuple[float, float]]] = defaultdict(list)
    teams = sorted({r.tenant for r in shared} | {r.tenant for r in private})
    for record in private:
        twin = shared_by_id.get(record.job_id)
        if record.finished and twin is not None:
            by_team[record.tenant].append((twin.wait_s, record.wait_s))
    checks: dict[str, SharingCheck] = {}
    for team in teams:
        pairs = by_team.get(team, [])
        if not pairs:
            checks[team] = SharingCheck(0, 0.0, 0.0, None)
            continue
        ours = mean([p[0] for p in pairs])
        theirs = mean([p[1] for p in pairs])
        holds = ours <= SHARING_FACTOR * theirs + SHARING_SLACK_S
        checks[team] = SharingCheck(len(pairs), ours, theirs, holds)
    return checks


# ETA calibration counts the jobs that waited at least this long before they first started.
ETA_MIN_WAIT_S = 600.0


@dataclass(frozen=True, slots=True)
class EtaCalibration:
    jobs: int  # jobs that waited >= ETA_MIN_WAIT_S and had a first pending pass
    unknown: int  # of those, with no likely estimate
    median_error: float  # of |actual - predicted| / actual wait, over the known ones
    p90_error: float
    within_band: float  # share of the known ones whose start fell in [earliest, latest]


def eta_calibration(
    records: Iterable[JobRecord],
    etas: Mapping[str, Estimate],
    *,
    min_wait_s: float = ETA_MIN_WAIT_S,
) -> EtaCalibration:
    """How far each job's first estimate was from its first start (see the module doc)."""
    errors: list[float] = []
    inside = unknown = 0
    for record in records:
        estimate = etas.get(record.job_id)
        if estimate is None or not record.segments:
            continue
        started = record.segments[0].start_s
        waited = started - record.submit_s
        if waited < min_wait_s:
            continue
        if estimate.likely_s is None:
            unknown += 1
            continue
        errors.append(abs(started - estimate.likely_s) / waited)
        low, high = estimate.earliest_s, estimate.latest_s
        inside += (low is None or low <= started + _EPSILON) and (
            high is None or started <= high + _EPSILON
        )
    return EtaCalibration(
        jobs=len(errors) + unknown,
        unknown=unknown,
        median_error=percentile(errors, 50),
        p90_error=percentile(errors, 90),
        within_band=inside / len(errors) if errors else 0.0,
    )


# --- the anti-starvation bounds (docs/scheduling.md#starvation) ------------------------------


def pending_intervals(record: JobRecord) -> list[tuple[float, float]]:
    """When a job waited: from submit to its first start, and from each preemption (the end
    of its grace period) to its next start; the last one open (inf) if it never restarted."""
    intervals: list[tuple[float, float]] = []
    waiting_since: float | None = record.submit_s
    for segment in record.segments:
        if waiting_since is not None:
            intervals.append((waiting_since, segment.start_s))
        waiting_since = segment.end_s if segment.preempted else None
    if waiting_since is not None:
        intervals.append((waiting_since, math.inf))
    return intervals


def guarantee_waits(
    records: Sequence[JobRecord], guarantees: Mapping[str, float]
) -> dict[str, float]:
    """Per job, the longest it waited after it headed its team's queue (the oldest pending
    job of its team) while it fitted within the team's guarantee; jobs that never did so
    while waiting are left out. One user per team: the team's queue is in age order."""
    return {job_id: wait for job_id, (wait, _) in guarantee_heads(records, guarantees).items()}


def guarantee_heads(
    records: Sequence[JobRecord], guarantees: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """``guarantee_waits`` with, per job, the time its longest such wait began (when it
    headed its team's queue within the guarantee). One sweep per team over its starts, ends
    and waits, in time order."""
    by_team: dict[str, list[JobRecord]] = defaultdict(list)
    for record in records:
        by_team[record.tenant].append(record)
    out: dict[str, tuple[float, float]] = {}
    for name, mine in by_team.items():
        guarantee = guarantees.get(name, 0.0)
        # (time, change): +units / -units held, or a wait that begins (record, its end).
        held_changes: list[tuple[float, float]] = []
        waits: list[tuple[float, JobRecord, float]] = []
        for record in mine:
            for segment in record.segments:
                held_changes += [(segment.start_s, record.gpus), (segment.end_s, -record.gpus)]
            for begin, end in pending_intervals(record):
                if begin == end:  # started at once
                    out.setdefault(record.job_id, (0.0, begin))
                else:
                    waits.append((begin, record, end))
        times = sorted({t for t, _ in held_changes} | {w[0] for w in waits} | {w[2] for w in waits})
        held_changes.sort(key=lambda change: change[0])
        waits.sort(key=lambda wait: wait[0])
        queue: list[tuple[float, str, float, JobRecord]] = []  # (submit, id, wait end, record)
        held = 0.0
        next_change = next_wait = 0
        headed: set[tuple[str, float]] = set()  # (job, wait end) already measured
        for t in times:
            while next_change < len(held_changes) and held_changes[next_change][0] <= t:
                held += held_changes[next_change][1]
                next_change += 1
            while next_wait < len(waits) and waits[next_wait][0] <= t:
                begin, record, end = waits[next_wait]
                heapq.heappush(queue, (record.submit_s, record.job_id, end, record))
                next_wait += 1
            while queue and queue[0][2] <= t:  # started by now
                heapq.heappop(queue)
            if not queue:
                continue
            _, job_id, end, record = queue[0]
            if (job_id, end) not in headed and held + record.gpus <= guarantee + _EPSILON:
                headed.add((job_id, end))
                if end - t >= out.get(job_id, (0.0, t))[0]:
                    out[job_id] = (end - t, t)
    return out


@dataclass(frozen=True, slots=True)
class GuaranteeOverrun:
    """The waits within a guarantee over bound 1, by what they faced when the bound ran out
    (docs/scheduling.md#starvation)."""

    over: int  # waits after heading the team's queue longer than the bound
    # ... of which reclaim could not have made room when the bound ran out, and the borrowed
    # jobs it spares for having run past ``reclaim_max_run_s`` would have: an assumption of
    # bound 1, not a violation of it
    protected: int
    worst_unprotected_s: float  # the longest wait over the bound that is not such a case


def guarantee_overruns(
    records: Sequence[JobRecord],
    guarantees: Mapping[str, float],
    *,
    capacity: float,
    gpus_per_node: int,
    bound_s: float,
    reclaim_max_run_s: float | None,
    min_run_time_s: float,
) -> GuaranteeOverrun:
    """Each wait within a guarantee longer than ``bound_s`` after heading its team's queue,
    looked at the moment the bound ran out (headed + ``bound_s``): *protected* when no node's
    free GPUs plus the borrowed GPUs reclaim could take there (jobs of teams above their
    guarantee that had run ``min_run_time_s`` and not ``reclaim_max_run_s``) hold the job,
    while with the borrowed GPUs reclaim spares for their run time some node would (a gang
    larger than a node: the same by the whole cluster's GPUs). From the records alone (their
    segments' slices), whole GPUs; it tells the cases apart, it does not replay the pass."""
    heads = guarantee_heads(records, guarantees)
    by_id = {record.job_id: record for record in records}
    over = [(job_id, wait, at) for job_id, (wait, at) in heads.items() if wait > bound_s + _EPSILON]
    protected = 0
    worst = 0.0
    for job_id, wait, headed in over:
        if reclaim_max_run_s is not None and _only_protected_room(
            records,
            by_id[job_id],
            guarantees,
            nodes=round(capacity / gpus_per_node),
            gpus_per_node=gpus_per_node,
            when=headed + bound_s,
            reclaim_max_run_s=reclaim_max_run_s,
            min_run_time_s=min_run_time_s,
        ):
            protected += 1
        else:
            worst = max(worst, wait)
    return GuaranteeOverrun(len(over), protected, worst)


def _only_protected_room(
    records: Sequence[JobRecord],
    record: JobRecord,
    guarantees: Mapping[str, float],
    *,
    nodes: int,
    gpus_per_node: int,
    when: float,
    reclaim_max_run_s: float,
    min_run_time_s: float,
) -> bool:
    """At ``when``: reclaim could not make room for ``record`` on a node (or, for a gang
    larger than a node, in the cluster), and would have without ``reclaim_max_run_s``."""
    running: list[tuple[JobRecord, Segment]] = [
        (other, segment)
        for other in records
        for segment in other.segments
        if segment.start_s <= when < segment.end_s
    ]
    team_held: dict[str, float] = defaultdict(float)
    for other, _ in running:
        team_held[other.tenant] += other.gpus
    borrowing = {
        team
        for team, units in team_held.items()
        if team != record.tenant and units > guarantees.get(team, 0.0) + _EPSILON
    }
    used: dict[str, float] = defaultdict(float)  # per node
    young: dict[str, float] = defaultdict(float)  # reclaimable, per node
    old: dict[str, float] = defaultdict(float)  # borrowed but spared, per node
    for other, segment in running:
        if not segment.slice_ids:
            continue
        per_slice = other.gpus / len(segment.slice_ids)
        ran = when - segment.start_s
        for slice_id in segment.slice_ids:
            node = slice_id.split("/", 1)[0]
            used[node] += per_slice
            if other.tenant in borrowing and ran >= min_run_time_s:
                if ran < reclaim_max_run_s:
                    young[node] += per_slice
                else:
                    old[node] += per_slice
    need = record.gpus - _EPSILON
    empty = gpus_per_node if len(used) < nodes else 0.0  # a node nobody uses
    if record.gpus > gpus_per_node:  # a gang over nodes: count the cluster
        free = nodes * gpus_per_node - sum(used.values())
        with_reclaim = free + sum(young.values())
        return with_reclaim < need <= with_reclaim + sum(old.values())
    room = max([empty, *(gpus_per_node - used[n] + young[n] for n in used)])
    spared = max([empty, *(gpus_per_node - used[n] + young[n] + old[n] for n in used)])
    return room < need <= spared


@dataclass(frozen=True, slots=True)
class Starvation:
    max_wait_s: float
    starved: int  # jobs that waited longer than max_wait_s before they first started
    worst_wait_s: float  # the longest first wait among them (0 without any)
    worst_bound_s: float  # the bound of that job
    worst_ratio: float  # the largest wait / bound (<= 1 when every bound holds)
    violations: int  # jobs that waited longer than their bound
    # starved jobs whose bound counts from a later start of another team's work within its
    # guarantee than the end of their maximum wait (the bound's assumption at work)
    deferred: int


def starvation(
    records: Sequence[JobRecord],
    *,
    max_wait_s: float,
    longest_limit_s: float,
    grace_s: float,
    guarantees: Mapping[str, float] | None = None,
) -> Starvation:
    """Each job's first wait against bound 2 of docs/scheduling.md#starvation: it starts
    within (1 + k) x (longest limit + grace) of *since*, k = the jobs queued before it that
    still waited at some time after since. Since is the end of its maximum wait or, if
    later, the last time before its start that another team's job started within that
    team's guarantee while this one would have borrowed (a guarantee comes first, so such
    work may take the room it gathers: the bound's assumption). Held units come from the
    records' segments (whole units per job); without ``guarantees`` no team has one."""
    intervals = {r.job_id: pending_intervals(r) for r in records}
    guarantees = guarantees or {}
    held: dict[str, tuple[list[float], list[float]]] = {}
    # The starts of jobs within their team's guarantee, in time order: (time, team).
    within: list[tuple[float, str]] = []
    if guarantees:
        held = _held_steps(records)
        # What each team started at each time: of jobs started together, the records do not
        # say which went first, so each counts as within its guarantee if it was with the
        # team's units from before that time alone.
        started: dict[tuple[str, float], float] = defaultdict(float)
        for r in records:
            for segment in r.segments:
                started[(r.tenant, segment.start_s)] += r.gpus
        within = sorted(
            (segment.start_s, r.tenant)
            for r in records
            if guarantees.get(r.tenant, 0.0) > 0.0
            for segment in r.segments
            if _held_at(held, r.tenant, segment.start_s)
            - started[(r.tenant, segment.start_s)]
            + r.gpus
            <= guarantees[r.tenant] + _EPSILON
        )
    times = [t for t, _ in within]
    starved = violations = deferred = 0
    worst = (0.0, 0.0)
    ratio = 0.0
    for record in records:
        start = record.segments[0].start_s if record.segments else math.inf
        wait = start - record.submit_s
        if wait <= max_wait_s:
            continue
        starved += 1
        since = record.submit_s + max_wait_s
        mine = guarantees.get(record.tenant, 0.0)
        for at in range(bisect.bisect_left(times, start) - 1, -1, -1):
            t, team = within[at]
            if t < since:
                break
            if team != record.tenant and (
                _held_at(held, record.tenant, t) + record.gpus > mine + _EPSILON
            ):
                since = t
                deferred += 1
                break
        age = (record.submit_s, record.job_id)
        ahead = sum(
            1
            for other in records
            if (other.submit_s, other.job_id) < age
            and any(a < start and b > since for a, b in intervals[other.job_id])
        )
        bound = since - record.submit_s + (1 + ahead) * (longest_limit_s + grace_s)
        violations += wait > bound + _EPSILON
        if wait / bound > ratio:
            ratio = wait / bound
        if wait > worst[0]:
            worst = (wait, bound)
    return Starvation(max_wait_s, starved, worst[0], worst[1], ratio, violations, deferred)


def _held_steps(records: Sequence[JobRecord]) -> dict[str, tuple[list[float], list[float]]]:
    """Per team, the times its held units change and what it holds from each on."""
    changes: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for record in records:
        mine = changes[record.tenant]
        for segment in record.segments:
            mine[segment.start_s] += record.gpus
            mine[segment.end_s] -= record.gpus
    steps: dict[str, tuple[list[float], list[float]]] = {}
    for team, by_time in changes.items():
        times = sorted(by_time)
        steps[team] = (times, list(itertools.accumulate(by_time[t] for t in times)))
    return steps


def _held_at(steps: Mapping[str, tuple[list[float], list[float]]], team: str, t: float) -> float:
    """What ``team`` holds at ``t`` (the jobs that start at ``t`` included, those that end
    then not)."""
    found = steps.get(team)
    if found is None:
        return 0.0
    times, held = found
    at = bisect.bisect_right(times, t) - 1
    return held[at] if at >= 0 else 0.0

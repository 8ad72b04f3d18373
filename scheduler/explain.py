"""Step 5, explain: a reason with numbers, a position and an estimated start per pending job.

During admission (step 4) a job that cannot start is recorded as ``Left`` with a reason
code and the numbers known then (``capacity_reason`` tells apart why a job fits nowhere).
When the pass ends, ``Explainer`` turns them into ``Pending`` decisions: it fills in the
numbers that are only true at the end (what is free then, the fair-share factors), writes
the message and estimates the start from the running jobs' time limits.

With explanations off (trace replays) the reasons are bare codes and nothing is estimated.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType

from scheduler.arrays import ArrayThrottle
from scheduler.backfill import Estimator, Reservation, Timeline
from scheduler.cluster import FreeIndex, Pool
from scheduler.config import Cache, SchedulerConfig
from scheduler.eta import QueuePlan, later
from scheduler.memo import PassMemo, Releases, Verdict
from scheduler.model import (
    NO_RUN_TIMES,
    Assign,
    Job,
    Pending,
    PendingCode,
    Reason,
    RunTimes,
    Slice,
    SliceKind,
)
from scheduler.order import Candidate, FairShare, leading_teams
from scheduler.quota import EPS, Blocked, Held, Numbers
from scheduler.runtimes import end_band, run_band, running_runs

_Known = tuple[Reason, float | None]  # an explained reason and estimated start
_Fits = tuple[float | None, float | None, float | None]  # earliest, likely, latest fit
# A job placed in this pass: its units, and when it ends at the latest (None: unknown).
Placed = tuple[Job, float, float | None]


@dataclass(slots=True)
class Left:
    """A job left pending, in the order it was considered."""

    job: Job
    code: PendingCode
    numbers: Numbers = field(default_factory=dict)  # may be shared: copy before changing
    candidate: Candidate | None = None  # None: parked in step 2, never considered
    eta: float | None = None
    eta_known: bool = False
    verdict: Verdict | None = None  # the remembered verdict it took or left (Cache.VERDICTS)


# --- why a job fits nowhere (step 4) ---------------------------------------------------------


def capacity_reason(
    c: Candidate,
    *,
    reservations: Sequence[Reservation],
    index: FreeIndex,
    start_largest: Mapping[Pool, int],
    fair_order: bool,
) -> Blocked:
    """Why ``c`` fits nowhere: behind a reservation; below fair share (it fitted when the pass
    began and other teams' jobs, ahead in fair-share order, took the room); or no fit."""
    blocking = _blocking_reservation(c, reservations, index)
    if blocking is not None:
        numbers: Numbers = {"reserved_for": blocking.job_id}
        if blocking.at is not None:
            numbers["at"] = blocking.at
        return (PendingCode.WAITING_FOR_RESERVATION, numbers)
    start = max((start_largest.get(p, 0) for p in c.pools), default=0)
    # (the factors are filled in when explaining, as they end the pass)
    takers = index.takers
    team = c.job.team
    others = any(len(takers.get(p, ())) > (team in takers.get(p, ())) for p in c.pools)
    if start >= c.minimum and not c.job.request.multi_node and others and fair_order:
        return (PendingCode.FAIR_SHARE, no_fit_numbers(c))
    return (PendingCode.NO_FIT, no_fit_numbers(c))


def _blocking_reservation(
    c: Candidate, reservations: Sequence[Reservation], index: FreeIndex
) -> Reservation | None:
    team = c.job.team
    for reservation in reservations:
        for (pool, node), kept in reservation.by_node.items():
            if pool in c.pools and index.node_free(pool, team, node) + kept >= c.minimum:
                return reservation
    return None


def no_fit_numbers(c: Candidate) -> Numbers:
    request = c.job.request
    return {
        "needs": c.minimum,
        "largest_free": 0,  # filled in when explaining, from the end of the pass
        "kind": request.profile or request.kind.value,
    }


# --- the pending decisions (step 5) ----------------------------------------------------------


class Explainer:
    """Reasons, positions and estimates of the jobs a pass left pending."""

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        now: float,
        index: FreeIndex,
        timeline: Timeline,
        held: Sequence[Held],
        placed: Sequence[Placed],
        fair: FairShare,
        placed_teams: set[str],
        memo: PassMemo,
        arrays: ArrayThrottle,
        run_times: RunTimes = NO_RUN_TIMES,
        assigned: Sequence[Assign] = (),
        reservations: Sequence[Reservation] = (),
    ) -> None:
        self._explain = config.explain
        self._caches = config.caches
        self._now = now
        self._index = index
        self._timeline = timeline
        self._held = held
        self._placed = placed
        self._fair = fair
        self._placed_teams = placed_teams
        self._memo = memo
        self._arrays = arrays
        self._etas: dict[str, float | None] = {}
        # The two teams that placed jobs with the highest factors (ties by name): the leader
        # among the others, for a team's FAIR_SHARE numbers, is the first that is not it.
        self._leaders = leading_teams(fair, placed_teams, 2) if config.explain else []
        self._by_team_ends: dict[str, list[tuple[float, float, str]]] = {}
        self._run_times = run_times
        # The median time run so far of the running jobs of each user and shape
        # (``_timelines``; ``runtimes.running_runs``).
        self._running_runs: Mapping[str, float] = {}
        self._assigned = assigned  # the Assign of each placed job, in the order of ``placed``
        self._reservations = reservations

    def pending(self, entries: Iterable[Left]) -> list[Pending]:
        """``entries`` in their final order (position 1 first)."""
        self._memo.seal()
        explain = self._explain
        estimator = (
            Estimator(
                self._index,
                self._timeline,
                self._now,
                remember=Cache.ESTIMATES in self._caches,
            )
            if explain
            else None
        )
        explained: list[tuple[Left, Reason, float | None]] = []
        # Jobs alike in what explains them share one reason and estimate (a long queue has
        # many: same team, same request, same verdict).
        alike: dict[tuple[object, ...], _Known] | None = (
            {} if Cache.SHARED_REASONS in self._caches else None
        )
        etas = self._etas
        shared = Cache.SHARED_VERDICTS in self._caches
        bare: list[Pending] = []  # with explanations off
        for position, entry in enumerate(entries, start=1):
            # Most of a long queue took a remembered verdict that an alike job explained.
            verdict = entry.verdict
            if explain and verdict is not None and verdict.explained is not None:
                reason, eta = verdict.explained
                etas[entry.job.id] = eta
                explained.append((entry, reason, eta))
                continue
            c = entry.candidate
            if not explain:
                bare.append(
                    new_pending(
                        entry.job.id, BARE_REASONS[entry.code], position, entry.eta, None, None
                    )
                )
                continue
            if c is None and not entry.eta_known:
                # Parked jobs: the reason is all there is, alike for alike numbers (and for
                # NO_MATCHING_SLICES the same request).
                what = _request_text(entry.job) if entry.code is NO_MATCHING else ""
                key: tuple[object, ...] = (entry.code, what, *entry.numbers.values())
                known = alike.get(key) if alike is not None else None
                if known is None:
                    known = self._explain_one(entry, estimator)
                    if alike is not None:
                        alike[key] = known
                reason, eta = known
            elif c is None or entry.eta_known:
                reason, eta = self._explain_one(entry, estimator)
            else:
                code = entry.code
                user = c.job.user if code is PendingCode.MEMBER_LIMIT else ""
                team = c.job.team
                if code is PendingCode.NO_FIT and not any(p[0] is MPS for p in c.pools):
                    team = ""  # what is free, and when, is the same for every team
                # (a multi-node gang's estimate is when the pool, not one node, has room)
                spread = c.job.request.multi_node
                key = (code, team, user, c.pools, c.minimum, spread, *entry.numbers.values())
                known = alike.get(key) if alike is not None else None
                if known is None:
                    known = self._explain_one(entry, estimator)
                    if alike is not None:
                        alike[key] = known
                if verdict is not None and shared:
                    verdict.explained = known
                reason, eta = known
            etas[entry.job.id] = eta
            explained.append((entry, reason, eta))
        if not explain:
            return bare
        assert estimator is not None
        return self._with_bands(explained, estimator)

    # -- the band: earliest, likely, latest (``scheduler.eta``) ---------------------------------

    def _with_bands(
        self, explained: Sequence[tuple[Left, Reason, float | None]], estimator: Estimator
    ) -> list[Pending]:
        """The pending decisions, each with its estimate as a band. The estimate found above
        (from the time limits, ignoring the jobs ahead) is the floor of the latest start;
        the likely and latest starts book the queue ahead in order (``scheduler.eta``), and
        the earliest is when the request first fits on the earliest ends."""
        now = self._now
        history = self._run_times
        lines = self._timelines()
        pool_of = self._index.shape.slice_pool
        node_of = self._index.shape.slice_node
        set_aside: dict[tuple[Pool, int], int] = {}
        for reservation in self._reservations:
            for item in reservation.set_aside:  # free, kept for the job that reserved them
                pool = pool_of[item.id]
                key = (pool, node_of[item.id])
                set_aside[key] = set_aside.get(key, 0) + 1
        remember = Cache.ESTIMATES in self._caches
        fits: dict[int, Estimator] = {id(self._timeline): estimator}
        for line in lines:
            if id(line) not in fits:
                fits[id(line)] = Estimator(self._index, line, now, remember=remember)
        early_fit, likely_fit, latest_fit = (fits[id(line)] for line in lines)
        # A job holding a reservation may count the slices set aside for it as free.
        reserved_fit = Estimator(self._index, lines[0], now, remember=remember, set_aside=set_aside)
        known_history = lines[0] is not self._timeline
        likely_plan = QueuePlan(lines[1], self._index, set_aside, now)
        same = lines[2] is lines[1]
        latest_plan = likely_plan if same else QueuePlan(lines[2], self._index, set_aside, now)
        # 1. Book every planned job in queue order (a job waiting for room gets its start
        # only when the plans finish); 2. each job's band.
        booked: list[tuple[int, int] | None] = []
        book = booked.append
        for entry, _, eta in explained:
            c = entry.candidate
            code = entry.code
            if c is None or code in _AS_EXPLAINED or (eta is None and code in _HELD_BACK):
                book(None)
                continue
            job = c.job
            # quota, array: held back until ``eta`` (from the limits)
            not_before = eta if code in _HELD_BACK and eta is not None else now
            if known_history:
                _, run_likely, run_latest = run_band(job, history, self._running_runs)
            else:
                run_likely = run_latest = job.time_limit_s
            spread = job.request.multi_node
            likely_at = likely_plan.book(c.pools, c.minimum, spread, run_likely, not_before)
            if same and run_latest == run_likely:
                book((likely_at, -1))
            else:
                latest_at = latest_plan.book(c.pools, c.minimum, spread, run_latest, not_before)
                book((likely_at, latest_at))
        likely_starts = likely_plan.finish()
        latest_starts = likely_starts if same else latest_plan.finish()
        pending: list[Pending] = []
        append = pending.append
        reserved = PendingCode.RESERVED
        # (earliest, likely, latest) fit per request (``Cache.ESTIMATES``), by the identity of
        # its pools, which the candidates keep alive through the pass.
        fits_of: dict[tuple[int, int, bool, bool], _Fits] = {}
        for position, ((entry, reason, eta), handles) in enumerate(
            zip(explained, booked, strict=True), start=1
        ):
            c = entry.candidate
            code = entry.code
            if c is None or code in _AS_EXPLAINED:
                append(new_pending(entry.job.id, reason, position, eta, eta, eta))
                continue
            held_back = eta if code in _HELD_BACK else None  # quota, array: from the limits
            if handles is None:
                append(new_pending(entry.job.id, reason, position, None, None, None))
                continue
            job = c.job
            pools, need, spread = c.pools, c.minimum, job.request.multi_node
            likely = likely_starts[handles[0]]
            latest = likely if handles[1] < 0 else latest_starts[handles[1]]
            # The fits depend on the request alone (its pools are one object per distinct
            # request): one look-up per request and kind of fit, not per job.
            fit_key = (id(pools), need, spread, code is reserved)
            fit = fits_of.get(fit_key)
            if fit is None:
                if code is reserved:
                    earliest = reserved_fit.earliest(pools, need, spread)
                    fit = (earliest, earliest, earliest)
                elif known_history:
                    fit = (
                        early_fit.earliest(pools, need, spread),
                        likely_fit.earliest(pools, need, spread),
                        latest_fit.earliest(pools, need, spread),
                    )
                else:  # one time line: one fit
                    earliest = early_fit.earliest(pools, need, spread)
                    fit = (earliest, earliest, earliest)
                if remember:
                    fits_of[fit_key] = fit
            earliest, likely_fit_at, latest_fit_at = fit
            # (``later`` written out: this runs for every pending job)
            if pools and pools[0][0] is MPS:  # (not planned: the earliest fit)
                likely, latest = likely_fit_at, latest_fit_at
            else:
                if likely is None or likely_fit_at is None:
                    likely = None
                elif likely_fit_at > likely:
                    likely = likely_fit_at
                if latest is None or latest_fit_at is None:
                    latest = None
                elif latest_fit_at > latest:
                    latest = latest_fit_at
            if held_back is not None:
                earliest = later(earliest, held_back)
                likely = later(likely, held_back)
            if code is reserved and eta is not None:
                latest = max(eta, now)  # its slices are kept for it: it starts by then
            elif latest is not None and eta is not None and eta > latest:
                latest = eta
            if likely is not None and latest is not None and likely > latest:
                likely = latest
            if earliest is not None and likely is not None and earliest > likely:
                earliest = likely
            append(new_pending(job.id, reason, position, likely, earliest, latest))
        return pending

    def _timelines(self) -> tuple[Timeline, Timeline, Timeline]:
        """The time lines of ends for the earliest, likely and latest estimates: the pass's
        own (the time limits) when there is no history, else ends from
        ``scheduler.runtimes``."""
        history = self._run_times
        if not (history.by_user or history.by_team or history.by_shape):
            return self._timeline, self._timeline, self._timeline
        now = self._now
        ends: tuple[list[tuple[float | None, Sequence[Slice]]], ...] = ([], [], [])
        ran: list[tuple[Job, float]] = []
        for run, slices, _, end in self._held:
            if run.preempting_since is not None:
                band: tuple[float | None, ...] = (end, end, end)  # the end of its grace
            else:
                band = end_band(run.job, run.started_at, now, history)
                ran.append((run.job, now - run.started_at))
            for line, at in zip(ends, band, strict=True):
                line.append((at, slices))
        self._running_runs = running_runs(ran)
        by_id = self._index.shape.slice_by_id
        for (job, _, _), assign in zip(self._placed, self._assigned, strict=True):
            taken = [by_id[i] for i in assign.slice_ids]
            for line, run_s in zip(ends, run_band(job, history, self._running_runs), strict=True):
                line.append((None if run_s is None else now + run_s, taken))
        early, likely, latest = (Timeline(self._index, line) for line in ends)
        return early, likely, latest

    def _explain_one(self, entry: Left, estimator: Estimator | None) -> _Known:
        """The reason (with end-of-pass numbers) and estimated start of one pending job."""
        c = entry.candidate
        if c is not None and not entry.eta_known:
            numbers = entry.numbers = dict(entry.numbers)  # (shared with alike jobs)
            if "largest_free" in numbers:
                # Say what is free when the pass ends, not when the job was considered.
                numbers["largest_free"] = self._index.largest_free(c.pools, c.job.team)
            if entry.code is PendingCode.FAIR_SHARE:
                numbers.update(self._fair_share_numbers(c.job.team))
            return _reason(entry), self._eta(entry, estimator)
        return _reason(entry), entry.eta if entry.eta_known else None

    def _fair_share_numbers(self, team: str) -> Numbers:
        """The team's fair-share factor, and the highest among the other teams that placed
        jobs this pass, as the pass ends."""
        name, factor = next(((n, f) for n, f in self._leaders if n != team), ("", -1.0))
        return {
            "team_factor": round(self._fair.team_factor(team), 4),
            "leading_team": name,
            "leading_factor": round(factor, 4),
        }

    def _eta(self, entry: Left, estimator: Estimator | None) -> float | None:
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
        if code is PendingCode.ARRAY_THROTTLE:
            numbers = entry.numbers
            place = self._arrays.start(str(numbers["array"]), int(numbers["ahead"]), self._now)
            return None if place is None else max(fit, place)
        # Behind a FIFO head or a reservation: not before the job it waits for.
        ahead = entry.numbers.get("blocked_by") or entry.numbers.get("reserved_for")
        if ahead is not None:
            before = self._etas.get(str(ahead))
            return None if before is None else max(fit, before)
        return fit

    def _quota_free_at(self, entry: Left) -> float | None:
        """When enough of the team's (or user's) own jobs end for this one to fit its limit."""
        used = float(entry.numbers.get("used", 0.0))
        limit = float(entry.numbers.get("limit", 0.0))
        needs = float(entry.numbers.get("needs", 0.0))
        missing = used + needs - limit - EPS
        if missing <= 0:
            return self._now
        job = entry.job
        user = job.user if entry.code is PendingCode.MEMBER_LIMIT else ""
        ends, freed = self._releases(job.team, user)
        at = bisect.bisect_left(freed, missing)
        return ends[at] if at < len(ends) and ends[at] != math.inf else None

    def _releases(self, team: str, user: str) -> Releases:
        """End times of a team's (or one member's) jobs, and the units freed by each time."""
        memo = self._memo
        found = memo.releases(team, user)
        if found is not None:
            return found
        if not memo.remembers_releases:
            return _cumulative(self._team_ends(team, user))
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
                memo.keep_releases(team, name, _cumulative(mine))
            found = memo.releases(team, user)
            if found is None:
                found = ([], [])
                memo.keep_releases(team, user, found)
            return found
        found = _cumulative(releases)
        memo.keep_releases(team, user, found)
        return found

    def _group_releases(self) -> None:
        """Every holding's (end, units, user) per team, sorted by end once (a member's list
        is the team's, filtered, so it stays sorted)."""
        by_team = self._by_team_ends
        inf = math.inf
        for run, _, units, end in self._held:
            job = run.job
            release = (inf if end is None else end, units, job.user)
            found = by_team.get(job.team)
            if found is None:
                by_team[job.team] = [release]
            else:
                found.append(release)
        for job, units, end in self._placed:
            by_team.setdefault(job.team, []).append((inf if end is None else end, units, job.user))
        by_end = itemgetter(0)  # (equal ends free together: their order does not matter)
        for releases in by_team.values():
            releases.sort(key=by_end)

    def _team_ends(self, team: str, user: str) -> list[tuple[float, float, str]]:
        """The (end, units, user) of a team's (or member's) jobs, sorted by end, afresh."""
        inf = math.inf
        ends = [
            (inf if end is None else end, units, run.job.user)
            for run, _, units, end in self._held
            if run.job.team == team and (not user or run.job.user == user)
        ]
        ends += [
            (inf if end is None else end, units, job.user)
            for job, units, end in self._placed
            if job.team == team and (not user or job.user == user)
        ]
        ends.sort(key=itemgetter(0))
        return ends


def _cumulative(releases: list[tuple[float, float, str]]) -> Releases:
    """End times, and the units freed by each of them, of releases sorted by end."""
    return [end for end, _, _ in releases], list(itertools.accumulate(u for _, u, _ in releases))


# --- one pending decision per pending job ---------------------------------------------------

# The slots of ``Pending``, set through their descriptors: a frozen dataclass's ``__init__``
# goes through ``object.__setattr__`` once per field, which costs twice as much, and a pass
# makes one per pending job, explained or not (``tests/scheduler/test_core_speed_paths`` pins
# that this makes the same object as ``Pending(...)``).
_PENDING_SLOTS: tuple[Callable[[Pending, object], None], ...] = tuple(
    getattr(Pending, f.name).__set__ for f in dataclasses.fields(Pending)
)
_SET_ID, _SET_REASON, _SET_POSITION, _SET_ETA, _SET_EARLIEST, _SET_LATEST = _PENDING_SLOTS


def new_pending(
    job_id: str,
    reason: Reason,
    position: int,
    eta: float | None,
    earliest: float | None,
    latest: float | None,
) -> Pending:
    """``Pending(job_id, reason, position, eta, earliest, latest)``, made faster."""
    made: Pending = object.__new__(Pending)
    _SET_ID(made, job_id)
    _SET_REASON(made, reason)
    _SET_POSITION(made, position)
    _SET_ETA(made, eta)
    _SET_EARLIEST(made, earliest)
    _SET_LATEST(made, latest)
    return made


# --- reasons -------------------------------------------------------------------------------

# Codes with no estimate at all (the job cannot start until a person acts).
_NO_ESTIMATE = frozenset({PendingCode.BUDGET_EXHAUSTED, PendingCode.PRIORITY_NOT_ALLOWED})
# Codes held back by more than capacity: the estimate from the time limits is a floor.
_HELD_BACK = frozenset(
    {PendingCode.QUOTA_LIMIT, PendingCode.MEMBER_LIMIT, PendingCode.ARRAY_THROTTLE}
)
# Codes whose band is the estimate itself (none, or the end of the victims' grace).
_AS_EXPLAINED = _NO_ESTIMATE | {PendingCode.WAITING_FOR_PREEMPTION}

# With explanations off a reason is its code alone: one immutable object per code.
BARE_REASONS: Mapping[PendingCode, Reason] = MappingProxyType(
    {code: Reason(code, "") for code in PendingCode}
)
NO_MATCHING = PendingCode.NO_MATCHING_SLICES
MEMBER = PendingCode.MEMBER_LIMIT
MPS = SliceKind.MPS


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


def _reason(entry: Left) -> Reason:
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
    elif code is PendingCode.ARRAY_THROTTLE:
        text = f"array {n['array']} runs {n['running']} of at most {n['max_running']}"
        if n["ahead"]:
            text += f"; members waiting before this one: {n['ahead']}"
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

"""Quota: what each team and member holds during one pass, and the room their limits leave.

Per team: ``guaranteed`` units it always gets back, a ``limit`` it may never pass, a
``member_limit`` per member (tightened for a member with a limit of their own:
``Team.limit_of``) and an optional GPU-hour budget. Above its guarantee a team
borrows; a team below it is *under its guarantee* and may reclaim (see ``scheduler.preempt``).

The ledger counts plain units for the limits and billed units (per-model weights) for fair
share. A job being stopped holds its units until its agent reports it stopped: its team may
not use that room in the meantime, and reclaim counts what a team *keeps* once its stops
are done.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, cast

from scheduler.cluster import Placement
from scheduler.model import Job, PendingCode, RunningJob, Slice, Team

if TYPE_CHECKING:
    from scheduler.order import Candidate

EPS = 1e-9
_UNITS = attrgetter("units")
Numbers = dict[str, float | str]
# Why a job may not start now, with the numbers behind it.
Blocked = tuple[PendingCode, Numbers]
# A running job as the pass indexed it: its slices, their units, and when it ends at the
# latest (its time limit, or the end of its grace period; None: unknown).
Held = tuple[RunningJob, tuple[Slice, ...], float, float | None]


@dataclass(slots=True)
class Ledger:
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

    def charge_billed(self, held: Iterable[Held], weights: Mapping[str, float]) -> None:
        """Billed units held per team and user (the fair-share currency), once ``team`` and
        ``user`` count the running jobs."""
        if not weights:
            self.team_billed = dict(self.team)
            self.user_billed = dict(self.user)
            return
        for run, slices, _, _ in held:
            billed = sum(item.units * weights.get(item.model, 1.0) for item in slices)
            team, key = run.job.team, (run.job.team, run.job.user)
            self.team_billed[team] = self.team_billed.get(team, 0.0) + billed
            self.user_billed[key] = self.user_billed.get(key, 0.0) + billed


def guaranteed(teams: Mapping[str, Team], name: str) -> float:
    """A team's guarantee (0 for a team the snapshot does not know)."""
    team = teams.get(name)
    return team.guaranteed if team is not None else 0.0


def fits_guarantee(held: float, units: float, team: Team) -> bool:
    """Would ``units`` more keep ``team``, holding ``held`` now, within its guarantee?"""
    return held + units <= team.guaranteed + EPS


def within_guarantee(c: Candidate, held: float) -> bool:
    """Would ``c`` keep its team, holding ``held`` now, within its guarantee? (``fits_guarantee``
    for ``c``'s units, written out: a pass asks it for nearly every job it meets, and a
    call more cost 4% of a long-queue pass's instructions.)"""
    return held + c.least <= c.team.guaranteed + EPS


def under_guarantee(
    names: Iterable[str], ledger: Mapping[str, float], team_of: Mapping[str, Team]
) -> set[str]:
    """The teams of ``names`` that hold less than their guarantee."""
    return {name for name in names if ledger.get(name, 0.0) < team_of[name].guaranteed - EPS}


def guarantee_figures(
    names: Iterable[str], ledger: Mapping[str, float], team_of: Mapping[str, Team]
) -> dict[str, tuple[float, float]]:
    """(units held, guarantee) of each team of ``names`` under its guarantee: for a walk over
    many jobs that writes ``within_guarantee`` out as ``held + c.least <= guarantee + EPS``
    with each team's figures looked up once (a call per job cost 2 to 4% of a long-queue
    pass's instructions)."""
    return {
        name: (ledger.get(name, 0.0), team_of[name].guaranteed)
        for name in under_guarantee(names, ledger, team_of)
    }


def room(c: Candidate, ledger: Ledger) -> float | Blocked:
    """Units ``c`` may still take (``math.inf``: no limit), or why it may take none."""
    team, job = c.team, c.job
    if team.budget_gpu_hours is not None and team.used_gpu_hours >= team.budget_gpu_hours:
        spent: Numbers = {"used_gpu_hours": team.used_gpu_hours, "budget": team.budget_gpu_hours}
        return (PendingCode.BUDGET_EXHAUSTED, spent)
    needs = c.least
    left = math.inf
    if team.limit is not None:
        used = ledger.team.get(job.team, 0.0)
        if used + needs > team.limit + EPS:
            return (PendingCode.QUOTA_LIMIT, {"used": used, "limit": team.limit, "needs": needs})
        left = team.limit - used
    member = member_room(c, ledger)
    if isinstance(member, tuple):
        return member
    return left if member == math.inf else min(left, member)


def member_room(c: Candidate, ledger: Ledger) -> float | Blocked:
    """Units ``c``'s member limit leaves its member (``math.inf``: no member limit), or
    MEMBER_LIMIT when it leaves less than ``c``'s minimum (``room``'s last check)."""
    team, job = c.team, c.job
    member_limit = team.limit_of(job.user)
    if member_limit is None:
        return math.inf
    used = ledger.user.get((job.team, job.user), 0.0)
    needs = c.least
    if used + needs > member_limit + EPS:
        mine: Numbers = {"used": used, "limit": member_limit, "needs": needs}
        return (PendingCode.MEMBER_LIMIT, mine)
    return member_limit - used


def over_limit(c: Candidate, placement: Placement, ledger: Ledger) -> Blocked | None:
    """The exact units of a placement (MPS shares may differ in size) against the limits."""
    team, job = c.team, c.job
    units = sum(item.units for _, items in placement for item in items)
    checks = (
        (team.limit, ledger.team.get(job.team, 0.0), PendingCode.QUOTA_LIMIT),
        (
            team.limit_of(job.user),
            ledger.user.get((job.team, job.user), 0.0),
            PendingCode.MEMBER_LIMIT,
        ),
    )
    for limit, used, code in checks:
        if limit is not None and used + units > limit + EPS:
            return (code, {"used": used, "limit": limit, "needs": units})
    return None


def hold(
    running: Iterable[RunningJob],
    slices: Mapping[str, Slice],
    *,
    grace_period_s: float,
    weights: Mapping[str, float],
) -> tuple[Ledger, list[Held], dict[str, str]]:
    """What the running jobs hold: the ledger, each job's slices, units and latest end (its
    time limit; for a victim in its grace period, the end of the grace), and the team that
    holds each slice id."""
    ledger = Ledger()
    team_units, user_units = ledger.team, ledger.user
    holders: dict[str, str] = {}
    held_list: list[Held] = []
    find = slices.get
    # One tight loop: a pass meets every running job.
    for run in running:
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
            # (tuples, so the timeline keeps them as they are instead of copying; read with
            # map, as a gang of 8 is common in a replay)
            found = tuple(map(find, ids))
            if all(found):  # (a slice is never falsy: None is what is missing)
                held = cast(tuple[Slice, ...], found)
            else:
                held = tuple([item for item in found if item is not None])
            units = sum(map(_UNITS, held))
            for item_id in ids:  # (a loop: half the cost of updating from a dict made for it)
                holders[item_id] = team
        team_units[team] = team_units.get(team, 0.0) + units
        user = (team, job.user)
        user_units[user] = user_units.get(user, 0.0) + units
        limit = job.time_limit_s
        end = None if limit is None else run.started_at + limit
        if run.preempting_since is not None:
            stop = run.preempting_since + grace_period_s
            end = stop if end is None or stop < end else end
            ledger.stop(team, units)
        held_list.append((run, held, units, end))
    ledger.charge_billed(held_list, weights)
    return ledger, held_list, holders

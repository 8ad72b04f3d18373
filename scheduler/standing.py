"""The fair-share report of one pass: what Slurm's ``sshare -l`` and ``sprio`` show, from the
numbers the pass itself used (``Decisions.standing``; kept when the pass explains).

- Per team: weight, guarantee, decayed usage, the units it held as the pass began, its E
  (effective usage), fair share and factor as the pass began and as it ended, and its rank
  among the teams with pending work.
- Per member (a team and a user): the same, one level down.
- Per job the fair queues considered: the parts of its place in the order, as they were
  when its queue chose it (the factors change within a pass as jobs land): its class, its
  round (within its team's guarantee, or not), its team's and its user's factor, and its
  aging boost.

The pass only appends to a ``Journal`` (``scheduler.order``); the per-job parts are worked
out from it when asked (``Standing.priorities``), by replaying the pass's charges through the
same ``FairShare`` methods that ordered the queue, so they cost the pass nothing and cannot
disagree with it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.model import Team
from scheduler.order import FairShare, Journal


@dataclass(frozen=True, slots=True)
class TeamStanding:
    """One team's standing in a pass. E and fair shares are in billed GPU units."""

    team: str
    weight: float
    guaranteed: float
    usage: float  # decayed GPU-unit-seconds (``Team.usage``)
    held: float  # GPU units its jobs held as the pass began
    effective: float  # E as the pass began: billed units held + history_per_unit * usage
    effective_end: float  # E as the pass ended: plus what the pass placed for it
    # Its fair share, F and rank, for a team with pending work (None without: it was not
    # ranked). F = 2 ** (-E / fair): 1 = nothing used, 0.5 = exactly its share.
    fair: float | None
    factor: float | None  # as the pass began
    factor_end: float | None  # as the pass ended: what the jobs it left pending wait with
    rank: int | None  # 1 = the highest factor_end (ties by name)


@dataclass(frozen=True, slots=True)
class UserStanding:
    """One member's standing inside their team (``fair`` is the team's share, split evenly
    among its members with pending work)."""

    team: str
    user: str
    usage: float
    held: float
    effective: float
    effective_end: float
    fair: float | None
    factor: float | None
    factor_end: float | None
    rank: int | None  # inside the team


@dataclass(frozen=True, slots=True)
class JobPriority:
    """The parts of a job's place in the order, as its fair queue chose it: priority class
    first (highest first); in a class, the jobs within their team's guarantee before the
    others; then the team with the highest ``team_factor + age_boost``, in it the user with
    the highest ``user_factor + age_boost``, then the oldest job."""

    job_id: str
    priority: str  # the class it was ordered in (its team's highest, when clamped)
    class_rank: int  # 0 = the lowest class
    within_guarantee: bool  # ordered in the first round of its class
    team_factor: float
    user_factor: float
    age_boost: float  # aging_per_hour * hours queued

    @property
    def team_key(self) -> float:
        """What its team was chosen by among the teams (higher first)."""
        return self.team_factor + self.age_boost

    @property
    def user_key(self) -> float:
        """What its user was chosen by inside the team (higher first)."""
        return self.user_factor + self.age_boost


@dataclass(frozen=True, slots=True)
class Standing:
    """The fair-share report of one pass (see the module docstring)."""

    teams: tuple[TeamStanding, ...]
    users: tuple[UserStanding, ...]
    capacity: float  # GPU units of the nodes the pass saw
    scale: float  # what the teams' fair shares divide: max(capacity, sum of their E)
    history_per_unit: float  # history_weight * ln 2 / half-life: unit-seconds -> units
    aging_per_hour: float
    _journal: Journal = field(repr=False, compare=False)
    _fair: FairShare = field(repr=False, compare=False)
    _classes: tuple[str, ...] = field(repr=False, compare=False)

    def priorities(self) -> dict[str, JobPriority]:
        """Job id -> its priority parts, for every job the fair queues considered (a job
        considered twice, deferred from its class's first round, has its second)."""
        # One object per job next to the pass's large snapshot: as in ``schedule()``, the
        # cyclic garbage collector pauses meanwhile (it would walk the snapshot for nothing).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._replay()
        finally:
            if paused:
                gc.enable()

    def _replay(self) -> dict[str, JobPriority]:
        journal = self._journal
        fair = self._fair
        # A fresh standing from the pass's start, charged as the pass charged it.
        replay = FairShare(
            dict(journal.team_e), fair.team_fair, dict(journal.user_e), fair.user_fair
        )
        charges = journal.charges
        rounds = journal.rounds
        classes = self._classes
        next_charge = next_round = 0
        rank, within = 0, False
        out: dict[str, JobPriority] = {}
        for at, (boost, key, candidate) in enumerate(journal.yielded):
            while next_charge < len(charges) and charges[next_charge][0] <= at:
                _, team, user, billed = charges[next_charge]
                replay.charge(team, user, billed)
                next_charge += 1
            while next_round < len(rounds) and rounds[next_round][0] <= at:
                _, rank, within = rounds[next_round]
                next_round += 1
            job = candidate.job
            out[key[2]] = JobPriority(
                job_id=key[2],
                priority=classes[rank] if rank < len(classes) else str(rank),
                class_rank=rank,
                within_guarantee=within,
                team_factor=replay.team_factor(job.team),
                user_factor=replay.user_factor(job.team, job.user),
                age_boost=boost,
            )
        return out


def standing_of(
    fair: FairShare,
    *,
    teams: Mapping[str, Team],
    user_usage: Mapping[tuple[str, str], float],
    capacity: float,
    classes: tuple[str, ...],
    aging_per_hour: float,
) -> Standing | None:
    """The report of a pass whose standing ``fair`` kept a journal (None otherwise), as
    the pass ends. ``teams``: every team the pass knew, with their settings."""
    journal = fair.journal
    if journal is None:
        return None
    history = journal.history_per_unit
    # The standing as the pass began (read only), beside ``fair`` as it ended.
    began = FairShare(journal.team_e, fair.team_fair, journal.user_e, fair.user_fair, False)

    team_rows = []
    for name in sorted(set(teams) | set(journal.team_e)):
        team = teams.get(name) or Team(name=name)
        # (a team the pass left out of E held nothing: its E is its history alone)
        effective = journal.team_e.get(name, history * team.usage)
        ranked = name in fair.team_fair
        team_rows.append(
            (
                team,
                effective,
                fair.team_e.get(name, effective),
                fair.team_fair[name] if ranked else None,
                began.team_factor(name) if ranked else None,
                fair.team_factor(name) if ranked else None,
            )
        )
    team_ranks = _ranks((team.name, end) for team, *_, end in team_rows)
    team_standings = tuple(
        TeamStanding(
            team=team.name,
            weight=team.weight,
            guaranteed=team.guaranteed,
            usage=team.usage,
            held=journal.held.get(team.name, 0.0),
            effective=effective,
            effective_end=effective_end,
            fair=share,
            factor=start,
            factor_end=end,
            rank=team_ranks.get(team.name),
        )
        for team, effective, effective_end, share, start, end in team_rows
    )

    user_rows = []
    members: dict[str, list[tuple[str, float | None]]] = {}
    for key in sorted(set(user_usage) | set(journal.user_e)):
        usage = user_usage.get(key, 0.0)
        effective = journal.user_e.get(key, history * usage)
        ranked = key in fair.user_fair
        end = fair.user_factor(*key) if ranked else None
        user_rows.append(
            (
                key,
                usage,
                effective,
                fair.user_e.get(key, effective),
                fair.user_fair[key] if ranked else None,
                began.user_factor(*key) if ranked else None,
                end,
            )
        )
        members.setdefault(key[0], []).append((key[1], end))
    user_ranks = {
        (team_name, user): place
        for team_name, factors in members.items()
        for user, place in _ranks(factors).items()
    }
    user_standings = tuple(
        UserStanding(
            team=key[0],
            user=key[1],
            usage=usage,
            held=journal.user_held.get(key, 0.0),
            effective=effective,
            effective_end=effective_end,
            fair=share,
            factor=start,
            factor_end=end,
            rank=user_ranks.get(key),
        )
        for key, usage, effective, effective_end, share, start, end in user_rows
    )
    return Standing(
        teams=team_standings,
        users=user_standings,
        capacity=capacity,
        scale=fair.scale,
        history_per_unit=history,
        aging_per_hour=aging_per_hour,
        _journal=journal,
        _fair=fair,
        _classes=classes,
    )


def _ranks(factors: Iterable[tuple[str, float | None]]) -> dict[str, int]:
    """1-based places by factor, highest first, ties by name; unranked (None) left out."""
    ranked = sorted((-factor, name) for name, factor in factors if factor is not None)
    return {name: place for place, (_, name) in enumerate(ranked, start=1)}

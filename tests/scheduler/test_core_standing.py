"""The fair-share report of a pass (``Decisions.standing``): what ``sshare -l`` and ``sprio``
show, from the numbers the pass used: per team, per member, and per job its priority parts as
its queue chose it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from sched_builders import decide, job, placed, running, snapshot, whole_node
from test_core_properties import NOW, PROPERTY, configs, snapshots

from scheduler import (
    JobPriority,
    PendingCode,
    Policy,
    SchedulerConfig,
    Snapshot,
    Team,
    TeamStanding,
    UserStanding,
    schedule,
)

HOUR = 3600.0
HISTORY_PER_UNIT = 0.5 * math.log(2) / (7 * 24 * HOUR)  # the default knobs


def two_teams_one_node() -> tuple:
    """4 GPUs; team a holds 2 (user w) and waits with a1 (user x); team b, under its
    guarantee of 1, waits with b1 and b2 (user y, b2 queued 5 h later). 10 h after a1."""
    return snapshot(
        [whole_node("n0", gpus=4)],
        [
            job("a1", "a", user="x", at=0),
            job("b1", "b", user="y", at=0),
            job("b2", "b", user="y", at=5 * HOUR),
            job("d1", "a", user="x", at=0, after_ok=["elsewhere"]),
        ],
        [running(job("a0", "a", user="w"), ["n0-g0", "n0-g1"])],
        teams=[Team("a", usage=1e6), Team("b", guaranteed=1.0, weight=1.0)],
        user_usage={("a", "w"): 1e6},
    )


def test_each_team_and_member_gets_its_usage_share_factor_and_rank() -> None:
    decisions = decide(two_teams_one_node(), now=10 * HOUR)
    assert placed(decisions) == {"b1": ("n0-g2",), "b2": ("n0-g3",)}
    standing = decisions.standing
    assert standing is not None
    history_a = HISTORY_PER_UNIT * 1e6  # about 0.573 units of history
    # E a: 2 units held + history; b: nothing. Scale: max(4 units, 2.573) = 4, split by
    # weight 1:1 into fair shares of 2. F = 2 ** (-E / 2).
    assert (standing.capacity, standing.scale) == (4.0, 4.0)
    assert standing.history_per_unit == pytest.approx(HISTORY_PER_UNIT, rel=1e-15)
    assert standing.teams == (
        TeamStanding(
            team="a",
            weight=1.0,
            guaranteed=0.0,
            usage=1e6,
            held=2.0,
            effective=2.0 + history_a,
            effective_end=2.0 + history_a,  # a placed nothing
            fair=2.0,
            factor=2 ** (-(2.0 + history_a) / 2.0),
            factor_end=2 ** (-(2.0 + history_a) / 2.0),
            rank=2,
        ),
        TeamStanding(
            team="b",
            weight=1.0,
            guaranteed=1.0,
            usage=0.0,
            held=0.0,
            effective=0.0,
            effective_end=2.0,  # b1 and b2 landed
            fair=2.0,
            factor=1.0,
            factor_end=0.5,
            rank=1,
        ),
    )
    assert [round(t.factor_end or 0, 4) for t in standing.teams] == [0.4099, 0.5]
    # Members: w holds a's two GPUs and has no pending work (so no share); x waits, y placed
    # two. A member's fair share is max(team fair, team E) / members with pending work.
    assert standing.users == (
        UserStanding("a", "w", 1e6, 2.0, 2.0 + history_a, 2.0 + history_a, None, None, None, None),
        UserStanding("a", "x", 0.0, 0.0, 0.0, 0.0, 2.0 + history_a, 1.0, 1.0, 1),
        UserStanding("b", "y", 0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.5, 1),
    )


def test_each_job_gets_the_priority_parts_its_queue_chose_it_by() -> None:
    decisions = decide(two_teams_one_node(), now=10 * HOUR)
    assert decisions.standing is not None
    priorities = decisions.standing.priorities()
    boost_10h, boost_5h = 0.002 * 10 * HOUR / HOUR, 0.002 * 5 * HOUR / HOUR
    history_a = HISTORY_PER_UNIT * 1e6
    # b1 first (b is under its guarantee: first round), at b's starting factors; b2 next in
    # that round after b1 landed (E 1 of fair 2), is found to borrow and goes to the second
    # round: its parts are the second round's, after b1. a1 then waits at a's factor.
    assert priorities == {
        "b1": JobPriority("b1", "normal", 1, True, 1.0, 1.0, pytest.approx(boost_10h)),
        "b2": JobPriority("b2", "normal", 1, False, 2**-0.5, 2**-0.5, pytest.approx(boost_5h)),
        "a1": JobPriority(
            "a1",
            "normal",
            1,
            False,
            2 ** (-(2.0 + history_a) / 2.0),
            1.0,
            pytest.approx(boost_10h),
        ),
    }
    assert "d1" not in priorities  # parked (its dependency): never ordered
    b2 = priorities["b2"]
    assert (b2.team_key, b2.user_key) == (
        b2.team_factor + b2.age_boost,
        b2.user_factor + b2.age_boost,
    )


def test_the_pending_reason_and_the_report_give_the_same_factors() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("a1", "a", at=0), job("b1", "b", at=1)],
        teams=[Team("a", usage=1e7), Team("b")],
    )
    decisions = decide(snap, backfill=False)
    numbers = decisions.pending[0].reason.numbers
    assert decisions.standing is not None
    teams = {t.team: t for t in decisions.standing.teams}
    assert numbers["team_factor"] == round(teams["a"].factor_end or 0, 4)
    assert numbers["leading_factor"] == round(teams["b"].factor_end or 0, 4)
    assert (teams["a"].rank, teams["b"].rank) == (2, 1)


def test_a_clamped_class_is_reported_as_the_class_it_was_ordered_in() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("plain", at=0), job("vip", priority="high", at=1)],
        teams=[Team("a", max_priority="normal")],
    )
    decisions = decide(snap, backfill=False, clamp_priority=True)
    assert decisions.standing is not None
    parts = decisions.standing.priorities()
    assert (parts["vip"].priority, parts["vip"].class_rank) == ("normal", 1)


def test_the_report_is_the_same_with_every_cache_off() -> None:
    snap = two_teams_one_node()
    cached = decide(snap, now=10 * HOUR)
    uncached = decide(snap, now=10 * HOUR, caches=frozenset())
    assert cached.standing is not None and uncached.standing is not None
    assert cached.standing.teams == uncached.standing.teams
    assert cached.standing.users == uncached.standing.users
    assert cached.standing.priorities() == uncached.standing.priorities()


def test_no_report_without_explanations_or_fair_share_and_decisions_compare_without_it() -> None:
    snap = two_teams_one_node()
    full = decide(snap, now=10 * HOUR)
    assert decide(snap, now=10 * HOUR, explain=False).standing is None
    fifo = decide(snap, now=10 * HOUR, policy=Policy.FIFO_BACKFILL)
    assert fifo.standing is None
    # The report is left out of comparisons: a decision list compares as before.
    assert full == type(full)(full.assign, full.preempt, full.pending, full.fail)


# Jobs a pass parks before ordering (scheduler.nominate): they get no priority parts.
PARKED = {
    PendingCode.DEPENDENCY,
    PendingCode.PRIORITY_NOT_ALLOWED,
    PendingCode.NO_MATCHING_SLICES,
}


@PROPERTY
@given(snapshots(), configs)
def test_every_ordered_job_has_parts_and_the_report_agrees_with_the_reasons(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    config = replace(config, policy=Policy.FAIRSHARE, explain=True)
    decisions = schedule(snap, now=NOW, config=config)
    standing = decisions.standing
    assert standing is not None
    parts = standing.priorities()
    assert {p.job_id for p in decisions.pending if p.reason.code not in PARKED} <= set(parts)
    assert not {p.job_id for p in decisions.pending if p.reason.code in PARKED} & set(parts)
    assert {a.job_id for a in decisions.assign} <= set(parts)
    for p in parts.values():
        assert 0.0 <= p.team_factor <= 1.0 and 0.0 <= p.user_factor <= 1.0
        assert p.age_boost >= 0.0 and p.priority in config.priority_classes
    teams = {t.team: t for t in standing.teams}
    ranked = sorted((t for t in standing.teams if t.rank is not None), key=lambda t: t.rank or 0)
    assert [t.rank for t in ranked] == list(range(1, len(ranked) + 1))
    assert all((t.fair is None) == (t.rank is None) for t in standing.teams)
    keys = [(-(t.factor_end or 0.0), t.team) for t in ranked]
    assert keys == sorted(keys)
    for pending in decisions.pending:
        if pending.reason.code is PendingCode.FAIR_SHARE:
            job_team = next(j.team for j in snap.pending if j.id == pending.job_id)
            factor = teams[job_team].factor_end
            assert pending.reason.numbers["team_factor"] == round(factor or 0.0, 4)
    uncached = schedule(snap, now=NOW, config=replace(config, caches=frozenset()))
    assert uncached.standing is not None
    assert (uncached.standing.teams, uncached.standing.users) == (standing.teams, standing.users)
    assert uncached.standing.priorities() == parts

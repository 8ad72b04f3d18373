"""Fair-share order: teams by weight and usage, users inside a team, aging, classes, limits."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import replace

import pytest
from sched_builders import codes, decide, job, placed, running, snapshot, summary, whole_node

from scheduler import PendingCode, Team
from scheduler.order import Candidate, FairQueue

HOUR = 3600.0
HEAVY = 1e7  # decayed GPU-unit-seconds: about 5.7 units of history at the default knobs


def test_the_team_with_less_usage_goes_first() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("a1", "a", at=0), job("b1", "b", at=1)],
        teams=[Team("a", usage=HEAVY), Team("b")],
    )
    decisions = decide(snap, backfill=False)
    assert placed(decisions) == {"b1": ("n0-g0",)}
    assert codes(decisions) == {"a1": "FAIR_SHARE"}
    numbers = decisions.pending[0].reason.numbers
    assert numbers["leading_team"] == "b"
    assert float(numbers["team_factor"]) < float(numbers["leading_factor"])


def test_free_gpus_are_shared_in_proportion_to_weight_within_one_pass() -> None:
    pending = [job(f"{t}{i}", t, at=0) for t in "ab" for i in range(4)]
    snap = snapshot(
        [whole_node("n0", gpus=4)], pending, teams=[Team("a", weight=3.0), Team("b", weight=1.0)]
    )
    teams = sorted(j[0] for j in placed(decide(snap)))
    assert teams == ["a", "a", "a", "b"]


def test_equal_weights_split_evenly_whatever_the_submit_order() -> None:
    pending = [job(f"a{i}", "a", at=i) for i in range(10)] + [
        job(f"b{i}", "b", at=100 + i) for i in range(10)
    ]
    decisions = decide(snapshot([whole_node("n0", gpus=4)], pending))
    assert sorted(placed(decisions)) == ["a0", "a1", "b0", "b1"]


def test_inside_a_team_the_user_with_less_usage_goes_first() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("x1", user="x", at=0), job("y1", user="y", at=1)],
        user_usage={("a", "x"): HEAVY},
    )
    assert placed(decide(snap, backfill=False)) == {"y1": ("n0-g0",)}


def test_aging_lets_a_long_waiting_job_overtake_fair_share() -> None:
    now = 100 * HOUR
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("old", "a", at=0), job("new", "b", at=now - HOUR)],
        teams=[Team("a", usage=HEAVY * 100), Team("b")],
    )
    assert placed(decide(snap, now=now, backfill=False, aging_per_hour=0.05)) == {"old": ("n0-g0",)}
    assert placed(decide(snap, now=now, backfill=False, aging_per_hour=0.0)) == {"new": ("n0-g0",)}


def test_a_requeued_job_keeps_its_place() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("fresh", at=50), job("requeued", at=90, queued_since=10)],
    )
    assert placed(decide(snap, backfill=False)) == {"requeued": ("n0-g0",)}


def test_a_class_above_the_teams_maximum_is_refused_or_clamped() -> None:
    pending = [job("vip", priority="high", at=0), job("plain", at=1)]
    snap = snapshot([whole_node("n0", gpus=1)], pending, teams=[Team("a", max_priority="normal")])
    refused = decide(snap, backfill=False)
    assert summary(refused) == [
        ("assign", "plain", ("n0-g0",)),
        ("pending", "vip", "PRIORITY_NOT_ALLOWED", 1),
    ]
    assert refused.pending[0].reason.message == (
        "class 'high' is above the team's highest allowed class 'normal'"
    )
    clamped = decide(snap, backfill=False, clamp_priority=True)
    assert placed(clamped) == {"vip": ("n0-g0",)}  # as "normal", and older than "plain"


def test_a_member_limit_holds_back_one_user_not_the_team() -> None:
    snap = snapshot(
        [whole_node("n0")],
        [job("x2", user="x", count=2, at=0), job("y2", user="y", count=2, at=1)],
        [running(job("x1", user="x"), ["n0-g0"])],
        teams=[Team("a", member_limit=2.0)],
    )
    decisions = decide(snap)
    assert placed(decisions) == {"y2": ("n0-g1", "n0-g2")}
    assert codes(decisions) == {"x2": "MEMBER_LIMIT"}
    assert decisions.pending[0].reason.message == (
        "x uses 1.0 of the 2.0 units a member may hold, job needs 2.0"
    )


def test_an_exhausted_budget_stops_new_work() -> None:
    snap = snapshot(
        [whole_node("n0")],
        [job("a1")],
        teams=[Team("a", budget_gpu_hours=100.0, used_gpu_hours=100.5)],
    )
    decisions = decide(snap)
    assert codes(decisions) == {"a1": "BUDGET_EXHAUSTED"}
    assert decisions.pending[0].reason.message == "team used 100.5 of its 100.0 GPU-hours"


def test_without_explanations_the_decisions_are_the_same() -> None:
    pending = [job(f"{t}{i}", t, at=i, count=1 + i % 3) for t in "abc" for i in range(6)]
    snap = snapshot([whole_node("n0"), whole_node("n1")], pending)
    full = decide(snap)
    bare = decide(snap, explain=False)
    assert bare.assign == full.assign
    # Once nothing more can start, a replay lists the rest in submit order, unexplained.
    assert sorted(p.job_id for p in bare.pending) == sorted(p.job_id for p in full.pending)
    assert {p.reason.code for p in bare.pending} <= {
        PendingCode.NOT_EXPLAINED,
        PendingCode.RESERVED,
    }


def test_work_within_a_guarantee_goes_before_borrowing_whatever_the_usage() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=3)],
        [job("a1", "a", at=0), job("b1", "b", at=0)],
        [running(job("b0", "b"), ["n0-g0", "n0-g1"])],
        teams=[Team("a", guaranteed=1.0, usage=HEAVY * 10), Team("b", guaranteed=1.0)],
    )
    decisions = decide(snap, backfill=False)
    assert placed(decisions) == {"a1": ("n0-g2",)}
    assert decisions.assign[0].borrowed is False


def test_a_team_that_no_job_of_its_keeps_within_its_guarantee_leaves_the_first_round_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a (guarantee 4) gets a1's 4 GPUs, so a2 would borrow and is deferred, and none of a's
    # jobs left fits the guarantee: without a pending list the round defers a3 and a4 with
    # it, instead of meeting each in the fair order. The decisions are those of the listed
    # pass, which meets every job: a's deferred jobs and b's share what is left in the
    # borrowing round.
    snap = snapshot(
        [whole_node("n0", gpus=4), whole_node("n1", gpus=8)],
        [
            job("a1", "a", at=1, count=4),
            job("a2", "a", at=2),
            job("a3", "a", at=3, count=2),
            job("a4", "a", at=4),
            job("b1", "b", at=5, count=2),
        ],
        [running(job("b0", "b", count=4), [f"n0-g{i}" for i in range(4)])],
        teams=[Team("a", guaranteed=4.0), Team("b", guaranteed=4.0)],
    )
    dropped: list[list[str]] = []
    keep_teams = FairQueue.keep_teams

    def spy(self: FairQueue, teams: Set[str]) -> list[Candidate]:
        found = keep_teams(self, teams)
        dropped.append(sorted(c.job.id for c in found))
        return found

    monkeypatch.setattr(FairQueue, "keep_teams", spy)
    listed = decide(snap, explain=False)
    assert dropped == []
    lean = decide(snap, explain=False, list_pending=False)
    assert dropped == [["a3", "a4"]]
    # a1 in the first round; then a2 and b1, and a3 (next in the fair order, 2 GPUs) holds
    # a reservation on the last free GPU, which a4 (no time limit) may not use.
    assert sorted(placed(lean)) == ["a1", "a2", "b1"]
    assert (lean.assign, lean.preempt, lean.fail) == (listed.assign, listed.preempt, listed.fail)


@pytest.mark.parametrize("promised", [False, True])
def test_a_job_the_first_round_defers_keeps_its_place_in_its_users_queue(promised: bool) -> None:
    # a1 and a2 each fit team a's guarantee of 2 GPUs; a1 takes it, so a2 would borrow after
    # all and moves to the borrowing round, where it is still older than a3 (4 GPUs, never
    # within the guarantee): a2 goes first and a3 does not fit what is left, so it holds the
    # borrowing round's reservation. (Whether the shell promises its queue in submit order or
    # not: the borrowing round's queue is the split's rest with the deferred jobs after it,
    # which is no longer in that order.)
    node = whole_node("n0", gpus=8)
    busy = running(job("b1", "b", count=2), ["n0-g6", "n0-g7"])
    queue = [job("a1", count=2, at=0), job("a2", count=2, at=1), job("a3", count=4, at=2)]
    snap = snapshot([node], queue, [busy], teams=[Team("a", guaranteed=2.0), Team("b")])
    snap = replace(snap, pending_in_submit_order=promised)
    decisions = decide(snap)
    assert sorted(placed(decisions)) == ["a1", "a2"]
    assert codes(decisions) == {"a3": "RESERVED"}

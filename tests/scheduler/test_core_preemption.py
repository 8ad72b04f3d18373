"""Reclaim of borrowed capacity and preemption by priority class."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import codes, decide, job, placed, running, snapshot, summary, whole_node

from scheduler import RunningJob, Team


def _team_b_fills_n0(**overrides: dict[str, object]) -> list[RunningJob]:
    """Team b runs one 1-GPU job per GPU of n0, started at t=0, 10, 20, 30."""
    held = []
    for g in range(4):
        name = f"b{g}"
        extra = overrides.get(name, {})
        spec = job(name, "b", preemptible=bool(extra.get("preemptible", True)))
        held.append(
            running(
                spec,
                [f"n0-g{g}"],
                started=float(extra.get("started", 10.0 * g)),  # type: ignore[arg-type]
                borrowed=True,
                preempting_since=extra.get("preempting_since"),  # type: ignore[arg-type]
            )
        )
    return held


TEAMS = [Team("a", guaranteed=2.0), Team("b", guaranteed=0.0)]


def test_reclaim_preempts_the_most_recently_started_borrowed_jobs() -> None:
    snap = snapshot([whole_node("n0")], [job("a1", count=2)], _team_b_fills_n0(), TEAMS)
    decisions = decide(snap)
    assert summary(decisions) == [
        ("preempt", "b3", "a1"),
        ("preempt", "b2", "a1"),
        ("pending", "a1", "WAITING_FOR_PREEMPTION", 1),
    ]
    assert decisions.preempt[0].reason == "reclaim"
    assert decisions.pending[0].eta == 1000.0 + 30.0  # now + grace period


@pytest.mark.parametrize(
    ("overrides", "victims"),
    [
        ({"b3": {"preemptible": False}}, ["b2", "b1"]),
        ({"b3": {"started": 990.0}}, ["b2", "b1"]),  # ran 10 s < min_run_time 60 s
        ({"b3": {"preempting_since": 995.0}}, ["b2"]),  # b3 already frees its GPU
    ],
    ids=["never-non-preemptible", "min-run-time", "grace-period-counts-as-freeing"],
)
def test_reclaim_skips_jobs_that_may_not_or_need_not_be_victims(
    overrides: dict[str, dict[str, object]], victims: list[str]
) -> None:
    snap = snapshot([whole_node("n0")], [job("a1", count=2)], _team_b_fills_n0(**overrides), TEAMS)
    decisions = decide(snap)
    assert [p.job_id for p in decisions.preempt] == victims
    assert codes(decisions) == {"a1": "WAITING_FOR_PREEMPTION"}


@pytest.mark.parametrize(
    "limits",
    [{"limit": 4.0}, {"member_limit": 4.0}],
    ids=["team-limit", "member-limit"],
)
def test_a_victim_keeps_its_units_charged_through_its_grace_period(
    limits: dict[str, float],
) -> None:
    # b holds 4 GPUs, its limit. a reclaims two of them; until they have stopped b still
    # holds 4, so its next job may not take n1's free GPU in the same pass (it would hold 5).
    teams = [Team("a", guaranteed=2.0), Team("b", guaranteed=0.0, **limits)]
    pending = [job("a1", count=2), job("b5", "b", at=1.0)]
    snap = snapshot(
        [whole_node("n0"), whole_node("n1", gpus=1)], pending, _team_b_fills_n0(), teams
    )
    decisions = decide(snap)
    assert [(p.job_id, p.for_job_id) for p in decisions.preempt] == [("b3", "a1"), ("b2", "a1")]
    assert decisions.assign == ()
    code = "QUOTA_LIMIT" if "limit" in limits else "MEMBER_LIMIT"
    assert codes(decisions) == {"a1": "WAITING_FOR_PREEMPTION", "b5": code}


def test_victims_in_their_grace_period_still_count_against_the_limit() -> None:
    # The next pass, while b3 and b2 stop: same answer.
    held = _team_b_fills_n0(b3={"preempting_since": 995.0}, b2={"preempting_since": 995.0})
    teams = [Team("a", guaranteed=2.0), Team("b", guaranteed=0.0, limit=4.0)]
    pending = [job("a1", count=2), job("b5", "b", at=1.0)]
    decisions = decide(snapshot([whole_node("n0"), whole_node("n1", gpus=1)], pending, held, teams))
    assert decisions.assign == () and decisions.preempt == ()
    assert codes(decisions) == {"a1": "WAITING_FOR_PREEMPTION", "b5": "QUOTA_LIMIT"}


def test_a_victim_in_its_grace_period_is_not_preempted_again() -> None:
    held = _team_b_fills_n0(b3={"preempting_since": 995.0}, b2={"preempting_since": 995.0})
    decisions = decide(snapshot([whole_node("n0")], [job("a1", count=2)], held, TEAMS))
    assert decisions.preempt == ()
    assert codes(decisions) == {"a1": "WAITING_FOR_PREEMPTION"}


def test_no_reclaim_beyond_the_guarantee() -> None:
    snap = snapshot([whole_node("n0")], [job("a1", count=3)], _team_b_fills_n0(), TEAMS)
    decisions = decide(snap, backfill=False)
    assert decisions.preempt == ()
    assert codes(decisions) == {"a1": "NO_FIT"}


def test_no_reclaim_from_a_team_within_its_own_guarantee() -> None:
    teams = [Team("a", guaranteed=2.0), Team("b", guaranteed=4.0)]
    snap = snapshot([whole_node("n0")], [job("a1", count=2)], _team_b_fills_n0(), teams)
    assert decide(snap, backfill=False).preempt == ()


def test_reclaim_can_be_switched_off() -> None:
    snap = snapshot([whole_node("n0")], [job("a1", count=2)], _team_b_fills_n0(), TEAMS)
    assert decide(snap, reclaim=False, backfill=False).preempt == ()


def test_a_higher_class_preempts_a_lower_one_only_when_configured() -> None:
    teams = [Team("a", max_priority="high"), Team("b", guaranteed=4.0)]
    snap = snapshot([whole_node("n0")], [job("urgent", priority="high")], _team_b_fills_n0(), teams)
    assert decide(snap, backfill=False).preempt == ()
    decisions = decide(snap, preempt_by_priority=True)
    assert [(p.job_id, p.reason, p.for_job_id) for p in decisions.preempt] == [
        ("b3", "priority", "urgent")
    ]


def test_reclaimed_capacity_goes_to_the_reclaiming_team_not_back_to_the_borrower() -> None:
    # b's big job was preempted for a's 2-GPU job and is pending again, older than a's job:
    # the freed GPUs go to a (within its guarantee) first, so no preemption loop starts.
    snap = snapshot(
        [whole_node("n0")],
        [job("b_big", "b", count=4, at=0), job("a1", "a", count=2, at=10)],
        teams=[Team("a", guaranteed=2.0), Team("b", guaranteed=2.0, usage=0.0)],
    )
    decisions = decide(snap)
    assert summary(decisions)[0] == ("assign", "a1", ("n0-g0", "n0-g1"))
    assert codes(decisions) == {"b_big": "RESERVED"}


def test_reclaim_spares_jobs_that_have_run_longer_than_reclaim_max_run_s() -> None:
    # now = 1000: b0 and b1 have run 1000 and 990 s, b2 and b3 980 and 970 s. With a limit of
    # 975 s only b3 may be reclaimed: a2 needs 2 GPUs, so nothing is preempted for it, and a1
    # (1 GPU) takes b3 alone.
    for wanted, victims in ((2, []), (1, ["b3"])):
        snap = snapshot([whole_node("n0")], [job("a1", count=wanted)], _team_b_fills_n0(), TEAMS)
        decisions = decide(snap, reclaim_max_run_s=975.0)
        assert [p.job_id for p in decisions.preempt] == victims


def test_reclaim_max_run_s_rejects_a_negative_value() -> None:
    with pytest.raises(ValueError, match="reclaim_max_run_s"):
        decide(snapshot([whole_node("n0")]), reclaim_max_run_s=-1.0)


# -- jobs larger than their team's guarantee (``reclaim_wait_s``) ------------------------------
#
# Team o's guarantee is 1 GPU and its gang o1 holds all 4 GPUs of n0: it can only ever run on
# borrowed capacity. Team a (guarantee 2) queues a 1-GPU job a1. now = 1000.

OVERSIZED_TEAMS = [Team("a", guaranteed=2.0), Team("o", guaranteed=1.0), Team("b", guaranteed=1.0)]


def _gang(started: float, limit: float | None) -> RunningJob:
    gang = job("o1", "o", count=4, limit=limit)
    return running(gang, [f"n0-g{g}" for g in range(4)], started=started, borrowed=True)


@pytest.mark.parametrize(
    ("started", "limit", "queued", "now", "config", "expected"),
    [
        # o1 has run 1000 s on 4 GPUs (4,000 GPU-s to lose) and ends at 1200: a1 waits 200 s
        # (200 GPU-s), with the round's reservation.
        (0.0, 1200.0, 0.0, 1000.0, {}, [("pending", "a1", "RESERVED", 1)]),
        # o1 has run 100 s (400 GPU-s) and ends at 2900: waiting 1,900 GPU-s costs more.
        (
            900.0,
            2000.0,
            0.0,
            1000.0,
            {},
            [("preempt", "o1", "a1"), ("pending", "a1", "WAITING_FOR_PREEMPTION", 1)],
        ),
        # o1 ends at 32000, cheaper to wait for than its 80,000 GPU-s, but a1 was queued at
        # 19000: its 3 hours run out at 29800, before.
        (
            0.0,
            32000.0,
            19000.0,
            20000.0,
            {},
            [("preempt", "o1", "a1"), ("pending", "a1", "WAITING_FOR_PREEMPTION", 1)],
        ),
        # a1 has been queued reclaim_wait_s already (600 s): it reclaims.
        (
            0.0,
            1200.0,
            0.0,
            1000.0,
            {"reclaim_wait_s": 600.0},
            [("preempt", "o1", "a1"), ("pending", "a1", "WAITING_FOR_PREEMPTION", 1)],
        ),
        # Switched off: reclaim at once, whatever it throws away.
        (
            0.0,
            1200.0,
            0.0,
            1000.0,
            {"reclaim_wait_s": None},
            [("preempt", "o1", "a1"), ("pending", "a1", "WAITING_FOR_PREEMPTION", 1)],
        ),
        # No known end (no time limit): nothing to wait for.
        (
            0.0,
            None,
            0.0,
            1000.0,
            {},
            [("preempt", "o1", "a1"), ("pending", "a1", "WAITING_FOR_PREEMPTION", 1)],
        ),
    ],
    ids=[
        "waits-for-a-near-end",
        "reclaims-when-waiting-costs-more",
        "reclaims-when-the-end-is-past-its-wait",
        "reclaims-once-it-waited-reclaim_wait_s",
        "switched-off",
        "no-known-end",
    ],
)
def test_reclaim_of_a_job_larger_than_its_teams_guarantee_counts_the_work_it_throws_away(
    started: float,
    limit: float | None,
    queued: float,
    now: float,
    config: dict[str, object],
    expected: list[tuple[object, ...]],
) -> None:
    snap = snapshot(
        [whole_node("n0")], [job("a1", at=queued)], [_gang(started, limit)], OVERSIZED_TEAMS
    )
    assert summary(decide(snap, now=now, **config)) == expected


def test_reclaim_takes_borrowed_work_that_fits_its_teams_guarantee_before_an_oversized_job() -> (
    None
):
    # n0: o's 2-GPU gang (larger than o's 1-GPU guarantee), started last, and b's two 1-GPU
    # jobs (b borrows one GPU). Most recently started first would pick o1; the rule picks b2.
    held = [
        running(job("o1", "o", count=2), ["n0-g0", "n0-g1"], started=900.0, borrowed=True),
        running(job("b1", "b"), ["n0-g2"], started=500.0),
        running(job("b2", "b"), ["n0-g3"], started=600.0, borrowed=True),
    ]
    snap = snapshot([whole_node("n0")], [job("a1")], held, OVERSIZED_TEAMS)
    assert [(p.job_id, p.for_job_id) for p in decide(snap).preempt] == [("b2", "a1")]
    off = decide(snap, reclaim_wait_s=None)
    assert [(p.job_id, p.for_job_id) for p in off.preempt] == [("o1", "a1")]


@pytest.mark.parametrize("caches", [None, frozenset()], ids=["caches-on", "caches-off"])
def test_a_job_that_waits_for_room_leaves_no_verdict_for_an_older_one_alike(
    caches: frozenset[object] | None,
) -> None:
    # a1 (member u1, queued just now) waits for o1's end; a2 (member u2, same request, queued
    # 20000 s ago: its reclaim_wait_s has run out) must reclaim all the same, not take a1's
    # verdict. u2 used more, so u1's job goes first.
    pending = [
        job("a1", user="u1", at=19990.0),
        job("a2", user="u2", at=0.0),
    ]
    snap = replace(
        snapshot([whole_node("n0")], pending, [_gang(0.0, 21000.0)], OVERSIZED_TEAMS),
        user_usage={("a", "u2"): 1e6},
    )
    config: dict[str, object] = {"max_reservations": 0}
    if caches is not None:
        config["caches"] = caches
    decisions = decide(snap, now=20000.0, **config)
    assert [(p.job_id, p.for_job_id) for p in decisions.preempt] == [("o1", "a2")]
    assert codes(decisions)["a2"] == "WAITING_FOR_PREEMPTION"


def test_reclaim_wait_s_rejects_a_negative_value() -> None:
    with pytest.raises(ValueError, match="reclaim_wait_s"):
        decide(snapshot([whole_node("n0")]), reclaim_wait_s=-1.0)


def test_a_multi_node_gang_reclaims_over_several_nodes() -> None:
    # Team a is guaranteed 16 GPUs and asks for a gang of 16 over two 8-GPU nodes, which
    # team b fills with borrowed work. No one node's victims make room; both nodes' do
    # (before, the gang found no victims and waited for b's jobs to end).
    teams = [Team("a", guaranteed=16.0), Team("b", guaranteed=0.0)]
    nodes = [whole_node("n0", gpus=8), whole_node("n1", gpus=8)]
    b1, b2 = job("b1", "b"), job("b2", "b")
    held = [
        running(b1, [f"n0-g{g}" for g in range(8)], started=0.0, borrowed=True),
        running(b2, [f"n1-g{g}" for g in range(8)], started=10.0, borrowed=True),
    ]
    gang = job("a16", count=16, multi_node=True)
    decisions = decide(snapshot(nodes, [gang], held, teams))
    assert summary(decisions) == [
        ("preempt", "b2", "a16"),
        ("preempt", "b1", "a16"),
        ("pending", "a16", "WAITING_FOR_PREEMPTION", 1),
    ]
    # In their grace period their GPUs are claimed for the gang: no new victims.
    stopping = [replace(r, preempting_since=1000.0) for r in held]
    later = decide(snapshot(nodes, [gang], stopping, teams), now=1010.0)
    assert summary(later) == [("pending", "a16", "WAITING_FOR_PREEMPTION", 1)]
    assert later.pending[0].reason.numbers["victims"] == 0
    # Once they have stopped, it starts on both nodes.
    done = decide(snapshot(nodes, [gang], teams=teams), now=1030.0)
    assert sorted(done.assign[0].nodes) == ["n0", "n1"]


def test_free_slices_a_reclaim_counts_on_stay_with_it_through_the_grace_period() -> None:
    # Team a (guaranteed 16) asks for a 16-GPU gang over two 8-GPU nodes. n1 has 4 GPUs
    # free; borrowed work of team b fills the rest, so the gang preempts 12 GPUs of it and
    # counts on the 4 free ones. A 1-GPU job of team c (no guarantee: it would borrow) arrives
    # meanwhile. Before, c1 took one of those 4 free GPUs in the same pass (and in every pass
    # of the grace period), so when b's jobs stopped the gang was still one short, preempted
    # again, and b's starving jobs took their GPUs back: a loop seen on the whole Philly trace.
    teams = [Team("a", guaranteed=16.0), Team("b"), Team("c")]
    nodes = [whole_node("n0", gpus=8), whole_node("n1", gpus=8)]
    b1, b2 = job("b1", "b", count=8), job("b2", "b", count=4)
    held = [
        running(b1, [f"n0-g{g}" for g in range(8)], started=0.0, borrowed=True),
        running(b2, [f"n1-g{g}" for g in range(4)], started=10.0, borrowed=True),
    ]
    gang = job("a16", count=16, multi_node=True)
    small = job("c1", "c", at=500.0)
    decisions = decide(snapshot(nodes, [gang, small], held, teams))
    assert summary(decisions) == [
        ("preempt", "b2", "a16"),
        ("preempt", "b1", "a16"),
        ("pending", "a16", "WAITING_FOR_PREEMPTION", 1),
        ("pending", "c1", "RESERVED", 2),
    ]
    # Through the grace period, too: the free GPUs stay for the gang, no new victims.
    stopping = [replace(r, preempting_since=1000.0) for r in held]
    later = decide(snapshot(nodes, [gang, small], stopping, teams), now=1010.0)
    assert codes(later) == {"a16": "WAITING_FOR_PREEMPTION", "c1": "RESERVED"}
    assert later.assign == () and later.preempt == ()
    # Once they have stopped, the gang starts on both nodes; c1 waits for room.
    done = decide(snapshot(nodes, [gang, small], teams=teams), now=1030.0)
    assert placed(done).keys() == {"a16"}
    assert sorted(done.assign[0].nodes) == ["n0", "n1"]

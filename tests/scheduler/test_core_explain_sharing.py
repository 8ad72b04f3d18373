"""Explanations are shared between alike jobs, and sharing never changes what they say."""

from __future__ import annotations

from sched_builders import decide, job, running, snapshot, whole_node

from scheduler import PendingCode, RunningJob, Team


def _full_node_held_by_b() -> list[RunningJob]:
    held = job("b0", "b", count=4, limit=500.0)
    return [running(held, [f"n0-g{i}" for i in range(4)], started=900.0)]


def test_jobs_alike_but_for_user_or_class_share_one_reason() -> None:
    teams = [Team("a", max_priority="high"), Team("b")]
    pending = [
        job("a1", "a", user="u1", count=2, at=1.0, limit=100.0),
        job("a2", "a", user="u2", count=2, at=2.0, limit=100.0, priority="high"),
        job("a3", "a", user="u1", count=2, at=3.0, limit=100.0),
    ]
    snap = snapshot([whole_node("n0")], pending, _full_node_held_by_b(), teams)
    decisions = decide(snap, backfill=False)
    by_id = {p.job_id: p for p in decisions.pending}
    assert {p.reason.code for p in decisions.pending} == {PendingCode.NO_FIT}
    # One Reason object for the three: same team, request and verdict.
    assert by_id["a1"].reason is by_id["a2"].reason is by_id["a3"].reason
    # And it says what each would be told alone in the queue.
    for pending_job in pending:
        alone = decide(
            snapshot([whole_node("n0")], [pending_job], _full_node_held_by_b(), teams),
            backfill=False,
        ).pending[0]
        assert alone.reason == by_id[pending_job.id].reason
        assert alone.eta == by_id[pending_job.id].eta_earliest == 1400.0
    # The likely start counts the queue ahead: a2 (high) and a1 fill the node at 1400 for
    # their 100 s; a3 follows at 1500.
    assert [(p.job_id, p.eta) for p in decisions.pending] == [
        ("a2", 1400.0),
        ("a1", 1400.0),
        ("a3", 1500.0),
    ]


def test_parked_jobs_with_the_same_numbers_share_one_reason() -> None:
    pending = [job(f"a{i}", "a", user=f"u{i}", at=float(i), priority="high") for i in range(3)]
    decisions = decide(snapshot([whole_node("n0")], pending))
    reasons = [p.reason for p in decisions.pending]
    assert reasons[0].code is PendingCode.PRIORITY_NOT_ALLOWED
    assert reasons[0] is reasons[1] is reasons[2]
    assert reasons[0].numbers == {"priority": "high", "max_priority": "normal"}


def test_each_team_is_told_the_leading_team_among_the_others() -> None:
    # a (weight 4) and b place jobs and both have one more waiting: a's is explained first.
    # c waits too: the team ahead of it is a, the highest factor of the teams that placed,
    # not the leader a was told about (b: a itself is left out of a's own answer).
    teams = [Team("a", weight=4.0), Team("b"), Team("c", usage=1e7)]
    pending = [job("a1", "a", at=0.0), job("a2", "a", at=1.0), job("a3", "a", at=2.0)]
    pending += [job("b1", "b", at=3.0), job("b2", "b", at=4.0), job("c1", "c", at=5.0)]
    decisions = decide(snapshot([whole_node("n0", gpus=3)], pending, [], teams), backfill=False)
    assert [a.job_id for a in decisions.assign] == ["a1", "b1", "a2"]
    leaders = {p.job_id: p.reason.numbers["leading_team"] for p in decisions.pending}
    assert [p.reason.code for p in decisions.pending] == [PendingCode.FAIR_SHARE] * 3
    assert leaders == {"a3": "b", "b2": "a", "c1": "a"}
    factors = {p.job_id: p.reason.numbers["team_factor"] for p in decisions.pending}
    assert decisions.pending[2].reason.numbers["leading_factor"] == factors["a3"]


def test_a_shared_verdict_tells_each_member_when_their_own_jobs_free_their_limit() -> None:
    # Members of a team with a member limit each have a verdict of their own: u1's two
    # waiting jobs share u1's reason and estimate (the end of u1's job), never u2's.
    teams = [Team("a", member_limit=1.0)]
    held = [
        running(job("r1", "a", user="u1", limit=1000.0), ["n0-g0"], started=1000.0),
        running(job("r2", "a", user="u2", limit=4000.0), ["n0-g1"], started=1000.0),
    ]
    pending = [
        job("p1", "a", user="u1", at=1.0),
        job("p2", "a", user="u2", at=2.0),
        job("p3", "a", user="u1", at=3.0),
        job("p4", "a", user="u2", at=4.0),
    ]
    snap = snapshot([whole_node("n0")], pending, held, teams)
    shared = decide(snap)
    by_id = {p.job_id: p for p in shared.pending}
    assert {p.reason.code for p in shared.pending} == {PendingCode.MEMBER_LIMIT}
    assert by_id["p1"].reason is by_id["p3"].reason
    assert by_id["p2"].reason is by_id["p4"].reason
    assert [by_id[j].eta for j in ("p1", "p2", "p3", "p4")] == [2000.0, 5000.0, 2000.0, 5000.0]
    assert decide(snap, caches=frozenset()) == shared

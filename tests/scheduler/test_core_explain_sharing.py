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
        assert alone.eta == by_id[pending_job.id].eta == 1400.0


def test_parked_jobs_with_the_same_numbers_share_one_reason() -> None:
    pending = [job(f"a{i}", "a", user=f"u{i}", at=float(i), priority="high") for i in range(3)]
    decisions = decide(snapshot([whole_node("n0")], pending))
    reasons = [p.reason for p in decisions.pending]
    assert reasons[0].code is PendingCode.PRIORITY_NOT_ALLOWED
    assert reasons[0] is reasons[1] is reasons[2]
    assert reasons[0].numbers == {"priority": "high", "max_priority": "normal"}

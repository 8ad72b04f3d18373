"""A member's own limit (set by a team admin) holds back that member only, and only ever
tightens the team's per-member limit."""

from __future__ import annotations

from sched_builders import codes, decide, job, placed, running, snapshot, whole_node

from scheduler import Team


def test_a_members_own_limit_holds_back_that_member_only() -> None:
    snap = snapshot(
        [whole_node("n0")],
        [job("x2", user="x", count=2, at=0), job("y2", user="y", count=2, at=1)],
        teams=[Team("a", member_limit=3.0, member_limits={"x": 1.0})],
    )
    decisions = decide(snap)
    assert placed(decisions) == {"y2": ("n0-g0", "n0-g1")}
    assert codes(decisions) == {"x2": "MEMBER_LIMIT"}
    assert decisions.pending[0].reason.message == (
        "x uses 0.0 of the 1.0 units a member may hold, job needs 2.0"
    )


def test_an_own_limit_counts_what_the_member_holds_already() -> None:
    snap = snapshot(
        [whole_node("n0")],
        [job("x2", user="x", count=1, at=0)],
        [running(job("x1", user="x"), ["n0-g0"])],
        teams=[Team("a", member_limits={"x": 1.5})],
    )
    decisions = decide(snap)
    assert placed(decisions) == {}
    assert decisions.pending[0].reason.numbers == {"used": 1.0, "limit": 1.5, "needs": 1.0}


def test_an_own_limit_above_the_teams_per_member_limit_does_not_loosen_it() -> None:
    snap = snapshot(
        [whole_node("n0")],
        [job("x2", user="x", count=2, at=0)],
        teams=[Team("a", member_limit=1.0, member_limits={"x": 3.0})],
    )
    decisions = decide(snap)
    assert codes(decisions) == {"x2": "MEMBER_LIMIT"}
    assert decisions.pending[0].reason.numbers == {"used": 0.0, "limit": 1.0, "needs": 2.0}


def test_limit_of_is_the_smaller_of_the_two() -> None:
    team = Team("a", member_limit=2.0, member_limits={"x": 0.5, "y": 4.0})
    assert (team.limit_of("x"), team.limit_of("y"), team.limit_of("z")) == (0.5, 2.0, 2.0)
    alone = Team("b", member_limits={"x": 0.5})
    assert (alone.limit_of("x"), alone.limit_of("z")) == (0.5, None)
    assert alone.limits_members() and not Team("c").limits_members()


def test_members_share_a_full_clusters_verdict_but_a_member_at_its_limit_is_told_so() -> None:
    # A team with a per-member limit: its members share one remembered verdict when nothing
    # is free (the member check passed for each), yet z, at its own limit, is told
    # MEMBER_LIMIT, and y after it still NO_FIT: the same with every cache off.
    snap = snapshot(
        [whole_node("n0", gpus=2), whole_node("n1", gpus=2)],
        [
            job("x1", user="x", at=0),
            job("z1", user="z", at=1),
            job("y1", user="y", at=2),
            job("z2", user="z", at=3),
        ],
        [
            running(job("zr", user="z", count=2), ["n0-g0", "n0-g1"]),
            running(job("br", team="b", count=2), ["n1-g0", "n1-g1"]),
        ],
        teams=[Team("a", member_limit=2.0), Team("b")],
    )
    decisions = decide(snap, backfill=False)
    assert codes(decisions) == {
        "x1": "NO_FIT",
        "y1": "NO_FIT",
        "z1": "MEMBER_LIMIT",
        "z2": "MEMBER_LIMIT",
    }
    by_id = {p.job_id: p for p in decisions.pending}
    assert by_id["z2"].reason.numbers == {"used": 2.0, "limit": 2.0, "needs": 1.0}
    assert decide(snap, backfill=False, caches=frozenset()) == decisions

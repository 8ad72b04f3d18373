"""Job arrays with a throttle (``max_running``, Slurm's ``%N``): at most that many members of
an array hold slices at once; the others wait with ARRAY_THROTTLE, in order, with the time
a member's end frees a place for them."""

from __future__ import annotations

from sched_builders import codes, decide, job, placed, running, snapshot, summary, whole_node

from scheduler import Policy


def _members(array: str, first: int, last: int, *, limit: float | None = 600.0) -> list:
    return [
        job(f"{array}{i}", at=float(i), array=array, limit=limit) for i in range(first, last + 1)
    ]


def test_an_array_at_its_limit_starts_only_up_to_it_and_the_rest_wait_in_line() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=8)],
        [*_members("A", 2, 6), job("x", at=10.0), job("b0", at=11.0, array="B")],
        [
            running(job("A0", array="A", limit=600.0), ["n0-g0"], started=0.0),
            running(job("A1", array="A", limit=600.0), ["n0-g1"], started=300.0),
        ],
        array_limits={"A": 3},  # B has no throttle
    )
    decisions = decide(snap, now=100.0)
    assert summary(decisions) == [
        ("assign", "A2", ("n0-g2",)),
        ("assign", "x", ("n0-g3",)),
        ("assign", "b0", ("n0-g4",)),
        ("pending", "A3", "ARRAY_THROTTLE", 1),
        ("pending", "A4", "ARRAY_THROTTLE", 2),
        ("pending", "A5", "ARRAY_THROTTLE", 3),
        ("pending", "A6", "ARRAY_THROTTLE", 4),
    ]
    reasons = {p.job_id: p.reason for p in decisions.pending}
    assert reasons["A3"].message == "array A runs 3 of at most 3"
    assert reasons["A5"].message == (
        "array A runs 3 of at most 3; members waiting before this one: 2"
    )
    assert dict(reasons["A5"].numbers) == {
        "array": "A",
        "running": 3,
        "max_running": 3,
        "ahead": 2,
    }
    # Members end at 600 (A0), 700 (A2, placed now), 900 (A1); each waiting member takes the
    # next place and holds it for its own 600 s: A6 takes the place A3 frees at 1200.
    etas = {p.job_id: p.eta for p in decisions.pending}
    assert etas == {"A3": 600.0, "A4": 700.0, "A5": 900.0, "A6": 1200.0}


def test_a_member_being_stopped_still_counts_until_it_has_stopped() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=4)],
        _members("A", 1, 1),
        [running(job("A0", array="A"), ["n0-g0"], preempting_since=990.0)],
        array_limits={"A": 1},
    )
    decisions = decide(snap)
    assert placed(decisions) == {}
    assert codes(decisions) == {"A1": "ARRAY_THROTTLE"}
    # Its end: the end of the stop's grace period (30 s after 990).
    assert decisions.pending[0].eta == 1020.0


def test_an_unknown_end_makes_the_estimate_unknown() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=4)],
        _members("A", 1, 1),
        [running(job("A0", array="A"), ["n0-g0"])],  # no time limit
        array_limits={"A": 1},
    )
    assert decide(snap).pending[0].eta is None


def test_a_throttled_member_neither_reserves_nor_holds_up_the_jobs_behind_it() -> None:
    # Full cluster: the first job that cannot start gets the reservation; the throttled
    # member is skipped, so it is y's.
    snap = snapshot(
        [whole_node("n0", gpus=2)],
        [job("A1", at=1.0, array="A", limit=60.0), job("y", at=2.0, limit=60.0)],
        [
            running(job("A0", array="A", limit=600.0), ["n0-g0"]),
            running(job("z", team="b", limit=600.0), ["n0-g1"]),
        ],
        array_limits={"A": 1},
    )
    assert codes(decide(snap)) == {"A1": "ARRAY_THROTTLE", "y": "RESERVED"}


def test_under_fifo_a_throttled_member_does_not_block_the_queue() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=2)],
        [job("A1", at=1.0, array="A"), job("y", at=2.0)],
        [running(job("A0", array="A"), ["n0-g0"])],
        array_limits={"A": 1},
    )
    decisions = decide(snap, policy=Policy.FIFO)
    assert placed(decisions) == {"y": ("n0-g1",)}
    assert codes(decisions) == {"A1": "ARRAY_THROTTLE"}


def test_members_of_other_arrays_and_of_no_array_are_not_held_by_one_arrays_verdict() -> None:
    # Same team, user and request as the throttled member: a remembered verdict must not
    # hold them back.
    snap = snapshot(
        [whole_node("n0", gpus=4)],
        [job("A1", at=1.0, array="A"), job("B0", at=2.0, array="B"), job("x", at=3.0)],
        [running(job("A0", array="A"), ["n0-g0"])],
        array_limits={"A": 1, "B": 1},
    )
    decisions = decide(snap)
    assert sorted(placed(decisions)) == ["B0", "x"]
    assert codes(decisions) == {"A1": "ARRAY_THROTTLE"}

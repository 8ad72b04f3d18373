"""Exact decisions for ordering, limits, placement and the reasons jobs wait."""

from __future__ import annotations

from sched_builders import (
    MIG,
    MPS,
    codes,
    decide,
    job,
    mig_node,
    mps_node,
    placed,
    running,
    snapshot,
    summary,
    whole_node,
)

from scheduler import DependencyState, Team


def test_it_orders_by_priority_class_then_submit_order() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=2)],
        pending=[
            job("j1", at=1),
            job("j2", at=2, priority="high"),
            job("j3", at=0, priority="low"),
        ],
        teams=[Team("a", max_priority="high")],
    )
    assert summary(decide(snap, backfill=False)) == [
        ("assign", "j2", ("n0-g0",)),
        ("assign", "j1", ("n0-g1",)),
        ("pending", "j3", "NO_FIT", 1),
    ]


def test_it_keeps_a_team_under_its_limit_and_says_by_how_much() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=4)],
        pending=[job("j1", count=2), job("j2", count=1, at=1)],
        running_jobs=[running(job("r1"), ["n0-g0"])],
        teams=[Team("a", limit=2.0)],
    )
    decisions = decide(snap)
    assert summary(decisions) == [
        ("assign", "j2", ("n0-g1",)),
        ("pending", "j1", "QUOTA_LIMIT", 1),
    ]
    reason = decisions.pending[0].reason
    assert reason.message == "team uses 1.0 of 2.0 units, job needs 2.0"
    assert dict(reason.numbers) == {"used": 1.0, "limit": 2.0, "needs": 2.0}


def test_it_places_whole_gpus_on_the_fullest_node_that_fits() -> None:
    snap = snapshot(
        [whole_node("n0"), whole_node("n1"), whole_node("n2")],
        pending=[job("one", at=0), job("two", count=2, at=1)],
        running_jobs=[
            running(job("r0", "b"), ["n0-g0", "n0-g1", "n0-g2"]),
            running(job("r2", "b"), ["n2-g0", "n2-g1"]),
        ],
    )
    assert placed(decide(snap)) == {"one": ("n0-g3",), "two": ("n2-g2", "n2-g3")}


def test_it_gives_mig_instances_of_the_asked_profile_on_the_fullest_gpu() -> None:
    node = mig_node("m0", [["3g.40gb", "2g.20gb", "2g.20gb"], ["3g.40gb", "3g.40gb", "1g.10gb"]])
    snap = snapshot(
        [node],
        pending=[
            job("three", kind=MIG, profile="3g.40gb", at=0),
            job("twos", kind=MIG, profile="2g.20gb", count=2, at=1),
            job("one", kind=MIG, profile="1g.10gb", at=2),
            job("seven", kind=MIG, profile="7g.80gb", at=3),
        ],
        running_jobs=[running(job("r", "b", kind=MIG, profile="3g.40gb"), ["m0-g1-0"])],
    )
    decisions = decide(snap)
    assert placed(decisions) == {
        "three": ("m0-g1-1",),  # g1 has 4/7 free, g0 7/7: the fuller GPU
        "twos": ("m0-g0-1", "m0-g0-2"),
        "one": ("m0-g1-2",),
    }
    assert codes(decisions) == {"seven": "NO_MATCHING_SLICES"}
    assert decisions.pending[0].reason.message == "the cluster has no 7g.80gb slices"


def test_it_never_puts_two_teams_on_one_mps_gpu() -> None:
    snap = snapshot(
        [mps_node("p0", gpus=2, shares=4)],
        pending=[
            job("a1", "a", kind=MPS, at=0),
            job("b1", "b", kind=MPS, count=2, at=1),
            job("a2", "a", kind=MPS, count=4, at=2),
        ],
        running_jobs=[running(job("rb", "b", kind=MPS), ["p0-g0-s0"])],
    )
    decisions = decide(snap, backfill=False)
    assert placed(decisions) == {
        "a1": ("p0-g1-s0",),  # g0 serves team b
        "b1": ("p0-g0-s1", "p0-g0-s2"),  # b packs onto its own GPU
    }
    assert codes(decisions) == {"a2": "NO_FIT"}  # 3 shares of g1 left for a, not 4


def test_it_honours_the_gpu_model_and_otherwise_takes_any_model() -> None:
    snap = snapshot(
        [whole_node("n0", gpus=2, model="T4"), whole_node("n1", gpus=2, model="A100")],
        pending=[
            job("a100", model="A100", at=0),
            job("h100", model="H100", at=1),
            job("any2", count=2, at=2),
        ],
    )
    decisions = decide(snap)
    assert placed(decisions) == {"a100": ("n1-g0",), "any2": ("n0-g0", "n0-g1")}
    assert codes(decisions) == {"h100": "NO_MATCHING_SLICES"}


def test_a_gang_starts_whole_on_one_node_or_not_at_all() -> None:
    snap = snapshot(
        [whole_node("n0"), whole_node("n1")],
        pending=[job("gang", count=3, at=0), job("spread", count=3, at=1, multi_node=True)],
        running_jobs=[
            running(job("r0", "b"), ["n0-g0", "n0-g1"]),
            running(job("r1", "b"), ["n1-g0", "n1-g1"]),
        ],
    )
    decisions = decide(snap, backfill=False)
    assert summary(decisions) == [
        ("assign", "spread", ("n0-g2", "n0-g3", "n1-g2")),
        ("pending", "gang", "NO_FIT", 1),
    ]
    assert decisions.assign[0].nodes == ("n0", "n1")
    assert decisions.pending[0].reason.message == "needs 3 x whole, at most 1 free on any node"


def test_no_fit_names_the_largest_free_fit() -> None:
    snap = snapshot(
        [whole_node("n0"), whole_node("n1")],
        pending=[job("gang", count=4)],
        running_jobs=[
            running(job("r0", "b"), ["n0-g0", "n0-g1"]),
            running(job("r1", "b"), ["n1-g0"]),
        ],
    )
    reason = decide(snap, backfill=False).pending[0].reason
    assert reason.message == "needs 4 x whole, at most 3 free on any node"
    assert dict(reason.numbers) == {"needs": 4, "largest_free": 3, "kind": "whole"}


def test_an_elastic_gang_takes_what_is_free_between_min_and_count() -> None:
    snap = snapshot(
        [whole_node("n0")],
        pending=[job("elastic", count=4, min_count=2)],
        running_jobs=[running(job("r0", "b"), ["n0-g0"])],
    )
    assert placed(decide(snap)) == {"elastic": ("n0-g1", "n0-g2", "n0-g3")}


def test_an_elastic_gang_below_its_minimum_waits() -> None:
    snap = snapshot(
        [whole_node("n0")],
        pending=[job("elastic", count=4, min_count=2)],
        running_jobs=[running(job("r0", "b"), ["n0-g0", "n0-g1", "n0-g2"])],
    )
    assert codes(decide(snap, backfill=False)) == {"elastic": "NO_FIT"}


def test_dependencies_fail_wait_or_release_the_job() -> None:
    snap = snapshot(
        [whole_node("n0")],
        pending=[
            job("failed_ok", after_ok=["x"], at=0),
            job("waits", after_ok=["y"], at=1),
            job("any_end", after_any=["x"], at=2),
            job("ok", after_ok=["z"], at=3),
        ],
        dependency_states={
            "x": DependencyState.FAILED,
            "y": DependencyState.WAITING,
            "z": DependencyState.SUCCEEDED,
        },
    )
    decisions = decide(snap)
    assert summary(decisions) == [
        ("assign", "any_end", ("n0-g0",)),
        ("assign", "ok", ("n0-g1",)),
        ("pending", "waits", "DEPENDENCY", 1),
        ("fail", "failed_ok"),
    ]
    assert decisions.pending[0].reason.message == "waiting for dependency y"
    assert decisions.fail[0].reason == "dependency x did not succeed"


def test_it_marks_work_above_the_guarantee_as_borrowed() -> None:
    snap = snapshot(
        [whole_node("n0")],
        pending=[job("inside", count=2, at=0), job("above", count=1, at=1)],
        teams=[Team("a", guaranteed=2.0)],
    )
    assert [(a.job_id, a.borrowed) for a in decide(snap).assign] == [
        ("inside", False),
        ("above", True),
    ]


def test_a_drained_node_gets_nothing() -> None:
    snap = snapshot(
        [whole_node("n0", schedulable=False), whole_node("n1", gpus=1)],
        pending=[job("j1", at=0), job("j2", at=1)],
    )
    decisions = decide(snap, backfill=False)
    assert placed(decisions) == {"j1": ("n1-g0",)}
    assert codes(decisions) == {"j2": "NO_FIT"}

"""FIFO baselines and reservation backfill, decision by decision."""

from __future__ import annotations

import pytest
from sched_builders import codes, decide, job, placed, running, snapshot, summary, whole_node

from scheduler import Job, Node, Policy, RunningJob


def _queue_behind_a_big_job() -> tuple[list[Node], list[Job], list[RunningJob]]:
    # n0 has 2 GPUs; r holds g0 until t=2000. "big" needs both, so it must wait for r.
    return (
        [whole_node("n0", gpus=2)],
        [
            job("big", count=2, at=0),
            job("short", at=1, limit=100.0),  # ends at 1100, before 2000
            job("long", at=2, limit=5000.0),  # would end after 2000
        ],
        [running(job("r", "b", limit=2000.0), ["n0-g0"], started=0.0)],
    )


def test_fifo_blocks_everything_behind_the_head() -> None:
    nodes, pending, held = _queue_behind_a_big_job()
    decisions = decide(snapshot(nodes, pending, held), policy=Policy.FIFO)
    assert summary(decisions) == [
        ("pending", "big", "NO_FIT", 1),
        ("pending", "short", "WAITING_FOR_RESERVATION", 2),
        ("pending", "long", "WAITING_FOR_RESERVATION", 3),
    ]
    assert decisions.pending[1].reason.message == "behind job big in submit order"


@pytest.mark.parametrize("policy", [Policy.FIFO_BACKFILL, Policy.FAIRSHARE])
def test_backfill_lets_a_job_run_ahead_only_if_it_ends_before_the_reservation(
    policy: Policy,
) -> None:
    nodes, pending, held = _queue_behind_a_big_job()
    decisions = decide(snapshot(nodes, pending, held), policy=policy)
    assert summary(decisions) == [
        ("assign", "short", ("n0-g1",)),
        ("pending", "big", "RESERVED", 1),
        ("pending", "long", "NO_FIT", 2),
    ]
    assert decisions.pending[0].eta == 2000.0
    # The message is for people: relative to now (decide() uses now=1000), not an epoch.
    assert decisions.pending[0].reason.message == "holds the reservation: starts in about 17 min"
    assert decisions.pending[0].reason.numbers["at"] == 2000.0


def test_a_job_that_would_delay_the_reservation_waits_for_it() -> None:
    nodes, pending, held = _queue_behind_a_big_job()
    without_short = [j for j in pending if j.id != "short"]
    decisions = decide(snapshot(nodes, without_short, held), policy=Policy.FIFO_BACKFILL)
    assert codes(decisions) == {"big": "RESERVED", "long": "WAITING_FOR_RESERVATION"}
    assert decisions.pending[1].reason.message == "would delay the reservation of job big"
    # Not before the reservation (2000); after it, "big" holds both GPUs with no time limit,
    # so when "long" starts is unknown.
    long = decisions.pending[1]
    assert (long.eta_earliest, long.eta, long.eta_latest) == (2000.0, None, None)


def test_a_job_behind_a_reservation_starts_when_the_reserved_job_ends() -> None:
    nodes, pending, held = _queue_behind_a_big_job()
    big = job("big", count=2, at=0, limit=1500.0)
    rest = [big, *(j for j in pending if j.id == "long")]
    decisions = decide(snapshot(nodes, rest, held), policy=Policy.FIFO_BACKFILL)
    bands = {p.job_id: (p.eta_earliest, p.eta, p.eta_latest) for p in decisions.pending}
    assert bands == {"big": (2000.0, 2000.0, 2000.0), "long": (2000.0, 3500.0, 3500.0)}


def test_jobs_on_other_slices_run_ahead_whatever_their_length() -> None:
    # The reservation only needs n0; n1 is free for anybody.
    decisions = decide(
        snapshot(
            [whole_node("n0", gpus=2), whole_node("n1", gpus=1)],
            [job("big", count=2, at=0), job("long", at=1, limit=5000.0)],
            [running(job("r", "b", limit=2000.0), ["n0-g0"])],
        )
    )
    # best fit puts "long" on n0-g1 only if that did not delay "big": it goes to n1 instead.
    assert placed(decisions) == {"long": ("n1-g0",)}
    assert codes(decisions) == {"big": "RESERVED"}


def test_a_reservation_without_known_end_keeps_the_free_slices_of_the_closest_node() -> None:
    decisions = decide(
        snapshot(
            [whole_node("n0", gpus=2)],
            [job("big", count=2, at=0), job("short", at=1, limit=10.0)],
            [running(job("r", "b"), ["n0-g0"])],  # no time limit: no known end
        )
    )
    assert summary(decisions) == [
        ("pending", "big", "RESERVED", 1),
        ("pending", "short", "WAITING_FOR_RESERVATION", 2),
    ]
    assert decisions.pending[0].eta is None


def test_backfill_off_lets_later_jobs_take_the_free_slices() -> None:
    nodes, pending, held = _queue_behind_a_big_job()
    decisions = decide(snapshot(nodes, pending, held), backfill=False)
    assert placed(decisions) == {"short": ("n0-g1",)}
    assert codes(decisions) == {"big": "NO_FIT", "long": "NO_FIT"}


def test_the_estimated_start_comes_from_running_jobs_time_limits() -> None:
    decisions = decide(
        snapshot(
            [whole_node("n0", gpus=2)],
            [job("one", at=0), job("two", count=2, at=1)],
            [
                running(job("r1", "b", limit=500.0), ["n0-g0"], started=900.0),
                running(job("r2", "b", limit=3000.0), ["n0-g1"], started=0.0),
            ],
        ),
        backfill=False,
    )
    bands = {p.job_id: (p.eta_earliest, p.eta, p.eta_latest) for p in decisions.pending}
    # "two" fits the node at 3000 at the earliest, but "one", ahead of it and without a time
    # limit, takes g0 at 1400 for good: its likely and latest start are unknown.
    assert bands == {"one": (1400.0, 1400.0, 1400.0), "two": (3000.0, None, None)}


def test_the_estimated_start_counts_the_jobs_ahead_in_the_queue() -> None:
    decisions = decide(
        snapshot(
            [whole_node("n0", gpus=2)],
            [job("one", at=0, limit=2000.0), job("two", count=2, at=1, limit=100.0)],
            [
                running(job("r1", "b", limit=500.0), ["n0-g0"], started=900.0),
                running(job("r2", "b", limit=3000.0), ["n0-g1"], started=0.0),
            ],
        ),
        backfill=False,
    )
    bands = {p.job_id: (p.eta_earliest, p.eta, p.eta_latest) for p in decisions.pending}
    # "one" takes g0 at 1400 until 3400; "two" needs both GPUs: 3400, not 3000.
    assert bands == {"one": (1400.0, 1400.0, 1400.0), "two": (3000.0, 3400.0, 3400.0)}


@pytest.mark.parametrize("policy", [Policy.FIFO_BACKFILL, Policy.FAIRSHARE])
def test_a_replay_without_explanations_still_backfills_into_set_aside_slices(
    policy: Policy,
) -> None:
    # The reservation sets aside the only free GPU; a job that ends before it may still use it.
    nodes, pending, held = _queue_behind_a_big_job()
    decisions = decide(snapshot(nodes, pending, held), policy=policy, explain=False)
    assert placed(decisions) == {"short": ("n0-g1",)}


@pytest.mark.parametrize("policy", [Policy.FIFO_BACKFILL, Policy.FAIRSHARE])
@pytest.mark.parametrize("with_short", [True, False], ids=["a short job last", "none short"])
def test_a_pass_without_explanations_stops_only_once_no_job_can_use_what_is_set_aside(
    policy: Policy, with_short: bool
) -> None:
    # Once nothing is free but the slice set aside for "big" (until 2000), the bare pass
    # stops considering the queue only when no pending job's time limit ends by then: a
    # short job queued behind long ones still backfills, exactly as an explained pass says.
    nodes, pending, held = _queue_behind_a_big_job()
    queue = [j for j in pending if j.id != "short"]
    queue += [job(f"long{i}", at=3 + i, limit=5000.0) for i in range(3)]
    if with_short:
        queue.append(job("short", at=9, limit=100.0))
    snap = snapshot(nodes, queue, held)
    bare = decide(snap, policy=policy, explain=False)
    explained = decide(snap, policy=policy)
    assert placed(bare) == placed(explained) == ({"short": ("n0-g1",)} if with_short else {})

"""``SchedulerConfig.list_pending`` off: a pass builds no pending list, and FIFO nominates
jobs only as far as its queue looks (``scheduler.nominate.InSubmitOrder``), with the same
decisions as a pass that lists every pending job."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import job, running, snapshot, whole_node

from scheduler import core
from scheduler.config import Policy, SchedulerConfig
from scheduler.model import DependencyState, Job, Team
from scheduler.nominate import Nominator
from scheduler.order import Candidate


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.FIFO_BACKFILL])
def test_a_fifo_pass_without_a_pending_list_still_fails_a_job_deep_in_the_queue(
    policy: Policy,
) -> None:
    # The cluster is full, so the pass settles at the head of the queue; the job whose
    # dependency failed is last in submit order, and fails all the same.
    queue = [job(f"q{i}", at=float(i), count=2) for i in range(5)]
    queue.append(job("late", at=10.0, after_ok=["gone"]))
    snap = snapshot(
        [whole_node("n0", gpus=2)],
        queue,
        [running(job("r0"), ["n0-g0", "n0-g1"])],
        dependency_states={"gone": DependencyState.FAILED},
    )
    config = SchedulerConfig(policy=policy, explain=False)
    listed = core.schedule(snap, now=100.0, config=config)
    lean = core.schedule(snap, now=100.0, config=replace(config, list_pending=False))
    assert [f.job_id for f in lean.fail] == [f.job_id for f in listed.fail] == ["late"]
    assert (lean.assign, lean.preempt) == (listed.assign, listed.preempt)
    assert lean.pending == () and len(listed.pending) == 5


def test_a_fair_share_pass_without_a_pending_list_skips_the_jobs_that_can_no_longer_act(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Team "a" has no guarantee, so all its jobs borrow. "big" takes the round's one
    # reservation and sets aside n0-g1 (free until r ends at 2000); after that, the jobs that
    # fit nowhere (two GPUs, or one GPU for longer than the reservation leaves) cannot act
    # any more and are not walked, but "short", queued last, still backfills into the slice
    # set aside, as in the pass that lists every job.
    nodes = [whole_node("n0", gpus=2), whole_node("n1", gpus=2)]
    held = [
        running(job("r", "b", limit=2000.0), ["n0-g0"]),
        running(job("r2", "b", limit=3000.0), ["n1-g0", "n1-g1"]),
    ]
    queue = [job("big", count=2, at=0.0, limit=5000.0)]
    queue += [job(f"long{i}", count=2, at=1.0 + i, limit=5000.0) for i in range(5)]
    queue += [job("wide", at=10.0, limit=5000.0), job("short", at=11.0, limit=100.0)]
    snap = snapshot(nodes, queue, held)
    walked: list[str] = []
    admit = core.Cycle.admit

    def counting(cycle: core.Cycle, c: core.Candidate) -> None:
        walked.append(c.job.id)
        admit(cycle, c)

    monkeypatch.setattr(core.Cycle, "admit", counting)
    config = SchedulerConfig(policy=Policy.FAIRSHARE, explain=False)
    listed = core.schedule(snap, now=1000.0, config=config)
    assert len(walked) == 8
    walked.clear()
    lean = core.schedule(snap, now=1000.0, config=replace(config, list_pending=False))
    assert walked == ["big", "short"]
    assert (lean.assign, lean.preempt) == (listed.assign, listed.preempt)
    assert [(a.job_id, a.slice_ids) for a in lean.assign] == [("short", ("n0-g1",))]


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.FIFO_BACKFILL])
def test_a_fifo_pass_without_a_pending_list_nominates_only_as_far_as_it_looks(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One GPU free of two: the head of the queue, asking for two, blocks the queue (plain
    # FIFO) or takes the reservation with the free GPU set aside (no job behind it has a
    # time limit that could use it), and the pass settles: no job behind it is nominated.
    # (Walking the round by its length nominated all 200 every pass: a whole-trace FIFO +
    # backfill replay spent 70% of its time there.)
    queue = [job(f"q{i:03}", at=float(i), count=2) for i in range(200)]
    snap = snapshot([whole_node("n0", gpus=2)], queue, [running(job("r0", limit=500.0), ["n0-g0"])])
    made: list[str] = []
    candidate = Nominator.candidate

    def counting(nominator: Nominator, j: Job) -> Candidate | None:
        made.append(j.id)
        return candidate(nominator, j)

    monkeypatch.setattr(Nominator, "candidate", counting)
    config = SchedulerConfig(policy=policy, explain=False)
    lean = core.schedule(snap, now=100.0, config=replace(config, list_pending=False))
    assert made == ["q000"]
    made.clear()
    listed = core.schedule(snap, now=100.0, config=config)
    assert len(made) == 200
    assert (lean.assign, lean.preempt, lean.fail) == (listed.assign, listed.preempt, listed.fail)


def test_starving_jobs_alike_share_the_first_ones_reservation_that_set_nothing_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Team "a", under its guarantee, has three 1-GPU jobs past the maximum wait; team "b"
    # holds every GPU, started too recently to be reclaimed. Each starving job gets a
    # reservation of its own, and with nothing free there is nothing to set aside, so
    # without a pending list the first one's outcome (no sweep, "reserved") is the verdict
    # of the two alike after it, which are not looked at again. With the caches off, or
    # with a pending list, every one of them is; the decisions are the same.
    nodes = [whole_node("n0", gpus=2), whole_node("n1", gpus=2)]
    held = [
        running(job(f"r{i}", "b", limit=5000.0), [f"n{i // 2}-g{i % 2}"], started=990.0)
        for i in range(4)
    ]
    queue = [job(f"s{i}", "a", at=float(i), limit=3000.0) for i in range(3)]
    queue.append(job("young", "a", at=900.0, limit=3000.0))  # not starving
    teams = [Team("a", guaranteed=4.0), Team("b")]
    snap = snapshot(nodes, queue, held, teams=teams)
    reserved: list[str] = []
    reserve = core.Cycle.reserve

    def counting(cycle: core.Cycle, c: Candidate, *, starving: bool = False) -> bool:
        reserved.append(c.job.id)
        return reserve(cycle, c, starving=starving)

    monkeypatch.setattr(core.Cycle, "reserve", counting)
    config = SchedulerConfig(policy=Policy.FAIRSHARE, explain=False, max_wait_s=500.0)
    lean = core.schedule(snap, now=1000.0, config=replace(config, list_pending=False))
    assert reserved == ["s0", "young"]
    reserved.clear()
    uncached = core.schedule(
        snap, now=1000.0, config=replace(config, list_pending=False, caches=frozenset())
    )
    assert reserved == ["s0", "s1", "s2", "young"]
    listed = core.schedule(snap, now=1000.0, config=config)
    assert [(p.job_id, p.reason.code.value) for p in listed.pending][:3] == [
        ("s0", "RESERVED"),
        ("s1", "RESERVED"),
        ("s2", "RESERVED"),
    ]
    for other in (uncached, listed):
        assert (lean.assign, lean.preempt, lean.fail) == (other.assign, other.preempt, other.fail)
    assert lean.assign == () and lean.preempt == ()

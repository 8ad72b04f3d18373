"""What a pass carries over to the next (``scheduler.memo.Carry``): each pending job as a
candidate, taken only for the very job object it was made for, while its team allows the
same classes, over the same cluster and with the same class rules."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import codes, job, running, snapshot, whole_node

from scheduler import Cache, Carry, SchedulerConfig, Snapshot, Team, schedule
from scheduler.cluster import ClusterShape

NOW = 1000.0
EVERY = SchedulerConfig()
NONE = SchedulerConfig(caches=frozenset())


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every request the cluster is asked about, from now on."""
    asked: list[object] = []
    original = ClusterShape.request_info

    def request_info(self: ClusterShape, request: object) -> object:
        asked.append(request)
        return original(self, request)  # type: ignore[arg-type]

    monkeypatch.setattr(ClusterShape, "request_info", request_info)
    return asked


def _three_waiting() -> Snapshot:
    """A full node of two GPUs and three jobs of two GPUs waiting, p0 to p2."""
    waiting = [job(f"p{k}", count=2, at=float(k)) for k in range(3)]
    held = running(job("r", count=2), ["n0-g0", "n0-g1"])
    return snapshot((whole_node("n0", 2),), waiting, [held])


def test_the_next_pass_takes_an_unchanged_jobs_request_from_the_carry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = _three_waiting()
    carry = Carry()
    first = schedule(snap, now=NOW, config=EVERY, carry=carry)
    asked = _counting(monkeypatch)
    arrived = job("p9", count=1, at=9.0)
    later = replace(snap, pending=(*snap.pending, arrived))
    second = schedule(later, now=NOW, config=EVERY, carry=carry)
    assert asked == [arrived.request]  # only the new job's request is looked up
    assert not first.assign and len(first.pending) == 3  # all three carried as pending
    assert second == schedule(later, now=NOW, config=NONE)


def test_jobs_not_carried_anywhere_in_the_queue_are_nominated_in_their_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The arrivals usually come last (only they are nominated then); a requeued job may come
    # back anywhere, and a job waiting for a dependency is never carried: each is
    # nominated where it stands, and the rest still come from the carry.
    snap = _three_waiting()
    carry = Carry()
    schedule(snap, now=NOW, config=EVERY, carry=carry)
    asked = _counting(monkeypatch)
    back = job("back", at=0.5)  # queued between p0 and p1
    parked = job("parked", at=8.0, after_ok=["p0"])
    arrived = job("p9", at=9.0)
    p0, p1, p2 = snap.pending
    later = replace(snap, pending=(p0, back, p1, p2, parked, arrived))
    second = schedule(later, now=NOW, config=EVERY, carry=carry)
    assert asked == [back.request, arrived.request]
    assert second == schedule(later, now=NOW, config=NONE)
    assert [p.job_id for p in second.pending] == ["p0", "back", "p1", "p2", "p9", "parked"]


def test_switched_off_nothing_is_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot((whole_node("n0", 2),), [job("p0", count=4)])
    off = replace(EVERY, caches=EVERY.caches - {Cache.CARRIED_CANDIDATES})
    carry = Carry()
    schedule(snap, now=NOW, config=off, carry=carry)
    asked = _counting(monkeypatch)
    schedule(snap, now=NOW, config=off, carry=carry)
    assert len(asked) == 1


def test_a_changed_node_list_voids_what_was_carried_for_the_old_cluster() -> None:
    # The H100 job could run only on n1: once n1 is gone, no node could ever hold it.
    nodes = (whole_node("n0", 2), whole_node("n1", 2, model="H100"))
    h100 = job("p0", count=1, model="H100")
    busy = running(job("r", count=2), ["n1-g0", "n1-g1"])
    snap = snapshot(nodes, [h100], [busy])
    carry = Carry()
    assert codes(schedule(snap, now=NOW, config=EVERY, carry=carry))["p0"] != "NO_MATCHING_SLICES"
    lost = replace(snap, nodes=nodes[:1])
    after = schedule(lost, now=NOW, config=EVERY, carry=carry)
    assert codes(after) == {"p0": "NO_MATCHING_SLICES"}
    assert after == schedule(lost, now=NOW, config=NONE)


def test_a_team_that_no_longer_allows_the_class_parks_the_carried_job() -> None:
    nodes = (whole_node("n0", 2),)
    high = job("p0", count=2, priority="high")
    allowed = Team("a", max_priority="high")
    busy = running(job("r", "b", count=2), ["n0-g0", "n0-g1"])
    snap = snapshot(nodes, [high], [busy], teams=[allowed])
    carry = Carry()
    assert codes(schedule(snap, now=NOW, config=EVERY, carry=carry))["p0"] != "PRIORITY_NOT_ALLOWED"
    lowered = replace(snap, teams={**snap.teams, "a": replace(allowed, max_priority="normal")})
    after = schedule(lowered, now=NOW, config=EVERY, carry=carry)
    assert codes(after) == {"p0": "PRIORITY_NOT_ALLOWED"}
    assert after == schedule(lowered, now=NOW, config=NONE)


def test_other_class_rules_void_the_carried_candidates() -> None:
    # With preemption by class, a job's class is part of its verdict's shape: the high job
    # may take the low one's GPUs.
    nodes = (whole_node("n0", 2),)
    low = running(job("r", "b", count=2, priority="low"), ["n0-g0", "n0-g1"])
    queue = [job("p0", count=2, priority="high"), job("p1", count=2, at=1.0)]
    snap = snapshot(nodes, queue, [low], teams=[Team("a", max_priority="high")])
    carry = Carry()
    schedule(snap, now=NOW, config=EVERY, carry=carry)
    by_class = replace(EVERY, preempt_by_priority=True)
    after = schedule(snap, now=NOW, config=by_class, carry=carry)
    assert after == schedule(snap, now=NOW, config=replace(by_class, caches=frozenset()))


def test_without_clamping_a_carried_clamped_job_is_parked() -> None:
    nodes = (whole_node("n0", 2),)
    busy = running(job("r", "b", count=2), ["n0-g0", "n0-g1"])
    snap = snapshot(nodes, [job("p0", count=2, priority="high")], [busy])
    carry = Carry()
    clamped = replace(EVERY, clamp_priority=True)
    assert (
        codes(schedule(snap, now=NOW, config=clamped, carry=carry))["p0"] != "PRIORITY_NOT_ALLOWED"
    )
    after = schedule(snap, now=NOW, config=EVERY, carry=carry)
    assert codes(after) == {"p0": "PRIORITY_NOT_ALLOWED"}


def test_the_candidates_of_jobs_that_left_are_forgotten_once_they_outnumber_the_queue() -> None:
    nodes = (whole_node("n0", 2),)
    busy = running(job("r", "b", count=2), ["n0-g0", "n0-g1"])
    queue = [job(f"p{k}", count=1, at=float(k)) for k in range(600)]
    carry = Carry()
    schedule(snapshot(nodes, queue, [busy]), now=NOW, config=EVERY, carry=carry)
    assert len(carry) == 600
    # Ten jobs left: their candidates stay while the kept ones could not outnumber the queue.
    rest = snapshot(nodes, queue[10:], [busy])
    assert schedule(rest, now=NOW, config=EVERY, carry=carry) == schedule(
        rest, now=NOW, config=NONE
    )
    assert len(carry) == 600
    # Most of the queue left: the next pass keeps only the jobs still pending.
    few = snapshot(nodes, queue[590:], [busy])
    assert schedule(few, now=NOW, config=EVERY, carry=carry) == schedule(few, now=NOW, config=NONE)
    assert len(carry) == 10
    # A job arriving later is kept beside them.
    later = snapshot(nodes, [*queue[590:], job("p9999", count=1, at=9999.0)], [busy])
    schedule(later, now=NOW, config=EVERY, carry=carry)
    assert len(carry) == 11


def test_a_carried_job_meets_this_passs_team_record() -> None:
    # The carried candidate keeps the last pass's team record until the pass considers it:
    # each check reads this pass's limit and guarantee.
    nodes = (whole_node("n0", 2),)
    capped = Team("a", limit=1.0)
    snap = snapshot(nodes, [job("p0", count=2)], teams=[capped])
    carry = Carry()
    assert codes(schedule(snap, now=NOW, config=EVERY, carry=carry)) == {"p0": "QUOTA_LIMIT"}
    raised = replace(snap, teams={**snap.teams, "a": replace(capped, limit=None)})
    after = schedule(raised, now=NOW, config=EVERY, carry=carry)
    assert [a.job_id for a in after.assign] == ["p0"]
    assert after == schedule(raised, now=NOW, config=NONE)


def test_a_carried_job_reclaims_once_its_team_is_given_a_guarantee() -> None:
    nodes = (whole_node("n0", 2),)
    borrowed = running(job("r", "b", count=2), ["n0-g0", "n0-g1"], borrowed=True)
    snap = snapshot(nodes, [job("p0", count=2)], [borrowed], teams=[Team("a"), Team("b")])
    carry = Carry()
    first = schedule(snap, now=NOW, config=EVERY, carry=carry)
    assert not first.preempt
    guaranteed = replace(snap, teams={**snap.teams, "a": Team("a", guaranteed=2.0)})
    after = schedule(guaranteed, now=NOW, config=EVERY, carry=carry)
    assert [p.job_id for p in after.preempt] == ["r"]
    assert after == schedule(guaranteed, now=NOW, config=NONE)


def test_a_carried_job_of_a_team_the_snapshot_does_not_list_gets_the_defaults() -> None:
    nodes = (whole_node("n0", 2),)
    busy = running(job("r", "b", count=2), ["n0-g0", "n0-g1"])
    listed = snapshot(nodes, [job("p0", "x", count=1)], [busy])
    unlisted = replace(listed, teams={"b": listed.teams["b"]})
    carry = Carry()
    schedule(unlisted, now=NOW, config=EVERY, carry=carry)
    after = schedule(unlisted, now=NOW, config=EVERY, carry=carry)
    assert codes(after) == {"p0": "RESERVED"}
    assert after == schedule(unlisted, now=NOW, config=NONE)

"""The event loop, driven by the stand-in cores of sim_helpers (not the real core)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sim_helpers import fifo_standin, job, reclaim_standin, team

from scheduler.config import Policy, SchedulerConfig
from scheduler.model import Assign, Decisions, Snapshot
from scheduler.sim.cluster import ClusterSpec, build_nodes
from scheduler.sim.engine import SimResult, SimulationError, replay
from scheduler.sim.records import JobRecord, Segment
from scheduler.sim.trace import TraceJob, load_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FIFO = SchedulerConfig(policy=Policy.FIFO, explain=False)
FAIRSHARE = SchedulerConfig(
    policy=Policy.FAIRSHARE, explain=False, min_run_time_s=60.0, grace_period_s=30.0
)


def run(
    jobs: list[TraceJob],
    gpus: int,
    *,
    config: SchedulerConfig = FIFO,
    teams: dict[str, int] | None = None,
    schedule=fifo_standin,  # noqa: ANN001 - any ScheduleFn
) -> SimResult:
    guarantees = teams if teams is not None else {j.tenant: 0 for j in jobs}
    return replay(
        jobs,
        nodes=build_nodes(ClusterSpec(gpus)),
        teams={name: team(name, g) for name, g in guarantees.items()},
        config=config,
        schedule=schedule,
    )


def by_id(result: SimResult) -> dict[str, JobRecord]:
    return {r.job_id: r for r in result.records}


def test_it_replays_the_tiresias_prefix_with_hand_computed_fifo_starts() -> None:
    # First 10 jobs of the Tiresias toy trace on one 8-GPU node, strict FIFO (the same hand
    # computation as test_sim_toy_trace.py, which drives the real core):
    # t=0 job0(1) starts; t=30 job1(8) blocks the queue until job0 ends at 164;
    # job1 runs 164..311; at 311 job2(2), job3(1), job4(4) start, job5(8) blocks;
    # job3, job4 end at 432, job2 at 438 -> job5 runs 438..576; then jobs 6..9 start at 576.
    jobs = load_trace(FIXTURES / "tiresias_60_job.csv", limit=10)
    result = run(jobs, 8)
    starts = [by_id(result)[str(i)].segments[0].start_s for i in range(10)]
    assert starts == [0, 164, 311, 311, 311, 438, 576, 576, 576, 576]


def test_it_skips_a_pass_when_nothing_is_free_and_nothing_can_be_preempted() -> None:
    jobs = [job("a1", 8, 0, 100), job("a2", 1, 10, 50), job("a3", 1, 20, 50), job("a4", 1, 30, 50)]
    result = run(jobs, 8)
    # Passes at t=0 (a1 starts) and t=100 (a2..a4 start); t=10, 20, 30 find a full cluster.
    assert (result.passes, result.skipped) == (2, 3)
    assert [by_id(result)[j].segments[0].start_s for j in ("a2", "a3", "a4")] == [100] * 3


def test_it_leaves_out_jobs_that_can_never_fit_and_spreads_large_gangs() -> None:
    jobs = [job("j0-huge", 17, 0, 10), job("j1-wide", 12, 0, 10), job("j2-small", 9, 0, 10)]
    result = run(jobs, 16)
    assert [j.id for j in result.excluded] == ["j0-huge"]
    assert by_id(result)["j1-wide"].segments == (Segment(0, 10, False),)
    assert by_id(result)["j2-small"].segments == (Segment(10, 20, False),)


def test_a_victim_runs_its_grace_period_and_is_requeued_with_its_work_lost() -> None:
    # b (guarantee 4) arrives at t=10 while a borrows the whole node since t=0. The victim
    # may only be taken after min_run_time 60 s: a tick at t=60 preempts it, it stops at
    # t=90 (grace 30 s), b runs 90..190, a restarts at 190 and runs its full 1000 s again.
    # (The stand-in reclaims at once: no tick for b1's reclaim_wait_s.)
    jobs = [job("a1", 8, 0, 1000, "a"), job("b1", 4, 10, 100, "b")]
    config = replace(FAIRSHARE, reclaim_wait_s=None)
    result = run(jobs, 8, config=config, teams={"a": 0, "b": 4}, schedule=_guarantee_first_standin)
    records = by_id(result)
    assert records["a1"].segments == (Segment(0, 90, True), Segment(190, 1190, False))
    assert records["b1"].segments == (Segment(90, 190, False),)
    assert records["a1"].wait_s == 190  # 90 s lost + 100 s queued again
    assert result.ticks == 1


def test_with_no_grace_period_the_freed_slices_are_used_at_once() -> None:
    jobs = [job("a1", 8, 0, 1000, "a"), job("b1", 4, 100, 100, "b")]
    config = replace(FAIRSHARE, grace_period_s=0.0)
    result = run(jobs, 8, config=config, teams={"a": 0, "b": 4}, schedule=_guarantee_first_standin)
    assert by_id(result)["b1"].segments == (Segment(100, 200, False),)
    assert by_id(result)["a1"].segments[0] == Segment(0, 100, True)


def test_a_requeued_job_keeps_its_place_and_the_snapshot_charges_running_work() -> None:
    seen: list[tuple[float, Snapshot]] = []

    def recording(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        seen.append((now, snapshot))
        return _guarantee_first_standin(snapshot, now=now, config=config)

    jobs = [job("a1", 8, 0, 1000, "a"), job("b1", 4, 10, 100, "b")]
    run(jobs, 8, config=FAIRSHARE, teams={"a": 0, "b": 4}, schedule=recording)
    now, at_restart = next((t, s) for t, s in seen if t == 90)
    requeued = next(j for j in at_restart.pending if j.id == "a1")
    assert (requeued.queued_since, requeued.submitted_at) == (0, 0)
    # a held 8 GPUs for 90 s; the 7-day half-life decays it by well under 0.1%.
    assert at_restart.teams["a"].usage == pytest.approx(8 * 90, rel=1e-3)
    assert at_restart.user_usage[("a", "a")] == at_restart.teams["a"].usage
    assert at_restart.teams["b"].usage == 0
    assert requeued.time_limit_s == 1000  # the true duration, so backfill can reserve


def test_every_snapshot_lists_its_queue_in_submit_order_and_says_so() -> None:
    # Snapshot.pending_in_submit_order: arrivals of one instant go in by job id (the trace
    # has them the other way round), and a requeued victim goes back before the jobs
    # that arrived after it first queued.
    seen: list[tuple[float, Snapshot]] = []

    def recording(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        seen.append((now, snapshot))
        return _guarantee_first_standin(snapshot, now=now, config=config)

    jobs = [
        job("a1", 8, 0, 1000, "a"),
        job("a3", 8, 5, 50, "a"),
        job("a2", 8, 5, 50, "a"),
        job("b1", 4, 10, 100, "b"),
    ]
    run(jobs, 8, config=FAIRSHARE, teams={"a": 0, "b": 4}, schedule=recording)
    assert all(s.pending_in_submit_order for _, s in seen)
    queues = {t: [j.id for j in s.pending] for t, s in seen}
    assert queues[10] == ["a2", "a3", "b1"]
    assert queues[90] == ["a1", "a2", "a3", "b1"]  # a1 stopped at 90, b1 not started yet


def test_it_stops_when_the_core_gives_a_slice_twice() -> None:
    def greedy(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        first_slice = snapshot.nodes[0].slices[0].id
        return Decisions(
            assign=tuple(Assign(j.id, "n000", (first_slice,)) for j in snapshot.pending)
        )

    with pytest.raises(SimulationError, match="holds it"):
        run([job("a1", 1, 0, 10), job("a2", 1, 0, 10)], 8, schedule=greedy)


def test_it_stops_when_the_core_assigns_a_job_that_is_not_pending() -> None:
    def ghost(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        return Decisions(assign=(Assign("nobody", "n000", ("n000/g0",)),))

    with pytest.raises(SimulationError, match="not pending"):
        run([job("a1", 1, 0, 10)], 8, schedule=ghost)


def test_it_stops_when_the_core_gives_a_gang_the_wrong_size() -> None:
    def stingy(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        return Decisions(assign=(Assign("a1", "n000", ("n000/g0",)),))

    with pytest.raises(SimulationError, match="asks for 2..2"):
        run([job("a1", 2, 0, 10)], 8, schedule=stingy)


def test_it_leaves_jobs_the_core_never_starts_unfinished() -> None:
    def idle(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        return Decisions()

    result = run([job("a1", 1, 0, 10)], 8, schedule=idle)
    assert [r.job_id for r in result.unfinished] == ["a1"]


def test_it_refuses_a_tenant_without_a_team() -> None:
    with pytest.raises(SimulationError, match="without a team: b"):
        run([job("a1", 1, 0, 10, "a"), job("b1", 1, 0, 10, "b")], 8, teams={"a": 0})


def _guarantee_first_standin(
    snapshot: Snapshot, /, *, now: float, config: SchedulerConfig
) -> Decisions:
    """The reclaim stand-in, with jobs of teams under their guarantee ordered first."""
    held: dict[str, int] = {}
    for running in snapshot.running:
        held[running.job.team] = held.get(running.job.team, 0) + len(running.slice_ids)
    under = {n for n, t in snapshot.teams.items() if held.get(n, 0) < t.guaranteed}
    # The stand-ins order by (submitted_at, id): shift the favoured jobs' keys to the front.
    favoured = tuple(
        replace(j, submitted_at=j.submitted_at - 1e9) if j.team in under else j
        for j in snapshot.pending
    )
    return reclaim_standin(replace(snapshot, pending=favoured), now=now, config=config)


def _pass_times(
    jobs: list[TraceJob],
    config: SchedulerConfig,
    teams: dict[str, int],
    schedule=_guarantee_first_standin,  # noqa: ANN001 - any ScheduleFn
) -> tuple[list[float], SimResult]:
    times: list[float] = []

    def recording(snapshot: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        times.append(now)
        return schedule(snapshot, now=now, config=config)

    result = run(jobs, 8, config=config, teams=teams, schedule=recording)
    return times, result


def test_a_tick_planned_for_a_victim_that_finished_since_causes_no_pass() -> None:
    # b1 (within b's guarantee) waits for a's borrowed jobs to reach min_run_time (60 s):
    # a1 would at t=60, but it ends at t=30 while 4 GPUs stay free. Only a2's tick (t=65)
    # can change anything: it preempts a2, which stops at t=95; b1 runs 95..195.
    jobs = [
        job("a1", 4, 0, 30, "a"),
        job("a2", 4, 5, 1000, "a"),
        job("b1", 8, 10, 100, "b"),
    ]
    config = replace(FAIRSHARE, reclaim_wait_s=None)
    times, result = _pass_times(jobs, config, {"a": 0, "b": 8})
    assert times == [0, 5, 10, 30, 65, 95, 195]
    assert by_id(result)["b1"].segments == (Segment(95, 195, False),)
    assert by_id(result)["a2"].segments == (Segment(5, 95, True), Segment(195, 1195, False))
    assert result.ticks == 1


def test_the_reclaim_wait_of_a_job_that_can_never_reclaim_causes_no_pass() -> None:
    # c1 is larger than c's whole guarantee: it would borrow, and borrowing never preempts,
    # so its reclaim_wait_s running out (t=3601) changes nothing. b1, within b's guarantee,
    # waits behind it (the stand-in is FIFO): its own reclaim_wait_s (t=3602) is a tick, as
    # is t=60, when a1 (borrowing) reaches the minimum run time. c1's arrival (t=1) causes
    # no pass either: it fits none of the 4 free GPUs, and no queued job could reclaim.
    jobs = [
        job("a1", 4, 0, 100_000, "a"),
        job("c1", 8, 1, 10, "c"),
        job("b1", 4, 2, 10, "b"),
    ]
    config = replace(FAIRSHARE, reclaim_wait_s=3600.0)
    times, _ = _pass_times(jobs, config, {"a": 0, "b": 4, "c": 0}, reclaim_standin)
    assert times[:4] == [0, 2, 60, 3602]

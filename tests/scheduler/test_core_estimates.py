"""Start estimates: the band (earliest, likely, latest) and run-time history, exact numbers.

decide() runs the pass at now=1000. History comes in ``Snapshot.run_times`` as data; it is
looked up by user and shape, then team and shape, then shape (``scheduler.runtimes``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import decide, job, running, snapshot, whole_node

from scheduler import Job, RunTime, RunTimes, Snapshot
from scheduler.runtimes import (
    QUANTILE_STEPS,
    RECENT_RUNS,
    history_of,
    percentile,
    run_time_of,
    run_times_from,
    shape_of_job,
    team_key,
    user_key,
)

HOUR = 3600.0


def _band(decisions_snapshot: Snapshot) -> tuple[float | None, float | None, float | None]:
    pending = decide(decisions_snapshot).pending
    assert len(pending) == 1
    p = pending[0]
    return (p.eta_earliest, p.eta, p.eta_latest)


def _one_gpu_held_by(held: Job, *, started: float = 0.0, run_times: RunTimes) -> Snapshot:
    """n0 has one GPU, held by ``held`` since ``started``; one job waits for it."""
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [job("wait", "a", at=500.0, limit=HOUR)],
        [running(held, ["n0-g0"], started=started)],
    )
    return replace(snap, run_times=run_times)


def test_a_running_job_without_limit_or_history_leaves_the_estimate_unknown() -> None:
    snap = _one_gpu_held_by(job("r", "b", user="x"), run_times=RunTimes())
    assert _band(snap) == (None, None, None)


def test_history_of_the_same_user_and_shape_gives_the_band_of_a_job_without_limit() -> None:
    held = job("r", "b", user="x")
    past = [(job(f"h{i}", "b", user="x"), d) for i, d in enumerate([1000.0, 2000.0, 3000.0])]
    # p10 = 1200, median = 2000, p90 = 2800 (linear between order statistics).
    snap = _one_gpu_held_by(held, run_times=run_times_from(past))
    assert _band(snap) == (1200.0, 2000.0, 2800.0)


@pytest.mark.parametrize(
    ("user", "team", "likely"),
    [
        ("x", "b", 1000.0 + 100.0),  # same user and shape: its own history
        ("y", "b", 1000.0 + 200.0),  # another member: the team's history of the shape
        ("z", "c", 1000.0 + 300.0),  # another team: the shape's history across teams
    ],
)
def test_history_falls_back_from_user_to_team_to_shape(user: str, team: str, likely: float) -> None:
    held = job("r", team, user=user)
    shape = shape_of_job(held)
    flat = {  # one sample each: p10 = median = p90
        "user": RunTime(1, 100.0, 100.0, 100.0),
        "team": RunTime(1, 200.0, 200.0, 200.0),
        "shape": RunTime(1, 300.0, 300.0, 300.0),
    }
    history = RunTimes(
        by_user={user_key("b", "x", shape): flat["user"]},
        by_team={team_key("b", shape): flat["team"]},
        by_shape={shape: flat["shape"]},
    )
    # Started at 1000 (= now), so each end is 1000 + the run time.
    assert _band(_one_gpu_held_by(held, started=1000.0, run_times=history)) == (
        likely,
        likely,
        likely,
    )


def test_history_of_another_shape_is_not_used() -> None:
    held = job("r", "b", user="x", count=1)
    other = job("h", "b", user="x", count=2)
    snap = _one_gpu_held_by(held, run_times=run_times_from([(other, 100.0)]))
    assert _band(snap) == (None, None, None)


def test_history_shortens_the_likely_end_of_a_job_with_a_time_limit_never_its_latest() -> None:
    # r may run 4 h; jobs like it ran 1 h: likely ends at 1 h, at the latest at 4 h.
    held = job("r", "b", user="x", limit=4 * HOUR)
    snap = _one_gpu_held_by(held, run_times=run_times_from([(held, HOUR)]))
    assert _band(snap) == (HOUR, HOUR, 4 * HOUR)


def test_a_job_past_its_likely_end_is_expected_halfway_to_its_latest() -> None:
    # Jobs like r ran 600 s; r has run 1000 s of its 3000 s limit: likely at (1000+3000)/2.
    held = job("r", "b", user="x", limit=3000.0)
    snap = _one_gpu_held_by(held, run_times=run_times_from([(held, 600.0)]))
    assert _band(snap) == (1000.0, 2000.0, 3000.0)


@pytest.mark.parametrize(
    ("started", "limit", "band"),
    [
        # Past runs 0, 1000, ..., 4000 s: a run of t s is longer than t / 4000 of them.
        # r has run 0 s: the 10th, 50th, 90th percentile of all runs.
        (1000.0, None, (1400.0, 3000.0, 4600.0)),
        # r has run 1000 s (longer than 1/4): it is one of the runs longer than 1000 s, the
        # 10th/50th/90th percentile of those are at 0.325, 0.625, 0.925 of all: 1300, 2500,
        # 3700 s (the median of all runs alone would say 2000).
        (0.0, None, (1300.0, 2500.0, 3700.0)),
        # r has run 2000 s (longer than half): 0.55, 0.75, 0.95 of all; started at -1000.
        (-1000.0, None, (1200.0, 2000.0, 2800.0)),
        # ... with a 2500 s limit: every point capped by it, the latest is the limit.
        (-1000.0, 2500.0, (1200.0, 1500.0, 1500.0)),
        # r has run 4500 s, past every past run: likely halfway between now and its limit.
        (-3500.0, 6000.0, (1000.0, 1750.0, 2500.0)),
    ],
)
def test_a_running_jobs_end_is_estimated_from_the_past_runs_as_long_as_it_has_run(
    started: float, limit: float | None, band: tuple[float, float, float]
) -> None:
    held = job("r", "b", user="x", limit=limit)
    past = [(job(f"h{i}", "b", user="x", limit=limit), i * 1000.0) for i in range(5)]
    snap = _one_gpu_held_by(held, started=started, run_times=run_times_from(past))
    assert _band(snap) == pytest.approx(band)


def test_history_keeps_the_most_recent_runs_of_each_key() -> None:
    # 2 * RECENT_RUNS runs of 100 s, then RECENT_RUNS of 500 s: only the last count.
    alike = job("h", "b", user="x")
    runs = [100.0] * (2 * RECENT_RUNS) + [500.0] * RECENT_RUNS
    oldest_first = run_times_from([(alike, ran) for ran in runs])
    newest_first = run_times_from([(alike, ran) for ran in reversed(runs)], newest_first=True)
    for history in (oldest_first, newest_first):
        past = history_of(history, alike)
        assert past is not None
        assert (past.samples, past.p10_s, past.p90_s) == (RECENT_RUNS, 500.0, 500.0)


@pytest.mark.parametrize(
    ("past_runs", "likely"),
    [
        # r (1 h limit) has run 1000 s, past every run of its shape: it likely ends halfway
        # between now and its limit, at 2300. "first" starts then; "second" waits for it,
        # which runs at least as long as r has run, 1000 s, not the 200 s of the history.
        ((100.0, 200.0, 300.0), {"first": 2300.0, "second": 3300.0}),
        # r's shape ran 2000 to 3500 s: r, 1000 s in, likely runs the median, 3000 s; so
        # does "first" (r has run less than that).
        ((2000.0, 3000.0, 3500.0), {"first": 3000.0, "second": 6000.0}),
    ],
)
def test_a_queued_job_runs_at_least_as_long_as_its_users_alike_jobs_running_now(
    past_runs: tuple[float, ...], likely: dict[str, float]
) -> None:
    held = job("r", "b", user="x", limit=HOUR)
    first = job("first", "b", user="x", at=1.0, limit=HOUR)
    second = job("second", "b", user="x", at=2.0, limit=HOUR)
    snap = snapshot([whole_node("n0", gpus=1)], [first, second], [running(held, ["n0-g0"])])
    history = run_times_from([(job("h", "b", user="x", limit=HOUR), ran) for ran in past_runs])
    pending = decide(replace(snap, run_times=history), backfill=False).pending
    assert {p.job_id: p.eta for p in pending} == pytest.approx(likely)


def test_the_queue_ahead_is_booked_for_its_likely_run_times() -> None:
    # One GPU, free at 2000 (r's limit). "first" runs 1 h by its limit, 10 min by history;
    # "second" waits behind it: likely 2000 + 600, latest 2000 + 3600.
    first = job("first", "a", user="u", at=1.0, limit=HOUR)
    second = job("second", "a", user="u", at=2.0, limit=HOUR)
    snap = snapshot(
        [whole_node("n0", gpus=1)],
        [first, second],
        [running(job("r", "b", limit=2000.0), ["n0-g0"], started=0.0)],
    )
    history = run_times_from([(job("h", "a", user="u", limit=HOUR), 600.0)])
    pending = decide(replace(snap, run_times=history), backfill=False).pending
    bands = {p.job_id: (p.eta_earliest, p.eta, p.eta_latest) for p in pending}
    assert bands == {
        "first": (2000.0, 2000.0, 2000.0),
        "second": (2000.0, 2600.0, 2000.0 + HOUR),
    }


def test_history_changes_no_decision() -> None:
    nodes = [whole_node("n0", gpus=2)]
    held = [running(job("r", "b", limit=2000.0), ["n0-g0"], started=0.0)]
    pending = [job("big", "a", count=2, at=0.0), job("short", "a", at=1.0, limit=100.0)]
    snap = snapshot(nodes, pending, held)
    history = run_times_from([(job("r", "b", limit=2000.0), 10.0), (pending[0], 5.0)])
    blind, told = decide(snap), decide(replace(snap, run_times=history))
    assert (told.assign, told.preempt, told.fail) == (blind.assign, blind.preempt, blind.fail)
    assert [(p.job_id, p.reason) for p in told.pending] == [
        (p.job_id, p.reason) for p in blind.pending
    ]


def test_run_time_summaries_are_linear_percentiles() -> None:
    assert percentile([0.0, 10.0], 0.9) == 9.0
    assert run_time_of([]) is None
    three = run_time_of([30.0, 10.0, 20.0])
    steps = tuple(10.0 + i for i in range(QUANTILE_STEPS + 1))  # 10, 11, ..., 30
    assert three == RunTime(3, 12.0, 20.0, 28.0, steps)
    assert shape_of_job(job("j", count=4, model="A100", limit=3600.0)) == "whole:4::A100:3600"
    assert shape_of_job(job("j")) == "whole:1:::-"

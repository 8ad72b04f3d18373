"""Never two teams on one MPS daemon (one daemon per GPU): the core's rule, case by case.

The agent checks the same rule again before a launch (tests/workers/test_mps_supervision.py);
the property test `test_mps_gpus_never_serve_two_teams` checks it on random clusters.
"""

from __future__ import annotations

import pytest
from sched_builders import MPS, codes, decide, job, mps_node, placed, running, snapshot

from scheduler import Job, RunningJob


def mps(job_id: str, team: str, count: int = 1, at: float = 0.0) -> Job:
    return job(job_id, team, kind=MPS, count=count, at=at)


def holding(job_id: str, team: str, *slice_ids: str, preempting: bool = False) -> RunningJob:
    return running(
        mps(job_id, team), list(slice_ids), preempting_since=990.0 if preempting else None
    )


CASES = {
    "a GPU that serves a team takes only that team": (
        2,
        [holding("rb", "b", "p0-g0-s0")],
        [mps("a1", "a", at=0), mps("b1", "b", at=1)],
        {"a1": ("p0-g1-s0",), "b1": ("p0-g0-s1",)},
        {},
    ),
    "every GPU serves another team: the job waits": (
        2,
        [holding("rb", "b", "p0-g0-s0"), holding("rc", "c", "p0-g1-s0")],
        [mps("a1", "a")],
        {},
        {"a1": "NO_FIT"},
    ),
    "a GPU left serving two teams takes no one, not even them": (
        2,
        [holding("ra", "a", "p0-g0-s0"), holding("rb", "b", "p0-g0-s1")],
        [mps("a1", "a", at=0), mps("b1", "b", at=1)],
        {"a1": ("p0-g1-s0",)},  # b may not open g1 now that a serves on it
        {"b1": "FAIR_SHARE"},  # a job ahead of it (a1) took the GPU it could have had
    ),
    "a job being preempted still holds its GPU for its team": (
        1,
        [holding("rb", "b", "p0-g0-s0", preempting=True)],
        [mps("a1", "a")],
        {},
        {"a1": "NO_FIT"},
    ),
    "two teams in one pass open two GPUs": (
        2,
        [],
        [mps("a1", "a", at=0), mps("b1", "b", at=1), mps("a2", "a", at=2)],
        {"a1": ("p0-g0-s0",), "b1": ("p0-g1-s0",), "a2": ("p0-g0-s1",)},
        {},
    ),
    "a GPU whose last job left is open to any team": (
        1,
        [],
        [mps("b1", "b")],
        {"b1": ("p0-g0-s0",)},
        {},
    ),
}


@pytest.mark.parametrize(
    ("gpus", "held", "pending", "expected_placed", "expected_codes"),
    list(CASES.values()),
    ids=list(CASES),
)
def test_an_mps_gpu_serves_one_team(
    gpus: int,
    held: list[RunningJob],
    pending: list[Job],
    expected_placed: dict[str, tuple[str, ...]],
    expected_codes: dict[str, str],
) -> None:
    snap = snapshot([mps_node("p0", gpus=gpus, shares=4)], pending=pending, running_jobs=held)
    decisions = decide(snap, backfill=False)
    assert placed(decisions) == expected_placed
    assert codes(decisions) == expected_codes
    assert decisions.preempt == ()

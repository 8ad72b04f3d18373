"""The replay's shortcuts change no decision: every job's record is the same as on the plain
path, which runs a pass wherever a slice is free (the skip rule before ``_could_place``) and
lets the core list every pending job (``SchedulerConfig.list_pending``; FIFO then nominates
the whole queue instead of only as far as it looks, ``scheduler.nominate.InSubmitOrder``).
The lean replay also hands the core one ``scheduler.Carry`` for the whole replay
(``runner.carrying``: candidates kept between passes), and the plain path none."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from scheduler import core, nominate
from scheduler.config import SchedulerConfig
from scheduler.memo import Carry
from scheduler.model import Decisions, Snapshot
from scheduler.order import Candidate
from scheduler.sim.cluster import ClusterSpec, build_nodes, build_teams
from scheduler.sim.engine import Replay, SimResult
from scheduler.sim.runner import config_for
from scheduler.sim.trace import load_quotas, load_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GPUS = 64


class _EveryPass(Replay):
    """The plain path: a pass at every instant with pending work and a free slice."""

    def _could_place(self) -> bool:
        return len(self._owner) < len(self._slice_units)


def _replay(policy: str, *, hidden: bool, lean: bool, cached: bool = True) -> tuple[SimResult, int]:
    jobs = load_trace(FIXTURES / "trace_bursty.csv", limit=700)
    quotas = load_quotas(FIXTURES / "trace_bursty_quotas.csv")
    config = config_for(policy, SchedulerConfig())
    if not lean:
        config = replace(config, list_pending=True)
    if not cached:
        config = replace(config, caches=frozenset())
    listed = 0

    def counting(
        snap: Snapshot, /, *, now: float, config: SchedulerConfig, carry: Carry | None = None
    ) -> Decisions:
        nonlocal listed
        decisions = core.schedule(snap, now=now, config=config, carry=carry)
        listed += len(decisions.pending)
        return decisions

    kind = Replay if lean else _EveryPass
    result = kind(
        jobs,
        nodes=build_nodes(ClusterSpec(GPUS)),
        teams=build_teams((j.tenant for j in jobs), quotas, GPUS),
        config=config,
        schedule=partial(counting, carry=Carry()) if lean else counting,
        hide_durations=hidden,
    ).run()
    return result, listed


@pytest.mark.parametrize("hidden", [False, True], ids=["shown", "hidden"])
@pytest.mark.parametrize("policy", ["fairshare", "fifo_backfill", "fifo"])
def test_the_lean_replay_gives_every_job_the_same_record(policy: str, hidden: bool) -> None:
    lean, lean_listed = _replay(policy, hidden=hidden, lean=True)
    plain, plain_listed = _replay(policy, hidden=hidden, lean=False)
    assert lean.records == plain.records
    assert (lean.failed, lean.excluded) == (plain.failed, plain.excluded)
    # The shortcuts were taken: fewer passes, and no pending list built.
    assert lean.passes < plain.passes
    assert lean_listed == 0 < plain_listed


@pytest.mark.parametrize("hidden", [False, True], ids=["shown", "hidden"])
def test_the_lean_replay_decides_as_a_plain_one_with_no_cache(hidden: bool) -> None:
    """Fair share, the lean replay with every cache and the carry against the plain path
    with no cache at all: the remembered verdicts (keyed by the reservations a job may use,
    ``scheduler.memo``) and the carried candidates change no record."""
    lean, _ = _replay("fairshare", hidden=hidden, lean=True)
    plain, _ = _replay("fairshare", hidden=hidden, lean=False, cached=False)
    assert lean.records == plain.records
    assert (lean.failed, lean.excluded) == (plain.failed, plain.excluded)


def test_the_lean_replay_makes_a_waiting_job_a_candidate_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the carry, a job that waits through many passes is made a candidate once (and
    again only when requeued), not once per pass."""
    made = 0
    plain_candidate = nominate.Candidate

    def counted(*args: Any) -> Candidate:
        nonlocal made
        made += 1
        return plain_candidate(*args)

    monkeypatch.setattr(nominate, "Candidate", counted)
    lean, _ = _replay("fairshare", hidden=True, lean=True)
    lean_made, made = made, 0
    plain, _ = _replay("fairshare", hidden=True, lean=False)
    assert lean.records == plain.records
    assert lean_made <= len(lean.records) + sum(
        seg.preempted for r in lean.records for seg in r.segments
    )
    assert lean_made < made

"""The replay's shortcuts change no decision: every job's record is the same as on the plain
path, which runs a pass wherever a slice is free (the skip rule before ``_could_place``) and
lets the core list every pending job (``SchedulerConfig.list_pending``; FIFO then nominates
the whole queue instead of only as far as it looks, ``scheduler.nominate.InSubmitOrder``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduler import core
from scheduler.config import SchedulerConfig
from scheduler.model import Decisions, Snapshot
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


def _replay(policy: str, *, hidden: bool, lean: bool) -> tuple[SimResult, int]:
    jobs = load_trace(FIXTURES / "trace_bursty.csv", limit=700)
    quotas = load_quotas(FIXTURES / "trace_bursty_quotas.csv")
    config = config_for(policy, SchedulerConfig())
    if not lean:
        config = replace(config, list_pending=True)
    listed = 0

    def counting(snap: Snapshot, /, *, now: float, config: SchedulerConfig) -> Decisions:
        nonlocal listed
        decisions = core.schedule(snap, now=now, config=config)
        listed += len(decisions.pending)
        return decisions

    kind = Replay if lean else _EveryPass
    result = kind(
        jobs,
        nodes=build_nodes(ClusterSpec(GPUS)),
        teams=build_teams((j.tenant for j in jobs), quotas, GPUS),
        config=config,
        schedule=counting,
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

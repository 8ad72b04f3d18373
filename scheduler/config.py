"""The scheduling policy's knobs, with the defaults the README documents."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Policy(enum.StrEnum):
    FAIRSHARE = "fairshare"  # the portal's policy: everything below
    FIFO = "fifo"  # baseline: submit order, no backfill, no preemption
    FIFO_BACKFILL = "fifo_backfill"  # baseline: submit order with reservation backfill


class Cache(enum.StrEnum):
    """The memoisation a pass may use (``scheduler/memo.py`` lists what each one keeps).

    None of them changes a decision, only what a pass costs: the property tests run with all
    of them off and compare, and ``python -m bench.core_pass --caches`` measures each one's
    gain (docs/scheduling.md#speed).
    """

    VERDICTS = "verdicts"  # a job shaped like one that just failed, nothing changed since
    WHY_NOT = "why_not"  # why a (team, request) fits nowhere, across users and classes
    SHARED_REASONS = "shared_reasons"  # one reason and estimate per alike explanation
    SHARED_VERDICTS = "shared_verdicts"  # ... kept on the verdict jobs took from VERDICTS
    RELEASES = "releases"  # when a team's (member's) own jobs free its quota, per team
    ESTIMATES = "estimates"  # the time line of free capacity per pool, for estimates
    FACTORS = "factors"  # fair-share factors between charges
    NODE_LIST = "node_list"  # the node list's static index, while the node list is the same
    REQUESTS = "requests"  # what the cluster offers each distinct request
    SWEEPS = "sweeps"  # where the last sweep of a pool's ends for a need stopped
    # across passes, in a ``scheduler.memo.Carry`` the caller keeps:
    CARRIED_CANDIDATES = "carried_candidates"  # each pending job as a candidate


ALL_CACHES: frozenset[Cache] = frozenset(Cache)


def _default_priority_classes() -> tuple[str, ...]:
    return ("low", "normal", "high")


def _no_model_weights() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: Policy = Policy.FAIRSHARE
    # Priority classes, lowest first.
    priority_classes: tuple[str, ...] = field(default_factory=_default_priority_classes)
    # Fair share: usage half-life in seconds (7 days).
    usage_half_life_s: float = 7 * 24 * 3600.0
    # Aging: a waiting job's standing (a fair-share factor in (0, 1]) improves by this much
    # per hour waited: within a class, a job that waited 2 / aging_per_hour hours longer than
    # another goes first (1000 h with 0.002). The bound on waits is ``max_wait_s``.
    # Stronger aging turns long queues into FIFO and undoes fair share: on the Philly trace
    # 0.05 gave jain_waiting 0.86-0.87, 0.002 gave 0.95-0.97.
    aging_per_hour: float = 0.002
    backfill: bool = True
    # Preemption.
    reclaim: bool = True  # take borrowed capacity back for a team under its guarantee
    preempt_by_priority: bool = False
    min_run_time_s: float = 60.0  # a job runs at least this long before it can be a victim
    grace_period_s: float = 30.0  # victims get this long to stop
    # Reclaim never takes a job that has run this long (its restart from zero would lose
    # more than the reclaiming team waits for it); None: no such protection. On Philly one
    # reclaim of an 8-GPU job after 49 days of running set the makespan (see
    # docs/scheduling.md, Preemption).
    reclaim_max_run_s: float | None = 3 * 24 * 3600.0
    # Reclaim counts the work it throws away: a job that may reclaim waits instead when the
    # room it needs comes free (by the running jobs' time limits) before waiting would cost
    # its team more GPU time than the preemption throws away (units x time run of the
    # victims), and no later than this long after it was queued; past that it reclaims. So
    # a gang larger than its team's guarantee, which always borrows, keeps what it borrowed
    # longer the more work it has done. The bound on reclaim grows by this much
    # (docs/scheduling.md#preemption). None: reclaim at once, whatever it throws away.
    reclaim_wait_s: float | None = 3 * 3600.0
    # Billing weight of one GPU unit per GPU model (missing models weigh 1.0).
    model_weights: Mapping[str, float] = field(default_factory=_no_model_weights)
    # Explanations (reasons, positions, ETAs) for every pending job; replays may switch off.
    explain: bool = True
    # With ``explain`` off, whether ``Decisions.pending`` still lists every pending job (bare
    # codes and positions). The simulator, which reads only what a pass assigns, preempts and
    # fails, switches it off: a pass then builds no entry for the jobs it leaves pending. Has
    # no effect while ``explain`` is on.
    list_pending: bool = True
    # Fair share: how much a team's decayed history counts next to what it holds now, both in
    # GPU units (history as "average units held lately", see ``units.decayed_rate``).
    # 0 = only what it holds now; 1 = history weighs as much as the present.
    history_weight: float = 0.5
    # A job asking for a class above its team's ``max_priority``: False leaves it pending
    # with PRIORITY_NOT_ALLOWED (the portal should refuse it at submit); True runs it at the
    # team's highest allowed class.
    clamp_priority: bool = False
    # Backfill reservations per pass: the first N blocked jobs (in order) each reserve slices
    # (1 = EASY backfill; 0 = backfill without protection, like ``backfill=False`` only
    # greedier).
    max_reservations: int = 1
    # The bound on any job's wait: a job queued this long (seconds since ``queued_since``)
    # is *starving*; starving jobs go before every class and round (one that would borrow
    # after the work within guarantees, unless ``preempt_by_priority``), oldest first, and
    # each that does not fit gets a reservation of its own (beyond ``max_reservations``,
    # whether or not ``backfill`` is on), so it starts at the latest when the jobs on its
    # reserved slices reach their time limits (docs/scheduling.md#starvation). None: no
    # such bound.
    max_wait_s: float | None = 7 * 24 * 3600.0
    # The memoisation a pass may use (all by default). Only tests and the benchmark switch
    # caches off, to check that no decision depends on them and to measure what each gains.
    caches: frozenset[Cache] = ALL_CACHES

    def __post_init__(self) -> None:
        _check(len(self.priority_classes) > 0, "priority_classes", "at least one class name")
        _check(
            len(set(self.priority_classes)) == len(self.priority_classes),
            "priority_classes",
            "distinct names",
        )
        _check(self.usage_half_life_s >= 0, "usage_half_life_s", "a number >= 0")
        _check(self.aging_per_hour >= 0, "aging_per_hour", "a number >= 0")
        _check(self.min_run_time_s >= 0, "min_run_time_s", "a number >= 0")
        _check(self.grace_period_s >= 0, "grace_period_s", "a number >= 0")
        _check(
            self.reclaim_max_run_s is None or self.reclaim_max_run_s >= 0,
            "reclaim_max_run_s",
            "None or a number >= 0",
        )
        _check(
            self.reclaim_wait_s is None or self.reclaim_wait_s >= 0,
            "reclaim_wait_s",
            "None or a number >= 0",
        )
        _check(self.history_weight >= 0, "history_weight", "a number >= 0")
        _check(self.max_reservations >= 0, "max_reservations", "an integer >= 0")
        _check(
            self.max_wait_s is None or self.max_wait_s >= 0, "max_wait_s", "None or a number >= 0"
        )
        _check(
            all(isinstance(name, Cache) for name in self.caches),
            "caches",
            "a set of " + ", ".join(name.value for name in Cache),
        )
        for model, weight in self.model_weights.items():
            _check(weight > 0, f"model_weights[{model!r}]", "a number > 0")


def _check(ok: bool, field_name: str, allowed: str) -> None:
    if not ok:
        raise ValueError(f"SchedulerConfig.{field_name}: must be {allowed}")

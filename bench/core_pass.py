"""Speed of one scheduling pass: 10,000 pending jobs over 1,000 nodes x 8 GPUs.

The cluster mixes whole-GPU nodes (A100 and H100), MIG nodes (A100 split into assorted
profiles) and MPS nodes (4 shares per GPU, one team per GPU). Running jobs with assorted time
limits hold the slices; the queue mixes classes, teams, users, gangs, elastic gangs,
multi-node gangs, MIG and MPS requests and dependencies. Everything comes from one seeded
random source, so every run times the same snapshots.

Two snapshots:

- ``steady`` (the headline): what a pass of a running portal meets. 99% of the slices are
  held, mostly by teams in proportion to their guarantees, so a few slices are free and a
  few teams under their guarantee reclaim.
- ``burst``: a worst case, as after an outage. 90% held, by teams drawn at random, so about
  800 GPUs' worth is free and many teams reclaim at once (a pass of ~1,800 placements and
  ~200 preemptions).

Each call gets new node and slice objects of equal value, as a shell would that built them
anew from the database every pass (so the core's cache of the node list has to compare them
with the last ones); ``carried_cpu_median_ms`` is a cold pass given the ``Carry`` of the pass
before, as the portal's passes run (CPU time); ``warm_median_ms`` passes the same tuple again,
as the simulator does, and as the portal's shell does too while no slice row changed
(``portal.scheduling.snapshot`` keeps the last node tuple and hands it back when the rows
are equal). So the cold figure
overstates the portal's usual pass by that comparison (a few ms).

Every timed pass comes right after a bare greedy first-fit of the same snapshot
(``greedy_first_fit``: the free slices, then each job in submit order on the first node that
holds it), and ``ratio_to_greedy`` is the median of the pass's CPU time over the greedy's, pair
by pair: on a machine busy with other work both slow down alike, so the ratio holds where
milliseconds do not (``cpu_median_ms`` leaves out the time the process waited for a core;
``median_ms`` is wall time). ``first_cpu_median_ms`` is a first pass, with no node list kept
from an earlier one (the cold passes meet the one the pass before kept, as the portal's passes
do). ``python -m bench.core_pass`` prints the figures; ``run()``
returns them for ``make bench``. ``python -m bench.core_pass --caches`` times the pass with
each of its caches switched off in turn (docs/scheduling.md#speed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from scheduler import (
    ALL_CACHES,
    Cache,
    Carry,
    Dependency,
    DependencyState,
    GpuRequest,
    Job,
    Node,
    RunningJob,
    SchedulerConfig,
    Slice,
    SliceKind,
    Snapshot,
    Team,
    schedule,
)
from scheduler.units import mig_units

NODES = 1000
GPUS_PER_NODE = 8
PENDING = 10_000
TEAMS = 20
USERS_PER_TEAM = 5
NOW = 1_000_000.0
MIG_LAYOUTS = (
    ("3g.40gb", "2g.20gb", "2g.20gb"),
    ("1g.10gb",) * 7,
    ("4g.40gb", "3g.40gb"),
    ("7g.80gb",),
    ("3g.40gb", "3g.40gb", "1g.10gb"),
)
MPS_SHARES = 4


def _nodes(rng: random.Random, count: int) -> list[Node]:
    """Six in ten nodes of whole GPUs, a quarter split into MIG instances, the rest MPS."""
    nodes: list[Node] = []
    for n in range(count):
        name = f"node{n:04d}"
        slices: list[Slice] = []
        if n < count * 6 // 10:
            model = "H100" if n % 3 == 0 else "A100"
            for g in range(GPUS_PER_NODE):
                slices.append(Slice(f"{name}-g{g}", name, f"g{g}", SliceKind.WHOLE, 1.0, model))
        elif n < count * 85 // 100:
            for g in range(GPUS_PER_NODE):
                for i, profile in enumerate(rng.choice(MIG_LAYOUTS)):
                    units = mig_units(profile)
                    slice_id = f"{name}-g{g}-m{i}"
                    slices.append(
                        Slice(slice_id, name, f"g{g}", SliceKind.MIG, units, "A100", profile)
                    )
        else:
            for g in range(GPUS_PER_NODE):
                for s in range(MPS_SHARES):
                    slice_id = f"{name}-g{g}-s{s}"
                    share = 1.0 / MPS_SHARES
                    slices.append(Slice(slice_id, name, f"g{g}", SliceKind.MPS, share, "A100"))
        nodes.append(Node(name, tuple(slices), schedulable=rng.random() > 0.005))
    return nodes


def _teams(rng: random.Random) -> dict[str, Team]:
    teams = {}
    for t in range(TEAMS):
        name = f"team{t:02d}"
        guaranteed = float(rng.choice((100, 200, 300, 400, 500)))
        teams[name] = Team(
            name=name,
            weight=guaranteed / 100,
            guaranteed=guaranteed,
            limit=guaranteed * rng.choice((1.5, 2.0, 3.0)),
            max_priority=rng.choice(("normal", "high", "high")),
            usage=rng.uniform(0, 5e8),
            member_limit=rng.choice((None, 64.0, 128.0)),
        )
    return teams


def _job(rng: random.Random, job_id: str, kind: SliceKind, count: int, at: float) -> Job:
    team = f"team{rng.randrange(TEAMS):02d}"
    profile = ""
    model = ""
    min_count = 0
    multi = False
    if kind is SliceKind.MIG:
        profile = rng.choice(("1g.10gb", "2g.20gb", "3g.40gb", "3g.40gb", "7g.80gb"))
    elif kind is SliceKind.WHOLE:
        model = rng.choice(("", "", "", "A100", "H100"))
        if count > 2 and rng.random() < 0.2:
            min_count = count // 2
        multi = count >= 8 and rng.random() < 0.3
    limit = rng.choice((None, 3600.0, 4 * 3600.0, 12 * 3600.0, 48 * 3600.0))
    return Job(
        id=job_id,
        team=team,
        user=f"{team}-u{rng.randrange(USERS_PER_TEAM)}",
        request=GpuRequest(kind, count, profile, model, min_count, multi),
        submitted_at=at,
        priority=rng.choice(("low", "normal", "normal", "normal", "high")),
        time_limit_s=limit,
        preemptible=rng.random() < 0.8,
    )


@dataclass(frozen=True)
class Scenario:
    busy: float  # chance that a GPU, MIG instance or MPS share is held
    by_guarantee: bool  # holders drawn in proportion to team guarantees (else uniformly)


SCENARIOS = {
    "steady": Scenario(busy=0.99, by_guarantee=True),
    "burst": Scenario(busy=0.90, by_guarantee=False),
}


def _running(
    rng: random.Random, nodes: list[Node], teams: dict[str, Team], scenario: Scenario
) -> list[RunningJob]:
    """Fill the slices, GPU by GPU, with jobs of assorted sizes."""
    names = sorted(teams)
    weights = [teams[n].guaranteed if scenario.by_guarantee else 1.0 for n in names]

    def holder_team() -> str:
        return rng.choices(names, weights)[0]

    busy = scenario.busy
    held: list[RunningJob] = []
    k = 0
    for node in nodes:
        by_gpu: dict[str, list[Slice]] = {}
        for item in node.slices:
            by_gpu.setdefault(item.gpu, []).append(item)
        gpus = list(by_gpu.values())
        kind = gpus[0][0].kind
        if kind is SliceKind.WHOLE:
            taken = [g[0] for g in gpus if rng.random() < busy]
            while taken:
                size = min(len(taken), rng.choice((1, 1, 2, 4, 8)))
                group, taken = taken[:size], taken[size:]
                held.append(_holding(rng, f"r{k}", kind, group, holder_team()))
                k += 1
            continue
        for gpu in gpus:
            if kind is SliceKind.MPS:
                used = [item for item in gpu if rng.random() < busy]
                team = holder_team()  # one team per MPS GPU
                for item in used:
                    held.append(_holding(rng, f"r{k}", kind, [item], team))
                    k += 1
            else:
                for item in gpu:
                    if rng.random() < busy:
                        held.append(_holding(rng, f"r{k}", kind, [item], holder_team()))
                        k += 1
    return held


def _holding(
    rng: random.Random, job_id: str, kind: SliceKind, items: list[Slice], team: str
) -> RunningJob:
    spec = _job(rng, job_id, kind, len(items), NOW - rng.uniform(3600, 48 * 3600))
    spec = replace(spec, team=team, user=f"{team}-u{rng.randrange(USERS_PER_TEAM)}")
    if kind is SliceKind.MIG:
        spec = replace(spec, request=replace(spec.request, profile=items[0].profile))
    started = NOW - rng.uniform(60, 40 * 3600)
    preempting = NOW - 5.0 if rng.random() < 0.002 else None
    return RunningJob(spec, items[0].node, tuple(i.id for i in items), started, False, preempting)


def _pending(rng: random.Random, count: int) -> list[Job]:
    jobs: list[Job] = []
    for k in range(count):
        roll = rng.random()
        if roll < 0.6:
            kind, count = SliceKind.WHOLE, rng.choice((1, 1, 1, 2, 2, 4, 8))
        elif roll < 0.85:
            kind, count = SliceKind.MIG, rng.choice((1, 1, 2))
        else:
            kind, count = SliceKind.MPS, rng.choice((1, 1, 2))
        job = _job(rng, f"p{k:05d}", kind, count, NOW - rng.uniform(0, 72 * 3600))
        if rng.random() < 0.05 and jobs:
            job = replace(job, depends_on=(Dependency(rng.choice(jobs).id),))
        jobs.append(job)
    return jobs


def build_snapshot(
    scenario: str = "steady", seed: int = 7, *, nodes: int = NODES, pending: int = PENDING
) -> Snapshot:
    """The benchmark's cluster and queue (smaller ones for other benchmarks: `nodes`,
    `pending`); the defaults are the core pass's scenario."""
    rng = random.Random(seed)
    cluster = _nodes(rng, nodes)
    teams = _teams(rng)
    held = _running(rng, cluster, teams, SCENARIOS[scenario])
    queue = _pending(rng, pending)
    states = {
        dep.job_id: rng.choice(list(DependencyState)) for job in queue for dep in job.depends_on
    }
    user_usage = {
        (t, f"{t}-u{u}"): rng.uniform(0, 1e8) for t in teams for u in range(USERS_PER_TEAM)
    }
    return Snapshot(tuple(cluster), teams, tuple(queue), tuple(held), user_usage, states)


def greedy_first_fit(snapshot: Snapshot) -> int:
    """A bare greedy first-fit of ``snapshot``: the yardstick the pass is reported against.

    The free slices per pool (kind, MIG profile, GPU model) and node once the running jobs'
    slices are taken out; then each pending job in submit order takes its count from the first
    node, by name, with that many free slices of one matching pool. Nothing else: no quota,
    fair share, class, dependency, elastic or multi-node gang, MPS owner or reason. Timed in
    the same process as the pass, it makes the pass's figure a ratio that holds on a machine
    that is busy with other work. Returns how many jobs it placed.
    """
    held: set[str] = set()
    for run in snapshot.running:
        held.update(run.slice_ids)
    free: dict[tuple[SliceKind, str, str], dict[str, list[Slice]]] = {}
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if not node.schedulable:
            continue
        for item in node.slices:
            if item.id not in held:
                pool = free.setdefault((item.kind, item.profile, item.model), {})
                pool.setdefault(node.name, []).append(item)
    totals = {pool: sum(map(len, by_node.values())) for pool, by_node in free.items()}
    matching: dict[tuple[SliceKind, str, str], list[tuple[SliceKind, str, str]]] = {}
    placed = 0
    for job in sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id)):
        request = job.request
        asked = (request.kind, request.profile, request.model)
        pools = matching.get(asked)
        if pools is None:
            pools = matching[asked] = [
                p
                for p in free
                if p[0] is request.kind
                and p[1] == request.profile
                and (not request.model or p[2] == request.model)
            ]
        need = request.count
        for pool in pools:
            if totals[pool] < need:
                continue
            by_node = free[pool]
            name = next((n for n, items in by_node.items() if len(items) >= need), None)
            if name is not None:
                items = by_node[name]
                del items[:need]
                if not items:
                    del by_node[name]
                totals[pool] -= need
                placed += 1
                break
    return placed


def _shell_nodes(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """New node and slice objects of equal value: what a shell that rebuilt the nodes every
    pass would pass (so a cache of the node list must compare, not just recognise it)."""
    return tuple(Node(n.name, tuple(replace(s) for s in n.slices), n.schedulable) for n in nodes)


def _time(snapshot: Snapshot, config: SchedulerConfig, repeats: int, fresh: bool) -> list[float]:
    return [pair[0] for pair in _timed(snapshot, config, repeats, fresh)[0]]


_Pair = tuple[float, float]  # (wall ms, CPU ms)


def _timed(
    snapshot: Snapshot,
    config: SchedulerConfig,
    repeats: int,
    fresh: bool,
    greedy: bool = False,
    carry: Carry | None = None,
) -> tuple[list[_Pair], list[_Pair]]:
    """``repeats`` passes, each (when ``greedy``) right after a greedy first-fit of the same
    snapshot: the pass's (wall, CPU) ms and the greedy's. With ``carry``, each pass is given
    it (so the passes after the first take what the one before learnt)."""
    passes: list[_Pair] = []
    greedies: list[_Pair] = []
    for _ in range(repeats):
        snap = replace(snapshot, nodes=_shell_nodes(snapshot.nodes)) if fresh else snapshot
        if greedy:
            greedies.append(_clock(greedy_first_fit, snap))
        passes.append(_clock(lambda s: schedule(s, now=NOW, config=config, carry=carry), snap))
    return passes, greedies


def _clock(call: Callable[[Snapshot], object], snapshot: Snapshot) -> _Pair:
    wall, cpu = time.perf_counter(), time.process_time()
    call(snapshot)
    return (time.perf_counter() - wall) * 1000.0, (time.process_time() - cpu) * 1000.0


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _measure(scenario: str, repeats: int) -> dict[str, Any]:
    snapshot = build_snapshot(scenario)
    config = SchedulerConfig()
    decisions = schedule(snapshot, now=NOW, config=config)  # first-call costs out of the way
    cold, greedy = _timed(snapshot, config, repeats, fresh=True, greedy=True)
    warm = _time(snapshot, config, max(3, repeats // 4), fresh=False)
    # As the portal's passes run: its snapshot hands the core the same job objects for rows
    # that did not change, and portal.scheduling.service keeps a Carry per process.
    carry = Carry()
    schedule(snapshot, now=NOW, config=config, carry=carry)
    carried = _timed(snapshot, config, max(3, repeats // 4), fresh=True, carry=carry)[0]
    replay = _time(snapshot, SchedulerConfig(explain=False), max(3, repeats // 4), fresh=True)
    # A first pass: no node list (and so no request answers) kept from an earlier pass, as
    # after the scheduler process starts or the cluster changes.
    first_config = SchedulerConfig(caches=ALL_CACHES - {Cache.NODE_LIST})
    first = _timed(snapshot, first_config, max(3, repeats // 4), fresh=True)[0]
    # The pass against the greedy first-fit just before it, CPU time of this process: a
    # machine busy with other work slows both alike (and CPU time leaves out the waits).
    ratios = [p[1] / max(g[1], 1e-6) for p, g in zip(cold, greedy, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {
        "running": len(snapshot.running),
        "assigned": len(decisions.assign),
        "preempted": len(decisions.preempt),
        "median_ms": round(statistics.median(p[0] for p in cold), 1),
        "p95_ms": round(_p95([p[0] for p in cold]), 1),
        "cpu_median_ms": round(statistics.median(p[1] for p in cold), 1),
        "greedy_cpu_median_ms": round(statistics.median(g[1] for g in greedy), 1),
        "ratio_to_greedy": round(statistics.median(ratios), 2),
        "ratio_to_greedy_quartiles": [round(quartiles[0], 2), round(quartiles[2], 2)],
        "first_cpu_median_ms": round(statistics.median(p[1] for p in first), 1),
        "warm_median_ms": round(statistics.median(warm), 1),
        "carried_cpu_median_ms": round(statistics.median(p[1] for p in carried), 1),
        "no_explain_median_ms": round(statistics.median(replay), 1),
    }


def run(repeats: int = 20) -> dict[str, Any]:
    """Time ``repeats`` passes per snapshot; the top-level figures are the steady ones."""
    steady = _measure("steady", repeats)
    burst = _measure("burst", max(3, repeats // 2))
    snapshot = build_snapshot("steady")
    gpus = len({(s.node, s.gpu) for n in snapshot.nodes for s in n.slices})
    return {
        "pending": len(snapshot.pending),
        "gpus": gpus,
        "median_ms": steady["median_ms"],
        "p95_ms": steady["p95_ms"],
        "cpu_median_ms": steady["cpu_median_ms"],
        "ratio_to_greedy": steady["ratio_to_greedy"],
        "steady": steady,
        "burst": burst,
    }


OVERLAPPING: tuple[frozenset[Cache], ...] = (
    frozenset({Cache.VERDICTS, Cache.WHY_NOT}),
    frozenset({Cache.SHARED_REASONS, Cache.SHARED_VERDICTS}),
)


def cache_gains(
    repeats: int = 15, scenarios: tuple[str, ...] = ("steady", "burst")
) -> dict[str, Any]:
    """What each cache of the pass gains: each variant (one cache off, or two that stand in
    for each other) is timed right after a pass with every cache on, and the gain is the
    median of those paired differences (a machine that slows down or speeds up shifts both
    sides of a pair alike), next to the difference of the fastest passes, in CPU time. Cold
    passes get new node objects of equal value, as the portal's shell does after a slice row
    changed; warm ones pass the same tuple again, as the simulator does (and the portal while
    no slice row changed)."""
    variants: dict[str, frozenset[Cache]] = {
        f"{cache.value} off": ALL_CACHES - {cache} for cache in Cache
    }
    # Caches that stand in for each other: what one of them gains shows only with both off.
    for pair in OVERLAPPING:
        variants[" + ".join(sorted(c.value for c in pair)) + " off"] = ALL_CACHES - pair
    modes = {
        "cold, explained": (True, True),
        "cold, not explained": (True, False),
        "warm, explained": (False, True),
    }
    out: dict[str, Any] = {}
    for scenario in scenarios:
        snapshot = build_snapshot(scenario)
        schedule(snapshot, now=NOW, config=SchedulerConfig())  # first-call costs out of the way
        pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(repeats):
            for mode, (fresh, explain) in modes.items():
                every = SchedulerConfig(explain=explain)
                for name, caches in variants.items():
                    config = SchedulerConfig(explain=explain, caches=caches)
                    base = _cpu_ms(snapshot, every, fresh)
                    pairs.setdefault((mode, name), []).append(
                        (base, _cpu_ms(snapshot, config, fresh))
                    )
        table: dict[str, dict[str, Any]] = {}
        for mode in modes:
            bases = [base for name in variants for base, _ in pairs[(mode, name)]]
            table[mode] = {
                "all on ms (median, min)": [_ms(statistics.median(bases)), _ms(min(bases))]
            }
            for name in variants:
                measured = pairs[(mode, name)]
                paired = statistics.median(off - base for base, off in measured)
                fastest = min(off for _, off in measured) - min(base for base, _ in measured)
                table[mode][f"{name}: +ms (paired median, fastest)"] = [_ms(paired), _ms(fastest)]
        out[scenario] = table
    return out


def _cpu_ms(snapshot: Snapshot, config: SchedulerConfig, fresh: bool) -> float:
    return _timed(snapshot, config, 1, fresh)[0][0][1]


def _ms(value: float) -> float:
    return round(value, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core_pass", description=__doc__)
    parser.add_argument(
        "--repeats", type=int, help="passes per figure (default 20; 15 with --caches)"
    )
    parser.add_argument(
        "--caches", action="store_true", help="measure what each cache of the pass gains"
    )
    args = parser.parse_args(argv)
    if args.caches:
        print(json.dumps(cache_gains(repeats=args.repeats or 15), indent=2))
    else:
        print(json.dumps(run(repeats=args.repeats or 20), indent=2))


if __name__ == "__main__":
    main()

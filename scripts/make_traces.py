"""Write the benchmark's own job traces into tests/fixtures/, from one seed.

Three shapes the Philly trace does not have (issue 8), each a trace in the simulator's Philly
layout (``job_id,submit_s,duration_s,gpus,tenant``) with its quota file (``vc,node num``:
each team's quota in nodes, its weight and, scaled to the cluster, its guarantee):

- ``bursty``: a light load (about half the cluster over the trace) that comes in bursts,
  from 12 teams of very different sizes (quotas of 1 to 24 nodes);
- ``big_gangs``: small teams whose jobs are larger than their whole guarantee (8- and 16-GPU
  gangs against 2 to 4 GPUs of guarantee) next to large teams with small jobs;
- ``flood_late``: one team floods the cluster with a long queue from the start while a team
  of the same quota arrives late, next to two steady teams.

Every trace is meant for ``CLUSTER_GPUS`` GPUs (8 per node). The same seed gives the same
files: ``python scripts/make_traces.py [--seed 8] [--out tests/fixtures]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_GPUS = 64
HOUR = 3600.0


@dataclass(frozen=True)
class Row:
    submit_s: float
    duration_s: float
    gpus: int
    tenant: str


def _duration(rng: random.Random, median_h: float, spread: float = 1.0) -> float:
    """A log-normal run time around ``median_h`` hours, between 2 minutes and 3 days."""
    hours = median_h * math.exp(rng.gauss(0.0, spread))
    return round(min(72 * HOUR, max(120.0, hours * HOUR)))


def bursty(rng: random.Random) -> tuple[list[Row], dict[str, float]]:
    """12 teams of very different sizes; bursts of 5-40 jobs, quiet in between."""
    quotas = {f"b{i:02d}": q for i, q in enumerate((24, 12, 8, 6, 4, 3, 2, 1, 1, 1, 1, 1))}
    weights = list(quotas.values())
    rows: list[Row] = []
    t = 0.0
    end = 10 * 24 * HOUR
    while t < end:
        t += rng.expovariate(1 / (3 * HOUR))  # a burst every ~3 hours
        team = rng.choices(list(quotas), weights)[0]
        for _ in range(rng.randint(5, 40)):
            gpus = rng.choice((1, 1, 1, 2, 2, 4, 8))
            rows.append(Row(t + rng.uniform(0, 600), _duration(rng, 0.9), gpus, team))
    return rows, {team: float(q) for team, q in quotas.items()}


def big_gangs(rng: random.Random) -> tuple[list[Row], dict[str, float]]:
    """Teams with 2-4 GPUs of guarantee asking for 8- and 16-GPU gangs, next to large teams
    with 1-4 GPU jobs; about 85% of the cluster offered."""
    quotas = {"large1": 3.0, "large2": 3.0, "small1": 0.25, "small2": 0.5, "small3": 0.25}
    rows: list[Row] = []
    end = 14 * 24 * HOUR
    for team, rate_per_h, sizes, median_h in (
        ("large1", 2.5, (1, 2, 4), 2.0),
        ("large2", 2.5, (1, 1, 2, 4), 2.0),
        ("small1", 0.15, (8, 16), 3.0),
        ("small2", 0.2, (8, 8, 16), 3.0),
        ("small3", 0.1, (16,), 4.0),
    ):
        t = 0.0
        while True:
            t += rng.expovariate(rate_per_h / HOUR)
            if t >= end:
                break
            rows.append(Row(t, _duration(rng, median_h, 0.8), rng.choice(sizes), team))
    return rows, quotas


def flood_late(rng: random.Random) -> tuple[list[Row], dict[str, float]]:
    """``flood`` queues ~3 cluster-days of work in its first hours; ``late`` (same quota)
    starts on day 2; two steady teams throughout."""
    quotas = {"flood": 2.0, "late": 2.0, "steady1": 2.0, "steady2": 2.0}
    rows: list[Row] = []
    for _ in range(600):
        t = rng.uniform(0, 4 * HOUR)
        rows.append(Row(t, _duration(rng, 2.0, 0.7), rng.choice((1, 2, 4, 8)), "flood"))
    end = 8 * 24 * HOUR
    for team, start, rate_per_h in (("late", 2 * 24 * HOUR, 1.5), ("steady1", 0.0, 1.0)):
        t = start
        while True:
            t += rng.expovariate(rate_per_h / HOUR)
            if t >= end:
                break
            rows.append(Row(t, _duration(rng, 1.5), rng.choice((1, 2, 4)), team))
    t = 0.0
    while True:
        t += rng.expovariate(0.8 / HOUR)
        if t >= end:
            break
        rows.append(Row(t, _duration(rng, 2.0), rng.choice((1, 2, 4, 8)), "steady2"))
    return rows, quotas


TRACES: dict[str, Callable[[random.Random], tuple[list[Row], dict[str, float]]]] = {
    "bursty": bursty,
    "big_gangs": big_gangs,
    "flood_late": flood_late,
}


def trace_paths(name: str, out: Path = ROOT / "tests" / "fixtures") -> tuple[Path, Path]:
    """Where the trace ``name`` and its quota file are written."""
    return out / f"trace_{name}.csv", out / f"trace_{name}_quotas.csv"


def write(name: str, seed: int, out: Path) -> tuple[Path, Path]:
    # One generator per trace, seeded from the seed and the name, so a change to one shape
    # leaves the others' files alone.
    rng = random.Random(f"{seed}:{name}")
    rows, quotas = TRACES[name](rng)
    rows.sort(key=lambda r: r.submit_s)
    jobs, quota_file = trace_paths(name, out)
    with jobs.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("job_id", "submit_s", "duration_s", "gpus", "tenant"))
        for k, row in enumerate(rows):
            writer.writerow(
                (f"{name}-{k:05d}", round(row.submit_s), row.duration_s, row.gpus, row.tenant)
            )
    with quota_file.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("vc", "node num"))
        for team, nodes in quotas.items():
            writer.writerow((team, nodes))
    return jobs, quota_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/make_traces.py", description=__doc__)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args(argv)
    for name in TRACES:
        jobs, quotas = write(name, args.seed, args.out)
        print(f"wrote {jobs} and {quotas}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

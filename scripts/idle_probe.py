"""Why GPUs sit idle while jobs wait: ``python scripts/idle_probe.py --gpus N [--limit-jobs N]``.

Replays the Philly trace (fair share, durations hidden, as ``python -m scheduler.sim
--hide-durations`` does) through a ``Replay`` that looks at the node state after every pass
(the decisions are the replay's own) and splits the idle GPU-time until the next pass by what
that state allowed: a pending job fitted a node now, or (multi-node) the free total, yet
waited (reservations, slices claimed for a preemption, reclaim waits); the free total held a
waiting job but no node did (fragmentation); no waiting job fitted by count; nothing queued.
The split after ``--late-day`` is printed apart (docs/scheduling.md#where-fairness-and-
utilisation-are-lost-on-philly).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler import core  # noqa: E402
from scheduler.config import SchedulerConfig  # noqa: E402
from scheduler.sim.cluster import ClusterSpec, build_nodes, build_teams  # noqa: E402
from scheduler.sim.engine import Replay  # noqa: E402
from scheduler.sim.runner import config_for  # noqa: E402
from scheduler.sim.trace import load_quotas, load_trace  # noqa: E402

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "philly"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=str(TRACE / "jobs.csv"))
    parser.add_argument("--quotas", default=str(TRACE / "vc_quota_nodes.csv"))
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--limit-jobs", type=int)
    parser.add_argument("--late-day", type=float, default=99.8)
    args = parser.parse_args(argv)
    jobs = load_trace(args.trace, limit=args.limit_jobs)
    teams = build_teams((j.tenant for j in jobs), load_quotas(args.quotas), args.gpus)
    idle: dict[str, float] = defaultdict(float)
    late_s = args.late_day * 86400
    state: list[tuple[float, str, int]] = []  # (since, category, free GPUs) after a pass

    class Probe(Replay):
        def _pass(self, now: float) -> None:
            if state and now > state[0][0]:
                since, category, free = state[0]
                idle[category] += free * (now - since)
                if since >= late_s:
                    idle[f"after day {args.late_day:g}: {category}"] += free * (now - since)
            super()._pass(now)
            per_node = next(iter(self._free.values()))
            total, most = sum(per_node.values()), max(per_node.values())
            category = "nothing queued"
            if self._pending and total > 0:
                wanted = [(multi, least) for (_, multi, least), n in self._wanted.items() if n]
                if any(least <= (total if multi else most) for multi, least in wanted):
                    category = "a job fits a node now but waits"
                elif any(least <= total for _, least in wanted):
                    category = "fits by count, no node has room (fragmentation)"
                else:
                    category = "no waiting job fits by count"
            state[:] = [(now, category, total)]

    started = time.process_time()
    config = config_for("fairshare", SchedulerConfig())
    result = Probe(
        jobs,
        nodes=build_nodes(ClusterSpec(args.gpus, 8)),
        teams=teams,
        config=config,
        schedule=core.schedule,
        gpus_per_node=8,
        hide_durations=True,
    ).run()
    print(
        f"{len(jobs)} jobs on {args.gpus} GPUs: {result.passes} passes, "
        f"{time.process_time() - started:.0f} s of CPU"
    )
    for key, value in sorted(idle.items()):
        print(f"  {key:62s} {value / 3600:10.0f} GPU-h")
    return 0


if __name__ == "__main__":
    sys.exit(main())

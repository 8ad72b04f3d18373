"""`make bench`: every benchmark in one run, printed side by side and saved to bench/results.json.

(a) one schedule() call of the pure core on 10,000 pending jobs over 1,000 nodes x 8 GPUs, in
    ms and as a ratio to a greedy first-fit of the same snapshot (bench/core_pass.py), timed
    first and alone;
(b) the same pass through the database shell on PostgreSQL when DATABASE_URL is set
    (bench/db_pass.py);
(c) trace replays, one process per replay, as many at once as there are cores
    (bench/philly.py): the Philly trace on 512 and 400 GPUs, and the own traces of
    scripts/make_traces.py (tests/fixtures/trace_*.csv) on 64 GPUs, each with its targets.
    `make bench` replays fair share, FIFO + backfill and private partitions on every trace
    and size, each with the durations shown and hidden; `make bench-full` (--full) adds the
    slowest baseline, plain FIFO, on Philly;
(d) ETA calibration and the starvation bounds on a slice of the Philly trace (bench/eta.py).

Options: --full, --skip-philly, --skip-traces, --skip-db, --skip-eta, --philly-trace PATH,
--philly-limit-jobs N, --gpus 512,400, --workers N, --core-repeats N, --out PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"

CORE_TARGET_MS = 100.0
DB_TARGET_MS = 1000.0
BENCH_TARGET_MIN = 25.0  # the whole of `make bench`, wall clock (issue 8)
OWN_KEYS = (
    "when",
    "machine",
    "complete",
    "wall_s",
    "core_pass",
    "db_pass",
    "philly",
    "philly_targets",
    "traces",
    "trace_targets",
    "eta",
    "sources",  # where figures assembled from separate runs came from (a whole run has none)
)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--philly-trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--gpus", default="512,400", help="cluster sizes for the Philly replays")
    parser.add_argument("--full", action="store_true", help="also the slowest baselines")
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument("--skip-traces", action="store_true")
    parser.add_argument(
        "--philly-limit-jobs", type=int, help="replay only the first N jobs (a quick check)"
    )
    parser.add_argument("--skip-db", action="store_true")
    parser.add_argument("--workers", type=int, help="replays at once (default: the cores)")
    parser.add_argument("--skip-eta", action="store_true")
    parser.add_argument("--core-repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args(argv)
    started = time.monotonic()
    # Other benchmarks' keys (`make bench-api` writes "api") stay as they were; this run's own
    # keys are replaced, so a run cut short leaves no stale figure beside its new ones.
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    for key in OWN_KEYS:
        kept.pop(key, None)

    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "complete": False,
    }

    def save() -> None:
        """Write what is measured so far: a run cut short (the replays take many minutes)
        keeps its figures, marked ``"complete": false`` until the last section ends."""
        results["wall_s"] = round(time.monotonic() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**kept, **results}, indent=2, sort_keys=True) + "\n")

    from bench import core_pass

    print(
        "== (a) core pass: schedule() on 10,000 pending jobs, 1,000 nodes x 8 GPUs ==", flush=True
    )
    core = core_pass.run(repeats=args.core_repeats)
    results["core_pass"] = core
    save()
    steady = core["steady"]
    low, high = steady["ratio_to_greedy_quartiles"]
    print(
        f"median {core['median_ms']:.1f} ms wall, {core['cpu_median_ms']:.1f} ms CPU, "
        f"p95 {core['p95_ms']:.1f} ms wall; {core['ratio_to_greedy']:.2f}x a greedy first-fit "
        f"of the same snapshot (quartiles {low:.2f}-{high:.2f}; greedy "
        f"{steady['greedy_cpu_median_ms']:.1f} ms CPU)\n"
        f"target <= {CORE_TARGET_MS:.0f} ms median (CPU time): "
        f"{_verdict(core['cpu_median_ms'] <= CORE_TARGET_MS)}",
        flush=True,
    )

    if args.skip_db or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("\n== (b) database pass: skipped (set DATABASE_URL=postgres://... to run it) ==")
        results["db_pass"] = None
    else:
        from bench import db_pass

        print(
            "\n== (b) database pass: snapshot -> schedule() -> apply on PostgreSQL ==", flush=True
        )
        db = db_pass.run()
        results["db_pass"] = db
        print(
            f"median {db['median_ms']:.1f} ms, p95 {db['p95_ms']:.1f} ms "
            f"(target <= {DB_TARGET_MS:.0f} ms median: {_verdict(db['median_ms'] <= DB_TARGET_MS)})",
            flush=True,
        )
    save()

    from bench import philly

    sizes = tuple(int(size) for size in args.gpus.split(",") if size.strip())
    tasks = philly.bench_tasks(
        args.philly_trace,
        sizes,
        full=args.full,
        limit_jobs=args.philly_limit_jobs,
        philly=not args.skip_philly,
        traces=not args.skip_traces,
    )
    results["philly"], results["traces"] = [], []
    if tasks:
        print(f"\n== (c) {len(tasks)} trace replays, in parallel ==", flush=True)

        def keep(report: dict[str, Any]) -> None:
            key = "philly" if report["trace_label"] == "philly" else "traces"
            results[key].append(report)
            save()

        reports = philly.run_replays(tasks, workers=args.workers, on_report=keep)
        results["philly"] = [r for r in reports if r["trace_label"] == "philly"]
        results["traces"] = [r for r in reports if r["trace_label"] != "philly"]
    if results["philly"]:
        print("\nPhilly:\n" + philly.render_table(results["philly"]))
        results["philly_targets"] = philly.check_targets(results["philly"])
        print(philly.render_targets(results["philly_targets"]), flush=True)
    if results["traces"]:
        print("\nOwn traces (scripts/make_traces.py):")
        print(philly.render_tables(results["traces"]))
        results["trace_targets"] = philly.trace_targets(results["traces"])
        print(philly.render_targets(results["trace_targets"]), flush=True)

    # (d) ETA calibration and the starvation bounds: bench/eta.py owns the figures.
    if args.skip_eta:
        results["eta"] = None
    else:
        from bench import eta

        print("\n== (d) ETA calibration and starvation bounds ==", flush=True)
        results["eta"] = eta.calibration(args.philly_trace)
        print(eta.render_calibration(results["eta"]), flush=True)

    results["complete"] = True
    save()
    minutes = results["wall_s"] / 60
    print(f"\nwrote {args.out} ({minutes:.1f} min)")
    if not (args.skip_philly or args.skip_traces or args.skip_eta or args.philly_limit_jobs):
        # The whole of `make bench` (without --full) against the time it may take.
        verdict = _verdict(minutes <= BENCH_TARGET_MIN)
        print(f"target: make bench <= {BENCH_TARGET_MIN:.0f} min on this machine: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

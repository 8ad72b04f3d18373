"""`make bench`: every benchmark in one run, printed side by side and saved to bench/results.json.

(a) the Philly trace on 512 and 400 GPUs for our policy and the baselines (bench/philly.py);
(b) one schedule() call of the pure core on 10,000 pending jobs over 1,000 nodes x 8 GPUs
    (bench/core_pass.py);
(c) the same pass through the database shell on PostgreSQL when DATABASE_URL is set
    (bench/db_pass.py);
(d) ETA calibration and the starvation bounds on a slice of the Philly trace (bench/eta.py).

Options: --skip-philly, --skip-db, --skip-eta, --philly-trace PATH, --philly-limit-jobs N, --gpus 512,400,
--core-repeats N, --out PATH.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly" / "jobs.csv"

CORE_TARGET_MS = 100.0
DB_TARGET_MS = 1000.0


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _philly_one_size(trace: Path, gpus: int, limit_jobs: int | None) -> list[dict[str, Any]]:
    from bench import philly

    started = time.monotonic()
    reports = philly.run(trace, gpu_sizes=(gpus,), limit_jobs=limit_jobs, out=io.StringIO())
    print(f"  {gpus} GPUs: 4 policies replayed in {time.monotonic() - started:.0f} s", flush=True)
    return reports


def _philly_in_parallel(
    trace: Path, sizes: tuple[int, ...], limit_jobs: int | None
) -> list[dict[str, Any]]:
    """One process per cluster size (each replay is single-threaded Python)."""
    workers = max(1, min(len(sizes), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        per_size = list(
            pool.map(_philly_one_size, [trace] * len(sizes), sizes, [limit_jobs] * len(sizes))
        )
    return [report for reports in per_size for report in reports]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--philly-trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--gpus", default="512,400", help="cluster sizes for the Philly replays")
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument(
        "--philly-limit-jobs", type=int, help="replay only the first N jobs (a quick check)"
    )
    parser.add_argument("--skip-db", action="store_true")
    parser.add_argument("--skip-eta", action="store_true")
    parser.add_argument("--core-repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }

    from bench import core_pass

    print(
        "== (b) core pass: schedule() on 10,000 pending jobs, 1,000 nodes x 8 GPUs ==", flush=True
    )
    core = core_pass.run(repeats=args.core_repeats)
    results["core_pass"] = core
    print(
        f"median {core['median_ms']:.1f} ms, p95 {core['p95_ms']:.1f} ms "
        f"(target <= {CORE_TARGET_MS:.0f} ms median: {_verdict(core['median_ms'] <= CORE_TARGET_MS)})",
        flush=True,
    )

    if args.skip_db or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("\n== (c) database pass: skipped (set DATABASE_URL=postgres://... to run it) ==")
        results["db_pass"] = None
    else:
        from bench import db_pass

        print(
            "\n== (c) database pass: snapshot -> schedule() -> apply on PostgreSQL ==", flush=True
        )
        db = db_pass.run()
        results["db_pass"] = db
        print(
            f"median {db['median_ms']:.1f} ms, p95 {db['p95_ms']:.1f} ms "
            f"(target <= {DB_TARGET_MS:.0f} ms median: {_verdict(db['median_ms'] <= DB_TARGET_MS)})",
            flush=True,
        )

    if args.skip_philly:
        results["philly"] = []
    else:
        from bench import philly

        sizes = tuple(int(size) for size in args.gpus.split(",") if size.strip())
        print(f"\n== (a) Philly trace replays on {', '.join(map(str, sizes))} GPUs ==", flush=True)
        results["philly"] = _philly_in_parallel(args.philly_trace, sizes, args.philly_limit_jobs)
        print(philly.render_table(results["philly"]))
        results["philly_targets"] = philly.check_targets(results["philly"])
        print(philly.render_targets(results["philly_targets"]), flush=True)

    # (d) ETA calibration and the starvation bounds: bench/eta.py owns the figures.
    if args.skip_eta:
        results["eta"] = None
    else:
        from bench import eta

        print("\n== (d) ETA calibration and starvation bounds ==", flush=True)
        results["eta"] = eta.calibration(args.philly_trace)
        print(eta.render_calibration(results["eta"]), flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

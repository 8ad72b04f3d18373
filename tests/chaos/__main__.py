"""`python -m tests.chaos`: one chaos run against a private stack; exit 0 when every check
passes, 1 when one fails, 2 for a bad option or a machine that cannot run it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _pair(text: str, kind: type = float) -> tuple[float, float]:
    low, sep, high = text.partition(",")
    try:
        pair = (kind(low), kind(high)) if sep else (kind(low), kind(low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX numbers, got {text!r}") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text!r}")
    return pair


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description=(
            "Start the portal on a private PostgreSQL and Redis, submit jobs, inject a seeded "
            "schedule of faults (process kills, pauses, Redis and PostgreSQL restarts, dropped "
            "and duplicated messages), then check what really ran against the database. "
            "Needs root (PostgreSQL runs as the postgres user) and the PostgreSQL binaries."
        ),
    )
    parser.add_argument("--faults", type=int, default=20, help="how many faults (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="seed of faults and jobs (default 1)")
    parser.add_argument("--agents", type=int, default=3, help="agents, at least 3 (default 3)")
    parser.add_argument("--jobs", type=int, default=30, help="jobs to submit (default 30)")
    parser.add_argument(
        "--out", type=Path, default=Path("chaos-results.json"), help="results file (JSON)"
    )
    parser.add_argument(
        "--interval", type=_pair, default=(2.0, 5.0), metavar="MIN,MAX",
        help="seconds between faults, uniform (default 2,5)",
    )  # fmt: skip
    parser.add_argument(
        "--job-seconds", type=_pair, default=(3.0, 20.0), metavar="MIN,MAX",
        help="how long each job runs, uniform (default 3,20)",
    )  # fmt: skip
    parser.add_argument(
        "--weights", default="", metavar="KIND=W,...",
        help="fault kind weights over the defaults, e.g. drop_message=0,kill_agent=5",
    )  # fmt: skip
    parser.add_argument(
        "--settle-timeout", type=float, default=240.0,
        help="seconds to wait for every job to be final after the faults (default 240)",
    )  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true", help="keep the run directory even when every check passes"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from .backing import why_not_runnable
    from .faults import parse_weights

    problems = []
    if args.agents < 3:
        problems.append(f"--agents: at least 3, got {args.agents}")
    if args.faults < 0 or args.jobs < 1:
        problems.append("--faults must be >= 0 and --jobs >= 1")
    try:
        weights = parse_weights(args.weights)
    except ValueError as error:
        problems.append(str(error))
        weights = {}
    reason = why_not_runnable()
    if reason:
        problems.append(f"this machine cannot run it: {reason}")
    if problems:
        for problem in problems:
            sys.stderr.write(f"chaos: {problem}\n")
        return 2

    from .harness import Options, run

    return run(
        Options(
            faults=args.faults,
            seed=args.seed,
            agents=args.agents,
            jobs=args.jobs,
            out=args.out,
            interval_s=args.interval,
            job_seconds=args.job_seconds,
            weights=weights,
            settle_timeout_s=args.settle_timeout,
            keep=args.keep,
        )
    )


if __name__ == "__main__":
    sys.exit(main())

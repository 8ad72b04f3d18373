#!/usr/bin/env python
"""Measure how long a job takes from submit to RUNNING, through the real API and processes.

Against a portal that runs already (`make run` in another terminal):

    python scripts/latency.py --url http://127.0.0.1:8000/ --token "$(python manage.py issue_token alice)"

Or let the script start one of its own (`manage.py runportal` on a free port, in a temporary
var dir, migrated and seeded) with this shell's settings, and stop it afterwards:

    python scripts/latency.py --start                                   # embedded broker, SQLite
    REDIS_URL=redis://127.0.0.1:6379/14 python scripts/latency.py --start   # Redis broker

Jobs go one at a time onto an idle cluster, so the figure is the pipeline's own latency:
API -> on-commit scheduling pass -> launch message -> agent -> `started` report. It is read
from the job's own timestamps (`submitted_at`, `started_at`), not from polling.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from portal_client import GpuRequest, PortalClient, PortalError

PROJECT = Path(__file__).resolve().parents[1]


def main() -> int:
    args = parse_args()
    try:
        if args.start:
            with started_portal() as (url, token):
                return measure(url, token, args)
        if not args.url or not args.token:
            sys.stderr.write("latency: give --url and --token (or PORTAL_TOKEN), or --start\n")
            return 2
        return measure(args.url, args.token, args)
    except PortalError as error:  # refused, unreachable, or a wait that timed out
        sys.stderr.write(f"latency: {error}\n")
        return 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the portal's base URL, e.g. http://127.0.0.1:8000/")
    parser.add_argument("--token", default=os.environ.get("PORTAL_TOKEN"), help="an API token")
    parser.add_argument("--start", action="store_true", help="start a portal of its own")
    parser.add_argument("--jobs", type=int, default=20, help="how many jobs (default 20)")
    parser.add_argument("--team", default="vision", help="the team to submit as (default vision)")
    parser.add_argument(
        "--kind", default="whole", choices=("whole", "mig", "mps"), help="slice kind"
    )
    parser.add_argument(
        "--agent-ready-s",
        type=float,
        default=90.0,
        help="how long the first (warm-up, not counted) job may take",
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs: must be at least 1; got {args.jobs}")
    return args


# --- the measurement ---------------------------------------------------------------------------


def measure(url: str, token: str, args: argparse.Namespace) -> int:
    portal = PortalClient(url, token)
    agent_ready_s = args.agent_ready_s
    gpu: GpuRequest = {"kind": args.kind, "count": 1}
    if args.kind == "mig":
        gpu["profile"] = "1g.10gb"
    latencies = []
    # Job 0 warms up (the agent may still be registering its node); it is not counted.
    for number in range(0, args.jobs + 1):
        job = portal.submit(
            name=f"latency-{number}",
            team=args.team,
            image="python:3.11-slim",
            # Long enough that its `started` report is handled before its `finished` one.
            command=["sleep", "0.5"],
            gpu=gpu,
        )
        # Polled often so the next job follows at once; the figure comes from its timestamps.
        done = job.wait(timeout=agent_ready_s if number == 0 else 60, poll=0.05, progress=False)
        if not done.succeeded:
            sys.stderr.write(f"latency: job {job.id} ended {done.state}: {done.data}\n")
            return 1
        if done.started_at is None or done.submitted_at is None:
            sys.stderr.write(f"latency: job {job.id} has no started_at: {done.data}\n")
            return 1
        latency = (done.started_at - done.submitted_at).total_seconds()
        if number == 0:
            continue
        latencies.append(latency)
        print(f"job {job.id:>5}: submit -> RUNNING {latency * 1000:7.0f} ms", flush=True)
    report(latencies)
    return 0


def report(latencies: list[float]) -> None:
    ordered = sorted(latencies)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    broker = os.environ.get("PORTAL_BROKER_URL") or os.environ.get("REDIS_URL") or "embedded"
    print(
        f"\nsubmit -> RUNNING over {len(ordered)} jobs (broker: {broker}): "
        f"median {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, "
        f"min {ordered[0] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
    )


# --- a portal of its own -----------------------------------------------------------------------


@contextmanager
def started_portal() -> Iterator[tuple[str, str]]:
    """runportal on a free port in a temporary var dir; yields its URL and alice's token."""
    sys.path.insert(0, str(PROJECT))
    from portal.ops.processes import free_port, http_answers

    with tempfile.TemporaryDirectory(prefix="latency-") as var_dir:
        env = {**os.environ, "PORTAL_VAR_DIR": var_dir, "PYTHONUNBUFFERED": "1"}
        # It polls every 50 ms on purpose: the API rate limits would only measure themselves.
        env.update(PORTAL_API_THROTTLE_USER="off", PORTAL_API_THROTTLE_TOKEN="off")
        manage = [sys.executable, str(PROJECT / "manage.py")]
        for command in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
            subprocess.run([*manage, *command], env=env, check=True, stdout=subprocess.DEVNULL)
        token = subprocess.run(
            [*manage, "issue_token", "alice"], env=env, check=True, capture_output=True, text=True
        ).stdout.strip()
        port = free_port()
        log = open(Path(var_dir) / "runportal.log", "w")  # noqa: SIM115
        portal = subprocess.Popen(
            [*manage, "runportal", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + 90
            while not http_answers("127.0.0.1", port):
                if portal.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        "latency: the portal did not come up:\n"
                        + (Path(var_dir) / "runportal.log").read_text()[-4000:]
                    )
                time.sleep(0.2)
            yield url, token
        finally:
            portal.send_signal(signal.SIGINT)
            portal.wait(timeout=60)
            log.close()


if __name__ == "__main__":
    sys.exit(main())

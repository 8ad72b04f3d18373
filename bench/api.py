"""`make bench-api`: the API's throughput and the admissions rate, on the real stack.

On a scratch database next to DATABASE_URL (PostgreSQL; dropped afterwards) and the Redis at
REDIS_URL, it starts what production runs (``tests/stack.py``'s ``PortalStack``: gunicorn with
its workers sized from the cores, the control-plane worker and beat, the command lines of
``portal/ops/processes.py``), with agents that answer every launch at once
(``bench/fake_agents.py``) on ``--nodes`` nodes of 8 whole GPUs each. Then:

1. Admissions: ``--nodes x 8`` jobs submitted in one transaction (``jobs_submit``, as an
   array does) into the empty cluster, timed from the commit to the last one RUNNING, with
   the time to the last one placed (the pass), to the first and last launch received
   (dispatch) and to the first and last ``started`` handled (report handling), and when
   each pass ended. It starts once every control worker process answers a ping and beat's
   first pass has run: a portal in service has long started its workers, and their start
   (Django set up, the task modules imported, the first pass's caches) is not an admission.
2. ``GET /api/v1/jobs/?limit=1`` and ``GET /api/v1/jobs/`` (50 a page) with wrk, over a job
   table holding ``--history`` ended jobs plus the admitted ones. Each wrk run is measured
   after a discarded one of ``--warmup`` seconds (3): what a portal in service has long done
   by then (each web thread's database connection opened, each process's view of the
   cluster loaded, each token's last-used time written this minute) is not counted as the
   cost of a request.
3. ``POST /api/v1/jobs/`` with wrk (one whole GPU each; the cluster is full by then, so they
   queue and every pass the submits trigger runs over them).

The requests come from ``--users`` members of the team, each with its own token, taken in
turn, with the API's rate limits at their defaults: no request may be refused (a 429, or
any status but the one expected, is counted and reported as an error).

Prints req/s, p50 and p99 for each, and admissions/s; writes them under ``"api"`` in
bench/results.json (the other keys kept). Options: ``--duration``, ``--warmup``, ``--connections``,
``--threads`` (wrk), ``--web-workers``, ``--web-threads``, ``--worker-threads``,
``--worker-processes``, ``--nodes``, ``--history``, ``--users``, ``--out``.
``--admissions-only`` runs phase 1 alone (no wrk needed; no web server started) and writes
it under ``"api_admissions"``; with a small ``--nodes`` it is a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import cpu_by_role

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

ROOT = Path(__file__).resolve().parent.parent
SCRATCH_SUFFIX = "_api_bench"
TEAM = "bench"
GPUS_PER_NODE = 8
ADMISSION_TIMEOUT_S = 300.0

TARGETS = {
    "submit_rps": 400.0,
    "submit_p99_ms": 150.0,
    "list_rps": 800.0,
    "admissions_per_s": 1000.0,
}

SUBMIT_BODY = {
    "name": "bench",
    "team": TEAM,
    "image": "python:3.11-slim",
    "command": ["python3", "-c", "print('hi')"],
    "gpu": {"kind": "whole", "count": 1},
}

# wrk's script: each request with the next token in turn; at the end one line of figures.
WRK_SCRIPT = """
local tokens = {%(tokens)s}
local method, path, body = "%(method)s", "%(path)s", %(body)s
local i = 0
function setup(thread)
  thread:set("offset", math.random(#tokens))
end
function init(args)
  i = offset
end
function request()
  i = i + 1
  local headers = {["Authorization"] = "Token " .. tokens[(i %% #tokens) + 1],
                   ["Content-Type"] = "application/json", ["Accept"] = "application/json"}
  return wrk.format(method, path, headers, body)
end
function done(summary, latency, requests)
  io.write(string.format("BENCH requests=%%d duration_us=%%d status_errors=%%d " ..
    "socket_errors=%%d p50_us=%%d p90_us=%%d p99_us=%%d max_us=%%d\\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def run(
    *,
    duration_s: int = 10,
    warmup_s: int = 3,
    connections: int = 16,
    threads: int = 2,
    nodes: int = 250,
    history: int = 20_000,
    users: int = 200,
    web_workers: int | None = None,
    web_threads: int = 4,
    worker_threads: int | None = None,
    worker_processes: int | None = None,
    admissions_only: bool = False,
) -> dict[str, Any]:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from bench.db_pass import scratch_database
    from bench.fake_agents import FakeAgents
    from portal.agents.testing import capture_sent_messages
    from portal.ops import processes
    from tests.stack import PortalStack

    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        raise SystemExit(
            "bench.api: set DATABASE_URL=postgres://... and REDIS_URL=redis://... "
            "(it measures gunicorn on PostgreSQL and Redis)"
        )
    if not admissions_only:
        _require_wrk()
    threads_of_worker = worker_threads or processes.control_worker_threads(sqlite=False)
    worker_processes = worker_processes or processes.control_worker_processes(sqlite=False)
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "web_workers": web_workers or processes.web_workers_for_cores(),
        "web_threads": web_threads,
        "control_worker_threads": threads_of_worker,
        "control_worker_processes": worker_processes,
        "wrk": {
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "connections": connections,
            "threads": threads,
        },
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "users": users,
    }
    with scratch_database(SCRATCH_SUFFIX), _temporary_folder() as folder:
        call_command("migrate", verbosity=0, interactive=False)
        print(f"world: {nodes} nodes x {GPUS_PER_NODE} GPUs, {users} users, ", end="", flush=True)
        # Nothing of the world's making goes to the broker (the passes its submits ask for):
        # this process's first message to it is the admissions' own.
        with capture_sent_messages():
            world = _build_world(nodes=nodes, users=users, history=history)
        print(f"{history:,} ended jobs", flush=True)
        connection.close()
        stack = PortalStack(
            folder,
            web=not admissions_only,
            agent=False,
            web_workers=web_workers,  # None: sized from the cores, as runportal does
            web_threads=web_threads,
            worker_concurrency=threads_of_worker,
            control_workers=worker_processes,
            schedule_interval_s=settings.SCHEDULE_INTERVAL_S,
            # The fake agents send no heartbeats after registering: no lease may run out here.
            env={"PORTAL_AGENT_LEASE_S": "3600"},
        )
        with stack, FakeAgents(stack.broker_url, world["keys"]) as agents:
            _wait_until_serving(stack.run_id, processes=worker_processes)
            print("\n== admissions: queue -> RUNNING, agents that answer at once ==", flush=True)
            results["admissions"] = _admissions(world, agents)
            _print_admissions(results["admissions"])
            if admissions_only:
                return results
            assert stack.url is not None
            for label, path in (
                ("list_limit_1", "/api/v1/jobs/?limit=1"),
                ("list", "/api/v1/jobs/"),
            ):
                print(f"\n== GET {path} ==", flush=True)
                if warmup_s:
                    _wrk(
                        stack.url,
                        "GET",
                        path,
                        None,
                        world["tokens"],
                        warmup_s,
                        connections,
                        threads,
                    )
                results[label] = _wrk(
                    stack.url, "GET", path, None, world["tokens"], duration_s, connections, threads
                )
                _print_http(results[label], target_rps=TARGETS["list_rps"])
            print("\n== POST /api/v1/jobs/ (submit) ==", flush=True)
            if warmup_s:
                _wrk(
                    stack.url,
                    "POST",
                    "/api/v1/jobs/",
                    SUBMIT_BODY,
                    world["tokens"],
                    warmup_s,
                    connections,
                    threads,
                )
            began = time.time()
            results["submit"] = _wrk(
                stack.url,
                "POST",
                "/api/v1/jobs/",
                SUBMIT_BODY,
                world["tokens"],
                duration_s,
                connections,
                threads,
            )
            results["submit"]["passes"] = _passes_between(began, time.time())
            _print_http(
                results["submit"],
                target_rps=TARGETS["submit_rps"],
                target_p99_ms=TARGETS["submit_p99_ms"],
            )
            _print_passes(results["submit"]["passes"])
    results["targets"] = _verdicts(results)
    return results


# --- the world ---------------------------------------------------------------------------------


def _build_world(*, nodes: int, users: int, history: int) -> dict[str, Any]:
    """Nodes registered by their first heartbeat, a team, its members with a token each, and
    ``history`` ended jobs in the job table."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from portal.agents.keys import node_key_text
    from portal.agents.testing import register_node
    from portal.jobs.models import Job, JobState
    from portal.jobs.services import jobs_submit
    from portal.jobs.validation import validate_job_request
    from portal.tenants.models import Membership, Team
    from portal.tenants.tokens import token_issue
    from workers.signing import key_from_text

    names = [f"bench-{index:04d}" for index in range(nodes)]
    description = {"gpus": [{"mode": "whole", "count": GPUS_PER_NODE}]}
    for name in names:
        # As the fake agents say they do: they take a node's launches in one message.
        register_node(name, description=description, launch_batches=True)
    keys = {name: key_from_text(node_key_text(name=name)) for name in names}

    team = Team.objects.create(name=TEAM, weight=1.0)
    people = get_user_model().objects.bulk_create(
        get_user_model()(username=f"user{index:03d}") for index in range(users)
    )
    Membership.objects.bulk_create(Membership(team=team, user=person) for person in people)
    tokens = [token_issue(user=person, name="bench") for person in people]

    request = validate_job_request(SUBMIT_BODY, user=people[0])
    ended = timezone.now()
    with transaction.atomic():
        for start in range(0, history, 2_000):
            batch = jobs_submit(
                user=people[start % users],
                request=request,
                members=[None] * min(2_000, history - start),
            )
            Job.objects.filter(pk__in=[job.pk for job in batch]).update(
                state=JobState.SUCCEEDED,
                attempt=1,
                started_at=ended,
                finished_at=ended,
                exit_code=0,
            )
    # The planner's statistics, as a database in service has them (autovacuum's analyze may
    # not have come by yet): on a freshly loaded table it expects 23 jobs where there are
    # 20,000, and sorts them all for a page.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"keys": keys, "tokens": tokens, "people": people, "request": request}


# --- admissions --------------------------------------------------------------------------------

SERVING_TIMEOUT_S = 120.0


def _wait_until_serving(run_id: str, *, processes: int) -> None:
    """Until every control worker process answers a ping and one scheduling pass (beat's) has
    run since: a portal in service has long started its workers (Django set up, the task
    modules imported) and run passes, and the admissions must not be charged for that."""
    from portal.celery import app
    from portal.scheduling.models import SchedulerState

    deadline = time.monotonic() + SERVING_TIMEOUT_S
    answered: set[str] = set()
    while len(answered) < processes:
        for reply in app.control.ping(timeout=0.5) or []:
            answered |= {name for name in reply if name.startswith("control") and run_id in name}
        if time.monotonic() > deadline:
            raise SystemExit(f"bench.api: {len(answered)} of {processes} control workers answer")

    def passes() -> int:
        return SchedulerState.objects.filter(pk=1).values_list("passes", flat=True).first() or 0

    before = passes()
    while passes() == before:
        if time.monotonic() > deadline:
            raise SystemExit("bench.api: no scheduling pass ran after the workers started")
        time.sleep(0.1)


def _admissions(world: dict[str, Any], agents: Any) -> dict[str, Any]:
    """Submit one job per GPU in one transaction; time it to the last one RUNNING."""
    from django.db.models import Count, Max, Min

    from portal.jobs.models import Job, JobEvent, JobState
    from portal.jobs.services import jobs_submit
    from portal.scheduling.models import PassTiming

    count = len(world["keys"]) * GPUS_PER_NODE
    last_timing = PassTiming.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    jobs = jobs_submit(user=world["people"][0], request=world["request"], members=[None] * count)
    began, began_wall = time.monotonic(), time.time()
    ids = [job.pk for job in jobs]
    # Polled every 20 ms: by the range of ids (one bulk insert, nothing else inserting jobs),
    # not by 2,000 ids in each query, which cost the bench (and the database) more than the
    # poll is worth on the two cores the portal runs on.
    admitted = Job.objects.filter(pk__gte=min(ids), pk__lte=max(ids))
    if admitted.count() != count:
        admitted = Job.objects.filter(pk__in=ids)
    placed_at: float | None = None
    deadline = began + ADMISSION_TIMEOUT_S
    while True:
        states = dict(admitted.values_list("state").annotate(n=Count("pk")))
        now = time.monotonic()
        if placed_at is None and states.get(JobState.PENDING, 0) == 0:
            placed_at = now
        if states.get(JobState.RUNNING, 0) == count:
            running_at = now
            break
        if now > deadline:
            raise SystemExit(
                f"bench.api: admissions not done in {ADMISSION_TIMEOUT_S:.0f} s: {states}"
            )
        time.sleep(0.02)
    passes = list(
        PassTiming.objects.filter(pk__gt=last_timing)
        .order_by("pk")
        .values_list("finished_at", "snapshot_ms", "decide_ms", "apply_ms")
    )
    # When the control worker handled the first and the last batch of `started` (the events'
    # time is the report task's).
    handled = JobEvent.objects.filter(job__in=admitted, to_state=JobState.RUNNING).aggregate(
        first=Min("at"), last=Max("at")
    )

    def since_commit(at: Any) -> float | None:
        return None if at is None else round(at.timestamp() - began_wall, 3)

    def mark(at: float | None) -> float | None:
        return None if at is None else round(at - began, 3)

    total_s = running_at - began
    return {
        "jobs": count,
        "seconds": round(total_s, 3),
        "admissions_per_s": round(count / total_s, 1),
        # Each mark is seconds from the submit's commit (polled every 20 ms).
        "all_placed_s": round((placed_at or running_at) - began, 3),
        "first_launch_received_s": mark(agents.first_launch_at),
        "last_launch_received_s": round((agents.last_launch_at or running_at) - began, 3),
        "last_started_sent_s": round((agents.last_started_at or running_at) - began, 3),
        "first_started_handled_s": since_commit(handled["first"]),
        "last_started_handled_s": since_commit(handled["last"]),
        "all_running_s": round(total_s, 3),
        "passes": [
            {
                "ended_s": since_commit(ended),
                "snapshot_ms": round(s, 1),
                "decide_ms": round(d, 1),
                "apply_ms": round(a, 1),
            }
            for ended, s, d, a in passes
        ],
        "launches_received": agents.launches,
    }


def _passes_between(began: float, ended: float) -> dict[str, Any]:
    """The scheduling passes that ended within a wrk run: how many, and their phases' time."""
    from datetime import UTC, datetime

    from django.db.models import Count, Sum

    from portal.jobs.models import Job, JobState
    from portal.scheduling.models import PassTiming

    window = (datetime.fromtimestamp(began, tz=UTC), datetime.fromtimestamp(ended, tz=UTC))
    totals = PassTiming.objects.filter(finished_at__range=window).aggregate(
        count=Count("id"),
        snapshot=Sum("snapshot_ms"),
        decide=Sum("decide_ms"),
        apply=Sum("apply_ms"),
    )
    return {
        "count": totals["count"],
        **{
            f"{phase}_ms": round(totals[phase] or 0.0, 1)
            for phase in ("snapshot", "decide", "apply")
        },
        "pending_after": Job.objects.filter(state=JobState.PENDING).count(),
    }


def _print_passes(passes: dict[str, Any]) -> None:
    count = max(passes["count"], 1)
    print(
        f"passes meanwhile: {passes['count']}, each snapshot {passes['snapshot_ms'] / count:.0f} ms, "
        f"decide {passes['decide_ms'] / count:.0f} ms, apply {passes['apply_ms'] / count:.0f} ms; "
        f"{passes['pending_after']:,} jobs pending after"
    )


def _print_admissions(figures: dict[str, Any]) -> None:
    print(
        f"{figures['jobs']} jobs RUNNING in {figures['seconds']:.2f} s: "
        f"{figures['admissions_per_s']:.0f} admissions/s "
        f"(target >= {TARGETS['admissions_per_s']:.0f}: "
        f"{_verdict(figures['admissions_per_s'] >= TARGETS['admissions_per_s'])})"
    )
    print(
        f"  all placed at {figures['all_placed_s']:.2f} s, launches received from "
        f"{_seconds(figures['first_launch_received_s'])} to "
        f"{figures['last_launch_received_s']:.2f} s, last 'started' sent at "
        f"{figures['last_started_sent_s']:.2f} s, handled from "
        f"{_seconds(figures['first_started_handled_s'])} to "
        f"{_seconds(figures['last_started_handled_s'])}, all RUNNING at "
        f"{figures['all_running_s']:.2f} s"
    )
    for index, timing in enumerate(figures["passes"], start=1):
        print(
            f"  pass {index}: ended at {_seconds(timing['ended_s'])}: snapshot "
            f"{timing['snapshot_ms']:.0f} ms, decide {timing['decide_ms']:.0f} ms, apply "
            f"{timing['apply_ms']:.0f} ms"
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# --- wrk ---------------------------------------------------------------------------------------


def _require_wrk() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit(
            "bench.api: wrk is missing; `make bench-api` installs it (scripts/ensure-wrk.sh)"
        )


def _wrk(
    url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    tokens: list[str],
    duration_s: int,
    connections: int,
    threads: int,
) -> dict[str, Any]:
    script = WRK_SCRIPT % {
        "tokens": ", ".join(json.dumps(token) for token in tokens),
        "method": method,
        "path": path,
        "body": "nil" if body is None else _lua_string(json.dumps(body)),
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    before, children_before = cpu_by_role.reading(), _reaped_children_cpu_s()
    try:
        with subprocess.Popen(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{duration_s}s",
                "--timeout",
                "10s",
                "-s",
                handle.name,
                url.rstrip("/"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as wrk:
            time.sleep(min(1.0, duration_s / 2))
            spread = _connections_by_process(url)
            stdout, stderr = wrk.communicate()
        if wrk.returncode:
            raise SystemExit(f"bench.api: wrk failed ({wrk.returncode}):\n{stdout}{stderr}")
    finally:
        os.unlink(handle.name)
    by_role = cpu_by_role.spent(before, cpu_by_role.reading())
    # wrk is this process's child: once reaped, its CPU is in this process's reading.
    wrk_s = _reaped_children_cpu_s() - children_before
    by_role["bench"] = round(by_role.get("bench", 0.0) - wrk_s, 2)
    by_role["wrk"] = round(wrk_s, 2)
    match = re.search(r"^BENCH (.*)$", stdout, re.MULTILINE)
    if match is None:
        raise SystemExit(f"bench.api: wrk printed no figures:\n{stdout}{stderr}")
    raw = {key: int(value) for key, value in (part.split("=") for part in match.group(1).split())}
    seconds = raw["duration_us"] / 1e6
    return {
        "requests": raw["requests"],
        "rps": round(raw["requests"] / seconds, 1),
        "p50_ms": round(raw["p50_us"] / 1000, 1),
        "p90_ms": round(raw["p90_us"] / 1000, 1),
        "p99_ms": round(raw["p99_us"] / 1000, 1),
        "max_ms": round(raw["max_us"] / 1000, 1),
        "errors": raw["status_errors"] + raw["socket_errors"],
        "cpu_s_by_role": by_role,
        # wrk's connections held by each web process, a second into the run (most first).
        "connections_by_web_process": spread,
        "cpu_line": cpu_by_role.describe(by_role, requests=raw["requests"], seconds=seconds),
    }


def _connections_by_process(url: str) -> list[int]:
    """How many established connections to ``url``'s port each process holds (``ss``), most
    first: gunicorn's workers keep the connections they accepted, and a worker holding more
    than its share is a bottleneck of one core."""
    port = url.rstrip("/").rsplit(":", 1)[1]
    try:
        listing = subprocess.run(
            ["ss", "-Htnp", "state", "established", f"( sport = :{port} )"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []  # no ss here: the figure is left out
    counts: dict[str, int] = {}
    for pid in re.findall(r"pid=(\d+)", listing):
        counts[pid] = counts.get(pid, 0) + 1
    return sorted(counts.values(), reverse=True)


def _reaped_children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _print_http(
    figures: dict[str, Any], *, target_rps: float, target_p99_ms: float | None = None
) -> None:
    ok = figures["rps"] >= target_rps and figures["errors"] == 0
    target = f"target >= {target_rps:.0f} req/s"
    if target_p99_ms is not None:
        ok = ok and figures["p99_ms"] <= target_p99_ms
        target += f" with p99 <= {target_p99_ms:.0f} ms"
    print(
        f"{figures['rps']:.0f} req/s, p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
        f"{figures['requests']} requests, {figures['errors']} errors ({target}: {_verdict(ok)})"
    )
    print(figures["cpu_line"])
    spread = figures["connections_by_web_process"]
    if spread:
        print(f"wrk's connections by web process: {' / '.join(map(str, spread))}")


# --- results -----------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _verdicts(results: dict[str, Any]) -> dict[str, bool]:
    submit, listing = results["submit"], results["list_limit_1"]
    return {
        "submit_400_rps_p99_150_ms": submit["rps"] >= TARGETS["submit_rps"]
        and submit["p99_ms"] <= TARGETS["submit_p99_ms"]
        and submit["errors"] == 0,
        "list_800_rps": listing["rps"] >= TARGETS["list_rps"] and listing["errors"] == 0,
        "admissions_1000_per_s": results["admissions"]["admissions_per_s"]
        >= TARGETS["admissions_per_s"],
    }


def merge_into(path: Path, key: str, value: Any) -> None:
    """Write ``value`` under ``key`` of the JSON object in ``path``, keeping its other keys."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")


@contextmanager
def _temporary_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="bench-api-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__)
    parser.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="seconds of a discarded wrk run before each measured one (0: none)",
    )
    parser.add_argument("--connections", type=int, default=16, help="wrk's open connections")
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads")
    parser.add_argument("--nodes", type=int, default=250, help="nodes of 8 GPUs (admissions)")
    parser.add_argument("--history", type=int, default=20_000, help="ended jobs in the table")
    parser.add_argument("--users", type=int, default=200, help="members, one token each")
    parser.add_argument(
        "--web-workers", type=int, help="gunicorn workers (default: 1 per core + 1, as runportal)"
    )
    parser.add_argument(
        "--web-threads", type=int, default=4, help="threads per gunicorn worker (runportal: 4)"
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        help="threads per control worker process (default: as runportal on PostgreSQL, "
        "4 per core over all processes, at least 4 a process)",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        help="control worker processes (default: one per two cores, 1 to 8, as runportal on "
        "PostgreSQL)",
    )
    parser.add_argument(
        "--admissions-only",
        action="store_true",
        help="phase 1 alone (no wrk, no web server); written under 'api_admissions'",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args(argv)
    results = run(
        duration_s=args.duration,
        warmup_s=args.warmup,
        connections=args.connections,
        threads=args.threads,
        nodes=args.nodes,
        history=args.history,
        users=args.users,
        web_workers=args.web_workers,
        web_threads=args.web_threads,
        worker_threads=args.worker_threads,
        worker_processes=args.worker_processes,
        admissions_only=args.admissions_only,
    )
    key = "api_admissions" if args.admissions_only else "api"
    merge_into(args.out, key, results)
    print(f"\nwrote the '{key}' key of {args.out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
    sys.exit(0)

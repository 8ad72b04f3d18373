"""One chaos run: start a private stack, submit jobs, inject faults, settle, check, report.

    python -m tests.chaos --faults 20 --seed 1 --agents 3 --jobs 30 --out results.json

1. Stack: a private PostgreSQL and Redis (tests/chaos/backing.py), migrate, one team with a
   user and an API token, then the control-plane worker, beat, gunicorn and K agents
   (tests/chaos/cluster.py) with short timings so faults resolve in seconds.
2. Jobs: J jobs (`chaos_job.py`, seeded line counts and durations, a seeded mix of whole,
   MIG and MPS requests), submitted through the REST API spread over the fault phase.
3. Faults: the seeded schedule (tests/chaos/faults.py), one every few seconds.
4. Settle and check (tests/chaos/checks.py), print a table, write the JSON results.

The harness process itself talks to the private database through the Django ORM (to look
up submitted jobs, watch the nodes' states and read the history at the end), retrying
across database restarts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import checks
from .backing import PrivatePostgres, PrivateRedis
from .cluster import (
    AGENT_TIMINGS,
    PORTAL_TIMINGS,
    UNITS_PER_NODE,
    Proc,
    StackConfig,
    agent_spec,
    control_plane_specs,
)
from .faults import Fault, Injector, plan_faults
from .truth import JOB_SCRIPT, ProcessWatcher, kill_job_processes

T = TypeVar("T")

TEAM = "chaos"
USERNAME = "chaos"
START_TIMEOUT_S = 120.0
DB_RETRY_S = 90.0
SUBMIT_RETRY_S = 120.0
# A seeded mix of what the described inventory (cluster.INVENTORY) can hold on one node.
REQUESTS: list[tuple[dict[str, Any], float]] = [
    ({"kind": "whole", "count": 1}, 3.0),
    ({"kind": "whole", "count": 2}, 1.0),
    ({"kind": "mig", "profile": "1g.10gb", "count": 1}, 2.0),
    ({"kind": "mig", "profile": "1g.10gb", "count": 2}, 1.0),
    ({"kind": "mig", "profile": "2g.20gb", "count": 1}, 1.0),
    ({"kind": "mig", "profile": "3g.40gb", "count": 1}, 1.0),
    ({"kind": "mps", "count": 1}, 2.0),
    ({"kind": "mps", "count": 2}, 1.0),
]


@dataclass(frozen=True)
class Options:
    faults: int
    seed: int
    agents: int
    jobs: int
    out: Path
    interval_s: tuple[float, float] = (2.0, 5.0)
    job_seconds: tuple[float, float] = (3.0, 20.0)
    job_lines: tuple[int, int] = (5, 40)
    weights: dict[str, float] = field(default_factory=dict)
    settle_timeout_s: float = 240.0
    keep: bool = False


@dataclass(frozen=True)
class JobPlan:
    name: str
    gpu: dict[str, Any]
    lines: int
    seconds: float
    submit_at: float  # offset from the start of the fault phase


def plan_jobs(
    *, rng: random.Random, options: Options, window_s: float, prefix: str
) -> list[JobPlan]:
    """J jobs; a third at the start, the rest spread over the fault phase."""
    plans = []
    for index in range(options.jobs):
        gpu = rng.choices([r for r, _ in REQUESTS], weights=[w for _, w in REQUESTS])[0]
        at = 0.0 if index < max(1, options.jobs // 3) else rng.uniform(0.0, 0.8 * window_s)
        plans.append(
            JobPlan(
                name=f"{prefix}-{index}",
                gpu=dict(gpu),
                lines=rng.randint(*options.job_lines),
                seconds=round(rng.uniform(*options.job_seconds), 2),
                submit_at=round(at, 3),
            )
        )
    return sorted(plans, key=lambda plan: plan.submit_at)


class Output:
    """Lines to stdout, whole, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.t0 = time.time()

    def __call__(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


# --- the stack -------------------------------------------------------------------------------


class ChaosStack:
    """The private services and the portal's processes; the injector's `Target`."""

    def __init__(self, run_dir: Path, nodes: list[str], say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.nodes = nodes
        self.say = say
        self.postgres = PrivatePostgres(run_dir / "pg")
        self.redis = PrivateRedis(run_dir / "redis")
        self.truth_dir = run_dir / "truth"
        self.config: StackConfig | None = None
        self.procs: dict[str, Proc] = {}
        self.token = ""
        self.url = ""
        # Processes a fault took down on purpose; any other that exits died on its own.
        self._down: set[str] = set()
        self._lock = threading.RLock()
        self._guarding = threading.Event()
        self.died: list[dict[str, Any]] = []

    # -- start

    def up(self) -> None:
        from portal.ops.processes import free_port, http_answers

        (self.run_dir / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)
        # Jobs may run as another user: everyone may add their file here, nobody else's.
        self.truth_dir.mkdir()
        self.truth_dir.chmod(0o1777)
        self.postgres.init()
        self.redis.start()
        self.config = StackConfig(
            run_dir=self.run_dir,
            database_url=self.postgres.url,
            broker_url=self.redis.url,
            web_port=free_port(),
            base_env=dict(os.environ),
        )
        # The portal's own files are closed to other users: jobs may run as one, and an agent
        # refuses to launch while they could read them.
        self.config.var_dir.mkdir(parents=True, exist_ok=True)
        self.config.var_dir.chmod(0o700)
        _setup_django(self.config)
        self.token = _prepare_database(units=UNITS_PER_NODE * len(self.nodes))
        for spec in control_plane_specs(self.config):
            self._start(spec)
        for node in self.nodes:
            self._start(agent_spec(self.config, node, key=node_key(node)))
        port = self.config.web_port
        self.url = f"http://127.0.0.1:{port}"
        _wait(lambda: http_answers("127.0.0.1", port), START_TIMEOUT_S, "web server")
        _wait(self._nodes_registered, START_TIMEOUT_S, f"{len(self.nodes)} nodes registered")

    def _start(self, spec: Any) -> None:
        name = spec.name.removeprefix("agent-")
        proc = Proc(spec, self.run_dir / "logs" / f"{spec.name}.log")
        proc.start()
        self.procs[name] = proc

    def _nodes_registered(self) -> bool:
        Node = model("Node")
        registered = set(
            Node.objects.filter(name__in=self.nodes, gpus__isnull=False).values_list(
                "name", flat=True
            )
        )
        return registered == set(self.nodes)

    # -- Target (faults)

    def kill(self, name: str) -> None:
        with self._lock:
            self._down.add(name)
            self.procs[name].kill()

    def restart(self, name: str) -> None:
        with self._lock:
            proc = self.procs[name]
            if proc.running():
                proc.kill()
            proc.start()
            self._down.discard(name)

    # -- processes that die on their own

    def start_guard(self) -> None:
        """Watch for portal processes that exit without a fault: record and restart them."""
        self._guarding.set()
        threading.Thread(target=self._guard, name="guard", daemon=True).start()

    def stop_guard(self) -> None:
        self._guarding.clear()

    def _guard(self) -> None:
        while self._guarding.is_set():
            time.sleep(1.0)
            with self._lock:
                for name, proc in self.procs.items():
                    if not self._guarding.is_set() or name in self._down or proc.running():
                        continue
                    code = proc.process.returncode if proc.process is not None else None
                    tail = _tail(proc.log_path, 15)
                    self.died.append({"at": time.time(), "process": name, "exit_code": code,
                                      "last_lines": tail})  # fmt: skip
                    self.say(f"chaos: {name} exited on its own (code {code}); restarting it")
                    proc.start()

    def pause(self, name: str) -> None:
        self.procs[name].pause()

    def resume(self, name: str) -> None:
        self.procs[name].resume()

    def stop_redis(self) -> None:
        self.redis.stop()

    def start_redis(self) -> None:
        self.redis.start()

    def stop_postgres(self) -> None:
        self.postgres.stop("fast")

    def start_postgres(self) -> None:
        self.postgres.start()

    def redis_client(self) -> Any:
        import redis

        from .faults import MESSAGE_WINDOW_S

        # Longer than a message fault's blocking BRPOP.
        timeout = MESSAGE_WINDOW_S + 5
        return redis.Redis(host="127.0.0.1", port=self.redis.port, socket_timeout=timeout)

    # -- stop

    def stop_processes(self) -> None:
        for proc in self.procs.values():
            proc.resume()
        # Agents first (a warm stop still reports to the control plane), then the rest.
        order = sorted(self.procs.values(), key=lambda p: not p.name.startswith("agent-"))
        for proc in order:
            proc.stop()

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
        self.redis.stop()
        self.postgres.stop_quietly()

    def outbox_pending(self) -> dict[str, int | None]:
        assert self.config is not None
        return {node: outbox_pending(self.config.workdir(node)) for node in self.nodes}


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def outbox_pending(workdir: Path) -> int | None:
    """Reports still waiting in an agent's outbox (`<workdir>/outbox/`), None without one."""
    outbox = workdir / "outbox"
    if not outbox.is_dir():
        return None
    return sum(1 for path in outbox.rglob("*") if path.is_file())


def _setup_django(config: StackConfig) -> None:
    """Point this process's Django at the private database, then set it up."""
    for name, value in config.environment().items():
        if name in ("DATABASE_URL", "PORTAL_VAR_DIR", "PORTAL_BROKER_URL") or name.startswith(
            "PORTAL_"
        ):
            os.environ[name] = value
    os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    import django

    django.setup()


def _prepare_database(*, units: float) -> str:
    """Migrate; one team owning the whole cluster (nothing borrowed, nothing preempted), one
    member, one API token (returned)."""
    import io

    from django.core.management import call_command

    from portal.jobs.testing import make_team, make_user

    call_command("migrate", interactive=False, verbosity=0)
    team = make_team(TEAM, guaranteed_units=units, limit_units=units, max_priority="normal")
    make_user(USERNAME, team=team)
    # The command prints only the key on stdout, however the portal stores tokens.
    out = io.StringIO()
    call_command("issue_token", USERNAME, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def node_key(node: str) -> str | None:
    """The node's key from `manage.py node_add <node>` (it prints the key once), on portal
    versions that have the command; None on those whose agents need no key."""
    import io

    from django.core.management import call_command, get_commands

    if "node_add" not in get_commands():
        return None
    out = io.StringIO()
    call_command("node_add", node, stdout=out, stderr=io.StringIO())
    lines = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    return lines[-1] if lines else None


def model(name: str) -> Any:
    """A portal model by its class name, wherever the restructure put it (one per name)."""
    from django.apps import apps

    found = [
        m for m in apps.get_models() if m.__name__ == name and m.__module__.startswith("portal.")
    ]
    if len(found) != 1:
        raise LookupError(f"expected one portal model named {name}, found {found}")
    return found[0]


def db_call(fn: Callable[[], T], *, timeout_s: float = DB_RETRY_S) -> T:
    """Run an ORM call, retrying with a fresh connection while the database restarts."""
    from django.db import InterfaceError, OperationalError, connection

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait(predicate: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not db_call(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.2)


# --- watching the portal ---------------------------------------------------------------------


class NodeWatcher:
    """Polls the nodes' states four times a second and records every change with its time."""

    def __init__(self) -> None:
        self.changes: list[checks.NodeChange] = []
        self._last: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from django.db import DatabaseError, connection

        Node = model("Node")

        while not self._stop.wait(0.25):
            try:
                rows = list(Node.objects.values_list("name", "state"))
            except DatabaseError:
                connection.close()
                continue
            now = time.time()
            for name, state in rows:
                if self._last.get(name) != state:
                    self.changes.append(checks.NodeChange(at=now, node=name, state=state))
                    self._last[name] = state
        connection.close()


class Submitter:
    """Submits the planned jobs through the REST API at their times, across web restarts."""

    def __init__(self, *, url: str, token: str, plans: list[JobPlan], truth_dir: Path) -> None:
        self.url = url
        self.token = token
        self.plans = plans
        self.truth_dir = truth_dir
        self.python, self.script = job_command(truth_dir.parent)
        self.submitted: dict[str, int] = {}
        self.retries = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, name="submitter", daemon=True)
        self.t0 = 0.0

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        from django.db import connection

        for plan in self.plans:
            time.sleep(max(0.0, self.t0 + plan.submit_at - time.time()))
            try:
                self.submitted[plan.name] = self._submit(plan)
            except Exception as error:  # noqa: BLE001 - recorded, judged by the checks
                self.failures.append(f"{plan.name}: {error!r}")
        connection.close()

    def _submit(self, plan: JobPlan) -> int:
        body = {
            "name": plan.name,
            "team": TEAM,
            "image": "python:3.11-slim",
            "command": [
                self.python,
                str(self.script),
                str(self.truth_dir),
                str(plan.lines),
                f"{plan.seconds:.2f}",
            ],  # fmt: skip
            "gpu": plan.gpu,
            "preemptible": False,
        }
        deadline = time.monotonic() + SUBMIT_RETRY_S
        while True:
            try:
                return self._post(body)
            except (OSError, urllib.error.URLError, ValueError) as error:
                # The request may have been stored before the connection broke: the name is
                # unique to this run, so look before sending it again.
                existing = _job_id_by_name(plan.name)
                if existing is not None:
                    return existing
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not accepted in {SUBMIT_RETRY_S:.0f} s: {error}") from None
                self.retries += 1
                time.sleep(0.5)

    def _post(self, body: dict[str, Any]) -> int:
        request = urllib.request.Request(
            f"{self.url}/api/v1/jobs/",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return int(json.loads(response.read())["id"])


def job_command(run_dir: Path) -> tuple[str, Path]:
    """The interpreter and script a job runs. Jobs may run as an unprivileged uid: the
    script is copied where any user can read it, and the interpreter is the first Python 3
    any user may execute (the job script needs only the standard library)."""
    script = run_dir / "job" / JOB_SCRIPT.name
    script.parent.mkdir(mode=0o755, exist_ok=True)
    shutil.copyfile(JOB_SCRIPT, script)
    script.chmod(0o644)
    candidates = [sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"]
    python = next((c for c in candidates if _anyone_may_run(Path(c))), sys.executable)
    return python, script


def _anyone_may_run(path: Path) -> bool:
    real = path.resolve()
    if not real.is_file() or not real.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents)


def _job_id_by_name(name: str) -> int | None:
    from django.db import DatabaseError, connection

    Job = model("Job")
    try:
        return Job.objects.filter(name=name).values_list("pk", flat=True).first()
    except DatabaseError:
        connection.close()
        return None


# --- the run ---------------------------------------------------------------------------------


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs the `finally`s: the stack is stopped, not orphaned


def run(options: Options) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    say = Output()
    rng = random.Random(options.seed)
    nodes = [f"chaos-{i + 1}" for i in range(options.agents)]
    faults = plan_faults(
        rng=random.Random(f"faults-{options.seed}"),
        count=options.faults,
        agents=nodes,
        weights=options.weights,
        interval_s=options.interval_s,
    )
    window = faults[-1].at if faults else 0.0
    plans = plan_jobs(rng=rng, options=options, window_s=window, prefix=f"chaos-s{options.seed}")
    say(
        f"chaos: seed {options.seed}, {options.agents} agents, {options.jobs} jobs, "
        f"{options.faults} faults over {window:.0f} s; expected duration about "
        f"{(window + 60 + options.job_seconds[1] * 2) / 60:.1f} min "
        f"(start ~40 s, faults {window:.0f} s, settle up to {options.settle_timeout_s:.0f} s)"
    )
    run_dir = Path(tempfile.mkdtemp(prefix="chaos-"))
    run_dir.chmod(0o755)  # the postgres user must reach its cluster inside
    say(f"chaos: run directory {run_dir} (process logs in {run_dir / 'logs'})")
    stack = ChaosStack(run_dir, nodes, say)
    started = time.time()
    result: dict[str, Any] = {}
    passed = False
    try:
        stack.up()
        say(f"chaos: stack up in {time.time() - started:.0f} s: {stack.url}")
        result = _exercise(stack, options, faults, plans, say)
        passed = all(check["passed"] is not False for check in result["checks"])
    finally:
        stack.close()
        result.update(
            options={**asdict(options), "out": str(options.out)},
            timings={**PORTAL_TIMINGS, **AGENT_TIMINGS},
            nodes=nodes,
            faults=[fault.as_dict() for fault in faults],
            jobs_planned=[asdict(plan) for plan in plans],
            run_dir=str(run_dir),
            seconds=round(time.time() - started, 1),
            passed=passed,
        )
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(result, indent=2, default=str))
        say(f"chaos: results in {options.out} ({result['seconds']:.0f} s in all)")
        if passed and not options.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"chaos: kept {run_dir} (process logs, ground truth, database files)")
    return 0 if passed else 1


def _exercise(
    stack: ChaosStack,
    options: Options,
    faults: list[Fault],
    plans: list[JobPlan],
    say: Output,
) -> dict[str, Any]:
    watcher = ProcessWatcher(stack.truth_dir)
    nodes_watch = NodeWatcher()
    submitter = Submitter(url=stack.url, token=stack.token, plans=plans, truth_dir=stack.truth_dir)
    injector = Injector(stack=stack, faults=faults, say=say)
    watcher.start()
    nodes_watch.start()
    stack.start_guard()
    t0 = time.time()
    submitter.start(t0)
    injector.run()
    injector.wait_recovered()
    submitter.join()
    say(f"chaos: faults done after {time.time() - t0:.0f} s; settling")
    _settle(options, submitter, watcher, say)
    stray = watcher.running()
    nodes_watch.stop()
    stack.stop_guard()
    stack.stop_processes()
    killed = kill_job_processes(watcher.truth.executions)
    watcher.stop()
    if killed:
        say(f"chaos: killed {len(killed)} job processes left running: {killed}")
    return _judge(stack, options, faults, plans, submitter, watcher, nodes_watch, stray, say)


def _final_states(names: list[str]) -> dict[str, str]:
    Job = model("Job")
    return dict(
        db_call(lambda: list(Job.objects.filter(name__in=names).values_list("name", "state")))
    )


def _settle(options: Options, submitter: Submitter, watcher: ProcessWatcher, say: Output) -> None:
    """Wait until every job is final and no job process runs (or the timeout)."""
    names = list(submitter.submitted)
    deadline = time.monotonic() + options.settle_timeout_s
    last_note = 0.0
    while time.monotonic() < deadline:
        states = _final_states(names)
        waiting = Counter(s for s in states.values() if s not in checks.FINAL_STATES)
        running = watcher.running()
        if not waiting and not running:
            say("chaos: settled: every job final, no job process running")
            return
        if time.monotonic() - last_note > 10:
            say(
                f"chaos: settling: not final {dict(waiting) or 'none'}; "
                f"{len(running)} job processes running"
            )
            last_note = time.monotonic()
        if not waiting and running:
            # Every job is final, yet processes run: ones the portal forgot. Give them their
            # time to finish, so what they do (a second `end`) is seen, then stop waiting.
            grace = time.monotonic() + options.job_seconds[1] + 5
            while watcher.running() and time.monotonic() < min(grace, deadline):
                time.sleep(0.5)
            return
        time.sleep(1.0)
    say(f"chaos: settle timeout after {options.settle_timeout_s:.0f} s")


def _judge(
    stack: ChaosStack,
    options: Options,
    faults: list[Fault],
    plans: list[JobPlan],
    submitter: Submitter,
    watcher: ProcessWatcher,
    nodes_watch: NodeWatcher,
    stray: list[Any],
    say: Output,
) -> dict[str, Any]:
    Job, Allocation, JobLogChunk = model("Job"), model("Allocation"), model("JobLogChunk")

    ids = set(submitter.submitted.values())
    jobs = {
        row[0]: checks.JobRow(*row)
        for row in db_call(
            lambda: list(
                Job.objects.filter(pk__in=ids).values_list(
                    "pk", "name", "state", "attempt", "reason"
                )
            )
        )
    }
    allocations = [
        checks.AllocationRow(
            slice=key,
            job_id=job_id,
            attempt=attempt,
            created_at=created.timestamp(),
            released_at=released.timestamp() if released else None,
        )
        for key, job_id, attempt, created, released in db_call(
            lambda: list(
                Allocation.objects.values_list(
                    "slice__key", "job_id", "attempt", "created_at", "released_at"
                )
            )
        )
    ]
    logs: dict[int, str] = {}
    succeeded = {row.id: row.attempt for row in jobs.values() if row.state == "SUCCEEDED"}
    for job_id, attempt, data in db_call(
        lambda: list(
            JobLogChunk.objects.filter(job_id__in=list(succeeded))
            .order_by("job_id", "attempt", "seq")
            .values_list("job_id", "attempt", "data")
        )
    ):
        if succeeded.get(job_id) == attempt:
            logs[job_id] = logs.get(job_id, "") + data
    lines = {submitter.submitted[p.name]: p.lines for p in plans if p.name in submitter.submitted}
    JobEvent = model("JobEvent")
    lease_losses = {
        (job_id, attempt): at.timestamp()
        for job_id, attempt, at in db_call(
            lambda: list(
                JobEvent.objects.filter(
                    to_state="LOST", message__contains="stopped sending heartbeats"
                ).values_list("job_id", "attempt", "at")
            )
        )
    }
    assert stack.config is not None
    workdirs = {node: str(stack.config.workdir(node)) for node in stack.nodes}
    truth = watcher.truth
    overlaps = checks.find_overlaps(truth, faults)
    results = [
        checks.check_all_final(
            planned=[p.name for p in plans], submitted=submitter.submitted, jobs=jobs
        ),
        checks.check_attempt_started_once(truth),
        checks.check_no_overlap(overlaps, workdirs),
        checks.check_completed_once(truth, lease_losses),
        checks.check_succeeded_matches_truth(truth, jobs),
        checks.check_no_double_booking(allocations),
        checks.check_logs_complete(jobs, logs, lines),
        checks.check_outbox(stack.outbox_pending()),
        checks.check_no_stray_processes(stray, workdirs),
        checks.check_no_process_died(stack.died),
    ]
    figures = checks.recovery_figures(
        faults=faults, changes=nodes_watch.changes, truth=truth, workdirs=workdirs
    )
    _print_report(say, results, figures, faults, submitter, truth)
    return {
        "checks": [check.as_dict() for check in results],
        "figures": figures,
        "states": dict(Counter(row.state for row in jobs.values())),
        "submit_retries": submitter.retries,
        "submit_failures": submitter.failures,
        "processes_died": stack.died,
        "node_changes": [asdict(change) for change in nodes_watch.changes],
        "executions": [
            {**asdict(e), "node": e.node(workdirs), "how_it_ended": e.how_it_ended}
            for e in truth.executions
        ],
        "truth_malformed_lines": truth.malformed,
    }


def _print_report(
    say: Output,
    results: list[checks.Check],
    figures: dict[str, Any],
    faults: list[Fault],
    submitter: Submitter,
    truth: Any,
) -> None:
    kinds = Counter(fault.kind for fault in faults if fault.injected_at is not None)
    say("")
    say("faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
    idle = sum(1 for f in faults if f.outcome.startswith("no message"))
    if idle:
        say(f"  message faults that found no message to act on: {idle}")
    say(
        f"executions recorded by the jobs: {len(truth.executions)}; submit retries: {submitter.retries}"
    )
    say("")
    say(f"{'check':<34} {'result':<6} summary")
    say("-" * 100)
    for check in results:
        say(f"{check.name:<34} {check.verdict:<6} {check.summary}")
        for detail in check.details[:12]:
            say(f"{'':<41}- {detail}")
        if len(check.details) > 12:
            say(f"{'':<41}  ... {len(check.details) - 12} more in the results file")
    say("")
    lost, rerun = figures["fault_to_node_lost_s"], figures["fault_to_job_running_again_s"]
    say("agent kill / pause -> recovery (seconds)      n    min  median     p90    max")
    for label, spread in (
        ("fault -> node marked lost", lost),
        ("fault -> job running again", rerun),
        ("  node marked lost, control plane up", figures["quiet_fault_to_node_lost_s"]),
        ("  running again, control plane up", figures["quiet_fault_to_job_running_again_s"]),
    ):
        if spread["n"]:
            say(
                f"  {label:<40} {spread['n']:>4} {spread['min']:>6} {spread['median']:>7} "
                f"{spread['p90']:>7} {spread['max']:>6}"
            )
        else:
            say(f"  {label:<40} {0:>4}      -       -       -      -")
    say(
        f"  agent faults where the node was back before it was marked lost: {figures['node_back_before_marked_lost']}"
    )
    verdict = "PASS" if all(c.passed is not False for c in results) else "FAIL"
    say(f"\nchaos: {verdict}")

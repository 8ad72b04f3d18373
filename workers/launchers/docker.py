"""Run an attempt in a Docker container with exactly its GPUs (production).

`container_request()` is the pure part: the keyword arguments for the docker SDK's
`client.containers.create()`, asserted exactly in the tests. The launcher creates, then
starts, and removes the container again when the start fails (the engine refuses a
device request only at start), so a failed launch leaves nothing behind. The NVIDIA container runtime
turns the device request into the job's devices: GPU UUIDs for whole GPUs and MPS shares,
MIG device UUIDs for MIG. MPS clients also need the host IPC namespace and the GPU's MPS
pipe directory, bind-mounted at the same path so CUDA_MPS_PIPE_DIRECTORY holds inside.

Every container is confined (workers.policy): before it is created, the image is checked
against the team's and this host's allow-lists and the portal's policy against the host's
file; then it runs with every capability dropped, `no-new-privileges`, a non-root user,
memory (no swap), CPU and process limits, the network its team is allowed (`none` by
default), optionally a read-only root filesystem, and one writable host directory of its
own, `<scratch root>/<job>-<attempt>` at /scratch, removed with the container.

Containers outlive the agent. Each carries labels naming its job, attempt and node, so an
agent that restarts finds its node's containers again with `DockerLauncher.adopt()`: running
ones are followed again, exited ones hand over their recorded exit code at once. A container is
never removed before the agent has read that exit code. An adopted run's output goes on from
the byte the agent's journal says was shipped (`workers/logship.py`): the engine hands back
the same bytes in the same order every time. While the agent
is down or frozen, `workers.watchdog` kills the node's containers once the agent's lease has
lapsed and leaves a marker, which the run's `fenced()` reads, so the attempt is reported
`fenced`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.launch import job_environment, mps_pipe_dir
from workers.policy import (
    ContainerLimits,
    HostPolicy,
    check_image,
    load_host_policy,
    resolve_policy,
    user_ids,
)
from workers.protocol import Launch

log = logging.getLogger(__name__)

EXITED_STATES = ("exited", "dead")
# States in which a container's processes exist and hold its GPUs: what fencing must kill.
ACTIVE_STATES = ("running", "paused", "restarting")
LABEL_JOB = "portal.job_id"
LABEL_ATTEMPT = "portal.attempt"
LABEL_NODE = "portal.node"
FENCED_DIR = "fenced"
SCRATCH_DIR = "scratch"
# Where a job's scratch directory appears inside its container.
SCRATCH_MOUNT = "/scratch"
MIB = 1024 * 1024
_ATTEMPT_DIR = re.compile(r"^(\d+)-(\d+)$")


def container_name(launch: Launch) -> str:
    return f"portal-job-{launch.job_id}-{launch.attempt}"


def container_request(
    launch: Launch,
    *,
    env: dict[str, str],
    mps_root: Path,
    node: str,
    limits: ContainerLimits,
    scratch: Path,
) -> dict[str, Any]:
    """The exact `containers.create(**kwargs)` arguments for an attempt, confined by `limits`
    (what workers.policy resolved), with `scratch` as its only writable host directory."""
    from docker.types import DeviceRequest  # type: ignore[import-untyped]

    kinds = {d.kind for d in launch.devices}
    if kinds == {"mig"}:
        device_ids = [d.mig_uuid for d in launch.devices]
    else:
        device_ids = list(dict.fromkeys(d.gpu_uuid for d in launch.devices))
    memory = limits.memory_mb * MIB
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
        "user": limits.user,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "pids_limit": limits.pids_limit,
        "mem_limit": memory,
        "memswap_limit": memory,  # the same: no swap beyond the memory limit
        "nano_cpus": round(limits.cpus * 1e9),
        "network_mode": limits.network,
        "read_only": limits.read_only_rootfs,
        # The only host directories a job sees: its own scratch, and for MPS its GPU's pipe.
        "volumes": {str(scratch): {"bind": SCRATCH_MOUNT, "mode": "rw"}},
    }
    if kinds == {"mps"}:
        pipe = str(mps_pipe_dir(mps_root, device_ids[0]))
        # MPS needs the host IPC namespace: a client and the GPU's MPS server (started by the
        # agent, outside any job container) exchange work through shared memory, which only
        # works when both live in one IPC namespace; the pipe directory, at the same path, is
        # how the client finds the control daemon. No other job gets the host IPC namespace.
        request["ipc_mode"] = "host"
        request["volumes"][pipe] = {"bind": pipe, "mode": "rw"}
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


# --- scratch directories ----------------------------------------------------------------------


def scratch_path(root: Path, job_id: int, attempt: int) -> Path:
    return root / f"{job_id}-{attempt}"


def make_scratch(root: Path, job_id: int, attempt: int, *, user: str) -> Path:
    """A fresh, empty scratch directory for an attempt, mode 0700, owned by the job's
    `uid:gid`. Without root (an agent in the docker group) the agent cannot give it away: it
    is made writable for all instead, inside the agent's own work directory. A scratch root
    the agent makes is closed to every other user of the host (0700); the engine mounts the
    directory into the container without the job passing through it."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = scratch_path(root, job_id, attempt)
    remove_scratch(path)  # left by an earlier try of this attempt that never started
    path.mkdir(mode=0o700)
    uid, gid = user_ids(user)
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        log.warning("not root: scratch %s made writable for all instead of owned by %s", path, user)
        path.chmod(0o777)
    return path


def remove_scratch(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)  # never follows the job's symlinks


def oom_note(attrs: Any) -> str:
    """`OOM_KILLED: ...` when the engine says the kernel killed the container for its memory
    limit (State.OOMKilled), else ''."""
    if not isinstance(attrs, dict) or not (attrs.get("State") or {}).get("OOMKilled"):
        return ""
    limit = int((attrs.get("HostConfig") or {}).get("Memory") or 0) // MIB
    within = f" of {limit} MiB" if limit else ""
    return f"OOM_KILLED: the job went over its memory limit{within} and the kernel killed it"


# --- runs -----------------------------------------------------------------------------------


class DockerRun:
    """A container the agent follows: one it started, or one it adopted after a restart.

    `key` and `workdir` let `fenced()` find the watchdog's marker; `exit_code` is set for an
    adopted container that exited while no agent watched it; `scratch` is the job's scratch
    directory, removed with the container. After `wait()`, `end_note` says `OOM_KILLED: ...` when
    the kernel killed it for its memory limit (the supervisor adds it to the error)."""

    def __init__(
        self,
        container: Any,
        *,
        key: tuple[int, int] | None = None,
        workdir: Path | None = None,
        exit_code: int | None = None,
        scratch: Path | None = None,
    ) -> None:
        self._container = container
        self._key = key
        self._workdir = workdir
        self._exit_code = exit_code
        self._scratch = scratch
        self._stop_sent = False
        self.pid: int | None = None
        self.container_id: str | None = container.id
        self.end_note = ""

    def output(self, offset: int = 0) -> Iterator[bytes]:
        """The engine's log of the container (it keeps it across agent restarts), from byte
        `offset`: the same bytes in the same order every time it is read."""
        skip = offset
        for data in self._container.logs(stream=True, follow=True, stdout=True, stderr=True):
            if skip >= len(data):
                skip -= len(data)
                continue
            yield data[skip:]
            skip = 0

    def wait(self) -> int:
        if self._exit_code is None:
            self._exit_code = int(self._container.wait()["StatusCode"])
            self._container.reload()  # the exit's State (OOMKilled) comes from an inspect
        # An adopted exited container was inspected when it was adopted.
        self.end_note = oom_note(getattr(self._container, "attrs", None))
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
        remove_scratch(self._scratch)
        if self._key is not None and self._workdir is not None:
            fence_marker_path(self._workdir, *self._key).unlink(missing_ok=True)


class DockerLauncher:
    """Starts attempts in containers confined by `policy`, this host's policy (the built-in
    one when None); scratch directories live under its `scratch_root`, else
    `<workdir>/scratch`."""

    name = "docker"

    def __init__(
        self,
        *,
        node: str,
        mps_root: Path,
        workdir: Path,
        client: Any = None,
        policy: HostPolicy | None = None,
    ) -> None:
        if client is None:
            import docker  # type: ignore[import-untyped]

            client = docker.from_env()
        self._client = client
        self.node = node
        self.mps_root = mps_root
        # The agent's work directory, where the watchdog leaves its fence markers.
        self.workdir = workdir
        self.policy = policy if policy is not None else load_host_policy(None)
        self.scratch_root = Path(self.policy.scratch_root or workdir / SCRATCH_DIR)

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> DockerRun:
        # lease_epoch is not checked here: the agent starts the container itself, and the
        # fence stops one that an agent thawed after its lease ran out had started anyway.
        container, scratch = self.create(launch)
        try:
            container.start()
        except Exception:
            container.remove(force=True)
            remove_scratch(scratch)
            raise
        return DockerRun(
            container, key=(launch.job_id, launch.attempt), workdir=self.workdir, scratch=scratch
        )

    def create(self, launch: Launch) -> tuple[Any, Path]:
        """Check the launch against this host's policy and create its container, not started
        yet: (the container, its scratch directory). Raises LaunchError for what the policy
        refuses, before the engine is asked anything about the image."""
        check_image(launch, self.policy)
        env = job_environment(launch, mps_root=self.mps_root)
        limits = resolve_policy(launch.policy, self.policy, image_user=self._image_user(launch))
        scratch = make_scratch(self.scratch_root, launch.job_id, launch.attempt, user=limits.user)
        request = container_request(
            launch,
            env=env,
            mps_root=self.mps_root,
            node=self.node,
            limits=limits,
            scratch=scratch,
        )
        try:
            return self._client.containers.create(**request), scratch
        except Exception:
            remove_scratch(scratch)
            raise

    def _image_user(self, launch: Launch) -> str:
        """The image's own USER ('' when it names none); an image missing here fails the
        launch (the launcher does not pull)."""
        config = self._client.images.get(launch.image).attrs.get("Config") or {}
        return str(config.get("User") or "")

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
            scratch = scratch_path(self.scratch_root, *key)
            if state["Status"] == "created":
                log.warning("removing container %s: created but never started", container.name)
                container.remove(force=True)
                remove_scratch(scratch)
                continue
            if state["Status"] == "removing":
                continue
            exited = state["Status"] in EXITED_STATES
            adopted[key] = DockerRun(
                container,
                key=key,
                workdir=self.workdir,
                exit_code=int(state["ExitCode"]) if exited else None,
                scratch=scratch,
            )
        self._prune_fence_markers(set(adopted))
        self._prune_scratch(set(adopted))
        return adopted

    def fenced(self, job_id: int, attempt: int) -> str | None:
        """Why the watchdog killed this attempt's container, or None when it did not."""
        return read_fence_marker(self.workdir, job_id, attempt)

    def _prune_fence_markers(self, keep: set[tuple[int, int]]) -> None:
        for marker in (self.workdir / FENCED_DIR).glob("*-*"):
            if _attempt_of_name(marker.name) not in keep | {None}:
                marker.unlink(missing_ok=True)

    def _prune_scratch(self, keep: set[tuple[int, int]]) -> None:
        """Scratch directories whose container is gone (the agent died before removing it)."""
        if self.scratch_root.is_dir():
            for path in self.scratch_root.iterdir():
                if _attempt_of_name(path.name) not in keep | {None}:
                    remove_scratch(path)


def _attempt_of_name(name: str) -> tuple[int, int] | None:
    """(job_id, attempt) of a `<job>-<attempt>` file name, else None."""
    match = _ATTEMPT_DIR.match(name)
    return (int(match[1]), int(match[2])) if match else None

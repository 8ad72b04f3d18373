"""The exact request the Docker launcher sends to the engine, per slice kind and policy item,
and what the launcher refuses before it asks the engine anything."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agent_doubles import (
    GPU_0,
    GPU_3,
    MIG_1,
    MIG_SLICE,
    MPS_SHARE,
    WHOLE_GPU,
    RecordingSender,
    make_launch,
)
from docker.types import DeviceRequest

from workers.launch import job_environment
from workers.launchers.docker import (
    DockerLauncher,
    DockerRun,
    container_request,
    oom_note,
    write_fence_marker,
)
from workers.outbox import AttemptJournal
from workers.policy import ContainerLimits, HostPolicy
from workers.protocol import ContainerPolicy, Device, Launch
from workers.supervisor import Supervisor

ROOT = Path("/var/lib/portal/mps")
SCRATCH = Path("/var/lib/portal-agent/scratch/42-1")
GPU_1 = "GPU-1d1d1d1d-0000-4000-8000-000000000001"
GIB = 1024 * 1024 * 1024
LIMITS = ContainerLimits(
    user="65534:65534",
    memory_mb=16384,
    cpus=4.0,
    pids_limit=4096,
    network="none",
    read_only_rootfs=False,
)
HOST = HostPolicy(memory_mb_max=65536, cpus_max=16.0)
LAB_HOST = HostPolicy(memory_mb_max=8192, cpus_max=4.0, pids_limit_max=512, networks=("lab",))


def request_for(*devices: Device, limits: ContainerLimits = LIMITS) -> dict[str, Any]:
    launch = make_launch(["python", "-c", "print(1)"], job_id=42, attempt=1, devices=devices)
    env = job_environment(launch, mps_root=ROOT)
    return container_request(
        launch, env=env, mps_root=ROOT, node="gpu-7", limits=limits, scratch=SCRATCH
    )


LABELS = {"portal.job_id": "42", "portal.attempt": "1", "portal.node": "gpu-7"}
SCRATCH_VOLUME = {str(SCRATCH): {"bind": "/scratch", "mode": "rw"}}


def test_whole_gpus_are_requested_by_uuid_in_a_confined_container() -> None:
    second = Device(slice_id="gpu-7/1", kind="whole", gpu_uuid=GPU_1, gpu_index=1)
    assert request_for(WHOLE_GPU, second) == {
        "image": "python:3.11-slim",
        "command": ["python", "-c", "print(1)"],
        "environment": {
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": f"{GPU_0},{GPU_1}",
            "NVIDIA_VISIBLE_DEVICES": f"{GPU_0},{GPU_1}",
            "PORTAL_JOB_ID": "42",
            "PORTAL_JOB_ATTEMPT": "1",
        },
        "name": "portal-job-42-1",
        "labels": LABELS,
        "device_requests": [
            DeviceRequest(driver="nvidia", device_ids=[GPU_0, GPU_1], capabilities=[["gpu"]])
        ],
        "auto_remove": False,
        "stdin_open": False,
        "tty": False,
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "pids_limit": 4096,
        "mem_limit": 16 * GIB,
        "memswap_limit": 16 * GIB,
        "nano_cpus": 4_000_000_000,
        "network_mode": "none",
        "read_only": False,
        "volumes": SCRATCH_VOLUME,
    }


def test_the_device_request_is_the_engine_json_the_nvidia_runtime_reads() -> None:
    (device_request,) = request_for(WHOLE_GPU)["device_requests"]
    assert dict(device_request) == {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": [GPU_0],
        "Capabilities": [["gpu"]],
        "Options": {},
    }


def test_a_mig_slice_is_requested_by_its_mig_uuid_without_host_ipc_or_other_mounts() -> None:
    request = request_for(MIG_SLICE)
    assert request["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[MIG_1], capabilities=[["gpu"]])
    ]
    assert request["environment"]["CUDA_VISIBLE_DEVICES"] == MIG_1
    assert "ipc_mode" not in request
    assert request["volumes"] == SCRATCH_VOLUME


def test_mps_shares_get_their_gpu_host_ipc_and_the_pipe_directory_mounted() -> None:
    second_share = Device(**{**MPS_SHARE.to_dict(), "slice_id": "gpu-7/3/mps/1"})
    request = request_for(MPS_SHARE, second_share)
    pipe = f"/var/lib/portal/mps/{GPU_3}/pipe"
    assert request["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[GPU_3], capabilities=[["gpu"]])
    ]
    # The only job that gets the host IPC namespace: its MPS server's shared memory is there.
    assert request["ipc_mode"] == "host"
    assert request["volumes"] == {**SCRATCH_VOLUME, pipe: {"bind": pipe, "mode": "rw"}}
    assert request["environment"] == {
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": GPU_3,
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": f"/var/lib/portal/mps/{GPU_3}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M",
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "1",
    }
    # Confined like every other job.
    assert (request["cap_drop"], request["user"], request["network_mode"]) == (
        ["ALL"],
        "65534:65534",
        "none",
    )


# Each policy item, one at a time: the keyword arguments it changes, and nothing else.
POLICY_ITEMS = [
    ({"user": "1000:1000"}, {"user": "1000:1000"}),
    ({"memory_mb": 512}, {"mem_limit": 512 * 1024 * 1024, "memswap_limit": 512 * 1024 * 1024}),
    ({"cpus": 0.5}, {"nano_cpus": 500_000_000}),
    ({"cpus": 1.15}, {"nano_cpus": 1_150_000_000}),
    ({"pids_limit": 64}, {"pids_limit": 64}),
    ({"network": "jobs-net"}, {"network_mode": "jobs-net"}),
    ({"read_only_rootfs": True}, {"read_only": True}),
]


@pytest.mark.parametrize(("item", "changed"), POLICY_ITEMS)
def test_each_policy_item_changes_exactly_its_keyword_arguments(
    item: dict[str, Any], changed: dict[str, Any]
) -> None:
    base = request_for(WHOLE_GPU)
    limits = ContainerLimits(**{**LIMITS.__dict__, **item})
    assert request_for(WHOLE_GPU, limits=limits) == {**base, **changed}


class RecordingContainer:
    id = "c0ffee"
    status = "running"

    def __init__(
        self, start_error: Exception | None = None, *, status_after_reload: str = "exited"
    ) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.start_error = start_error
        self.status_after_reload = status_after_reload
        self.reloaded = threading.Event()
        self.stopped = threading.Event()

    def start(self) -> None:
        self.calls.append(("start", {}))
        if self.start_error is not None:
            raise self.start_error

    def logs(self, **kwargs: Any) -> list[bytes]:
        self.calls.append(("logs", kwargs))
        return [b"hi\n"]

    def wait(self) -> dict[str, int]:
        self.calls.append(("wait", {}))
        return {"StatusCode": 3}

    def reload(self) -> None:
        self.status = self.status_after_reload
        self.reloaded.set()

    def stop(self, **kwargs: Any) -> None:
        self.calls.append(("stop", kwargs))
        self.stopped.set()

    def remove(self, **kwargs: Any) -> None:
        self.calls.append(("remove", kwargs))


class RecordingImage:
    def __init__(self, user: str) -> None:
        self.attrs = {"Config": {"User": user}}


class RecordingClient:
    """Stands in for the engine: records creates; every image has USER `image_user`."""

    def __init__(self, start_error: Exception | None = None, *, image_user: str = "") -> None:
        self.created: list[dict[str, Any]] = []
        self.container = RecordingContainer(start_error)
        self.containers = self
        self.images = self
        self.image_user = image_user
        self.images_asked: list[str] = []

    def create(self, **kwargs: Any) -> RecordingContainer:
        self.created.append(kwargs)
        return self.container

    def get(self, image: str) -> RecordingImage:
        self.images_asked.append(image)
        return RecordingImage(self.image_user)


def launcher_for(client: RecordingClient, workdir: Path, host: HostPolicy = HOST) -> DockerLauncher:
    return DockerLauncher(node="gpu-7", mps_root=ROOT, client=client, workdir=workdir, policy=host)


def with_policy(launch: Launch, **fields: Any) -> Launch:
    return msgspec.structs.replace(launch, policy=ContainerPolicy(**fields))


def test_the_launcher_sends_exactly_the_built_request(tmp_path: Path) -> None:
    client = RecordingClient()
    launcher = launcher_for(client, tmp_path)
    launch = make_launch(["python", "-c", "print(1)"], job_id=42, attempt=1, env={"SEED": "1"})
    run = launcher.start(with_policy(launch, memory_mb=16384, cpus=4.0))
    scratch = tmp_path / "scratch" / "42-1"
    expected = request_for(WHOLE_GPU)
    expected["environment"] = {"SEED": "1", **expected["environment"]}
    expected["volumes"] = {str(scratch): {"bind": "/scratch", "mode": "rw"}}
    assert client.created == [expected]
    assert client.container.calls == [("start", {})]
    assert (run.container_id, run.pid) == ("c0ffee", None)
    # The job's own scratch: empty, owned by the job's user (an agent that is not root cannot
    # give it away and opens it instead); gone with the container.
    owner = (scratch.stat().st_uid, scratch.stat().st_gid, scratch.stat().st_mode & 0o777)
    assert owner == (
        (65534, 65534, 0o700) if os.geteuid() == 0 else (os.geteuid(), os.getegid(), 0o777)
    )
    assert list(scratch.iterdir()) == []
    run.release()
    assert not scratch.exists()


def test_limits_the_portal_leaves_out_are_the_hosts_maximums(tmp_path: Path) -> None:
    client = RecordingClient()
    host = HostPolicy(memory_mb_max=2048, cpus_max=2.0, pids_limit_max=100, read_only_rootfs=True)
    launcher_for(client, tmp_path, host).start(make_launch(["true"]))
    (request,) = client.created
    assert (request["mem_limit"], request["nano_cpus"], request["pids_limit"]) == (
        2048 * 1024 * 1024,
        2_000_000_000,
        100,
    )
    assert request["read_only"] is True  # the host file made it read-only for every job


@pytest.mark.parametrize(
    ("image_user", "runs_as"),
    [
        ("1000", "1000:1000"),  # a numeric USER of the image: its group is its uid
        ("1000:2000", "1000:2000"),
        ("", "65534:65534"),  # no USER: root by default, so the host's default user
        ("root", "65534:65534"),
        ("0", "65534:65534"),
        ("0:0", "65534:65534"),
        ("1000:0", "65534:65534"),  # root's group
        ("appuser", "65534:65534"),  # a name maps through the image's own /etc/passwd
    ],
)
def test_the_container_runs_as_the_images_user_only_when_that_is_a_numeric_non_root_one(
    tmp_path: Path, image_user: str, runs_as: str
) -> None:
    client = RecordingClient(image_user=image_user)
    launcher_for(client, tmp_path).start(make_launch(["true"]))
    assert client.created[0]["user"] == runs_as


def test_a_container_that_fails_to_start_is_removed_with_its_scratch(tmp_path: Path) -> None:
    client = RecordingClient(start_error=RuntimeError('could not select device driver "nvidia"'))
    launcher = launcher_for(client, tmp_path)
    with pytest.raises(RuntimeError, match="nvidia"):
        launcher.start(make_launch(["true"]))
    assert client.container.calls == [("start", {}), ("remove", {"force": True})]
    assert list((tmp_path / "scratch").iterdir()) == []


# --- refusals: the host's policy file wins over the portal ---------------------------------


def refused(launcher: DockerLauncher, launch: Launch, tmp_path: Path) -> str:
    """The error of the `launch_error` the agent reports for a launch it refuses."""
    sender = RecordingSender()

    def report(message: Any) -> bool:
        sender(message)
        return True

    supervisor = Supervisor(
        node=launch.node,
        launcher=launcher,
        report=report,
        journal=AttemptJournal(tmp_path / "journal"),
    )
    supervisor.launch(launch)
    finished = sender.finished(launch.job_id, launch.attempt)
    assert (finished.outcome, finished.exit_code, finished.started_at) == (
        "launch_error",
        None,
        None,
    )
    return finished.error


def test_the_agent_refuses_an_image_outside_its_hosts_allow_list(tmp_path: Path) -> None:
    client = RecordingClient()
    host = HostPolicy(memory_mb_max=65536, cpus_max=16.0, image_prefixes=("registry.internal/",))
    launch = make_launch(["true"])  # python:3.11-slim, which the team would allow
    error = refused(launcher_for(client, tmp_path, host), launch, tmp_path)
    assert error == (
        "image 'python:3.11-slim' is not allowed on this host (PORTAL_AGENT_POLICY_FILE "
        "image_prefixes); allowed prefixes: registry.internal/"
    )
    assert (client.created, client.images_asked) == ([], [])  # the engine was never asked


def test_the_agent_refuses_an_image_outside_the_teams_allow_list_again(tmp_path: Path) -> None:
    client = RecordingClient()
    launch = with_policy(make_launch(["true"]), image_prefixes=("registry.example.org/vision/",))
    error = refused(launcher_for(client, tmp_path), launch, tmp_path)
    assert error == (
        "image 'python:3.11-slim' is not allowed for team vision; allowed prefixes: "
        "registry.example.org/vision/"
    )
    assert client.created == []


def test_the_agent_refuses_a_policy_above_its_hosts_maximums_and_says_each_one(
    tmp_path: Path,
) -> None:
    client = RecordingClient()
    launch = with_policy(
        make_launch(["true"]), memory_mb=8193, cpus=4.5, pids_limit=513, network="public"
    )
    error = refused(launcher_for(client, tmp_path, LAB_HOST), launch, tmp_path)
    assert error == (
        "container policy refused by this host's PORTAL_AGENT_POLICY_FILE: "
        "memory_mb 8193 is above this host's maximum of 8192 (memory_mb_max); "
        "cpus 4.5 is above this host's maximum of 4 (cpus_max); "
        "pids_limit 513 is above this host's maximum of 512 (pids_limit_max); "
        "network 'public' is not allowed on this host; allowed: none, lab (networks)"
    )
    assert client.created == []
    assert not (tmp_path / "scratch" / "1-0").exists()


def test_a_policy_at_the_hosts_maximums_and_an_allowed_network_is_launched(
    tmp_path: Path,
) -> None:
    client = RecordingClient()
    launch = with_policy(
        make_launch(["true"]), memory_mb=8192, cpus=4.0, pids_limit=512, network="lab"
    )
    launcher_for(client, tmp_path, LAB_HOST).start(launch)
    (request,) = client.created
    assert (request["mem_limit"], request["nano_cpus"], request["pids_limit"]) == (
        8 * GIB,
        4_000_000_000,
        512,
    )
    assert request["network_mode"] == "lab"


def test_a_container_run_streams_logs_reports_the_exit_code_and_is_removed() -> None:
    container = RecordingContainer()
    run = DockerRun(container)
    assert list(run.output()) == [b"hi\n"]
    assert run.wait() == 3
    assert run.has_exited()
    run.release()
    assert container.calls == [
        ("logs", {"stream": True, "follow": True, "stdout": True, "stderr": True}),
        ("wait", {}),
        ("remove", {"force": True}),
    ]


def test_terminate_stops_the_container_with_the_grace_as_timeout() -> None:
    container = RecordingContainer(status_after_reload="running")
    run = DockerRun(container)
    run.terminate(2.5)
    assert container.stopped.wait(5)  # docker stop runs on its own thread
    assert container.calls == [("stop", {"timeout": 3})]
    assert run.stop_reached()


def test_a_container_that_ended_on_its_own_is_not_stopped_and_keeps_its_result() -> None:
    # Reported stopped, a job that had finished would be run again by the portal.
    container = RecordingContainer(status_after_reload="exited")
    run = DockerRun(container)
    run.terminate(2.5)
    assert container.reloaded.wait(5)  # it looked, saw the container exited: no stop follows
    assert container.calls == []
    assert not run.stop_reached()


def test_an_adopted_exited_run_gives_its_recorded_exit_code_without_asking_the_engine() -> None:
    container = RecordingContainer()
    run = DockerRun(container, exit_code=7)
    assert (run.has_exited(), run.wait()) == (True, 7)
    assert container.calls == []
    assert container.status == "running"  # never reloaded either


def test_a_run_reports_the_watchdogs_fence_reason_until_it_is_released(tmp_path: Path) -> None:
    client = RecordingClient()
    launcher = launcher_for(client, tmp_path)
    run = launcher.start(make_launch(["true"], job_id=42, attempt=1))
    assert run.fenced() is None and launcher.fenced(42, 1) is None
    assert write_fence_marker(tmp_path, 42, 1, "the agent's lease lapsed")
    assert not write_fence_marker(tmp_path, 42, 1, "a second reason")  # the first one stays
    assert run.fenced() == launcher.fenced(42, 1) == "the agent's lease lapsed"
    assert launcher.fenced(42, 2) is None
    run.release()
    assert launcher.fenced(42, 1) is None


def test_an_oom_kill_the_engine_recorded_is_named_in_the_runs_note() -> None:
    attrs = {"State": {"OOMKilled": True}, "HostConfig": {"Memory": 64 * 1024 * 1024}}
    assert oom_note(attrs) == (
        "OOM_KILLED: the job went over its memory limit of 64 MiB and the kernel killed it"
    )
    assert oom_note({"State": {"OOMKilled": False}, "HostConfig": {"Memory": 1}}) == ""
    container = RecordingContainer()
    container.attrs = attrs  # type: ignore[attr-defined]
    run = DockerRun(container, exit_code=137)  # adopted: inspected when it was adopted
    assert (run.wait(), run.end_note) == (137, oom_note(attrs))

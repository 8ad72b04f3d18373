"""The exact request the Docker launcher sends to the engine, per slice kind."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from agent_doubles import GPU_0, GPU_3, MIG_1, MIG_SLICE, MPS_SHARE, WHOLE_GPU, make_launch
from docker.types import DeviceRequest

from workers.launch import job_environment
from workers.launchers.docker import (
    DockerLauncher,
    DockerRun,
    container_request,
    write_fence_marker,
)
from workers.protocol import Device

ROOT = Path("/var/lib/portal/mps")
GPU_1 = "GPU-1d1d1d1d-0000-4000-8000-000000000001"


def request_for(*devices: Device, network: str | None = None) -> dict[str, Any]:
    launch = make_launch(["python", "-c", "print(1)"], job_id=42, attempt=1, devices=devices)
    env = job_environment(launch, mps_root=ROOT)
    return container_request(launch, env=env, mps_root=ROOT, node="gpu-7", network=network)


LABELS = {"portal.job_id": "42", "portal.attempt": "1", "portal.node": "gpu-7"}


def test_whole_gpus_are_requested_by_uuid() -> None:
    second = Device(slice_id="gpu-7/1", kind="whole", gpu_uuid=GPU_1, gpu_index=1)
    assert request_for(WHOLE_GPU, second) == {
        "image": "python:3.11-slim",
        "command": ["python", "-c", "print(1)"],
        "environment": {
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


def test_a_mig_slice_is_requested_by_its_mig_uuid() -> None:
    request = request_for(MIG_SLICE)
    assert request["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[MIG_1], capabilities=[["gpu"]])
    ]
    assert request["environment"]["CUDA_VISIBLE_DEVICES"] == MIG_1
    assert "ipc_mode" not in request and "volumes" not in request


def test_mps_shares_get_their_gpu_host_ipc_and_the_pipe_directory_mounted() -> None:
    second_share = Device(**{**MPS_SHARE.to_dict(), "slice_id": "gpu-7/3/mps/1"})
    request = request_for(MPS_SHARE, second_share)
    pipe = f"/var/lib/portal/mps/{GPU_3}/pipe"
    assert request["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[GPU_3], capabilities=[["gpu"]])
    ]
    assert request["ipc_mode"] == "host"
    assert request["volumes"] == {pipe: {"bind": pipe, "mode": "rw"}}
    assert request["environment"] == {
        "CUDA_VISIBLE_DEVICES": GPU_3,
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": f"/var/lib/portal/mps/{GPU_3}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M",
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "1",
    }


def test_a_configured_network_is_passed_as_network_mode() -> None:
    assert request_for(WHOLE_GPU, network="none")["network_mode"] == "none"
    assert "network_mode" not in request_for(WHOLE_GPU)


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


class RecordingClient:
    def __init__(self, start_error: Exception | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.container = RecordingContainer(start_error)
        self.containers = self

    def create(self, **kwargs: Any) -> RecordingContainer:
        self.created.append(kwargs)
        return self.container


def test_the_launcher_sends_exactly_the_built_request() -> None:
    client = RecordingClient()
    launcher = DockerLauncher(node="gpu-7", mps_root=ROOT, client=client)
    launch = make_launch(["python", "-c", "print(1)"], job_id=42, attempt=1, env={"SEED": "1"})
    run = launcher.start(launch)
    expected = request_for(WHOLE_GPU)
    expected["environment"] = {"SEED": "1", **expected["environment"]}
    assert client.created == [expected]
    assert client.container.calls == [("start", {})]
    assert (run.container_id, run.pid) == ("c0ffee", None)


def test_a_container_that_fails_to_start_is_removed() -> None:
    client = RecordingClient(start_error=RuntimeError('could not select device driver "nvidia"'))
    launcher = DockerLauncher(node="gpu-7", mps_root=ROOT, client=client)
    with pytest.raises(RuntimeError, match="nvidia"):
        launcher.start(make_launch(["true"]))
    assert client.container.calls == [("start", {}), ("remove", {"force": True})]


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
    launcher = DockerLauncher(node="gpu-7", mps_root=ROOT, client=client, workdir=tmp_path)
    run = launcher.start(make_launch(["true"], job_id=42, attempt=1))
    assert run.fenced() is None and launcher.fenced(42, 1) is None
    assert write_fence_marker(tmp_path, 42, 1, "the agent's lease lapsed")
    assert not write_fence_marker(tmp_path, 42, 1, "a second reason")  # the first one stays
    assert run.fenced() == launcher.fenced(42, 1) == "the agent's lease lapsed"
    assert launcher.fenced(42, 2) is None
    run.release()
    assert launcher.fenced(42, 1) is None

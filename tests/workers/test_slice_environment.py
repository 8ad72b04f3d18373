"""The exact environment a job gets for each kind of slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.launch import LaunchError, job_environment, slice_environment
from workers.protocol import Device, Launch

ROOT = Path("/var/lib/portal/mps")
GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def whole(uuid: str, index: int) -> Device:
    return Device(slice_id=f"s-{index}", kind="whole", gpu_uuid=uuid, gpu_index=index)


def mig(mig_uuid: str, profile: str = "1g.10gb") -> Device:
    return Device(
        slice_id=mig_uuid,
        kind="mig",
        gpu_uuid=GPU_A,
        gpu_index=0,
        mig_uuid=mig_uuid,
        profile=profile,
    )


def mps(slice_id: str, fraction: float, memory_mb: int | None, gpu: str = GPU_B) -> Device:
    return Device(
        slice_id=slice_id,
        kind="mps",
        gpu_uuid=gpu,
        gpu_index=3,
        mps_fraction=fraction,
        memory_mb=memory_mb,
    )


def env_for(*devices: Device) -> dict[str, str]:
    return slice_environment(devices, job_id=42, attempt=2, mps_root=ROOT)


def test_whole_gpus_are_visible_by_uuid_to_cuda_and_the_container_runtime() -> None:
    assert env_for(whole(GPU_A, 0), whole(GPU_B, 1)) == {
        "CUDA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}",
        "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}",
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "2",
    }


def test_a_mig_slice_is_visible_by_its_mig_uuid() -> None:
    assert env_for(mig("MIG-11111111-2222-3333-4444-555555555555")) == {
        "CUDA_VISIBLE_DEVICES": "MIG-11111111-2222-3333-4444-555555555555",
        "NVIDIA_VISIBLE_DEVICES": "MIG-11111111-2222-3333-4444-555555555555",
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "2",
    }


def test_an_mps_share_gets_its_gpus_pipe_and_log_dirs_and_a_thread_percentage() -> None:
    assert env_for(mps("s1", 0.25, 20480)) == {
        "CUDA_VISIBLE_DEVICES": GPU_B,
        "CUDA_MPS_PIPE_DIRECTORY": f"/var/lib/portal/mps/{GPU_B}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/var/lib/portal/mps/{GPU_B}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "2",
    }


def test_two_shares_of_one_gpu_add_up_their_fraction_and_memory() -> None:
    env = env_for(mps("s1", 0.25, 20480), mps("s2", 0.25, 20480))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_B


def test_an_mps_share_without_known_memory_gets_no_memory_limit() -> None:
    env = env_for(mps("s1", 1 / 3, None))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_mps_shares_on_two_gpus_cannot_be_launched() -> None:
    with pytest.raises(LaunchError, match="MPS shares must all be on one GPU; got 2 GPUs"):
        env_for(mps("s1", 0.25, None, gpu=GPU_A), mps("s2", 0.25, None, gpu=GPU_B))


def test_mixed_slice_kinds_cannot_be_launched() -> None:
    with pytest.raises(LaunchError, match=r"all be of one kind; got \['mig', 'whole'\]"):
        env_for(whole(GPU_A, 0), mig("MIG-1"))


def test_the_same_gpu_twice_cannot_be_launched() -> None:
    twice = Device(slice_id="other", kind="whole", gpu_uuid=GPU_A, gpu_index=0)
    with pytest.raises(LaunchError, match="device listed twice"):
        env_for(whole(GPU_A, 0), twice)


def test_user_env_is_kept_but_cannot_override_the_slice_variables() -> None:
    launch = Launch(
        node="node-e",
        job_id=42,
        attempt=2,
        name="n",
        team="vision",
        user="alice",
        image="img",
        command=("run",),
        env={
            "SEED": "7",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/someone-elses-mps",
            "PORTAL_JOB_ID": "1",
        },
        devices=(whole(GPU_A, 0),),
    )
    base = {"PATH": "/usr/bin", "CUDA_MPS_LOG_DIRECTORY": "/agent/own"}
    assert job_environment(launch, mps_root=ROOT, base=base) == {
        "PATH": "/usr/bin",
        "SEED": "7",
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": GPU_A,
        "NVIDIA_VISIBLE_DEVICES": GPU_A,
        "PORTAL_JOB_ID": "42",
        "PORTAL_JOB_ATTEMPT": "2",
    }


def test_python_output_is_unbuffered_unless_the_user_says_otherwise() -> None:
    def launch_with(env: dict[str, str]) -> Launch:
        return Launch(
            node="node-e",
            job_id=42,
            attempt=2,
            name="n",
            team="vision",
            user="alice",
            image="img",
            command=("python", "train.py"),
            env=env,
            devices=(whole(GPU_A, 0),),
        )

    host = {"PYTHONUNBUFFERED": ""}  # what the agent's own environment had: not the user's
    assert job_environment(launch_with({}), mps_root=ROOT, base=host)["PYTHONUNBUFFERED"] == "1"
    chosen = job_environment(launch_with({"PYTHONUNBUFFERED": ""}), mps_root=ROOT)
    assert chosen["PYTHONUNBUFFERED"] == ""

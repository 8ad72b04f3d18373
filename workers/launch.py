"""The environment a job gets for its slice: one function for every launcher.

A process in the embedded default and a container in production see the same variables:

- whole GPUs: CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES = the GPU UUIDs;
- MIG: both = the MIG device UUIDs;
- MPS: CUDA_VISIBLE_DEVICES = the GPU UUID, the per-GPU CUDA_MPS_PIPE_DIRECTORY and
  CUDA_MPS_LOG_DIRECTORY of that GPU's control daemon, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE =
  round(100 x the job's fraction) and, when the shares' memory is known,
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = `0=<MB>M` (the job sees exactly one GPU, ordinal 0);
- always PORTAL_JOB_ID and PORTAL_JOB_ATTEMPT.

These keys are the agent's: a user's env entry with one of these names is dropped, so a job
can neither widen its devices nor point itself at another GPU's MPS server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from workers.protocol import Device, Launch

RESERVED_ENV_KEYS = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "PORTAL_JOB_ID",
        "PORTAL_JOB_ATTEMPT",
    }
)


class LaunchError(Exception):
    """The attempt cannot be started as asked; reported as outcome 'launch_error'."""


class LeaseLapsed(LaunchError):
    """Not started because the agent's lease lapsed just before: not the job's fault, reported
    as outcome 'fenced' so the portal requeues the attempt."""


class SliceGone(LaunchError):
    """Not started because a slice it was given is no longer in the node's inventory (its GPU
    was lost, its MIG layout changed): not the job's fault, reported as outcome 'lost' so the
    portal requeues the attempt within its retry bound."""


LEASE_LAPSED_TEXT = "the agent's lease has expired"


def mps_pipe_dir(mps_root: Path, gpu_uuid: str) -> Path:
    return mps_root / gpu_uuid / "pipe"


def mps_log_dir(mps_root: Path, gpu_uuid: str) -> Path:
    return mps_root / gpu_uuid / "log"


def _mps_environment(devices: Sequence[Device], mps_root: Path) -> dict[str, str]:
    gpus = {d.gpu_uuid for d in devices}
    if len(gpus) != 1:
        # A client connects to one MPS pipe directory, and the agent runs one daemon per GPU.
        raise LaunchError(f"MPS shares must all be on one GPU; got {len(gpus)} GPUs")
    (gpu_uuid,) = gpus
    fraction = sum(d.mps_fraction or 0.0 for d in devices)
    env = {
        "CUDA_VISIBLE_DEVICES": gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps_pipe_dir(mps_root, gpu_uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps_log_dir(mps_root, gpu_uuid)),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(min(100, max(1, round(100 * fraction)))),
    }
    memories = [d.memory_mb for d in devices]
    if all(m is not None for m in memories):
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={sum(m or 0 for m in memories)}M"
    return env


def slice_environment(
    devices: Sequence[Device], *, job_id: int, attempt: int, mps_root: Path
) -> dict[str, str]:
    """The variables that bind a job to exactly its devices (see the module docstring)."""
    kinds = {d.kind for d in devices}
    if len(kinds) != 1:
        raise LaunchError(f"a job's devices must all be of one kind; got {sorted(kinds)}")
    (kind,) = kinds
    if kind == "mps":
        env = _mps_environment(devices, mps_root)
    else:
        ids = [d.mig_uuid if kind == "mig" else d.gpu_uuid for d in devices]
        if len(set(ids)) != len(ids):
            raise LaunchError(f"device listed twice: {', '.join(ids)}")
        visible = ",".join(ids)
        env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
    env["PORTAL_JOB_ID"] = str(job_id)
    env["PORTAL_JOB_ATTEMPT"] = str(attempt)
    return env


def job_environment(
    launch: Launch, *, mps_root: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (what the launcher passes through, e.g. PATH), then the user's env without the
    reserved keys, then the slice variables: the agent's values always win. PYTHONUNBUFFERED=1
    unless the user set it, so a Python job's prints and tracebacks reach its log in order."""
    env = {k: v for k, v in (base or {}).items() if k not in RESERVED_ENV_KEYS}
    env.update({k: v for k, v in launch.env.items() if k not in RESERVED_ENV_KEYS})
    if "PYTHONUNBUFFERED" not in launch.env:
        env["PYTHONUNBUFFERED"] = "1"
    env.update(
        slice_environment(
            launch.devices, job_id=launch.job_id, attempt=launch.attempt, mps_root=mps_root
        )
    )
    return env


def dropped_user_keys(launch: Launch) -> list[str]:
    """The user's env keys the agent ignores, to tell the user in the job's log."""
    return sorted(k for k in launch.env if k in RESERVED_ENV_KEYS)

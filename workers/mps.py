"""One MPS control daemon per GPU in MPS mode, each with its own pipe and log directory.

Jobs on an MPS share find their GPU's daemon through CUDA_MPS_PIPE_DIRECTORY (see
`workers.launch`). With a real driver and `nvidia-cuda-mps-control` on PATH the agent starts
the daemon (`nvidia-cuda-mps-control -d`, CUDA_VISIBLE_DEVICES = that GPU's UUID) unless
one already answers in that pipe directory, and asks the ones it started to quit when it
stops. With a described inventory there is no daemon to start: the directories are made so
the paths a job sees exist.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.launch import mps_log_dir, mps_pipe_dir
from workers.protocol import Inventory

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"


@dataclass
class MpsDaemons:
    """The daemons this agent started, to stop them again."""

    binary: str | None
    environments: list[dict[str, str]] = field(default_factory=list)

    def stop(self, run: Callable[..., object] = subprocess.run) -> None:
        for env in self.environments:
            try:
                # `echo quit | nvidia-cuda-mps-control` is the documented way to stop it.
                run([self.binary], input="quit\n", env=env, text=True, timeout=30, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("stopping MPS daemon for %s: %s", env["CUDA_VISIBLE_DEVICES"], exc)
        self.environments.clear()


def daemon_environment(mps_root: Path, gpu_uuid: str) -> dict[str, str]:
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps_pipe_dir(mps_root, gpu_uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps_log_dir(mps_root, gpu_uuid)),
    }


def prepare_mps(
    inventory: Inventory,
    mps_root: Path,
    *,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., object] = subprocess.run,
) -> MpsDaemons:
    binary = which(CONTROL_BINARY) if inventory.driver == "nvml" else None
    daemons = MpsDaemons(binary=binary)
    for gpu in inventory.gpus:
        if gpu.mode != "mps":
            continue
        pipe, logs = mps_pipe_dir(mps_root, gpu.uuid), mps_log_dir(mps_root, gpu.uuid)
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        if binary is None:
            continue
        if (pipe / "control").exists():
            log.info("MPS daemon for %s already running in %s", gpu.uuid, pipe)
            continue
        env = daemon_environment(mps_root, gpu.uuid)
        run([binary, "-d"], env=env, timeout=30, check=True)
        daemons.environments.append(env)
        log.info("started MPS daemon for %s (pipe %s)", gpu.uuid, pipe)
    return daemons

"""GPU use per running attempt, read through NVML (only on a host with a driver).

Whole GPUs give utilisation and memory; a MIG device gives its memory (NVML has no
utilisation counter per MIG device); MPS shares are skipped, because the GPU-wide numbers
would charge one job for its neighbours.
"""

from __future__ import annotations

from typing import Any

from workers.protocol import Launch

MIB = 1024 * 1024


class NvmlSampler:
    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml  # an initialised pynvml module (or a stand-in in tests)

    def sample(self, launch: Launch) -> tuple[float | None, int] | None:
        """(mean utilisation % of its whole GPUs or None, memory used in MB), or None."""
        if any(d.kind == "mps" for d in launch.devices):
            return None
        utilisation: list[float] = []
        memory_mb = 0
        for device in launch.devices:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(device.mig_uuid or device.gpu_uuid)
            memory_mb += int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used // MIB)
            if device.kind == "whole":
                utilisation.append(float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        mean = sum(utilisation) / len(utilisation) if utilisation else None
        return mean, memory_mb

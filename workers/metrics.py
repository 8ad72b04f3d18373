"""GPU samples through NVML (only on a host with a driver): per device and per attempt.

Every PORTAL_AGENT_METRICS_S the agent reads each device of its inventory and each attempt
that runs, and ships the samples in batches (``metrics`` messages, at most
``METRICS_MAX_SAMPLES`` each) every PORTAL_AGENT_METRICS_BATCH_S. What NVML offers:

- A whole GPU (also one in MPS mode): SM and memory utilisation
  (``nvmlDeviceGetUtilizationRates``), memory used and total, its compute processes
  (``nvmlDeviceGetComputeRunningProcesses``, plus ``nvmlDeviceGetMPSComputeRunningProcesses``
  for MPS clients, each pid once), power (mW, shown in W) and temperature.
- A GPU in MIG mode: power, temperature and memory of the physical GPU; utilisation is not
  supported on a GPU in MIG mode nor on its MIG devices.
- A MIG device: its memory and its processes; no utilisation, power or temperature.
- Any query NVML refuses (not supported, no permission) is null; any other error (a GPU that
  fell off the bus: GPU_IS_LOST) is written in the sample's ``error`` and the device's other
  readings are not tried.

An attempt's sample comes from its devices: a whole GPU gives all of its readings; a MIG
device its memory and processes; an MPS share only what belongs to the attempt's own MPS
clients (their memory and count, found by pid: the process group or session of the attempt's
process, or its container's cgroup). The GPU-wide utilisation of an MPS GPU is the attempt's
only when all of the GPU's clients are its own (and 0 when none are); a client whose owner
cannot be told (another PID namespace) leaves the attempt's MPS readings null rather than
charging it for a neighbour. Values over several devices: utilisation averaged, memory,
processes and power added up, the highest temperature; null as soon as one device cannot tell.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from workers.protocol import (
    METRICS_MAX_SAMPLES,
    AttemptSample,
    DeviceSample,
    Inventory,
    Launch,
    RunningAttempt,
)

log = logging.getLogger("workers.metrics")

MIB = 1024 * 1024
# NVML's return codes for a query the device does not answer (a null, not an error).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_TEMPERATURE_GPU = 0
# Samples kept while the broker is away (the oldest go first): about a day of a node with
# 8 GPUs and 8 jobs sampled every 30 s.
BUFFER_MAX_SAMPLES = 50_000

Key = tuple[int, int]
_N = TypeVar("_N", int, float)


class _DeviceGone(Exception):
    """NVML answered with an error that ends this device's reading (GPU_IS_LOST, ...)."""


@dataclass
class _Reading:
    """What NVML told of one device, before it becomes a DeviceSample."""

    uuid: str
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    processes: int | None = None
    mps_clients: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    error: str = ""
    # MPS clients by pid: their memory in MB (None: the driver does not say).
    clients: dict[int, int | None] | None = None

    def sample(self, at: float) -> DeviceSample:
        return DeviceSample(
            at=at,
            uuid=self.uuid,
            sm_util_pct=self.sm_util_pct,
            mem_util_pct=self.mem_util_pct,
            memory_used_mb=self.memory_used_mb,
            memory_total_mb=self.memory_total_mb,
            processes=self.processes,
            mps_clients=self.mps_clients,
            power_w=self.power_w,
            temperature_c=self.temperature_c,
            error=self.error[:200],
        )


class ProcessOwners:
    """Which running attempt a host pid belongs to, read from ``/proc``: the attempt whose
    process (``RunningAttempt.pid``: a process launcher's job is its own process group) is the
    pid itself, its process group or its session; or whose container id is in the pid's
    cgroup. None when it cannot be told (no such pid here, another PID namespace)."""

    def __init__(self, running: Iterable[RunningAttempt], *, proc: Path = Path("/proc")) -> None:
        self._by_pid = {r.pid: (r.job_id, r.attempt) for r in running if r.pid}
        self._containers = {
            r.container_id: (r.job_id, r.attempt) for r in running if r.container_id
        }
        self._proc = proc

    def __call__(self, pid: int) -> Key | None:
        if pid in self._by_pid:
            return self._by_pid[pid]
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (self._proc / str(pid) / "stat").read_text()
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
            fields = stat[stat.rindex(")") + 2 :].split()
            for group in (int(fields[2]), int(fields[3])):
                if group in self._by_pid:
                    return self._by_pid[group]
        if self._containers:
            with contextlib.suppress(OSError):
                cgroup = (self._proc / str(pid) / "cgroup").read_text()
                for container_id, key in self._containers.items():
                    if container_id in cgroup:
                        return key
        return None


class NvmlSampler:
    def __init__(self, nvml: Any, *, proc: Path = Path("/proc")) -> None:
        self._nvml = nvml  # an initialised pynvml module (or a stand-in in tests)
        self._proc = proc

    def sample(
        self,
        *,
        inventory: Inventory,
        running: Sequence[tuple[Launch, RunningAttempt]],
        at: float,
        owners: Callable[[int], Key | None] | None = None,
    ) -> tuple[list[DeviceSample], list[AttemptSample]]:
        """Read every device of ``inventory`` and every attempt in ``running`` once."""
        readings: dict[str, _Reading] = {}
        for gpu in inventory.gpus:
            readings[gpu.uuid] = self._read(gpu.uuid, mig=False, mps=gpu.mode == "mps")
            for mig in gpu.mig:
                readings[mig.uuid] = self._read(mig.uuid, mig=True, mps=False)
        owner_of = owners or ProcessOwners([r for _, r in running], proc=self._proc)
        attempts = [_attempt_sample(launch, readings, owner_of, at) for launch, _ in running]
        return [r.sample(at) for r in readings.values()], attempts

    def _read(self, uuid: str, *, mig: bool, mps: bool) -> _Reading:
        reading = _Reading(uuid=uuid)
        nvml = self._nvml
        try:
            handle = self._query(nvml.nvmlDeviceGetHandleByUUID, uuid)
            memory = self._query(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                reading.memory_used_mb = int(memory.used // MIB)
                reading.memory_total_mb = int(memory.total // MIB)
            rates = self._query(nvml.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                reading.sm_util_pct = float(rates.gpu)
                reading.mem_util_pct = float(rates.memory)
            if not mig:
                power = self._query(nvml.nvmlDeviceGetPowerUsage, handle)
                reading.power_w = None if power is None else round(power / 1000.0, 3)
                temperature = self._query(
                    nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU
                )
                reading.temperature_c = None if temperature is None else float(temperature)
            compute = self._query(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            clients = (
                self._query(nvml.nvmlDeviceGetMPSComputeRunningProcesses, handle) if mps else []
            )
            if compute is not None and clients is not None:
                reading.processes = len({p.pid for p in (*compute, *clients)})
            if mps and clients is not None:
                reading.mps_clients = len(clients)
                reading.clients = {
                    p.pid: None if p.usedGpuMemory is None else int(p.usedGpuMemory // MIB)
                    for p in clients
                }
        except _DeviceGone as gone:
            return _Reading(uuid=uuid, error=str(gone))
        return reading

    def _query(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``; None where NVML does not answer it (not supported, no permission);
        _DeviceGone for any other NVML error."""
        try:
            return call(*args)
        except self._nvml.NVMLError as error:
            if getattr(error, "value", None) in (
                NVML_ERROR_NOT_SUPPORTED,
                NVML_ERROR_NO_PERMISSION,
            ):
                return None
            raise _DeviceGone(f"NVML: {error}") from None


def _attempt_sample(
    launch: Launch,
    readings: Mapping[str, _Reading],
    owner_of: Callable[[int], Key | None],
    at: float,
) -> AttemptSample:
    key = (launch.job_id, launch.attempt)
    parts: list[_Reading] = []
    whole: list[_Reading] = []
    mps_gpus: list[str] = []
    for device in launch.devices:
        if device.kind == "mps":
            if device.gpu_uuid not in mps_gpus:  # shares of one GPU are read once
                mps_gpus.append(device.gpu_uuid)
            continue
        reading = readings.get(device.mig_uuid or device.gpu_uuid) or _Reading(uuid="?")
        parts.append(reading)
        if device.kind == "whole":
            whole.append(reading)
    parts += [_mps_part(readings.get(uuid), key, owner_of) for uuid in mps_gpus]
    # Power and temperature are the physical GPU's: the attempt's only on whole GPUs.
    only_whole = len(whole) == len(parts)
    return AttemptSample(
        at=at,
        job_id=launch.job_id,
        attempt=launch.attempt,
        sm_util_pct=_mean([r.sm_util_pct for r in parts]),
        mem_util_pct=_mean([r.mem_util_pct for r in parts]),
        memory_used_mb=_total_int([r.memory_used_mb for r in parts]),
        processes=_total_int([r.processes for r in parts]),
        power_w=_total_float([r.power_w for r in whole]) if only_whole else None,
        temperature_c=_highest([r.temperature_c for r in whole]) if only_whole else None,
    )


def _mps_part(gpu: _Reading | None, key: Key, owner_of: Callable[[int], Key | None]) -> _Reading:
    """What of an MPS GPU's reading is the attempt's own (see the module docstring)."""
    part = _Reading(uuid=gpu.uuid if gpu else "?")
    if gpu is None or gpu.clients is None:
        return part
    owners = {pid: owner_of(pid) for pid in gpu.clients}
    if any(owner is None for owner in owners.values()):
        return part  # a client of nobody we know: could be ours, could be a neighbour's
    mine = [pid for pid, owner in owners.items() if owner == key]
    part.processes = len(mine)
    part.memory_used_mb = _total_int([gpu.clients[pid] for pid in mine]) if mine else 0
    if not mine:
        part.sm_util_pct = part.mem_util_pct = 0.0
    elif len(mine) == len(owners):
        part.sm_util_pct, part.mem_util_pct = gpu.sm_util_pct, gpu.mem_util_pct
    return part


def _known(values: Sequence[_N | None]) -> list[_N] | None:
    """The values, or None when there are none or one device cannot tell."""
    if not values or any(v is None for v in values):
        return None
    return [v for v in values if v is not None]


def _mean(values: Sequence[float | None]) -> float | None:
    known = _known(values)
    return None if known is None else round(sum(known) / len(known), 3)


def _total_int(values: Sequence[int | None]) -> int | None:
    known = _known(values)
    return None if known is None else sum(known)


def _total_float(values: Sequence[float | None]) -> float | None:
    known = _known(values)
    return None if known is None else round(sum(known), 3)


def _highest(values: Sequence[float | None]) -> float | None:
    known = _known(values)
    return None if known is None else max(known)


@dataclass
class MetricsBatch:
    """Samples waiting to be shipped, oldest first, at most ``limit`` (the oldest go first
    when the broker stays away). ``take`` hands out one message's worth; ``restore`` puts a
    batch back when it could not be sent."""

    limit: int = BUFFER_MAX_SAMPLES
    devices: deque[DeviceSample] = field(default_factory=deque)
    attempts: deque[AttemptSample] = field(default_factory=deque)
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.devices) + len(self.attempts)

    def oldest(self) -> float | None:
        times = [q[0].at for q in (self.devices, self.attempts) if q]
        return min(times) if times else None

    def add(self, devices: Iterable[DeviceSample], attempts: Iterable[AttemptSample]) -> None:
        self.devices.extend(devices)
        self.attempts.extend(attempts)
        self._trim()

    def take(
        self, max_samples: int = METRICS_MAX_SAMPLES
    ) -> tuple[list[DeviceSample], list[AttemptSample]]:
        """Up to ``max_samples``, the oldest first, attempts before devices of the same time
        (what the portal's pages and idle detection read)."""
        devices: list[DeviceSample] = []
        attempts: list[AttemptSample] = []
        while len(devices) + len(attempts) < max_samples and (self.devices or self.attempts):
            if self.attempts and (not self.devices or self.attempts[0].at <= self.devices[0].at):
                attempts.append(self.attempts.popleft())
            else:
                devices.append(self.devices.popleft())
        return devices, attempts

    def restore(self, devices: Sequence[DeviceSample], attempts: Sequence[AttemptSample]) -> None:
        """Put back a batch that was not sent, ahead of what came since."""
        self.devices.extendleft(reversed(devices))
        self.attempts.extendleft(reversed(attempts))
        self._trim()

    def _trim(self) -> None:
        """Drop the oldest samples (devices before attempts of the same time) down to limit."""
        while len(self) > self.limit:
            devices_older = bool(self.devices) and (
                not self.attempts or self.devices[0].at <= self.attempts[0].at
            )
            (self.devices if devices_older else self.attempts).popleft()
            self.dropped += 1

"""A small stand-in for the pynvml module, passed to `discover(nvml=...)` in tests.

It answers the NVML calls the agent makes, with the shapes pynvml returns (structs with the
same attribute names, lists, bytes or str), for GPUs the test describes. It is not NVML:
it only knows what the test tells it.

Where real NVML refuses, so does the fake, with the same error: utilisation rates are not
supported on a GPU in MIG mode nor on its MIG devices; power and temperature are the physical
GPU's (not supported on a MIG device handle); a GPU that fell off the bus answers every query
with GPU_IS_LOST (also to a handle asked for by index, its UUID, name and MIG mode, as
the real library may). The test can change the hardware under the agent as an operator or a
fault would: `reconfigure_mig` gives a GPU a new MIG layout (new MIG UUIDs, refused with
IN_USE while a MIG device has processes, like `nvidia-smi mig -dci/-dgi`), `lose` makes a GPU
fall off the bus, `xid` reports an Xid error through the event API (nvmlEventSetCreate,
nvmlDeviceRegisterEvents, nvmlEventSetWait_v2 answering TIMEOUT when nothing is pending; it
never blocks, it records the wait asked for). Processes are pynvml's friendly objects (`pid`, `usedGpuMemory` in bytes or
None when the driver does not say); on a GPU in MPS mode the compute list holds the MPS server
and the MPS list its clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1024 * 1024

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_EVENT_TYPE_PSTATE = 0x2
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
            NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_IN_USE: "In use by another client",
            NVML_ERROR_UNKNOWN: "Unknown Error",
        }.get(self.value, f"NVML error {self.value}")


# GPU instance profiles of an A100 80GB: profile index -> (profile id, name), as NVML
# reports them through nvmlDeviceGetGpuInstanceProfileInfo (v2 structs carry the name).
A100_80GB_PROFILES = {
    0: (19, "MIG 1g.10gb"),
    1: (14, "MIG 2g.20gb"),
    2: (9, "MIG 3g.40gb"),
    3: (5, "MIG 4g.40gb"),
    4: (0, "MIG 7g.80gb"),
    7: (15, "MIG 1g.10gb+me"),
    9: (20, "MIG 1g.20gb"),
}


@dataclass
class FakeProcess:
    """A compute process on a device; `used_mb` None: the driver does not say (as in a
    container without the host's PID namespace)."""

    pid: int
    used_mb: int | None = None


@dataclass
class FakeMig:
    uuid: str
    profile_id: int
    gpu_instance_id: int
    gpu_slices: int
    compute_slices: int
    memory_mb: int
    name: str  # what nvmlDeviceGetName returns for the MIG device
    used_mb: int = 0
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_mb: int = 81920
    mig_capable: bool = True
    mig_enabled: bool = False
    mig_slots: list[FakeMig | None] = field(default_factory=list)  # by MIG device index
    used_mb: int = 0
    util_pct: int = 0
    mem_util_pct: int = 0
    power_mw: int = 0
    temperature_c: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    # A GPU whose operator runs MPS: its server (in the compute list) and its clients.
    mps_server_pid: int | None = None
    mps_clients: list[FakeProcess] = field(default_factory=list)
    lost: bool = False  # fell off the bus: every query answers GPU_IS_LOST


def busy_gpu(uuid: str) -> FakeGpu:
    """A whole GPU at work, with every reading NVML offers: 87 % SM and 41 % memory
    utilisation, 30000 of 81920 MB used, 312.5 W, 61 C, one compute process (pid 4242)."""
    return FakeGpu(
        uuid=uuid,
        mig_capable=False,
        used_mb=30000,
        util_pct=87,
        mem_util_pct=41,
        power_mw=312_500,
        temperature_c=61,
        processes=[FakeProcess(pid=4242, used_mb=29000)],
    )


def a100_mig(uuid: str, profile: str, instance: int) -> FakeMig:
    """A MIG device of an A100 80GB with the given profile ('3g.40gb') as GPU instance
    `instance`, with the profile id, slices and memory NVML reports for it."""
    profile_id = next(pid for pid, name in A100_80GB_PROFILES.values() if name == f"MIG {profile}")
    slices = int(profile.split("g.", 1)[0])
    memory_mb = {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192, "4g.40gb": 40192}.get(
        profile, 81050
    )
    return FakeMig(
        uuid=uuid,
        profile_id=profile_id,
        gpu_instance_id=instance,
        gpu_slices=slices,
        compute_slices=slices,
        memory_mb=memory_mb,
        name=f"NVIDIA A100-SXM4-80GB MIG {profile}",
    )


@dataclass
class FakeEventSet:
    """What nvmlEventSetCreate returns: the devices registered on it, by event type mask."""

    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event types
    pending: list[SimpleNamespace] = field(default_factory=list)
    freed: bool = False


class FakeNvml:
    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_loaded: bool = True,
        instance_queries_allowed: bool = True,
        profiles: dict[int, tuple[int, str]] | None = None,
    ) -> None:
        self.gpus = gpus
        self.driver_loaded = driver_loaded
        self.instance_queries_allowed = instance_queries_allowed
        self.profiles = A100_80GB_PROFILES if profiles is None else profiles
        self.init_calls = 0
        self.shutdown_calls = 0
        self.event_sets: list[FakeEventSet] = []
        self.waits: list[int] = []  # the timeouts (ms) nvmlEventSetWait_v2 was called with

    # --- what the test does to the hardware -------------------------------------------------

    def lose(self, index: int) -> None:
        """GPU `index` falls off the bus: every query of it answers GPU_IS_LOST from now on."""
        self.gpus[index].lost = True

    def recover(self, index: int) -> None:
        """GPU `index` is back (reset, or the node was serviced)."""
        self.gpus[index].lost = False

    def reconfigure_mig(self, index: int, layout: list[FakeMig]) -> None:
        """Give GPU `index` a new MIG layout (MIG mode on; an empty layout: MIG mode off).
        Refused with IN_USE while a MIG device of it has processes, as the real tools are."""
        gpu = self.gpus[index]
        if any(mig is not None and mig.processes for mig in gpu.mig_slots):
            raise NVMLError(NVML_ERROR_IN_USE)
        gpu.mig_enabled = bool(layout)
        gpu.mig_slots = list(layout)

    def xid(self, index: int, code: int) -> None:
        """The driver reports Xid `code` on GPU `index` (to every event set it is registered
        on for critical Xid errors)."""
        for events in self.event_sets:
            if events.registered.get(index, 0) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                events.pending.append(
                    SimpleNamespace(
                        device=("gpu", index),
                        eventType=NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                        eventData=code,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
                )

    # --- events -----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        events = FakeEventSet()
        self.event_sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: tuple, types: int, events: FakeEventSet) -> None:
        if handle[0] == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._readable(handle)
        events.registered[handle[1]] = events.registered.get(handle[1], 0) | types

    def nvmlEventSetWait_v2(self, events: FakeEventSet, timeout_ms: int) -> SimpleNamespace:
        self.waits.append(timeout_ms)
        if not events.pending:
            raise NVMLError(NVML_ERROR_TIMEOUT)  # the real call would have waited timeout_ms
        return events.pending.pop(0)

    def nvmlEventSetFree(self, events: FakeEventSet) -> None:
        events.freed = True
        self.event_sets.remove(events)

    # --- library ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if not self.driver_loaded:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    # --- devices (handles are tuples: ("gpu", i) or ("mig", i, slot)) ----------------------

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return ("gpu", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return ("gpu", i)
            for slot, mig in enumerate(gpu.mig_slots):
                if mig is not None and mig.uuid == uuid:
                    return ("mig", i, slot)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def _gpu(self, handle: tuple) -> FakeGpu:
        return self.gpus[handle[1]]

    def _mig(self, handle: tuple) -> FakeMig:
        mig = self._gpu(handle).mig_slots[handle[2]]
        assert mig is not None
        return mig

    def nvmlDeviceGetUUID(self, handle: tuple) -> str | bytes:
        self._readable(handle)
        if handle[0] == "mig":
            return self._mig(handle).uuid
        return self._gpu(handle).uuid.encode()  # older pynvml releases return bytes

    def nvmlDeviceGetName(self, handle: tuple) -> str:
        self._readable(handle)
        return self._mig(handle).name if handle[0] == "mig" else self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: tuple) -> SimpleNamespace:
        self._readable(handle)
        if handle[0] == "mig":
            mig = self._mig(handle)
            return SimpleNamespace(total=mig.memory_mb * MIB, used=mig.used_mb * MIB)
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.memory_mb * MIB, used=gpu.used_mb * MIB)

    def _readable(self, handle: tuple) -> None:
        if self._gpu(handle).lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetUtilizationRates(self, handle: tuple) -> SimpleNamespace:
        self._readable(handle)
        gpu = self._gpu(handle)
        if handle[0] == "mig" or gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # not on MIG, nor on a GPU in MIG mode
        return SimpleNamespace(gpu=gpu.util_pct, memory=gpu.mem_util_pct)

    def nvmlDeviceGetPowerUsage(self, handle: tuple) -> int:
        """Milliwatts, of the physical GPU."""
        self._readable(handle)
        if handle[0] == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle).power_mw

    def nvmlDeviceGetTemperature(self, handle: tuple, sensor: int) -> int:
        self._readable(handle)
        if handle[0] == "mig" or sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle).temperature_c

    @staticmethod
    def _process_info(process: FakeProcess) -> SimpleNamespace:
        used = None if process.used_mb is None else process.used_mb * MIB
        return SimpleNamespace(
            pid=process.pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple) -> list[SimpleNamespace]:
        self._readable(handle)
        if handle[0] == "mig":
            return [self._process_info(p) for p in self._mig(handle).processes]
        gpu = self._gpu(handle)
        found = list(gpu.processes)
        if gpu.mig_enabled:  # the GPU's list holds its MIG devices' processes (root agent)
            found += [p for mig in gpu.mig_slots if mig is not None for p in mig.processes]
        if gpu.mps_server_pid is not None:
            found.append(FakeProcess(pid=gpu.mps_server_pid, used_mb=None))
        return [self._process_info(p) for p in found]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: tuple) -> list[SimpleNamespace]:
        self._readable(handle)
        if handle[0] == "mig":
            return []
        return [self._process_info(p) for p in self._gpu(handle).mps_clients]

    # --- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: tuple) -> list[int]:
        self._readable(handle)
        gpu = self._gpu(handle)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = 1 if gpu.mig_enabled else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple) -> int:
        return 7 if self._gpu(handle).mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple, index: int) -> tuple:
        slots = self._gpu(handle).mig_slots
        if index >= len(slots) or slots[index] is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: tuple, profile: int) -> SimpleNamespace:
        if profile not in self.profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        profile_id, name = self.profiles[profile]
        return SimpleNamespace(id=profile_id, name=name.encode())

    def nvmlDeviceGetGpuInstanceId(self, mig_handle: tuple) -> int:
        return self._mig(mig_handle).gpu_instance_id

    def nvmlDeviceGetGpuInstanceById(self, handle: tuple, instance_id: int) -> tuple:
        if not self.instance_queries_allowed:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        return ("gi", handle[1], instance_id)

    def nvmlGpuInstanceGetInfo(self, instance: tuple) -> SimpleNamespace:
        gpu = self.gpus[instance[1]]
        for mig in gpu.mig_slots:
            if mig is not None and mig.gpu_instance_id == instance[2]:
                return SimpleNamespace(id=instance[2], profileId=mig.profile_id)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetAttributes(self, mig_handle: tuple) -> SimpleNamespace:
        mig = self._mig(mig_handle)
        return SimpleNamespace(
            gpuInstanceSliceCount=mig.gpu_slices,
            computeInstanceSliceCount=mig.compute_slices,
            memorySizeMB=mig.memory_mb,
        )

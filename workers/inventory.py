"""What GPUs this node has: read through NVML where a driver is present, else described.

With an NVIDIA driver, `discover()` reads every GPU through pynvml (nvidia-ml-py): UUID,
model, memory, MIG mode and the MIG devices with their profiles. NVML cannot tell that an
operator runs an MPS control daemon on a GPU, so MPS shares are declared by configuration
(`PORTAL_AGENT_MPS`, e.g. `3=4` or `GPU-...=4`).

Without a driver (pynvml missing, or NVMLError on init) the node's inventory is *described*:
from `PORTAL_AGENT_INVENTORY` (inline JSON or a path to a JSON file) or the default of one
node with 2 whole GPUs, 1 GPU split into MIG 3g.40gb + 2g.20gb + 2 x 1g.10gb and 1 GPU in
MPS mode with 4 shares. Described UUIDs are derived from the node name and GPU index, so a
node that restarts registers the same ids again. The format is in docs/agent.md.

The agent reads its inventory again on SIGHUP and every PORTAL_AGENT_INVENTORY_S
(`workers.hardware`). A GPU whose NVML queries answer GPU_IS_LOST (it fell off the bus), or
that NVML reported a critical Xid error for (`XidWatch`, polled without blocking), is left
out of `gpus` and listed in `lost` with the reason; `slices_gone` says why each slice of the
last inventory is no longer offered (GPU_LOST, MIG_RECONFIGURED, GPU_RECONFIGURED), for the
agent (which stops the attempts on them) and the portal (which records it on the node).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.protocol import Gpu, Inventory, LostGpu, MigDevice, ProtocolError

log = logging.getLogger("workers.inventory")

DEFAULT_MODEL = "NVIDIA A100-SXM4-80GB"
DEFAULT_MEMORY_MB = 81920
DEFAULT_DESCRIPTION: dict[str, Any] = {
    "gpus": [
        {"mode": "whole", "count": 2},
        {"mode": "mig", "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
        {"mode": "mps", "mps_shares": 4},
    ]
}
GPU_SOURCES = ("auto", "nvml", "described")

# A MIG GPU has at most 7 compute slices (A100, H100, H200); names carry the memory in GB.
MIG_MAX_SLICES = 7
MIG_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+me|\+gfx|-me)?$")
MIB = 1024 * 1024

# Why a slice is no longer offered, first in the text of the reason (like MPS_SERVER_DIED).
GPU_LOST = "GPU_LOST"
MIG_RECONFIGURED = "MIG_RECONFIGURED"
GPU_RECONFIGURED = "GPU_RECONFIGURED"
# NVML's return codes (pynvml's NVML_ERROR_* values), and its event API's constants.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
# Xid errors an application causes (a bad kernel, an MMU fault of its own, a reset it asked
# for): its job fails, the GPU is fine. The NVIDIA device plugin for Kubernetes skips the
# same ones by default; every other critical Xid takes the GPU out of service.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class InventoryError(ValueError):
    """A described inventory or an MPS declaration that cannot be used; says which field."""


def stable_uuid(prefix: str, *parts: object) -> str:
    """A UUID-shaped id (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) derived from `parts`."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


# --- described inventory ----------------------------------------------------------------------


def load_description(value: str | None) -> dict[str, Any]:
    """The described inventory from PORTAL_AGENT_INVENTORY: inline JSON, a file path, or unset."""
    if value is None or not value.strip():
        return DEFAULT_DESCRIPTION
    text = value
    if not value.lstrip().startswith("{"):
        path = Path(value).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise InventoryError(f"cannot read inventory file {path}: {exc.strerror}") from None
    try:
        description = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(description, dict):
        raise InventoryError('must be a JSON object like {"gpus": [...]}')
    return description


def _field(entry: dict[str, Any], name: str, kind: type, default: Any, path: str) -> Any:
    value = entry.get(name, default)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise InventoryError(f"{path}.{name}: must be {kind.__name__}; got {value!r}")
    return value


def _check_mig_layout(profiles: list[Any], memory_mb: int, path: str) -> None:
    slices = gigabytes = 0
    for j, profile in enumerate(profiles):
        match = MIG_PROFILE.match(profile) if isinstance(profile, str) else None
        if match is None:
            raise InventoryError(
                f"{path}.mig[{j}]: {profile!r} is not a MIG profile name like '1g.10gb' or '3g.40gb'"
            )
        slices += int(match.group(2))
        gigabytes += int(match.group(3))
    if slices > MIG_MAX_SLICES:
        raise InventoryError(
            f"{path}.mig: uses {slices} compute slices; a GPU has {MIG_MAX_SLICES}"
        )
    if gigabytes * 1024 > memory_mb:
        raise InventoryError(f"{path}.mig: needs {gigabytes} GB; the GPU has {memory_mb} MB")


def _described_gpu(node: str, index: int, entry: dict[str, Any], path: str) -> Gpu:
    mode = entry.get("mode", "whole")
    if mode not in ("whole", "mig", "mps"):
        raise InventoryError(f"{path}.mode: must be one of 'whole', 'mig', 'mps'; got {mode!r}")
    memory_mb = _field(entry, "memory_mb", int, DEFAULT_MEMORY_MB, path)
    # Checked here: a msgspec Struct checks its constraints when decoded, not when built, so
    # Gpu(memory_mb=-5) would only be refused by the portal, heartbeat after heartbeat.
    if memory_mb < 1:
        raise InventoryError(f"{path}.memory_mb: must be positive; got {memory_mb}")
    model = _field(entry, "model", str, DEFAULT_MODEL, path)
    if not model.strip():
        raise InventoryError(f"{path}.model: must be a non-empty string; got {model!r}")
    profiles = _field(entry, "mig", list, [], path)
    shares = _field(entry, "mps_shares", int, 0, path)
    if mode == "mig":
        if not profiles:
            raise InventoryError(f"{path}.mig: list the MIG profiles, e.g. ['3g.40gb', '1g.10gb']")
        _check_mig_layout(profiles, memory_mb, path)
    elif profiles:
        raise InventoryError(f"{path}.mig: only for mode 'mig'")
    if mode == "mps" and shares < 1:
        raise InventoryError(f"{path}.mps_shares: must be 1 or more for mode 'mps'; got {shares}")
    if mode != "mps" and "mps_shares" in entry:
        raise InventoryError(f"{path}.mps_shares: only for mode 'mps'")
    try:
        return Gpu(
            uuid=stable_uuid("GPU", node, index),
            index=index,
            model=model,
            memory_mb=memory_mb,
            mode=mode,
            mig=tuple(
                MigDevice(uuid=stable_uuid("MIG", node, index, j, p), profile=p)
                for j, p in enumerate(profiles)
            ),
            mps_shares=shares,
        )
    except ProtocolError as exc:  # the contract's rules across fields (__post_init__)
        raise InventoryError(f"{path}.{exc.field}: {exc.problem}") from None


GPU_ENTRY_KEYS = ("model", "memory_mb", "mode", "mig", "mps_shares", "count")


def described_inventory(node: str, description: Mapping[str, Any]) -> Inventory:
    """Build the inventory a description declares; GPUs are indexed in the order listed."""
    unknown = sorted(set(description) - {"hostname", "gpus"})
    if unknown:
        raise InventoryError(f"{unknown[0]}: unknown field (allowed: hostname, gpus)")
    entries = description.get("gpus")
    if not isinstance(entries, list) or not entries:
        raise InventoryError("gpus: must be a non-empty list of GPU entries")
    hostname = description.get("hostname", node)
    if not isinstance(hostname, str) or not hostname:
        raise InventoryError(f"hostname: must be a non-empty string; got {hostname!r}")
    gpus: list[Gpu] = []
    for i, entry in enumerate(entries):
        path = f"gpus[{i}]"
        if not isinstance(entry, dict):
            raise InventoryError(f"{path}: must be an object like {{'mode': 'whole'}}")
        unknown = sorted(set(entry) - set(GPU_ENTRY_KEYS))
        if unknown:
            raise InventoryError(
                f"{path}.{unknown[0]}: unknown field (allowed: {', '.join(GPU_ENTRY_KEYS)})"
            )
        count = _field(entry, "count", int, 1, path)
        if count < 1:
            raise InventoryError(f"{path}.count: must be 1 or more; got {count}")
        for _ in range(count):
            gpus.append(_described_gpu(node, len(gpus), entry, path))
    try:
        return Inventory(hostname=hostname, driver="described", gpus=tuple(gpus))
    except ProtocolError as exc:
        raise InventoryError(str(exc)) from None


# --- NVML discovery ---------------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False  # NOT_SUPPORTED: a GPU without MIG
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _gpu_instance_profile_names(nvml: Any, handle: Any) -> dict[int, str]:
    """Profile id -> name ('1g.10gb') for the profiles this GPU supports."""
    names: dict[int, str] = {}
    for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except nvml.NVMLError:
            continue  # not supported on this GPU, or a driver without the v2 call
        name = _text(getattr(info, "name", b""))
        if name:
            names[info.id] = name.removeprefix("MIG ").strip()
    return names


def _mig_profile(nvml: Any, parent: Any, mig: Any, names: dict[int, str]) -> str:
    """The MIG device's profile name; a compute instance smaller than its GPU instance gets
    the `<n>c.` prefix nvidia-smi shows (for example `1c.3g.40gb`)."""
    attrs = nvml.nvmlDeviceGetAttributes(mig)
    name = ""
    try:
        instance = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(mig))
        name = names.get(nvml.nvmlGpuInstanceGetInfo(instance).profileId, "")
    except nvml.NVMLError:
        pass  # some drivers need privileges for instance queries; fall back below
    if not name:
        device_name = _text(nvml.nvmlDeviceGetName(mig))
        name = device_name.split("MIG ", 1)[1].strip() if "MIG " in device_name else ""
    if not name:
        gigabytes = round(attrs.memorySizeMB / 1024)
        name = f"{attrs.gpuInstanceSliceCount}g.{gigabytes}gb"
    if attrs.computeInstanceSliceCount < attrs.gpuInstanceSliceCount and "c." not in name:
        name = f"{attrs.computeInstanceSliceCount}c.{name}"
    return name


def _mig_devices(nvml: Any, handle: Any) -> tuple[MigDevice, ...]:
    names = _gpu_instance_profile_names(nvml, handle)
    devices: list[MigDevice] = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue  # NOT_FOUND: no MIG device in this slot
        uuid = _text(nvml.nvmlDeviceGetUUID(mig))
        devices.append(MigDevice(uuid=uuid, profile=_mig_profile(nvml, handle, mig, names)))
    return tuple(devices)


def nvml_inventory(
    nvml: Any,
    *,
    hostname: str,
    mps_shares: Mapping[str, int],
    previous: Inventory | None = None,
    unhealthy: Mapping[str, str] | None = None,
) -> Inventory:
    """Read the node's GPUs through an initialised NVML. `mps_shares` maps a GPU index (as a
    string) or UUID to its declared number of MPS shares.

    A GPU whose queries answer GPU_IS_LOST is listed in `lost` (its UUID from NVML if it still
    says, else from `previous`, the last inventory, at the same index; one known to neither is
    left out, with a warning). GPUs in `unhealthy` (UUID -> why: a critical Xid) are listed in
    `lost` too. Any other NVML error is raised."""
    gpus: list[Gpu] = []
    lost: list[LostGpu] = []
    claimed: set[str] = set()
    known = {g.index: g.uuid for g in previous.gpus} if previous is not None else {}
    if previous is not None:
        known.update((g.index, g.uuid) for g in previous.lost)
    for index in range(nvml.nvmlDeviceGetCount()):
        uuid = known.get(index, "")
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            key = uuid if uuid in mps_shares else str(index)
            shares = mps_shares.get(key, 0)
            if shares:
                claimed.add(key)
            gpu = _nvml_gpu(nvml, handle, index=index, uuid=uuid, key=key, shares=shares)
        except nvml.NVMLError as error:
            if getattr(error, "value", None) != NVML_ERROR_GPU_IS_LOST:
                raise
            claimed.update(k for k in (uuid, str(index)) if k in mps_shares)
            if not uuid:
                log.warning("GPU %d answers GPU_IS_LOST and its UUID is unknown: left out", index)
                continue
            off = f"{GPU_LOST}: NVML answers GPU_IS_LOST for GPU {index} ({uuid}): off the bus"
            lost.append(LostGpu(uuid=uuid, index=index, reason=off))
            continue
        marked = (unhealthy or {}).get(gpu.uuid)
        if marked is not None:
            lost.append(LostGpu(uuid=gpu.uuid, index=index, reason=marked[:500]))
            continue
        gpus.append(gpu)
    if previous is not None:
        # A GPU NVML no longer counts at all (the driver dropped it after it fell off).
        seen = {g.uuid for g in gpus} | {g.uuid for g in lost}
        earlier = [(g.uuid, g.index) for g in previous.gpus]
        earlier += [(g.uuid, g.index) for g in previous.lost]
        for uuid, index in earlier:
            if uuid not in seen:
                dropped = f"{GPU_LOST}: GPU {index} ({uuid}) is no longer found by NVML"
                lost.append(LostGpu(uuid=uuid, index=index, reason=dropped))
    unknown = sorted(set(mps_shares) - claimed)
    if unknown:
        raise InventoryError(f"PORTAL_AGENT_MPS: no GPU {unknown[0]} on this node")
    return Inventory(hostname=hostname, driver="nvml", gpus=tuple(gpus), lost=tuple(lost))


def _nvml_gpu(nvml: Any, handle: Any, *, index: int, uuid: str, key: str, shares: int) -> Gpu:
    mig = _mig_devices(nvml, handle) if _mig_enabled(nvml, handle) else None
    if shares and mig is not None:
        raise InventoryError(f"PORTAL_AGENT_MPS: GPU {key} is in MIG mode, not MPS")
    return Gpu(
        uuid=uuid,
        index=index,
        model=_text(nvml.nvmlDeviceGetName(handle)),
        memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB),
        mode="mig" if mig is not None else ("mps" if shares else "whole"),
        mig=mig or (),
        mps_shares=shares,
    )


def parse_mps_shares(value: str | None) -> dict[str, int]:
    """PORTAL_AGENT_MPS: comma-separated `<gpu index or uuid>=<shares>`, e.g. `3=4`."""
    shares: dict[str, int] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        gpu, _, count = item.strip().partition("=")
        if not gpu or not count.isdigit() or int(count) < 1:
            raise InventoryError(
                f"PORTAL_AGENT_MPS: {item.strip()!r} must be <gpu index or uuid>=<shares>, e.g. 3=4"
            )
        shares[gpu] = int(count)
    return shares


def open_nvml(nvml: Any = None) -> tuple[Any, str]:
    """Import (unless given) and initialise NVML. Returns (module, "") or (None, why not)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return None, f"NVML init failed: {exc}"
    return nvml, ""


def discover(
    node: str,
    *,
    source: str = "auto",
    description: str | None = None,
    mps_shares: str | None = None,
    nvml: Any = None,
    hostname: str | None = None,
    previous: Inventory | None = None,
    unhealthy: Mapping[str, str] | None = None,
) -> Inventory:
    """The node's inventory. `source` is 'auto' (NVML when it initialises, else described),
    'nvml' (fail without a driver) or 'described'. `description` and `mps_shares` are the raw
    values of PORTAL_AGENT_INVENTORY and PORTAL_AGENT_MPS; `nvml` replaces the pynvml module.
    `previous` and `unhealthy` are for a re-read (see `nvml_inventory`)."""
    if source not in GPU_SOURCES:
        raise InventoryError(f"PORTAL_AGENT_GPU_SOURCE: must be one of {', '.join(GPU_SOURCES)}")
    if source != "described":
        opened, why_not = open_nvml(nvml)
        if opened is not None:
            try:
                return nvml_inventory(
                    opened,
                    hostname=hostname or node,
                    mps_shares=parse_mps_shares(mps_shares),
                    previous=previous,
                    unhealthy=unhealthy,
                )
            finally:
                opened.nvmlShutdown()
        if source == "nvml":
            raise InventoryError(f"PORTAL_AGENT_GPU_SOURCE=nvml but {why_not}")
    try:
        return described_inventory(node, load_description(description))
    except InventoryError as exc:
        raise InventoryError(f"PORTAL_AGENT_INVENTORY: {exc}") from None


# --- what changed -----------------------------------------------------------------------------


def slices_gone(old: Inventory, new: Inventory) -> dict[str, str]:
    """Slice key -> why it is no longer offered, for every slice of `old` that `new` lacks."""
    offered = new.slice_keys()
    return {
        key: slice_gone_reason(gpu.uuid, gpu.index, new, was_mig=gpu.mode == "mig")
        for key, gpu in old.slice_keys().items()
        if key not in offered
    }


def slice_gone_reason(gpu_uuid: str, gpu_index: int, new: Inventory, *, was_mig: bool) -> str:
    """Why a slice of GPU `gpu_uuid` is not in the inventory `new`: its GPU is lost or gone
    (GPU_LOST), or its GPU is there with another MIG layout (MIG_RECONFIGURED) or mode or
    number of MPS shares (GPU_RECONFIGURED)."""
    for lost in new.lost:
        if lost.uuid == gpu_uuid:
            return lost.reason
    gpu = next((g for g in new.gpus if g.uuid == gpu_uuid), None)
    if gpu is None:
        return f"{GPU_LOST}: GPU {gpu_index} ({gpu_uuid}) is no longer in the node's inventory"
    if gpu.mode == "mig":
        layout = ", ".join(m.profile for m in gpu.mig) or "no MIG devices"
        return f"{MIG_RECONFIGURED}: GPU {gpu.index} ({gpu_uuid}) now has MIG {layout}"
    if was_mig:
        return f"{MIG_RECONFIGURED}: GPU {gpu.index} ({gpu_uuid}) is no longer in MIG mode"
    shares = f" with {gpu.mps_shares} shares" if gpu.mode == "mps" else ""
    return f"{GPU_RECONFIGURED}: GPU {gpu.index} ({gpu_uuid}) is now in {gpu.mode} mode{shares}"


# --- Xid errors -------------------------------------------------------------------------------


class XidWatch:
    """Critical Xid errors as NVML reports them: an event set with every GPU registered for
    nvmlEventTypeXidCriticalError, read without blocking (a wait of 0 ms) on each `poll()`.

    A GPU or driver that does not offer the event (NOT_SUPPORTED: some GPUs, MIG on older
    drivers) is simply not watched; GPU_IS_LOST still shows in the next inventory read."""

    def __init__(self, nvml: Any, *, ignore: frozenset[int] = APPLICATION_XIDS) -> None:
        self._nvml = nvml
        self.ignore = ignore
        self.watched: list[str] = []
        self._set: Any = None
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.warning("Xid errors are not watched: nvmlEventSetCreate failed: %s", error)

    def register(self, inventory: Inventory) -> None:
        """Watch every GPU of `inventory` not watched yet (again after a re-read)."""
        nvml = self._nvml
        if self._set is None:
            return
        for gpu in inventory.gpus:
            if gpu.uuid in self.watched:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self._set)
            except nvml.NVMLError as error:
                log.warning("GPU %s: Xid errors not watched (%s)", gpu.uuid, error)
                continue
            self.watched.append(gpu.uuid)

    def poll(self, limit: int = 100) -> list[tuple[str, int]]:
        """The critical Xid errors reported since the last poll, as (GPU UUID or "" when NVML
        cannot say which, Xid), application Xids left out; never blocks."""
        nvml = self._nvml
        found: list[tuple[str, int]] = []
        if self._set is None:
            return found
        for _ in range(limit):
            try:
                event = nvml.nvmlEventSetWait_v2(self._set, 0)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) != NVML_ERROR_TIMEOUT:
                    log.warning("reading Xid events failed: %s", error)
                break  # TIMEOUT: nothing more to read
            if not event.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            xid = int(event.eventData)
            if xid in self.ignore:
                log.info("Xid %d (caused by an application) on a GPU: not taken out", xid)
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError:
                uuid = ""
            found.append((uuid, xid))
        return found

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._set)
            self._set = None

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
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.protocol import Gpu, Inventory, MigDevice, ProtocolError

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


def nvml_inventory(nvml: Any, *, hostname: str, mps_shares: Mapping[str, int]) -> Inventory:
    """Read the node's GPUs through an initialised NVML. `mps_shares` maps a GPU index (as a
    string) or UUID to its declared number of MPS shares."""
    gpus: list[Gpu] = []
    claimed: set[str] = set()
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        mig = _mig_devices(nvml, handle) if _mig_enabled(nvml, handle) else None
        key = uuid if uuid in mps_shares else str(index)
        shares = mps_shares.get(key, 0)
        if shares:
            claimed.add(key)
            if mig is not None:
                raise InventoryError(f"PORTAL_AGENT_MPS: GPU {key} is in MIG mode, not MPS")
        gpus.append(
            Gpu(
                uuid=uuid,
                index=index,
                model=_text(nvml.nvmlDeviceGetName(handle)),
                memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                mode="mig" if mig is not None else ("mps" if shares else "whole"),
                mig=mig or (),
                mps_shares=shares,
            )
        )
    unknown = sorted(set(mps_shares) - claimed)
    if unknown:
        raise InventoryError(f"PORTAL_AGENT_MPS: no GPU {unknown[0]} on this node")
    return Inventory(hostname=hostname, driver="nvml", gpus=tuple(gpus))


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
) -> Inventory:
    """The node's inventory. `source` is 'auto' (NVML when it initialises, else described),
    'nvml' (fail without a driver) or 'described'. `description` and `mps_shares` are the raw
    values of PORTAL_AGENT_INVENTORY and PORTAL_AGENT_MPS; `nvml` replaces the pynvml module."""
    if source not in GPU_SOURCES:
        raise InventoryError(f"PORTAL_AGENT_GPU_SOURCE: must be one of {', '.join(GPU_SOURCES)}")
    if source != "described":
        opened, why_not = open_nvml(nvml)
        if opened is not None:
            try:
                return nvml_inventory(
                    opened, hostname=hostname or node, mps_shares=parse_mps_shares(mps_shares)
                )
            finally:
                opened.nvmlShutdown()
        if source == "nvml":
            raise InventoryError(f"PORTAL_AGENT_GPU_SOURCE=nvml but {why_not}")
    try:
        return described_inventory(node, load_description(description))
    except InventoryError as exc:
        raise InventoryError(f"PORTAL_AGENT_INVENTORY: {exc}") from None

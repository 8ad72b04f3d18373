"""The inventory: make a node's Gpu and Slice rows match what its agent reports.

Rows are never deleted (allocations and history point at them): a GPU or slice that vanished
is marked ``present=False`` and comes back under the same key. What a slice is worth in GPU
units is decided here, once, from its kind and MIG profile. Every change gets a new
``InventoryVersion`` token, so what is derived from the inventory can be kept until then.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from uuid import uuid4

from django.conf import settings
from django.db import transaction

from portal.cluster.models import Gpu, InventoryVersion, Node, Slice
from portal.compiled_queries import compiled_rows
from scheduler.model import MIG_COMPUTE_SLICES_PER_GPU, SliceKind
from scheduler.units import mig_units, mps_units
from workers.protocol import Gpu as InventoryGpu
from workers.protocol import mps_slice_key

log = logging.getLogger("portal.cluster")

# NVML names compute instances smaller than their GPU instance "1c.3g.40gb".
_MIG_NAME = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb")


@dataclass(frozen=True, slots=True)
class WantedSlice:
    gpu_uuid: str
    kind: str
    profile: str
    mig_uuid: str
    units: float


def wanted_slices(gpus: Iterable[InventoryGpu]) -> dict[str, WantedSlice]:
    """Slice key -> what the slice should be, for an inventory's GPUs."""
    wanted: dict[str, WantedSlice] = {}
    for gpu in gpus:
        if gpu.mode == "mig":
            for mig in gpu.mig:
                units = _mig_slice_units(mig.profile)
                if units is None:
                    log.warning(
                        "MIG device %s has unknown profile %r: not offered", mig.uuid, mig.profile
                    )
                    continue
                wanted[mig.uuid] = WantedSlice(
                    gpu.uuid, SliceKind.MIG, mig.profile, mig.uuid, units
                )
        elif gpu.mode == "mps":
            units = mps_units(gpu.mps_shares)
            for i in range(gpu.mps_shares):
                wanted[mps_slice_key(gpu.uuid, i)] = WantedSlice(
                    gpu.uuid, SliceKind.MPS, "", "", units
                )
        else:
            wanted[gpu.uuid] = WantedSlice(gpu.uuid, SliceKind.WHOLE, "", "", 1.0)
    return wanted


def _mig_slice_units(profile: str) -> float | None:
    try:
        return mig_units(profile)
    except ValueError:
        pass
    # A profile the core's table lacks (a compute instance "1c.3g.40gb", a new GPU): its
    # compute slices out of 7 still price it.
    match = _MIG_NAME.match(profile.strip().lower())
    if match is None:
        return None
    return int(match.group(1) or match.group(2)) / MIG_COMPUTE_SLICES_PER_GPU


@dataclass(frozen=True, slots=True)
class GoneSlice:
    """A slice the node's inventory no longer lists (present -> absent)."""

    pk: int
    key: str
    kind: str
    gpu_uuid: str
    gpu_index: int


@dataclass(slots=True)
class InventoryChange:
    """What one sync changed: true when anything did. ``gone``: slices that were offered and
    are not now; ``new``: slice keys offered now that were not (created or back);
    ``gpus_gone`` / ``gpus_back`` / ``gpus_new``: (UUID, index) of GPUs that left the
    inventory, came back into it, or joined a node that had GPUs already. ``registered``: the
    node had no GPU before (its first inventory)."""

    changed: bool = False
    registered: bool = False
    gone: list[GoneSlice] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    gpus_gone: list[tuple[str, int]] = field(default_factory=list)
    gpus_back: list[tuple[str, int]] = field(default_factory=list)
    gpus_new: list[tuple[str, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.changed


def inventory_changed() -> None:
    """Say that GPUs or slices were added, changed or removed (``InventoryVersion``): call it
    in the transaction that changes them."""
    InventoryVersion.objects.update_or_create(pk=1, defaults={"token": uuid4().hex})
    # This process sees its own change at once; the others within INVENTORY_RECHECK_S.
    transaction.on_commit(_forget_inventory_version)


@dataclass(frozen=True, slots=True)
class _VersionRead:
    token: str | None
    read_at: float  # time.monotonic()


_version_read: _VersionRead | None = None


def inventory_version() -> str | None:
    """The token of the inventory as it is now (None until it first changed), as read at most
    ``settings.INVENTORY_RECHECK_S`` seconds ago by this process.

    Every submit asks it (``portal.jobs.cluster_fit``); a GPU comes or goes a few times a day,
    so a second's delay in seeing it saves a round trip on nearly every submit. Read through
    SQL compiled once per process (``compiled_rows``; a prepared statement on PostgreSQL)."""
    global _version_read
    read = _version_read
    now = time.monotonic()
    if read is not None and now - read.read_at < settings.INVENTORY_RECHECK_S:
        return read.token
    rows = compiled_rows(
        key="inventory-version",
        build=lambda values: (
            InventoryVersion.objects.filter(pk=1).order_by("pk").values("token")[:1]
        ),
        values=(),
    )
    token = rows[0]["token"] if rows else None
    _version_read = _VersionRead(token=token, read_at=now)
    return token


def _forget_inventory_version() -> None:
    global _version_read
    _version_read = None


def sync_inventory(node: Node, gpus: tuple[InventoryGpu, ...]) -> InventoryChange:
    """Make the node's Gpu and Slice rows match the inventory; says what changed (and bumps
    the inventory's version when anything did)."""
    change = _sync_gpus(node, gpus)
    if change:
        inventory_changed()
    return change


def _sync_gpus(node: Node, gpus: tuple[InventoryGpu, ...]) -> InventoryChange:
    change = InventoryChange()
    by_uuid = {g.uuid: g for g in gpus}
    rows = {
        g.uuid: g
        for g in Gpu.objects.filter(node=node) | Gpu.objects.filter(uuid__in=list(by_uuid))
    }
    change.registered = not any(row.node_id == node.pk for row in rows.values())
    for uuid, gpu in by_uuid.items():
        values = {
            "node_id": node.pk,
            "index": gpu.index,
            "model": gpu.model,
            "memory_mb": gpu.memory_mb,
            "mode": gpu.mode,
            "present": True,
        }
        row = rows.get(uuid)
        if row is None:
            rows[uuid] = Gpu.objects.create(uuid=uuid, **values)
            change.changed = True
            if not change.registered:
                change.gpus_new.append((uuid, gpu.index))
        elif any(getattr(row, k) != v for k, v in values.items()):
            if not row.present or row.node_id != node.pk:
                change.gpus_back.append((uuid, gpu.index))
            Gpu.objects.filter(pk=row.pk).update(**values)
            change.changed = True
    gone = [row for uuid, row in rows.items() if uuid not in by_uuid and row.present]
    if gone:
        Gpu.objects.filter(pk__in=[row.pk for row in gone]).update(present=False)
        change.changed = True
        change.gpus_gone.extend((row.uuid, row.index) for row in gone)
    _sync_slices(node, rows, wanted_slices(gpus), change)
    return change


def _sync_slices(
    node: Node,
    gpu_rows: Mapping[str, Gpu],
    wanted: Mapping[str, WantedSlice],
    change: InventoryChange,
) -> None:
    existing = {
        s.key: s
        for s in (
            Slice.objects.filter(gpu__node=node) | Slice.objects.filter(key__in=list(wanted))
        ).select_related("gpu")
    }
    to_create = []
    for key, want in wanted.items():
        values = {
            "gpu_id": gpu_rows[want.gpu_uuid].pk,
            "kind": want.kind,
            "profile": want.profile,
            "mig_uuid": want.mig_uuid,
            "units": want.units,
            "present": True,
        }
        row = existing.get(key)
        if row is None:
            to_create.append(Slice(key=key, **values))
            change.new.append(key)
        elif any(getattr(row, k) != v for k, v in values.items()):
            if not row.present:
                change.new.append(key)
            Slice.objects.filter(pk=row.pk).update(**values)
            change.changed = True
    if to_create:
        Slice.objects.bulk_create(to_create)
        change.changed = True
    gone = [row for key, row in existing.items() if key not in wanted and row.present]
    if gone:
        Slice.objects.filter(pk__in=[row.pk for row in gone]).update(present=False)
        change.changed = True
        change.gone.extend(
            GoneSlice(
                pk=row.pk,
                key=row.key,
                kind=row.kind,
                gpu_uuid=row.gpu.uuid,
                gpu_index=row.gpu.index,
            )
            for row in gone
        )

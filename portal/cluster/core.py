"""The inventory in the scheduling core's terms: a ``Slice`` row as the core's ``Slice``.

The scheduling pass's snapshot and the submit-time check of what the cluster could ever hold
both read slices through this, so the core sees one cluster whoever asks.
"""

from __future__ import annotations

from scheduler.model import Slice as CoreSlice
from scheduler.model import SliceKind


def core_slice(
    key: str, kind: str, units: float, profile: str, gpu_uuid: str, model: str, node: str
) -> CoreSlice:
    """A slice row's values (its key, kind, units and MIG profile, its GPU's UUID and model,
    its node's name) as the core's ``Slice``: identified by its stable key."""
    return CoreSlice(
        id=key,
        node=node,
        gpu=gpu_uuid,
        kind=SliceKind(kind),
        units=units,
        model=model,
        profile=profile,
    )

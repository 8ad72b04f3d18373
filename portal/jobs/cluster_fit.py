"""Could any node of the cluster ever hold a GPU request? The check ``validate_job_request``
makes at submit, for the form and the API alike.

The verdict is the scheduling core's own: ``ClusterShape.request_info(request)`` and its
``could_ever_fit``, the rule behind the pending reason ``NO_MATCHING_SLICES`` (the matching
slices of one pool on one node, or of all nodes for a multi-node gang). It is asked about every
node that exists, whatever its state: a drained node may be put back and a lost one may
return, so only GPUs and slices its agent stopped reporting (``present=False``) are left out.
This module adds what the core does not do:

- it resolves a GPU model the way people type it to the exact name the inventory reports (the
  core matches ``GpuRequest.model`` to ``Slice.model`` by equality), see ``match_gpu_model``;
- it words a refusal with the largest request that would fit, or the kinds, profiles and
  models the cluster has.

A cluster where no agent has reported a GPU yet (a fresh install) refuses nothing: the request
is stored as given, with a note on its "submitted" event, and waits with the core's reason
until GPUs arrive.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from portal.cluster.core import core_slice
from portal.cluster.models import Slice
from portal.cluster.services import inventory_version
from scheduler.cluster import ClusterShape, build_shape
from scheduler.model import GpuRequest, SliceKind
from scheduler.model import Node as CoreNode
from scheduler.model import Slice as CoreSlice
from scheduler.units import MIG_PROFILES

# Said on the "submitted" event of a job accepted before any GPU was registered.
UNCHECKED_NOTE = (
    "not checked against the cluster: no GPU is registered yet (a GPU model must then be the "
    "exact name an agent will report)"
)

_KIND_PLURAL = {
    SliceKind.WHOLE: "whole GPUs (every GPU is split into MIG instances or MPS shares)",
    SliceKind.MIG: "MIG instances (no GPU is in MIG mode)",
    SliceKind.MPS: "MPS shares (no GPU is in MPS mode)",
}
_LISTED_SIZES = 5  # per-node sizes named in a message before "..."


# A process keeps the shape it built while the inventory's token stays the same, and this
# long at most (the safety net for a change made beside portal.cluster.services: the admin).
SHAPE_KEPT_S = 30.0


@dataclass(frozen=True)
class _KeptShape:
    token: str
    built_at: float  # time.monotonic()
    shape: ClusterShape | None


_kept: _KeptShape | None = None


def load_cluster_shape() -> ClusterShape | None:
    """The core's view of every registered node's present slices; None when there are none.

    Built from one query over every slice, and kept by the process until the inventory
    changes (``portal.cluster.services.inventory_version``, one small query a call):
    building it is what a submit cost most on a large cluster, and it changes only when a
    node's GPUs do. Node states are ignored on purpose (see the module's docstring).
    """
    global _kept
    token = inventory_version()
    kept = _kept
    if (
        kept is not None
        and token is not None
        and kept.token == token
        and time.monotonic() - kept.built_at < SHAPE_KEPT_S
    ):
        return kept.shape
    built_at = time.monotonic()
    shape = _build_cluster_shape()
    # Kept under the token read before the rows: a change committed in between makes the
    # next call see a newer token and build again.
    _kept = None if token is None else _KeptShape(token=token, built_at=built_at, shape=shape)
    return shape


def _build_cluster_shape() -> ClusterShape | None:
    rows = (
        Slice.objects.filter(present=True, gpu__present=True)
        .order_by("gpu__node__name", "gpu__index", "key")
        .values_list(
            "key", "kind", "units", "profile", "gpu__uuid", "gpu__model", "gpu__node__name"
        )
    )
    by_node: dict[str, list[CoreSlice]] = defaultdict(list)
    for key, kind, units, profile, gpu_uuid, model, node in rows:
        by_node[node].append(core_slice(key, kind, units, profile, gpu_uuid, model, node))
    if not by_node:
        return None
    return build_shape([CoreNode(name=name, slices=tuple(s)) for name, s in by_node.items()])


def match_gpu_model(text: str, models: Iterable[str]) -> tuple[str, ...]:
    """The models of ``models`` that ``text`` names, sorted.

    Case and runs of spaces do not matter. A model's exact name names it alone; otherwise
    ``text`` names every model whose name, or the part of it from the start of one of its
    words (words are separated by spaces), starts with ``text``: ``a100``, ``A100-SXM4`` and
    ``nvidia a100`` name ``NVIDIA A100-SXM4-80GB``; ``t4`` names ``Tesla T4``; ``80gb`` names
    ``NVIDIA H100 80GB HBM3`` but not ``NVIDIA A100-SXM4-80GB`` (a hyphen does not start a word).
    """
    wanted = _normal(text)
    names = sorted({model for model in models if model.strip()})
    if not wanted:
        return ()
    exact = tuple(model for model in names if _normal(model) == wanted)
    if exact:
        return exact
    return tuple(
        model for model in names if any(tail.startswith(wanted) for tail in _word_tails(model))
    )


def fit_cluster(
    gpu: GpuRequest, errors: dict[str, str]
) -> tuple[GpuRequest | None, tuple[str, ...]]:
    """``gpu`` with its model resolved, and notes for the job's events; or None (and errors)
    when no node of the cluster could ever hold it."""
    shape = load_cluster_shape()
    if shape is None:
        return gpu, (UNCHECKED_NOTE,)
    before = len(errors)
    kinds = _kinds(shape)
    if gpu.kind not in kinds:
        allowed = ", ".join(kind.value for kind in SliceKind if kind in kinds)
        errors["gpu.kind"] = f"this cluster has no {_KIND_PLURAL[gpu.kind]}; allowed: {allowed}"
    elif gpu.kind is SliceKind.MIG:
        _check_profile(gpu, shape, errors)
    elif gpu.model:
        gpu = replace(gpu, model=_resolve_model(gpu.model, shape, errors))
    if len(errors) == before:
        _check_count(gpu, shape, errors)
    return (None, ()) if len(errors) > before else (gpu, ())


# --- the checks ------------------------------------------------------------------------------


def _kinds(shape: ClusterShape) -> set[SliceKind]:
    return {pool[0] for pool in shape.pool_capacity}


def _check_profile(gpu: GpuRequest, shape: ClusterShape, errors: dict[str, str]) -> None:
    offered = {pool[1] for pool in shape.pool_capacity if pool[0] is SliceKind.MIG}
    if gpu.profile not in offered:
        errors["gpu.profile"] = (
            f"no GPU of this cluster offers MIG {gpu.profile}; allowed: "
            f"{', '.join(sorted(offered, key=_profile_order))}"
        )


def _resolve_model(text: str, shape: ClusterShape, errors: dict[str, str]) -> str:
    whole = {pool[2] for pool in shape.pool_capacity if pool[0] is SliceKind.WHOLE}
    found = match_gpu_model(text, whole)
    if len(found) == 1:
        return found[0]
    allowed = ", ".join(sorted(m for m in whole if m.strip())) or "(models not reported)"
    if found:
        errors["gpu.model"] = (
            f"{text!r} matches {len(found)} GPU models of this cluster: {', '.join(found)}; "
            "name one of them"
        )
        return text
    split = match_gpu_model(text, {pool[2] for pool in shape.pool_capacity})
    where = (
        f" (its {', '.join(split)} GPUs are split into MIG instances or MPS shares: ask for "
        "kind mig or mps instead)"
        if split
        else ""
    )
    errors["gpu.model"] = (
        f"no whole GPU of model {text!r} in this cluster{where}; allowed: {allowed} "
        "(a case-insensitive start of the name or of one of its words, e.g. a100)"
    )
    return text


def _check_count(gpu: GpuRequest, shape: ClusterShape, errors: dict[str, str]) -> None:
    info = shape.request_info(gpu)
    if info.could_ever_fit or not info.pools:
        return  # (no pools is ruled out above: kind, profile and model all exist)
    field = "gpu.min_count" if gpu.min_count else "gpu.count"
    what = _what(gpu, several_models=len(info.pools) > 1)
    total = sum(sum(shape.pool_capacity[pool].values()) for pool in info.pools)
    if gpu.multi_node:
        errors[field] = (
            f"at most {total} {what} exist in this cluster, on all its nodes together; "
            f"ask for {total} or fewer"
        )
        return
    largest = info.largest_node
    per_node: set[int] = set()
    for number in range(len(shape.nodes)):
        here = max(shape.pool_capacity[pool].get(number, 0) for pool in info.pools)
        if here:
            per_node.add(here)
    sizes = [str(size) for size in sorted(per_node, reverse=True)]
    if len(sizes) > _LISTED_SIZES:
        have = f"{', '.join(sizes[:_LISTED_SIZES])}, ..."
    else:
        have = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} and {sizes[-1]}"
    spread = ", or allow multi-node" if total >= gpu.minimum else ""
    errors[field] = (
        f"at most {largest} {what} fit on one node of this cluster (nodes have {have}); "
        f"ask for {largest} or fewer{spread}"
    )


# --- wording ---------------------------------------------------------------------------------


def _what(gpu: GpuRequest, *, several_models: bool) -> str:
    if gpu.kind is SliceKind.MIG:
        what = f"MIG {gpu.profile} instances"
    elif gpu.kind is SliceKind.MPS:
        what = "MPS shares"
    else:
        what = f"whole {gpu.model} GPUs" if gpu.model else "whole GPUs"
    return f"{what} of one model" if several_models else what


def _profile_order(name: str) -> tuple[int, int, str]:
    known = MIG_PROFILES.get(name)
    return (known.compute_slices, known.memory_gb, name) if known else (99, 0, name)


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def _word_tails(model: str) -> list[str]:
    words = _normal(model).split(" ")
    return [" ".join(words[i:]) for i in range(len(words))]

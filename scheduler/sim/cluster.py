"""The simulated cluster and its teams.

A cluster is ``gpus`` physical GPUs as nodes of ``gpus_per_node`` (the last node takes the
remainder); optionally the last ``mig_nodes`` nodes have every GPU split into MIG instances
by ``mig_layout``. Teams come from the trace's tenants; their weights and guarantees from a
quota table in nodes (Philly's ``vc_quota_nodes.csv``), scaled to the simulated cluster with
proportions kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import MIG_COMPUTE_SLICES_PER_GPU, Node, Slice, SliceKind
from scheduler.units import mig_units, parse_mig_profile

# Teams of a trace with no quota row get this many nodes of quota (weight and guarantee):
# one node, against 8..64 for the teams that have a row in Philly's table.
DEFAULT_QUOTA_NODES = 1.0
DEFAULT_MIG_LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


class ClusterError(ValueError):
    """A cluster description the simulator cannot build; the message names the option."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    gpus: int
    gpus_per_node: int = 8
    mig_nodes: int = 0
    mig_layout: tuple[str, ...] = DEFAULT_MIG_LAYOUT

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ClusterError(f"--gpus must be >= 1, got {self.gpus}")
        if self.gpus_per_node < 1:
            raise ClusterError(f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")
        if not 0 <= self.mig_nodes <= self.node_count:
            raise ClusterError(
                f"--mig-nodes must be between 0 and the {self.node_count} nodes, "
                f"got {self.mig_nodes}"
            )
        if self.mig_nodes and sum(mig_compute_slices(p) for p in self.mig_layout) > 7:
            raise ClusterError(
                f"--mig-layout {','.join(self.mig_layout)} uses more than the "
                f"{MIG_COMPUTE_SLICES_PER_GPU} compute slices of a GPU"
            )

    @property
    def node_count(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)


def mig_compute_slices(profile: str) -> int:
    """Compute slices of a MIG profile such as ``3g.40gb``."""
    try:
        return parse_mig_profile(profile).compute_slices
    except ValueError as error:
        raise ClusterError(f"--mig-layout / mig_profile: {error}") from None


def build_nodes(spec: ClusterSpec) -> tuple[Node, ...]:
    """The cluster's nodes, named ``n000``..; slices ``n000/g0`` (whole) or ``n000/g0/m1``."""
    nodes: list[Node] = []
    for index in range(spec.node_count):
        name = f"n{index:03d}"
        gpus = min(spec.gpus_per_node, spec.gpus - index * spec.gpus_per_node)
        mig = index >= spec.node_count - spec.mig_nodes
        slices: list[Slice] = []
        for gpu in range(gpus):
            gpu_id = f"{name}/g{gpu}"
            if not mig:
                slices.append(Slice(gpu_id, name, gpu_id, SliceKind.WHOLE, 1.0))
                continue
            for part, profile in enumerate(spec.mig_layout):
                units = mig_units(profile)
                slices.append(
                    Slice(f"{gpu_id}/m{part}", name, gpu_id, SliceKind.MIG, units, profile=profile)
                )
        nodes.append(Node(name, tuple(slices)))
    return tuple(nodes)


def capacity_units(nodes: Iterable[Node]) -> float:
    """GPU units of all slices (whole GPUs count 1, MIG instances their share)."""
    return sum(s.units for node in nodes for s in node.slices)


@dataclass(frozen=True, slots=True)
class TeamSpec:
    """A team as the simulator sees it: quota in trace nodes, scaled guarantee in GPUs."""

    name: str
    quota_nodes: float
    guaranteed_gpus: int
    defaulted: bool  # no row in the quota table: given DEFAULT_QUOTA_NODES

    @property
    def weight(self) -> float:
        return self.quota_nodes


def build_teams(
    tenants: Iterable[str],
    quotas: Mapping[str, float] | None,
    gpus: int,
    *,
    default_quota_nodes: float = DEFAULT_QUOTA_NODES,
) -> dict[str, TeamSpec]:
    """Teams of the trace with guarantees apportioned to ``gpus`` in proportion to quota.

    With no quota table every team gets an equal quota. Guarantees are whole GPUs summing to
    the cluster (largest-remainder rounding), so a private partition of each is well defined.
    """
    if default_quota_nodes <= 0:
        raise ClusterError(f"--default-quota-nodes must be > 0, got {default_quota_nodes:g}")
    names = sorted(set(tenants))
    table = quotas if quotas is not None else {}
    nodes = {name: table.get(name, default_quota_nodes) for name in names}
    if quotas is None:
        nodes = dict.fromkeys(names, 1.0)
    shares = apportion(nodes, gpus)
    return {
        name: TeamSpec(name, nodes[name], shares[name], quotas is not None and name not in table)
        for name in names
    }


def apportion(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Split ``total`` into whole parts proportional to ``weights`` (largest remainder).

    Ties in the remainder go to the name that sorts first, so the split is deterministic.
    """
    whole = sum(weights.values())
    exact = {name: total * weight / whole for name, weight in weights.items()}
    parts = {name: math.floor(value) for name, value in exact.items()}
    left = total - sum(parts.values())
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - parts[name]), name))
    for name in by_remainder[:left]:
        parts[name] += 1
    return parts

"""How many GPU units the cluster holds, against what the teams are guaranteed.

A site admin may promise more than the cluster has (a node is about to arrive, or not every
team uses its guarantee at once); the team page then warns, and stores the quota anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum

from portal.cluster.models import Node, Slice
from portal.tenants.models import Team


@dataclass(frozen=True)
class Overcommit:
    """The guarantees of all teams add up to more than the cluster holds."""

    guaranteed_units: float  # all teams together
    cluster_units: float  # what the ready nodes offer now

    @property
    def message(self) -> str:
        return (
            f"The guarantees of all teams add up to {self.guaranteed_units:g} GPU units, more "
            f"than the {self.cluster_units:g} units the cluster's ready nodes hold now: not "
            "every team can get its guarantee back at once."
        )


def cluster_units() -> float:
    """GPU units of every present slice of a present GPU on a ready node (one query)."""
    total = Slice.objects.filter(
        present=True, gpu__present=True, gpu__node__state=Node.State.READY
    ).aggregate(units=Sum("units"))["units"]
    return round(total or 0.0, 6)


def guarantee_overcommit() -> Overcommit | None:
    """An ``Overcommit`` when the teams' guarantees exceed ``cluster_units()``, else None."""
    guaranteed = Team.objects.aggregate(units=Sum("guaranteed_units"))["units"] or 0.0
    capacity = cluster_units()
    if guaranteed <= capacity + 1e-9:
        return None
    return Overcommit(guaranteed_units=round(guaranteed, 6), cluster_units=capacity)

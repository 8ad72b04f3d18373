"""The cluster's capacity as people see it: nodes, their GPUs and slices, which are free and
which team holds the others, the free totals by kind and profile, and the utilisation of the
last hours (the Cluster page and ``GET /api/v1/cluster/``).

It reads allocations, so it lives with the jobs. Whoever asks sees every slice and the team
that holds it; the job (its id, name, user and state) only when it is one of the asker's
teams' jobs, or when the asker is a site admin. Commands are never part of it.

A fixed number of queries whatever the size of the cluster (``CAPACITY_QUERIES``): nodes,
GPUs, slices, the holds now, the holds of the last hours (summed per node in the database for
those held all through them, one row each for the others), and the asker's teams.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, Sum

from portal.accounting.usage import spread_over_bins
from portal.cluster.models import Gpu, Node, Slice
from portal.jobs.models import Allocation
from portal.tenants.selectors import is_site_admin, teams_for_user

# This many queries, whatever the number of nodes, GPUs, slices and jobs
# (one fewer for a site admin, whose teams need no look-up).
CAPACITY_QUERIES = 7
UTILISATION_HOURS = 24

# A slice's status, one of these; the first that applies wins.
LOST = "lost"  # its node is lost (missed heartbeats beyond the lease), or the device is gone
HELD = "held"  # a job holds it
# Free, but its node takes no new work: an operator cordoned or drained it.
DRAINING = "draining"
FREE = "free"  # free: the scheduler may place a job on it
STATUSES = (FREE, HELD, DRAINING, LOST)

_HOUR = timedelta(hours=1)
_KIND_ORDER = {Slice.Kind.WHOLE: 0, Slice.Kind.MIG: 1, Slice.Kind.MPS: 2}
_DIGITS = re.compile(r"(\d+)")


def cluster_capacity(
    *,
    user: Any,
    now: datetime,
    hours: int = UTILISATION_HOURS,
    page: int | None = None,
    per_page: int = 50,
) -> dict[str, Any]:
    """Everything the Cluster page shows, as of ``now`` (see the module's docstring).

    ``page`` (from 1; beyond the last: the last): only that page's ``per_page`` nodes are
    listed in ``nodes`` (``nodes_page`` says which page, ``nodes_total`` how many nodes in
    all); the totals and the utilisation always count every node. None: every node listed.

    - ``nodes``: each node (state, agent, last heartbeat and whether it is late), its GPUs and
      their slices, each slice with its ``status`` (free, held, draining, lost) and ``holder``
      (``{"team", "since", "job"}``, ``job`` null unless the asker may see the job);
    - ``units``: GPU units by status (``free + held + draining`` is the capacity in service);
    - ``free_by_kind``: per kind and MIG profile, the slices in each status and the free units;
    - ``utilisation``: per hour of the last ``hours``, the GPU-unit-hours held and in service.
    """
    nodes = list(
        Node.objects.order_by("name").values(
            "id",
            "name",
            "hostname",
            "state",
            "driver",
            "agent_version",
            "last_heartbeat_at",
            "registered_at",
            "cordoned_at",
            "cordoned_by",
            "drain_deadline_at",
        )
    )
    gpus = list(
        Gpu.objects.order_by("node_id", "index").values(
            "id", "node_id", "uuid", "index", "model", "memory_mb", "mode", "present"
        )
    )
    active = Allocation.objects.filter(released_at__isnull=True)
    slices = list(
        Slice.objects.filter(Q(present=True) | Q(pk__in=active.values("slice_id"))).values(
            "id", "gpu_id", "key", "kind", "profile", "mig_uuid", "units", "present"
        )
    )
    holds = {
        row["slice_id"]: row
        for row in active.values(
            "slice_id",
            "created_at",
            "job_id",
            "job__name",
            "job__state",
            "job__team_id",
            "job__team__name",
            "job__user__username",
        )
    }
    seen_teams = _teams_whose_jobs_are_visible(user)

    lease_s = float(settings.AGENT_LEASE_S)
    slices_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in slices:
        slices_of[row["gpu_id"]].append(row)
    gpus_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in gpus:
        gpus_of[row["node_id"]].append(row)

    units = dict.fromkeys(STATUSES, 0.0)
    by_kind: dict[tuple[str, str], dict[str, Any]] = {}
    node_units: dict[int, float] = {}
    out_nodes = []
    if page is None:
        listed = range(len(nodes))
    else:
        page = min(max(1, page), max(1, -(-len(nodes) // per_page)))
        listed = range((page - 1) * per_page, page * per_page)
    for position, node in enumerate(nodes):
        shown = position in listed
        node_lost = node["state"] == Node.State.LOST
        node_draining = node["state"] == Node.State.DRAINED
        counts = dict.fromkeys(STATUSES, 0)
        slices_held = 0
        node_units[node["id"]] = 0.0
        out_gpus = []
        for gpu in gpus_of[node["id"]]:
            out_slices = []
            rows = slices_of[gpu["id"]]
            for row in sorted(rows, key=lambda r: _natural(r["key"])) if shown else rows:
                hold = holds.get(row["id"])
                gone = not (gpu["present"] and row["present"])
                if node_lost or gone:
                    status = LOST
                elif hold is not None:
                    status = HELD
                elif node_draining:
                    status = DRAINING
                else:
                    status = FREE
                if not gone:
                    node_units[node["id"]] += row["units"]
                if hold is not None:
                    slices_held += 1
                counts[status] += 1
                units[status] += row["units"]
                total = by_kind.setdefault(
                    (row["kind"], row["profile"]),
                    {
                        "kind": row["kind"],
                        "profile": row["profile"],
                        "units_each": row["units"],
                        **dict.fromkeys(STATUSES, 0),
                        "total": 0,
                        "free_units": 0.0,
                    },
                )
                total[status] += 1
                total["total"] += 1
                if status == FREE:
                    total["free_units"] += row["units"]
                if not shown:
                    continue  # counted; spelled out only for the nodes listed
                out_slices.append(
                    {
                        "key": row["key"],
                        "kind": row["kind"],
                        "profile": row["profile"],
                        "mig_uuid": row["mig_uuid"],
                        "units": round(row["units"], 6),
                        "status": status,
                        "holder": _holder(hold, seen_teams),
                    }
                )
            if shown:
                out_gpus.append(
                    {
                        "index": gpu["index"],
                        "uuid": gpu["uuid"],
                        "model": gpu["model"],
                        "memory_mb": gpu["memory_mb"],
                        "mode": gpu["mode"],
                        "present": gpu["present"],
                        "slices": out_slices,
                    }
                )
        if not shown:
            continue
        heartbeat = node["last_heartbeat_at"]
        age = (now - heartbeat).total_seconds() if heartbeat is not None else None
        out_nodes.append(
            {
                "name": node["name"],
                "hostname": node["hostname"],
                "state": node["state"],
                "status": node_status(
                    state=node["state"],
                    drain_deadline_at=node["drain_deadline_at"],
                    slices_held=slices_held,
                ),
                "cordoned_at": node["cordoned_at"],
                "cordoned_by": node["cordoned_by"],
                "drain_deadline_at": node["drain_deadline_at"],
                "driver": node["driver"],
                "agent_version": node["agent_version"],
                "last_heartbeat_at": heartbeat,
                "heartbeat_age_s": None if age is None else round(max(0.0, age), 1),
                # Past the lease but not marked lost yet (the reaper runs every few seconds).
                "heartbeat_late": age is None or age > lease_s,
                "slice_counts": counts,
                "slices_total": sum(counts.values()),
                "gpus": out_gpus,
            }
        )

    free_by_kind = sorted(
        by_kind.values(),
        key=lambda t: (_KIND_ORDER.get(t["kind"], 9), t["units_each"], t["profile"]),
    )
    for total in free_by_kind:
        total["units_each"] = round(total["units_each"], 6)
        total["free_units"] = round(total["free_units"], 6)
    units["in_service"] = units[FREE] + units[HELD] + units[DRAINING]
    units = {status: round(value, 6) for status, value in units.items()}
    return {
        "as_of": now,
        "lease_s": lease_s,
        "units": units,
        "free_by_kind": free_by_kind,
        "nodes": out_nodes,
        "nodes_total": len(nodes),
        "nodes_page": page,
        "utilisation": _utilisation(now=now, hours=hours, nodes=nodes, node_units=node_units),
    }


def node_status(*, state: str, drain_deadline_at: datetime | None, slices_held: int) -> str:
    """A node in one word: ready, lost, or, once an operator took it out of scheduling
    (state ``drained``), cordoned (its jobs run on), draining (a drain deadline is set) or
    drained (nothing holds its slices any more)."""
    if state != Node.State.DRAINED:
        return str(state)
    if slices_held == 0:
        return "drained"
    return "draining" if drain_deadline_at is not None else "cordoned"


def _teams_whose_jobs_are_visible(user: Any) -> set[int] | None:
    """None: every team's (a site admin); else the ids of the user's teams."""
    if is_site_admin(user):
        return None
    return set(teams_for_user(user=user).values_list("pk", flat=True))


def _holder(hold: dict[str, Any] | None, seen_teams: set[int] | None) -> dict[str, Any] | None:
    if hold is None:
        return None
    visible = seen_teams is None or hold["job__team_id"] in seen_teams
    return {
        "team": hold["job__team__name"],
        "since": hold["created_at"],
        "job": {
            "id": hold["job_id"],
            "name": hold["job__name"],
            "user": hold["job__user__username"],
            "state": hold["job__state"],
        }
        if visible
        else None,
    }


def _natural(key: str) -> list[Any]:
    """``.../mps/2`` before ``.../mps/10``."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(key)]


# --- utilisation -------------------------------------------------------------------------


def _utilisation(
    *, now: datetime, hours: int, nodes: list[dict[str, Any]], node_units: dict[int, float]
) -> dict[str, Any]:
    """Per hour of the last ``hours`` (clock hours, UTC; the last one ends at ``now``): the
    GPU-unit-hours jobs held and the GPU-unit-hours in service, and their ratio.

    In service: each node's present slices (its inventory as it is now), from the node's
    registration until now, or until its last heartbeat when it is lost; no history of
    inventories is kept. Held: every allocation's slice units over the time it was held,
    within its node's time in service. The ratio is null for an hour with nothing in service
    and at most 1 (a hold on a slice the inventory no longer has may outlast it).
    """
    top = now.replace(minute=0, second=0, microsecond=0)
    if top == now:
        top -= _HOUR
    starts = [top - _HOUR * (hours - 1 - i) for i in range(hours)]
    window_start = starts[0]
    service: dict[int, tuple[datetime, datetime]] = {}
    for node in nodes:
        if node["state"] == Node.State.LOST:
            end = node["last_heartbeat_at"] or node["registered_at"]
        else:
            end = now
        service[node["id"]] = (node["registered_at"], min(end, now))

    origin, until = window_start.timestamp(), now.timestamp()
    capacity = [0.0] * hours
    held = [0.0] * hours
    for node_id, (begin, end) in service.items():
        _spread(capacity, origin, until, node_units.get(node_id, 0.0), begin, end)
    # Held all through the window (most holds on a busy cluster): each counts over its node's
    # time in service within the window, the same for all of them, so the database sums their
    # units per node instead of sending a row each.
    throughout = Q(created_at__lte=window_start) & (
        Q(released_at__isnull=True) | Q(released_at__gte=now)
    )
    summed = (
        Allocation.objects.filter(throughout)
        .values_list("slice__gpu__node_id")
        .annotate(units=Sum("slice__units"))
        .order_by()
    )
    for node_id, slice_units in summed:
        if node_id in service:
            begin, end = service[node_id]
            _spread(held, origin, until, slice_units, max(window_start, begin), end)
    # The others: begun in the window, or ended in it.
    intervals = Allocation.objects.filter(
        Q(created_at__gt=window_start, created_at__lt=now)
        | Q(created_at__lte=window_start, released_at__gt=window_start, released_at__lt=now)
    ).values_list("created_at", "released_at", "slice__units", "slice__gpu__node_id")
    for created_at, released_at, slice_units, node_id in intervals:
        begin, end = service.get(node_id, (created_at, created_at))
        _spread(
            held, origin, until, slice_units, max(created_at, begin), min(released_at or now, end)
        )

    series = []
    for i, start in enumerate(starts):
        ratio = min(1.0, held[i] / capacity[i]) if capacity[i] > 1e-9 else None
        series.append(
            {
                "start": start,
                "end": min(start + _HOUR, now),
                "held_unit_hours": round(held[i], 4),
                "in_service_unit_hours": round(capacity[i], 4),
                "ratio": None if ratio is None else round(ratio, 4),
            }
        )
    return {"hours": hours, "start": window_start, "end": now, "series": series}


def _spread(
    into: list[float], origin: float, until: float, units: float, begin: datetime, end: datetime
) -> None:
    """Add ``units`` held over ``[begin, end)`` to the unit-hours of each hour it overlaps;
    ``into[0]`` is the hour from ``origin`` (epoch seconds), and nothing counts after
    ``until``."""
    if units <= 0:
        return
    spread = spread_over_bins(
        begin.timestamp(), min(end.timestamp(), until), first=origin, bin_s=3600.0, bins=len(into)
    )
    for hour, seconds in spread:
        into[hour] += units * seconds / 3600.0

"""Taking a node out of service: cordon, drain, uncordon (site admins), and the drain deadline
the reaper enforces.

- **Cordon**: the node takes no new job (state ``drained``: the snapshot hands the core the
  node as not schedulable); the jobs on it run on.
- **Drain**: cordon, then wait for the node's jobs to end. Jobs still holding its slices at
  the deadline are preempted through the one stop path (``attempt_request_stops``, reason
  ``preempt``): the agent stops them, its ``finished`` report frees their slices and requeues
  them, so a job is neither lost nor run twice. Preemptible or not: the operator's deadline
  wins. The drain ends (event ``drained``, deadline cleared) once nothing holds the slices.
- **Uncordon**: back in scheduling (lost instead, if its agent is silent past the lease).

Every change is a ``NodeEvent`` (who, when, what). A cordon waits for a scheduling pass that
is running to commit first, so no pass that read the node as ready places a job on it
afterwards. Deadlines are enforced by the reaper (``drains_enforce``, every
PORTAL_REAP_INTERVAL_S) and at once by a drain whose deadline is 0.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, DateTimeField, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from portal.agents.dispatch import request_stops
from portal.cluster.models import Node, NodeEvent, Slice
from portal.jobs.attempts import StopAsked, StopWanted, attempt_request_stops
from portal.jobs.capacity import node_status
from portal.jobs.models import Allocation
from portal.passes import schedule_pass_on_commit
from portal.scheduling.lock import wait_for_running_pass
from portal.tenants.selectors import is_site_admin

log = logging.getLogger("portal.agents")

# A week: a drain longer than that is a cordon (which waits as long as it takes).
DRAIN_DEADLINE_MAX_S = 7 * 24 * 3600
_DEADLINE_ALLOWED = (
    f"allowed: a whole number of seconds from 0 (preempt at once) to {DRAIN_DEADLINE_MAX_S} "
    "(7 days)"
)

E = NodeEvent.Kind


class DrainError(ValueError):
    """A drain with bad values; ``errors`` maps each field to what it accepts."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


# --- writes -----------------------------------------------------------------------------------


def node_cordon(*, node: Node, by: Any, now: datetime | None = None) -> bool:
    """Take ``node`` out of scheduling; its jobs run on. A drain in progress is called off
    (the node stays cordoned, its jobs are not preempted). Returns whether anything changed.
    Raises ``PermissionDenied`` for anyone but a site admin."""
    who = _site_admin_name(by)
    when = now or timezone.now()
    with transaction.atomic():
        wait_for_running_pass()
        if _cordon(node, who, when):
            _record(node, E.CORDON, who, when, f"cordoned: no new jobs; {_holding_text(node)}")
            changed = True
        else:
            changed = bool(
                Node.objects.filter(
                    pk=node.pk, state=Node.State.DRAINED, drain_deadline_at__isnull=False
                ).update(drain_deadline_at=None)
            )
            if changed:
                _record(node, E.DRAIN_CALLED_OFF, who, when, "drain called off; stays cordoned")
    _refresh(node)
    return changed


def node_uncordon(*, node: Node, by: Any, now: datetime | None = None) -> bool:
    """Put a cordoned (or draining) ``node`` back in scheduling, or mark it lost when its
    agent has been silent past the lease. Jobs already asked to stop still stop (and are
    requeued). Returns whether anything changed. Raises ``PermissionDenied``."""
    who = _site_admin_name(by)
    when = now or timezone.now()
    lease = timedelta(seconds=settings.AGENT_LEASE_S)
    with transaction.atomic():
        heartbeat = Node.objects.filter(pk=node.pk).values_list("last_heartbeat_at", flat=True)
        last = heartbeat.first()
        alive = last is not None and when - last <= lease
        back_to = Node.State.READY if alive else Node.State.LOST
        changed = bool(
            Node.objects.filter(pk=node.pk, state=Node.State.DRAINED).update(
                state=back_to, cordoned_at=None, cordoned_by="", drain_deadline_at=None
            )
        )
        if changed:
            message = (
                "uncordoned: back in scheduling"
                if alive
                else "uncordoned; its agent is silent, so it is lost until a heartbeat arrives"
            )
            _record(node, E.UNCORDON, who, when, message)
            schedule_pass_on_commit()
    _refresh(node)
    return changed


def node_drain(*, node: Node, by: Any, deadline_s: Any, now: datetime | None = None) -> None:
    """Cordon ``node`` and give its jobs ``deadline_s`` seconds to end; jobs still holding its
    slices then are preempted and requeued (0: at once). A drain in progress gets the new
    deadline. Raises ``PermissionDenied`` or ``DrainError``."""
    who = _site_admin_name(by)
    seconds = _deadline_seconds(deadline_s)
    when = now or timezone.now()
    deadline = when + timedelta(seconds=seconds)
    with transaction.atomic():
        wait_for_running_pass()
        before = Node.objects.filter(pk=node.pk).values_list("drain_deadline_at", flat=True)
        earlier = before.first()
        Node.objects.filter(pk=node.pk).update(
            state=Node.State.DRAINED,
            cordoned_at=Coalesce("cordoned_at", Value(when, output_field=DateTimeField())),
            cordoned_by=who,
            drain_deadline_at=deadline,
        )
        moved = f" (was {earlier:%Y-%m-%d %H:%M:%S} UTC)" if earlier else ""
        _record(
            node,
            E.DRAIN,
            who,
            when,
            f"drain: no new jobs; deadline {deadline:%Y-%m-%d %H:%M:%S} UTC, in {seconds} s"
            f"{moved}; {_holding_text(node)}; those still running then are preempted and "
            "requeued",
        )
        _enforce([node.pk], when)
    _refresh(node)


def drains_enforce(*, now: datetime | None = None) -> int:
    """For every drain in progress: end it when nothing holds the node's slices any more;
    past its deadline, ask the jobs still holding them to stop (preempt). Returns the stops
    asked for. Safe to repeat and to run twice at once (guarded writes)."""
    when = now or timezone.now()
    draining = list(
        Node.objects.filter(state=Node.State.DRAINED, drain_deadline_at__isnull=False).values_list(
            "pk", flat=True
        )
    )
    if not draining:
        return 0
    with transaction.atomic():
        return _enforce(draining, when)


def _enforce(node_ids: list[int], now: datetime) -> int:
    """``drains_enforce`` for these nodes, inside the caller's transaction."""
    nodes = list(
        Node.objects.filter(
            pk__in=node_ids, state=Node.State.DRAINED, drain_deadline_at__isnull=False
        ).only("pk", "name", "drain_deadline_at", "cordoned_by")
    )
    holders = _holders([n.pk for n in nodes])
    wanted: list[StopWanted] = []
    overdue: dict[int, list[int]] = {}
    for node in nodes:
        jobs = holders.get(node.pk, {})
        if not jobs:
            ended = Node.objects.filter(
                pk=node.pk, state=Node.State.DRAINED, drain_deadline_at=node.drain_deadline_at
            ).update(drain_deadline_at=None)
            if ended:
                _record(node, E.DRAINED, "", now, "drained: nothing holds its slices")
                log.info("node %s drained", node.name)
            continue
        if node.drain_deadline_at is None or node.drain_deadline_at > now:
            continue
        by = f" by {node.cordoned_by}" if node.cordoned_by else ""
        message = (
            f"preempt: node {node.name} is being drained{by} and its deadline passed; "
            "requeued once it stops"
        )
        overdue[node.pk] = sorted(jobs)
        wanted.extend(StopWanted(job_id=j, message=message, attempt=a) for j, a in jobs.items())
    if not wanted:
        return 0
    asked = attempt_request_stops(wanted=wanted, reason="preempt", at=now)
    stopped = sorted(j for j, found in asked.items() if found == StopAsked.REQUESTED)
    asked_now = set(stopped)
    for node in nodes:
        fresh = [j for j in overdue.get(node.pk, ()) if j in asked_now]
        if fresh:
            listed = ", ".join(str(j) for j in fresh)
            _record(
                node,
                E.PREEMPT,
                "",
                now,
                f"deadline passed: jobs {listed} asked to stop (preempted, to be requeued)",
            )
            log.warning("node %s: drain deadline passed, preempting jobs %s", node.name, listed)
    if stopped:
        transaction.on_commit(lambda: request_stops(stopped, now=now))
    return len(stopped)


def _cordon(node: Node, who: str, when: datetime) -> bool:
    return bool(
        Node.objects.filter(pk=node.pk)
        .exclude(state=Node.State.DRAINED)
        .update(state=Node.State.DRAINED, cordoned_at=when, cordoned_by=who)
    )


def _holders(node_ids: list[int]) -> dict[int, dict[int, int]]:
    """Node pk -> {job pk: attempt} of the attempts holding its slices now."""
    held: dict[int, dict[int, int]] = defaultdict(dict)
    rows = Allocation.objects.filter(
        released_at__isnull=True, slice__gpu__node_id__in=node_ids
    ).values_list("slice__gpu__node_id", "job_id", "attempt")
    for node_id, job_id, attempt in rows:
        held[node_id][job_id] = attempt
    return held


def _holding_text(node: Node) -> str:
    jobs = sorted(_holders([node.pk]).get(node.pk, {}))
    if not jobs:
        return "no job holds its slices"
    return f"{len(jobs)} job(s) hold its slices ({', '.join(str(j) for j in jobs)})"


def _record(node: Node, kind: str, by: str, at: datetime, message: str) -> None:
    NodeEvent.objects.create(node_id=node.pk, kind=kind, by=by, at=at, message=message)
    log.info("node %s: %s%s", node.name, message, f" (by {by})" if by else "")


def _refresh(node: Node) -> None:
    node.refresh_from_db(fields=["state", "cordoned_at", "cordoned_by", "drain_deadline_at"])


def _site_admin_name(user: Any) -> str:
    if not is_site_admin(user):
        raise PermissionDenied("only site admins may cordon, uncordon or drain a node")
    return str(user.get_username())


def _deadline_seconds(value: Any) -> int:
    """``deadline_s`` as whole seconds, from JSON (a number) or a form (its text)."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        number = int(value.strip())
    if value is None or value == "":
        raise DrainError({"deadline_s": f"required; {_DEADLINE_ALLOWED}"})
    if number is None or not 0 <= number <= DRAIN_DEADLINE_MAX_S:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise DrainError({"deadline_s": f"{shown} is not allowed; {_DEADLINE_ALLOWED}"})
    return number


# --- reads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeOverview:
    """A node as the Nodes page and ``/api/v1/nodes/`` show it. ``status``: ready, lost,
    cordoned (jobs run on, none placed), draining (a deadline is set) or drained (cordoned
    and nothing holds its slices)."""

    name: str
    hostname: str
    state: str
    status: str
    cordoned: bool
    cordoned_at: datetime | None
    cordoned_by: str
    drain_deadline_at: datetime | None
    last_heartbeat_at: datetime | None
    agent_version: str
    slices: int
    slices_held: int
    units: float
    units_held: float
    jobs_running: int
    jobs_stopping: int
    job_ids: tuple[int, ...]


def node_overviews(*, name: str | None = None) -> list[NodeOverview]:
    """Every node (or the one named), sorted by name, in three queries whatever the size."""
    nodes = Node.objects.order_by("name")
    if name is not None:
        nodes = nodes.filter(name=name)
    rows = list(nodes)
    offered = {
        node_id: (count, units or 0.0)
        for node_id, count, units in Slice.objects.filter(
            present=True, gpu__present=True, gpu__node__in=[n.pk for n in rows]
        )
        .values("gpu__node_id")
        .annotate(count=Count("pk"), units=Sum("units"))
        .values_list("gpu__node_id", "count", "units")
    }
    held_slices: dict[int, int] = defaultdict(int)
    held_units: dict[int, float] = defaultdict(float)
    jobs: dict[int, set[int]] = defaultdict(set)
    stopping: dict[int, set[int]] = defaultdict(set)
    allocations = Allocation.objects.filter(
        released_at__isnull=True, slice__gpu__node__in=[n.pk for n in rows]
    ).values_list("slice__gpu__node_id", "job_id", "slice__units", "job__stop_requested_at")
    for node_id, job_id, units, stop_requested_at in allocations:
        held_slices[node_id] += 1
        held_units[node_id] += units
        jobs[node_id].add(job_id)
        if stop_requested_at is not None:
            stopping[node_id].add(job_id)
    return [
        NodeOverview(
            name=node.name,
            hostname=node.hostname,
            state=node.state,
            status=node_status(
                state=node.state,
                drain_deadline_at=node.drain_deadline_at,
                slices_held=held_slices[node.pk],
            ),
            cordoned=node.state == Node.State.DRAINED,
            cordoned_at=node.cordoned_at,
            cordoned_by=node.cordoned_by,
            drain_deadline_at=node.drain_deadline_at,
            last_heartbeat_at=node.last_heartbeat_at,
            agent_version=node.agent_version,
            slices=offered.get(node.pk, (0, 0.0))[0],
            slices_held=held_slices[node.pk],
            units=round(offered.get(node.pk, (0, 0.0))[1], 4),
            units_held=round(held_units[node.pk], 4),
            jobs_running=len(jobs[node.pk]),
            jobs_stopping=len(stopping[node.pk]),
            job_ids=tuple(sorted(jobs[node.pk])),
        )
        for node in rows
    ]


def node_events(*, node: Node, limit: int = 50) -> list[NodeEvent]:
    """The node's latest events, newest first."""
    return list(NodeEvent.objects.filter(node=node).order_by("-at", "-id")[:limit])

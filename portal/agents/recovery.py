"""The reaper: repair what lost agents and lost messages leave behind.

Runs on beat every PORTAL_REAP_INTERVAL_S:

1. Agents   - a node whose last heartbeat is older than PORTAL_AGENT_LEASE_S is marked lost;
              every attempt holding slices on it becomes LOST, its slices are freed and its
              use charged, and the job is requeued (or failed after PORTAL_JOB_MAX_RETRIES
              losses). A lost node that sends a heartbeat again is ready again.
2. Launches - a job ASSIGNED for PORTAL_LAUNCH_RESEND_S without a ``started`` gets its launch
              again (agents ignore a launch they already have); after PORTAL_LAUNCH_TIMEOUT_S
              its node is asked about it (``query``): only the node's answer that it has no
              record of the attempt (after which it never runs it) lets the portal requeue
              it. Never a guess: the attempt may be starting there.
3. Stops    - a stop asked for PORTAL_STOP_RESEND_S ago whose job still holds slices is sent
              again.
4. Nonces   - nonces of applied messages older than twice PORTAL_MESSAGE_MAX_SKEW_S go.
5. Drains   - a drained node's drain ends once nothing holds its slices; past its deadline,
              the jobs still holding them are preempted (``portal.agents.drain``).

A node's jobs are requeued only after its lease lapsed (step 1), or on its own word (a
``finished`` report saying fenced, lost or unknown). Its agent stopped them itself at
PORTAL_AGENT_FENCE_FRACTION of the lease, so a requeued attempt never overlaps the old one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from portal.agents.dispatch import recently_sent, request_stops, send_launches, send_queries
from portal.agents.drain import drains_enforce
from portal.agents.models import Dispatch
from portal.agents.trust import forget_old_nonces, forget_old_refusals
from portal.cluster.models import Node
from portal.jobs.attempts import attempt_finish, attempt_lose
from portal.jobs.models import HOLDING_STATES, Allocation, Job, JobState

log = logging.getLogger("portal.agents")


@dataclass(slots=True)
class ReapResult:
    nodes_lost: int = 0
    jobs_lost: int = 0
    launches_resent: int = 0
    launches_queried: int = 0
    stops_resent: int = 0
    nonces_forgotten: int = 0
    drain_stops: int = 0  # jobs preempted because their node's drain deadline passed

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def reap_lost_agents(*, now: datetime | None = None) -> ReapResult:
    when = now or timezone.now()
    result = ReapResult()
    stale = _mark_lost_nodes(when, result)
    _lose_jobs_on(stale, when, result)
    _resend_launches(when, result)
    _resend_stops(when, result)
    result.nonces_forgotten = forget_old_nonces(now=when)
    forget_old_refusals(now=when)
    result.drain_stops = drains_enforce(now=when)
    if any(result.as_dict().values()):
        log.info("reaper: %s", result.as_dict())
    return result


def _mark_lost_nodes(now: datetime, result: ReapResult) -> list[int]:
    """Nodes past their lease (ids); READY ones become LOST. A drained node keeps its state
    (an operator's decision) but its jobs are reaped all the same."""
    cutoff = now - timedelta(seconds=settings.AGENT_LEASE_S)
    stale = Node.objects.filter(last_heartbeat_at__lt=cutoff)
    for name in stale.filter(state=Node.State.READY).values_list("name", flat=True):
        log.warning("node %s missed heartbeats for %.0f s: lost", name, settings.AGENT_LEASE_S)
    # Guarded by the same cutoff: a heartbeat that committed meanwhile keeps the node.
    result.nodes_lost = stale.filter(state=Node.State.READY).update(state=Node.State.LOST)
    return list(stale.values_list("pk", flat=True))


def _lose_jobs_on(node_ids: list[int], now: datetime, result: ReapResult) -> None:
    if not node_ids:
        return
    on_nodes: dict[int, set[str]] = defaultdict(set)
    for job_id, name in Allocation.objects.filter(
        released_at__isnull=True, slice__gpu__node_id__in=node_ids
    ).values_list("job_id", "slice__gpu__node__name"):
        on_nodes[job_id].add(name)
    holding = Job.objects.filter(
        Q(pk__in=list(on_nodes)) | Q(node_id__in=node_ids), state__in=HOLDING_STATES
    ).select_related("node")
    stop_gangs: list[int] = []
    for job in holding:
        if job.multi_node:
            # The gang's parts on those nodes are lost (their slices are freed); the others
            # are stopped, and the job is requeued once they ended (portal.jobs.attempts). A
            # gang whose parts there ended already (its first node, lost before) runs on.
            if job.pk not in on_nodes:
                continue
            for name in sorted(on_nodes[job.pk]):
                attempt_finish(
                    job_id=job.pk,
                    attempt=job.attempt,
                    outcome="lost",
                    node=name,
                    exit_code=None,
                    error=f"agent on {name} stopped sending heartbeats",
                    finished_at=now,
                    started_at=None,
                    now=now,
                )
            stop_gangs.append(job.pk)
            result.jobs_lost += 1
            continue
        where = job.node.name if job.node else "its node"
        if attempt_lose(
            job_id=job.pk,
            attempt=job.attempt,
            why=f"agent on {where} stopped sending heartbeats",
            now=now,
        ):
            result.jobs_lost += 1
    if stop_gangs:
        request_stops(stop_gangs, now=now)


def _resend_launches(now: datetime, result: ReapResult) -> None:
    resend_before = now - timedelta(seconds=settings.LAUNCH_RESEND_S)
    give_up_before = now - timedelta(seconds=settings.LAUNCH_TIMEOUT_S)
    waiting = list(
        Job.objects.filter(
            state=JobState.ASSIGNED,
            started_at__isnull=True,
            stop_requested_at__isnull=True,
            assigned_at__lt=resend_before,
            node__state=Node.State.READY,
        ).values_list("pk", "attempt", "assigned_at", "node__name")
    )
    keys = [(pk, a) for pk, a, _, _ in waiting]
    recent = recently_sent(Dispatch.Kind.LAUNCH, keys, resend_before)
    asked = recently_sent(
        Dispatch.Kind.QUERY, keys, now - timedelta(seconds=settings.QUERY_RESEND_S)
    )
    # A multi-node gang not started in time is asked about on every node its attempt holds
    # slices on: the part that did not start may be on any of them.
    gang_nodes: dict[tuple[int, int], list[str]] = defaultdict(list)
    for job_id, attempt, name in (
        Allocation.objects.filter(
            job__in=[pk for pk, _, assigned_at, _ in waiting if assigned_at < give_up_before],
            job__multi_node=True,
            attempt=F("job__attempt"),
            released_at__isnull=True,
        )
        .values_list("job_id", "attempt", "slice__gpu__node__name")
        .distinct()
        .order_by("slice__gpu__node__name")
    ):
        gang_nodes[job_id, attempt].append(name)
    resend = []
    ask: list[tuple[str, int, int]] = []
    for job_id, attempt, assigned_at, node in waiting:
        if assigned_at < give_up_before:
            if (job_id, attempt) not in asked:
                for name in gang_nodes.get((job_id, attempt)) or [node]:
                    ask.append((name, job_id, attempt))
        elif (job_id, attempt) not in recent:
            resend.append(job_id)
    if resend:
        log.info("re-sending launch of jobs %s (no started report yet)", resend)
        result.launches_resent = send_launches(resend, now=now)
    if ask:
        log.warning("asking the nodes of jobs %s, not started in time", [j for _, j, _ in ask])
        result.launches_queried = send_queries(ask, now=now)


def _resend_stops(now: datetime, result: ReapResult) -> None:
    resend_before = now - timedelta(seconds=settings.STOP_RESEND_S)
    stopping = list(
        Job.objects.filter(
            # A gang's parts may run on after its first node was lost: the stop goes to
            # every node where a part still holds slices.
            Q(node__state__in=[Node.State.READY, Node.State.DRAINED]) | Q(multi_node=True),
            state__in=HOLDING_STATES,
            stop_requested_at__lt=resend_before,
        ).values_list("pk", "attempt")
    )
    recent = recently_sent(Dispatch.Kind.STOP, stopping, resend_before)
    resend = [job_id for job_id, attempt in stopping if (job_id, attempt) not in recent]
    if resend:
        log.info("re-sending stop of jobs %s (still holding slices)", resend)
        request_stops(resend, now=now)
        result.stops_resent = len(resend)

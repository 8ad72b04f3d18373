"""What the control plane does with the agents' reports.

Every handler is idempotent and guarded by the job's state and attempt (the attempt
lifecycle in ``portal.jobs.attempts``): a report repeated by the broker, or one that arrives
after the portal moved on (a stale attempt), changes nothing. Nothing here waits on the
broker: messages to agents go out after commit.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from portal.agents.dispatch import recently_sent, request_stop, send_queries, send_stop_attempt
from portal.agents.gpu_metrics import record_gpu_samples
from portal.agents.hardware import record_inventory_change
from portal.agents.models import Dispatch, JobMetrics, NodeCredential, RefusedMessage
from portal.agents.trust import record_refusal
from portal.cluster.models import Gpu, Node, Slice
from portal.cluster.services import sync_inventory
from portal.jobs.attempts import (
    AttemptStarted,
    ReportedAttempt,
    attempt_finish,
    attempt_settle_late,
    attempt_start,
    attempts_start_on_node,
)
from portal.jobs.gangs import gang_members
from portal.jobs.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobLogChunk,
    JobState,
)
from portal.passes import schedule_pass_on_commit
from workers.protocol import (
    Ack,
    Finished,
    Heartbeat,
    LogChunk,
    Message,
    Metrics,
    Report,
    ReportKey,
    Reports,
    Started,
)
from workers.protocol import Gpu as InventoryGpu
from workers.signing import SignatureError

log = logging.getLogger("portal.agents")

S = JobState
# A node that keeps claiming another node's GPU is recorded once per this long.
CLAIM_QUIET = timedelta(minutes=10)


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def handle_report(message: Message, *, now: datetime | None = None) -> Ack | None:
    """Apply one verified agent message; returns the acknowledgement to send after commit
    (None for metrics, which are not acknowledged). Raises AgentRefused for a heartbeat of a
    second agent claiming a live node.

    A report is acknowledged whether it changed something or not: a repeat or a stale report
    (an attempt the portal moved on from) must leave the agent's outbox all the same."""
    when = now or timezone.now()
    if isinstance(message, Heartbeat):
        return record_heartbeat(message, now=when)
    if isinstance(message, Reports):
        return record_reports(message, now=when)
    if isinstance(message, (Started, LogChunk, Finished)) and not _its_attempt(message):
        _refuse_not_its_attempt(message, now=when)
    elif isinstance(message, Started):
        record_started(message, now=when)
    elif isinstance(message, LogChunk):
        record_log(message)
    elif isinstance(message, Finished):
        record_finished(message, now=when)
    elif isinstance(message, Metrics):
        record_metrics(message, now=when)
        return None
    else:
        log.warning("dropped a %s message: agents do not send those", type(message).__name__)
        return None
    return Ack(node=message.node, reports=(message.report_key(),))


def _its_attempt(message: Started | LogChunk | Finished) -> bool:
    """Whether the attempt was ever placed on the reporting node (held now or before)."""
    return Allocation.objects.filter(
        job_id=message.job_id, attempt=message.attempt, slice__gpu__node__name=message.node
    ).exists()


def _refuse_not_its_attempt(message: Report, *, now: datetime) -> None:
    """Signed by a node that was never given this attempt: not applied, but acknowledged, so a
    confused agent's outbox does not resend it for ever."""
    record_refusal(
        SignatureError(
            "not_its_attempt",
            f"{message.node} reported {message.TYPE} for job {message.job_id} attempt "
            f"{message.attempt}, which was never placed on it",
            node=message.node,
        ),
        {"type": message.TYPE},
        now=now,
    )


def record_reports(batch: Reports, *, now: datetime) -> Ack:
    """A node's batch of reports, in the caller's transaction (the one that claims the batch's
    nonce), with the same effects as each report handled alone, in the batch's order:

    1. a report repeated inside the batch (same key) is applied once;
    2. the attempts ever placed on the node are read, and the ``started`` of single-node
       jobs still ASSIGNED at that attempt move to RUNNING together, in one statement on
       PostgreSQL (``attempts_start_on_node``: the guarded UPDATE and the INSERT of events
       of ``attempts_start``); a report about an attempt never placed on the node is refused
       and recorded, and acknowledged (as alone);
    3. every other report goes the way it goes alone: a ``started`` that did not move (a
       repeat, a stale attempt, a gang's part), log chunks and ``finished`` (charging,
       losses, requeues, gangs).

    Returns one acknowledgement naming every report of the batch."""
    unique: dict[tuple[str, int, int, int], Report] = {}
    for report in batch.reports:
        unique.setdefault(report.report_key().as_tuple(), report)
    reports = list(unique.values())
    starts = attempts_start_on_node(
        node=batch.node,
        reported=[
            ReportedAttempt(
                job_id=r.job_id,
                attempt=r.attempt,
                start=AttemptStarted(
                    job_id=r.job_id,
                    attempt=r.attempt,
                    started_at=_at(r.started_at),
                    message=f"started on {r.node}",
                )
                if isinstance(r, Started)
                else None,
            )
            for r in reports
        ],
        at=now,
    )
    ours = []
    for report in reports:
        if (report.job_id, report.attempt) in starts.placed:
            ours.append(report)
        else:
            _refuse_not_its_attempt(report, now=now)
    started = starts.started
    for report in ours:
        if isinstance(report, Started):
            if (report.job_id, report.attempt) not in started:
                record_started(report, now=now)
        elif isinstance(report, LogChunk):
            record_log(report)
        else:
            record_finished(report, now=now)
    return Ack(node=batch.node, reports=tuple(r.report_key() for r in reports))


# --- reports about one attempt ----------------------------------------------------------------


def record_started(msg: Started, *, now: datetime) -> None:
    with transaction.atomic():
        if not attempt_start(
            job_id=msg.job_id,
            attempt=msg.attempt,
            started_at=_at(msg.started_at),
            message=f"started on {msg.node}",
            at=now,
            node=msg.node,
        ):
            _stop_if_orphan(msg.node, msg.job_id, msg.attempt)


def _stop_if_orphan(node: str, job_id: int, attempt: int) -> None:
    """An agent runs an attempt the portal does not give it (a stale attempt, a job that was
    lost and requeued): tell it to stop, after commit."""
    row = Job.objects.filter(pk=job_id).values_list("state", "attempt").first()
    if (
        row is not None
        and row[1] == attempt
        and (row[0] in HOLDING_STATES or row[0] in TERMINAL_STATES)
    ):
        # A repeat of a report we already applied, or a `started` that arrived after its
        # `finished`: the attempt is the portal's, nothing to stop.
        return
    log.info("job %s attempt %s on %s is not the portal's: stopping it", job_id, attempt, node)
    transaction.on_commit(lambda: send_stop_attempt(node, job_id, attempt, "cancel"))


def record_log(msg: LogChunk) -> None:
    """A chunk of output, once per (job, attempt, part, seq): the part is the rank of the
    node that sent it in a multi-node gang (each node numbers its chunks), else 0."""
    row = (
        Job.objects.filter(pk=msg.job_id).values_list("attempt", "multi_node", "node__name").first()
    )
    if row is None or msg.attempt > row[0] or msg.attempt < 1:
        log.warning("dropped log chunk of unknown job %s attempt %s", msg.job_id, msg.attempt)
        return
    part = 0
    if row[1]:
        members = gang_members(job_id=msg.job_id, attempt=msg.attempt, first=row[2] or "")
        part = next((m.rank for m in members if m.node == msg.node), 0)
    JobLogChunk.objects.bulk_create(
        [
            JobLogChunk(
                job_id=msg.job_id, attempt=msg.attempt, part=part, seq=msg.seq, data=msg.data
            )
        ],
        ignore_conflicts=True,
    )


def record_finished(msg: Finished, *, now: datetime) -> None:
    ended = attempt_finish(
        job_id=msg.job_id,
        attempt=msg.attempt,
        outcome=msg.outcome,
        node=msg.node,
        exit_code=msg.exit_code,
        error=msg.error,
        finished_at=_at(msg.finished_at),
        started_at=None if msg.started_at is None else _at(msg.started_at),
        now=now,
    )
    if ended in HOLDING_STATES:
        # One part of a multi-node gang ended, the others run: if it ended otherwise than
        # succeeded, their stop was asked for (sent only where one was).
        job_id = msg.job_id
        transaction.on_commit(lambda: request_stop(job_id))
        return
    if ended is not None:
        return
    late = attempt_settle_late(
        job_id=msg.job_id,
        attempt=msg.attempt,
        outcome=msg.outcome,
        node=msg.node,
        exit_code=msg.exit_code,
        error=msg.error,
        finished_at=_at(msg.finished_at),
        started_at=None if msg.started_at is None else _at(msg.started_at),
        now=now,
    )
    if late is None:
        log.info("finished report of job %s attempt %s ignored: stale", msg.job_id, msg.attempt)
        return
    log.warning(
        "job %s ended %s by the late result of attempt %s; attempt %s is not needed",
        msg.job_id,
        late.state,
        msg.attempt,
        late.superseded_attempt,
    )
    if late.node is not None:
        node, attempt = late.node, late.superseded_attempt
        transaction.on_commit(lambda: send_stop_attempt(node, msg.job_id, attempt, "cancel"))


def record_metrics(msg: Metrics, *, now: datetime) -> None:
    """A batch of GPU samples (portal.agents.gpu_metrics), and the single latest sample of
    one attempt that agents sent before batches."""
    if msg.devices or msg.attempts:
        record_gpu_samples(msg, now=now)
    if msg.job_id is None or msg.sampled_at is None:
        return
    holding = Job.objects.filter(
        pk=msg.job_id, attempt=msg.attempt, state__in=HOLDING_STATES
    ).exists()
    if not holding:
        return
    JobMetrics.objects.update_or_create(
        job_id=msg.job_id,
        defaults={
            "attempt": msg.attempt,
            "gpu_util_pct": msg.gpu_util_pct,
            "memory_used_mb": msg.memory_used_mb,
            "sampled_at": _at(msg.sampled_at),
        },
    )


# --- heartbeats: registration, lease, inventory, settlement ----------------------------------


class AgentRefused(Exception):
    """A heartbeat that is signed by the node's key but cannot be accepted (a second agent
    claiming a node whose agent is alive); `reason` and the message say why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def record_heartbeat(msg: Heartbeat, *, now: datetime) -> Ack:
    """Renew the node's lease, sync its inventory, settle what the heartbeat says ran and
    ended, and ask about held attempts it does not mention. Raises AgentRefused for a second
    agent on a live node (nothing is applied)."""
    settled: list[ReportKey] = []
    with transaction.atomic():
        node, came_back = _accept_agent_run(msg, now)
        gpus, claimed = _own_gpus(node, msg)
        changed = sync_inventory(node, gpus)
        age = now.timestamp() - msg.sent_at
        for finished in msg.finished:
            if _its_attempt(finished):
                record_finished(finished, now=now)
            settled.append(finished.report_key())
        # Slices that are gone: drained, the attempts still on them asked to stop (after the
        # ends this heartbeat reports, so an attempt already over is not asked), an event on
        # the node.
        record_inventory_change(node, msg.inventory, changed, now=now)
        if age <= settings.AGENT_LEASE_S:
            _settle_running(node, msg, now)
        else:
            # An old heartbeat (a backlog, or a clock far off) says little about what runs now.
            log.warning("heartbeat of %s is %.0f s old: not reconciling its jobs", node.name, age)
        if came_back or changed:
            schedule_pass_on_commit()
    for uuid, owner in claimed:
        if RefusedMessage.objects.filter(
            reason="gpu_claimed", node=msg.node, detail__contains=uuid, at__gte=now - CLAIM_QUIET
        ).exists():
            continue  # said already: one record per claim every CLAIM_QUIET, not per heartbeat
        record_refusal(
            SignatureError(
                "gpu_claimed",
                f"{msg.node} listed GPU {uuid}, which belongs to node {owner}: not given to it",
                node=msg.node,
            ),
            {"type": "heartbeat"},
            now=now,
        )
    return Ack(
        node=msg.node,
        boot=msg.boot,
        heartbeat_seq=msg.seq,
        lease_s=settings.AGENT_LEASE_S,
        reports=tuple(settled),
    )


def _accept_agent_run(msg: Heartbeat, now: datetime) -> tuple[Node, bool]:
    """Renew the node's lease from this heartbeat, if its agent run may hold it.

    The run the portal listens to (`NodeCredential.boot`) keeps it; a new run takes over when
    it names that run as its predecessor on the same work directory (a restart), when the
    node has no run yet, or when the lease of the old run lapsed. Any other run is a second
    agent claiming the node: refused, so two agents never run one node's jobs.
    """
    node = Node.objects.select_for_update().get(name=msg.node)
    credential = NodeCredential.objects.select_for_update().get(node=node)
    lease_lapsed = (
        node.last_heartbeat_at is None
        or (now - node.last_heartbeat_at).total_seconds() > settings.AGENT_LEASE_S
    )
    if credential.boot != msg.boot:
        successor = bool(msg.previous_boot) and msg.previous_boot == credential.boot
        if credential.boot and not successor and not lease_lapsed:
            raise AgentRefused(
                "duplicate_agent",
                f"agent run {msg.boot} claims node {msg.node}, whose agent run "
                f"{credential.boot} is alive (last heartbeat "
                f"{(now - node.last_heartbeat_at).total_seconds():.0f} s ago): refused",
            )
        log.info("node %s: agent run %s takes over from %r", msg.node, msg.boot, credential.boot)
        NodeCredential.objects.filter(pk=credential.pk).update(boot=msg.boot, boot_since=now)
    fields: dict[str, Any] = {
        "hostname": msg.inventory.hostname,
        "address": msg.address,
        "driver": msg.inventory.driver,
        "agent_version": msg.agent_version,
        "launch_batches": msg.launch_batches,
        "last_heartbeat_at": now,
    }
    came_back = node.state == Node.State.LOST
    if came_back:
        log.info("node %s is back", node.name)
        fields["state"] = Node.State.READY
    Node.objects.filter(pk=node.pk).update(**fields)
    for name, value in fields.items():
        setattr(node, name, value)
    return node, came_back


def _own_gpus(node: Node, msg: Heartbeat) -> tuple[tuple[InventoryGpu, ...], list[tuple[str, str]]]:
    """The heartbeat's GPUs minus those registered to another node that still has them (a
    node cannot claim another node's GPUs). A GPU its old node no longer lists (present
    False: the card moved) may be claimed. Returns (GPUs to sync, [(uuid, owner)] refused)."""
    uuids = {u for g in msg.inventory.gpus for u in (g.uuid, *(m.uuid for m in g.mig))}
    owners = dict(
        Gpu.objects.filter(uuid__in=uuids, present=True)
        .exclude(node=node)
        .values_list("uuid", "node__name")
    )
    owners.update(
        Slice.objects.filter(key__in=uuids, present=True)
        .exclude(gpu__node=node)
        .values_list("key", "gpu__node__name")
    )
    if not owners:
        return msg.inventory.gpus, []
    kept = tuple(
        g
        for g in msg.inventory.gpus
        if g.uuid not in owners and not any(m.uuid in owners for m in g.mig)
    )
    return kept, sorted(owners.items())


def _settle_running(node: Node, msg: Heartbeat, now: datetime) -> None:
    """Compare what the agent runs with what the portal believes runs on the node.

    - A listed attempt with a start time that the portal still has ASSIGNED started (its
      `started` report is late): recorded as started.
    - A started attempt the heartbeat does not mention (neither running nor finished) is
      never declared lost for that: the node is asked about it (`query`), at most every
      PORTAL_QUERY_RESEND_S, and only its answer, or the lease, ends it. One that started
      less than PORTAL_RECONCILE_GRACE_S before the heartbeat was sent is left alone. An
      attempt not yet started (ASSIGNED) is the reaper's: its launch is sent again until it
      starts, and its node is asked only after PORTAL_LAUNCH_TIMEOUT_S. Asking sooner would
      race the launch still on its way (a backlog, a dropped copy): a `query` that overtakes
      it makes the node refuse the attempt for good, and the job is requeued for nothing.
    - An attempt it lists that the portal does not give it is told to stop.
    """
    listed = {(r.job_id, r.attempt): r for r in msg.running}
    finished = {(f.job_id, f.attempt) for f in msg.finished}
    held = {
        pk: (attempt, state, started_at or assigned_at)
        for pk, attempt, state, started_at, assigned_at in Job.objects.filter(
            # A gang runs on this node only while its part here holds slices.
            Q(node=node, multi_node=False)
            | Q(
                allocations__slice__gpu__node=node,
                allocations__released_at__isnull=True,
                allocations__attempt=F("attempt"),
            ),
            state__in=HOLDING_STATES,
        )
        .values_list("pk", "attempt", "state", "started_at", "assigned_at")
        .distinct()
    }
    for job_id, (attempt, state, _) in held.items():
        running = listed.get((job_id, attempt))
        if running is not None and running.started_at is not None and state == S.ASSIGNED:
            attempt_start(
                job_id=job_id,
                attempt=attempt,
                started_at=_at(running.started_at),
                message=f"started on {node.name} (from its heartbeat)",
                at=now,
                node=node.name,
            )
    cutoff = msg.sent_at - settings.RECONCILE_GRACE_S
    unmentioned = [
        (job_id, attempt)
        for job_id, (attempt, state, started_at) in held.items()
        if state == S.RUNNING
        and (job_id, attempt) not in listed
        and (job_id, attempt) not in finished
        and started_at is not None
        and started_at.timestamp() < cutoff
    ]
    if unmentioned:
        recent = recently_sent(
            Dispatch.Kind.QUERY,
            unmentioned,
            now - timedelta(seconds=settings.QUERY_RESEND_S),
        )
        ask = [(node.name, j, a) for j, a in unmentioned if (j, a) not in recent]
        if ask:
            log.info("node %s does not mention %s: asking it", node.name, ask)
            transaction.on_commit(lambda: send_queries(ask, now=now))
    held_keys = {(job_id, attempt) for job_id, (attempt, _, _) in held.items()}
    for job_id, attempt in sorted(set(listed) - held_keys):
        _stop_if_orphan(node.name, job_id, attempt)

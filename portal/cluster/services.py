"""What the control plane does with the agents' reports, and how an attempt ends.

Every handler is idempotent and guarded by the job's state and attempt (a conditional
UPDATE through ``transition``): a report repeated by the broker, or one that arrives after
the portal moved on (a stale attempt), changes nothing. Nothing here waits on the broker:
messages to agents go out after commit.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from portal.accounting.services import charge_attempt
from portal.cluster.models import Allocation, Gpu, JobMetrics, Node, Slice
from portal.jobs.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Job,
    JobEvent,
    JobLogChunk,
    JobState,
)
from portal.jobs.transitions import transition
from portal.scheduling.triggers import schedule_pass_on_commit
from scheduler.model import MIG_COMPUTE_SLICES_PER_GPU, SliceKind
from scheduler.units import billed_units, mig_units, mps_units
from workers.protocol import (
    Finished,
    Heartbeat,
    LogChunk,
    Message,
    Metrics,
    Started,
)
from workers.protocol import Gpu as InventoryGpu

log = logging.getLogger("portal.cluster")

S = JobState

# A finished report's outcome -> the job's end state.
OUTCOME_STATES = {
    "succeeded": S.SUCCEEDED,
    "failed": S.FAILED,
    "launch_error": S.FAILED,
    "timed_out": S.TIMED_OUT,
    "cancelled": S.CANCELLED,
    "preempted": S.PREEMPTED,
}
_TERMINAL_FIELDS_FOR = frozenset({S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED})
# NVML names compute instances smaller than their GPU instance "1c.3g.40gb".
_MIG_NAME = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb")


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def handle_report(message: Message, *, now: datetime | None = None) -> None:
    """Apply one validated agent report."""
    when = now or timezone.now()
    if isinstance(message, Heartbeat):
        record_heartbeat(message, now=when)
    elif isinstance(message, Started):
        record_started(message, now=when)
    elif isinstance(message, LogChunk):
        record_log(message)
    elif isinstance(message, Finished):
        record_finished(message, now=when)
    elif isinstance(message, Metrics):
        record_metrics(message)
    else:
        log.warning("dropped a %s message: agents do not send those", type(message).__name__)


# --- ending attempts ------------------------------------------------------------------------


def end_attempt(
    job_id: int,
    *,
    attempt: int,
    to: str,
    from_states: Iterable[str],
    message: str,
    now: datetime | None = None,
    ended_at: datetime | None = None,
    fields: Mapping[str, Any] | None = None,
) -> bool:
    """Move a holding attempt to ``to``, free its slices and charge its use.

    Returns False (and changes nothing) when the job is not at ``attempt`` in one of
    ``from_states`` any more.
    """
    when = now or timezone.now()
    with transaction.atomic():
        left = transition(
            job_id,
            to=to,
            from_states=from_states,
            attempt=attempt,
            message=message,
            at=when,
            **dict(fields or {}),
        )
        if left is None:
            return False
        release_and_charge(job_id, attempt, ended_at=min(ended_at or when, when), now=when)
        schedule_pass_on_commit()
    return True


def release_and_charge(job_id: int, attempt: int, *, ended_at: datetime, now: datetime) -> None:
    """Release the attempt's allocations and charge the hold (once per attempt)."""
    from portal.scheduling.config import scheduler_config

    config = scheduler_config()
    held = list(
        Allocation.objects.filter(job_id=job_id, attempt=attempt, released_at__isnull=True)
        .select_related("slice__gpu", "job")
        .order_by("created_at")
    )
    if not held:
        return
    Allocation.objects.filter(pk__in=[a.pk for a in held]).update(released_at=now)
    job = held[0].job
    units = sum(billed_units(a.slice.units, a.slice.gpu.model, config.model_weights) for a in held)
    held_from = held[0].created_at
    charge_attempt(
        job_id=job_id,
        attempt=attempt,
        team_id=job.team_id,
        user_id=job.user_id,
        units=units,
        held_from=held_from,
        held_until=max(ended_at, held_from),
        half_life_s=config.usage_half_life_s,
    )


def requeue(job_id: int, *, attempt: int, from_state: str, message: str) -> bool:
    """PREEMPTED/LOST -> PENDING, keeping ``queued_since`` (its place) and the attempt number
    (the next assignment counts it up)."""
    return (
        transition(
            job_id,
            to=S.PENDING,
            from_states=[from_state],
            attempt=attempt,
            message=message,
            stop_requested_at=None,
            stop_reason="",
            assigned_at=None,
            started_at=None,
            finished_at=None,
            exit_code=None,
            borrowed=False,
        )
        is not None
    )


def lose_attempt(job_id: int, *, attempt: int, why: str, now: datetime | None = None) -> str | None:
    """A holding attempt whose agent is gone or forgot it: LOST, then requeued while the job
    has retries left (PORTAL_JOB_MAX_RETRIES lost attempts), else FAILED. Returns the state
    it ended in, or None when the attempt was not holding any more."""
    when = now or timezone.now()
    with transaction.atomic():
        if not end_attempt(
            job_id,
            attempt=attempt,
            to=S.LOST,
            from_states=HOLDING_STATES,
            message=f"lost: {why}",
            now=when,
        ):
            return None
        losses = JobEvent.objects.filter(job_id=job_id, to_state=S.LOST).count()
        retries = settings.JOB_MAX_RETRIES
        if losses > retries:
            reason = f"lost {losses} times (PORTAL_JOB_MAX_RETRIES={retries}); last: {why}"
            transition(
                job_id,
                to=S.FAILED,
                from_states=[S.LOST],
                attempt=attempt,
                message=reason,
                at=when,
                reason=reason,
                finished_at=when,
            )
            return S.FAILED
        requeue(
            job_id,
            attempt=attempt,
            from_state=S.LOST,
            message=f"requeued after loss {losses} of {retries + 1} allowed",
        )
        return S.PENDING


# --- reports ---------------------------------------------------------------------------------


def record_started(msg: Started, *, now: datetime) -> None:
    with transaction.atomic():
        left = transition(
            msg.job_id,
            to=S.RUNNING,
            from_states=[S.ASSIGNED],
            attempt=msg.attempt,
            message=f"started on {msg.node}",
            at=now,
            started_at=_at(msg.started_at),
        )
        if left is None:
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
    _stop_after_commit(node, job_id, attempt)


def _stop_after_commit(node: str, job_id: int, attempt: int) -> None:
    from portal.cluster.dispatch import send_stop_attempt

    transaction.on_commit(lambda: send_stop_attempt(node, job_id, attempt, "cancel"))


def record_log(msg: LogChunk) -> None:
    current = Job.objects.filter(pk=msg.job_id).values_list("attempt", flat=True).first()
    if current is None or msg.attempt > current or msg.attempt < 1:
        log.warning("dropped log chunk of unknown job %s attempt %s", msg.job_id, msg.attempt)
        return
    JobLogChunk.objects.bulk_create(
        [JobLogChunk(job_id=msg.job_id, attempt=msg.attempt, seq=msg.seq, data=msg.data)],
        ignore_conflicts=True,
    )


def end_state_for(outcome: str, stop_reason: str) -> str:
    """The job's end state for an agent's outcome, read together with why the portal asked it
    to stop: a cancel that overtook a preemption ends the job (no requeue), and a preempted
    job that an agent reports merely 'cancelled' is requeued."""
    state = OUTCOME_STATES[outcome]
    if stop_reason == "cancel" and state in (S.PREEMPTED, S.CANCELLED):
        return S.CANCELLED
    if stop_reason == "preempt" and state == S.CANCELLED:
        return S.PREEMPTED
    return state


def record_finished(msg: Finished, *, now: datetime) -> None:
    row = Job.objects.filter(pk=msg.job_id).values_list("state", "attempt", "stop_reason").first()
    if row is None or row[0] not in HOLDING_STATES or row[1] != msg.attempt:
        log.info("finished report of job %s attempt %s ignored: stale", msg.job_id, msg.attempt)
        return
    to = end_state_for(msg.outcome, row[2])
    ended = _at(msg.finished_at)
    detail = msg.error or msg.outcome
    fields: dict[str, Any] = {"exit_code": msg.exit_code}
    if to in _TERMINAL_FIELDS_FOR:
        fields.update(finished_at=min(ended, now), reason="" if to == S.SUCCEEDED else detail)
    exit_text = "" if msg.exit_code is None else f", exit code {msg.exit_code}"
    with transaction.atomic():
        if row[0] == S.ASSIGNED and msg.started_at is not None:
            # This report overtook `started` (two control workers, a job that ends at once):
            # record the start first, so the job's history and times stay whole.
            transition(
                msg.job_id,
                to=S.RUNNING,
                from_states=[S.ASSIGNED],
                attempt=msg.attempt,
                message=f"started on {msg.node}",
                at=min(_at(msg.started_at), now),
                started_at=_at(msg.started_at),
            )
        if not end_attempt(
            msg.job_id,
            attempt=msg.attempt,
            to=to,
            from_states=HOLDING_STATES,
            message=f"{msg.outcome} on {msg.node}{exit_text}"
            + (f": {msg.error}" if msg.error else ""),
            now=now,
            ended_at=ended,
            fields=fields,
        ):
            return
        if to == S.PREEMPTED:
            requeue(
                msg.job_id,
                attempt=msg.attempt,
                from_state=S.PREEMPTED,
                message="requeued after preemption, keeping its place",
            )


def record_metrics(msg: Metrics) -> None:
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


# --- heartbeats: registration, inventory, reconciliation ------------------------------------


@dataclass(frozen=True, slots=True)
class _WantedSlice:
    gpu_uuid: str
    kind: str
    profile: str
    mig_uuid: str
    units: float


def record_heartbeat(msg: Heartbeat, *, now: datetime) -> Node:
    with transaction.atomic():
        node, came_back = _upsert_node(msg, now)
        changed = sync_inventory(node, msg.inventory.gpus)
        age = now.timestamp() - msg.sent_at
        if age <= settings.AGENT_LEASE_S:
            _reconcile(node, msg, now)
        else:
            # An old heartbeat (a backlog, or a clock far off) says little about what runs now.
            log.warning("heartbeat of %s is %.0f s old: not reconciling its jobs", node.name, age)
        if came_back or changed:
            schedule_pass_on_commit()
    return node


def _upsert_node(msg: Heartbeat, now: datetime) -> tuple[Node, bool]:
    fields = {
        "hostname": msg.inventory.hostname,
        "driver": msg.inventory.driver,
        "agent_version": msg.agent_version,
        "last_heartbeat_at": now,
    }
    node = Node.objects.select_for_update().filter(name=msg.node).first()
    if node is None:
        try:
            with transaction.atomic():
                node = Node.objects.create(name=msg.node, state=Node.State.READY, **fields)
            log.info("node %s registered", node.name)
            return node, True
        except IntegrityError:
            node = Node.objects.select_for_update().get(name=msg.node)
    came_back = node.state == Node.State.LOST
    if came_back:
        log.info("node %s is back", node.name)
        fields["state"] = Node.State.READY
    Node.objects.filter(pk=node.pk).update(**fields)
    for name, value in fields.items():
        setattr(node, name, value)
    return node, came_back


def wanted_slices(gpus: Iterable[InventoryGpu]) -> dict[str, _WantedSlice]:
    """Slice key -> what the slice should be, for an inventory's GPUs."""
    wanted: dict[str, _WantedSlice] = {}
    for gpu in gpus:
        if gpu.mode == "mig":
            for mig in gpu.mig:
                units = _mig_slice_units(mig.profile)
                if units is None:
                    log.warning(
                        "MIG device %s has unknown profile %r: not offered", mig.uuid, mig.profile
                    )
                    continue
                wanted[mig.uuid] = _WantedSlice(
                    gpu.uuid, SliceKind.MIG, mig.profile, mig.uuid, units
                )
        elif gpu.mode == "mps":
            units = mps_units(gpu.mps_shares)
            for i in range(gpu.mps_shares):
                wanted[f"{gpu.uuid}/mps/{i}"] = _WantedSlice(gpu.uuid, SliceKind.MPS, "", "", units)
        else:
            wanted[gpu.uuid] = _WantedSlice(gpu.uuid, SliceKind.WHOLE, "", "", 1.0)
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


def sync_inventory(node: Node, gpus: tuple[InventoryGpu, ...]) -> bool:
    """Make the node's Gpu and Slice rows match the inventory; returns whether anything changed.

    Rows are never deleted (allocations and history point at them): a GPU or slice that
    vanished is marked ``present=False`` and comes back under the same key.
    """
    changed = False
    by_uuid = {g.uuid: g for g in gpus}
    rows = {
        g.uuid: g
        for g in Gpu.objects.filter(node=node) | Gpu.objects.filter(uuid__in=list(by_uuid))
    }
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
            changed = True
        elif any(getattr(row, k) != v for k, v in values.items()):
            Gpu.objects.filter(pk=row.pk).update(**values)
            changed = True
    gone = [row.pk for uuid, row in rows.items() if uuid not in by_uuid and row.present]
    if gone:
        Gpu.objects.filter(pk__in=gone).update(present=False)
        changed = True
    return _sync_slices(node, rows, wanted_slices(gpus)) or changed


def _sync_slices(
    node: Node, gpu_rows: Mapping[str, Gpu], wanted: Mapping[str, _WantedSlice]
) -> bool:
    changed = False
    existing = {
        s.key: s
        for s in Slice.objects.filter(gpu__node=node) | Slice.objects.filter(key__in=list(wanted))
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
        elif any(getattr(row, k) != v for k, v in values.items()):
            Slice.objects.filter(pk=row.pk).update(**values)
            changed = True
    if to_create:
        Slice.objects.bulk_create(to_create)
        changed = True
    gone = [row.pk for key, row in existing.items() if key not in wanted and row.present]
    if gone:
        Slice.objects.filter(pk__in=gone).update(present=False)
        changed = True
    return changed


def _reconcile(node: Node, msg: Heartbeat, now: datetime) -> None:
    """Compare what the agent runs with what the portal believes runs on the node.

    - A RUNNING attempt the agent does not list, started more than PORTAL_RECONCILE_GRACE_S
      before the heartbeat was sent, is lost (the agent restarted without it).
    - An ASSIGNED attempt it does not list may still be on its way (the launch message);
      the reaper re-sends the launch and gives up after PORTAL_LAUNCH_TIMEOUT_S.
    - An attempt it lists that the portal does not give it is told to stop.
    """
    listed = {(ref.job_id, ref.attempt) for ref in msg.running}
    held = set(
        Allocation.objects.filter(
            released_at__isnull=True,
            slice__gpu__node=node,
            job__state__in=HOLDING_STATES,
            attempt=F("job__attempt"),
        ).values_list("job_id", "attempt")
    )
    held |= set(
        Job.objects.filter(node=node, state__in=HOLDING_STATES).values_list("pk", "attempt")
    )
    cutoff = msg.sent_at - settings.RECONCILE_GRACE_S
    missing = [key for key in held if key not in listed]
    if missing:
        running = Job.objects.filter(
            pk__in=[job_id for job_id, _ in missing], state=S.RUNNING
        ).values_list("pk", "attempt", "started_at")
        for job_id, attempt, started_at in running:
            if (job_id, attempt) in held and started_at and started_at.timestamp() < cutoff:
                lose_attempt(
                    job_id,
                    attempt=attempt,
                    why=f"its agent on {node.name} no longer runs it",
                    now=now,
                )
    for job_id, attempt in sorted(listed - held):
        _stop_if_orphan(node.name, job_id, attempt)

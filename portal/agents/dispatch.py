"""Messages to the agents: launch an attempt on its slices, stop an attempt.

Messages are built from the database (never from what a caller passes in), so a late or
repeated call sends what is true now: a launch only for a job still ASSIGNED, a stop only
for a job whose stop was asked for. Agents are idempotent by (job, attempt), so sending
twice is safe; the reaper re-sends what got no answer. A broker error is logged and never
raised: the database already holds the decision, and the reaper repairs the message.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from portal.agents.keys import node_keys
from portal.agents.models import Dispatch
from portal.agents.trust import seal_for
from portal.bulk import insert_rows
from portal.celery import app
from portal.cluster.models import Node
from portal.jobs.attempts import attempt_end
from portal.jobs.gangs import GangMember, gang_members, rendezvous_env
from portal.jobs.models import HOLDING_STATES, Allocation, Job, JobState
from portal.policy import scheduler_config
from portal.tenants.models import image_prefixes_of
from workers.protocol import (
    LAUNCHES_MAX,
    STOP_REASONS,
    TASK_ACK,
    TASK_LAUNCH,
    TASK_QUERY,
    TASK_STOP,
    Ack,
    ContainerPolicy,
    Device,
    Launch,
    Launches,
    Message,
    ProtocolError,
    Query,
    Stop,
    checked,
    node_queue,
)

log = logging.getLogger("portal.dispatch")

# A message an agent has not picked up by then is dropped by the broker; the reaper sends
# a fresh one if it is still needed (so an agent back after a long outage does not start
# attempts that were requeued elsewhere meanwhile).
MESSAGE_EXPIRES_S = 600
_CHUNK = 1_000
_MIG_MEMORY = re.compile(r"(\d+)g\.(\d+)gb")


def send_launch(job_id: int) -> None:
    """Send agent.launch for the job's current attempt, if it is ASSIGNED. Safe to repeat."""
    send_launches([job_id])


def send_launches(job_ids: Iterable[int], *, now: datetime | None = None) -> int:
    """Send one launch per node per ASSIGNED job among ``job_ids``, together per node where
    its agent takes batches; returns launches sent (one per job and node)."""
    ids = list(dict.fromkeys(job_ids))
    sent = 0
    for start in range(0, len(ids), _CHUNK):
        sent += _send_launch_chunk(ids[start : start + _CHUNK], now or timezone.now())
    return sent


def _send_launch_chunk(job_ids: Sequence[int], now: datetime) -> int:
    jobs = launch_jobs(job_ids)
    devices: dict[int, dict[str, list[Device]]] = defaultdict(lambda: defaultdict(list))
    units: dict[tuple[int, str], float] = defaultdict(float)  # GPU units per (job, node)
    # Plain rows, not model instances, as for the jobs: four model instances per allocation
    # cost more than everything else here.
    allocations = (
        Allocation.objects.filter(job_id__in=list(jobs), released_at__isnull=True)
        .order_by("job_id", "slice__gpu__index", "slice__key")
        .values_list("job_id", "attempt", "slice__gpu__node__name", *_SLICE_COLUMNS)
    )
    for job_id, attempt, node, *slice_values in allocations:
        job = jobs[job_id]
        if attempt != job.attempt:
            continue
        item = AllocatedSlice(*slice_values)
        devices[job.pk][node].append(device_of(item))
        units[job.pk, node] += item.units
    keys = node_keys({node for by_node in devices.values() for node in by_node})
    outgoing: list[tuple[LaunchJob, str, Launch]] = []
    for job in jobs.values():
        by_node = devices.get(job.pk)
        if not by_node:
            log.error("job %s attempt %s is ASSIGNED without slices", job.pk, job.attempt)
            continue
        # The layout counts every part, also one that ended already (a resend of the launch
        # to the others must give them the same ranks).
        gang = (
            gang_members(job_id=job.pk, attempt=job.attempt, first=job.first_node)
            if job.multi_node
            else ()
        )
        try:
            messages = [
                (
                    job,
                    node,
                    launch_message(
                        job, node_devices, node=node, units=units[job.pk, node], gang=gang
                    ),
                )
                for node, node_devices in by_node.items()
            ]
        except ProtocolError as error:
            _fail_unlaunchable(job, str(error))
            continue
        outgoing += messages
    messages = _launch_messages(outgoing)
    published = _publish_all(TASK_LAUNCH, [(node, message) for node, message, _ in messages], keys)
    ok: dict[int, bool] = {}
    for (_, _, job_ids), was_sent in zip(messages, published, strict=True):
        for job_id in job_ids:
            ok[job_id] = ok.get(job_id, False) or was_sent
    launched = [(job.pk, job.attempt) for job in jobs.values() if ok.get(job.pk)]
    record_dispatch(Dispatch.Kind.LAUNCH, launched, now)
    return len(outgoing)


@dataclass(frozen=True, slots=True)
class LaunchJob:
    """What a launch says of its job: the job's own columns, its owner's name, its team's
    name and container policy, and its first node (a gang's rank 0). Read as plain rows
    (``launch_jobs``): a pass launches thousands of jobs at once, and building the job, its
    team, owner and node as model instances (every column of each, a dozen timestamps among
    them) cost more than all the rest of the dispatch."""

    pk: int
    attempt: int
    name: str
    image: str
    command: Any
    env: Any
    array_id: int | None
    array_index: int | None
    time_limit_s: int | None
    multi_node: bool
    first_node: str
    team: str
    user: str
    job_network: str
    read_only_rootfs: bool
    image_prefixes: tuple[str, ...]


_LAUNCH_COLUMNS = (
    "pk",
    "attempt",
    "name",
    "image",
    "command",
    "env",
    "array_id",
    "array_index",
    "time_limit_s",
    "multi_node",
    "node__name",
    "team__name",
    "user__username",
    "team__job_network",
    "team__read_only_rootfs",
    "team__allowed_image_prefixes",
)


def launch_jobs(job_ids: Sequence[int]) -> dict[int, LaunchJob]:
    """The ASSIGNED jobs among ``job_ids`` as ``LaunchJob``s, by pk (one query)."""
    rows = Job.objects.filter(pk__in=job_ids, state=JobState.ASSIGNED).values_list(*_LAUNCH_COLUMNS)
    jobs = {}
    for *columns, node, team, user, network, read_only, prefixes in rows:
        job = LaunchJob(
            *columns,
            first_node=node or "",
            team=team,
            user=user,
            job_network=network,
            read_only_rootfs=read_only,
            image_prefixes=image_prefixes_of(prefixes),
        )
        jobs[job.pk] = job
    return jobs


def _launch_messages(
    outgoing: Sequence[tuple[LaunchJob, str, Launch]],
) -> list[tuple[str, Launch | Launches, list[int]]]:
    """(node, message, its job ids): a node whose agent takes batches (``launch_batches``)
    gets its launches together, LAUNCHES_MAX a message; any other one launch a message. A
    pass that fills a node of 8 GPUs sends it one message, not eight."""
    batching = set(
        Node.objects.filter(
            name__in={node for _, node, _ in outgoing}, launch_batches=True
        ).values_list("name", flat=True)
    )
    messages: list[tuple[str, Launch | Launches, list[int]]] = []
    by_node: dict[str, list[Launch]] = defaultdict(list)
    for job, node, launch in outgoing:
        if node in batching:
            by_node[node].append(launch)
        else:
            messages.append((node, launch, [job.pk]))
    for node, launches in by_node.items():
        for start in range(0, len(launches), LAUNCHES_MAX):
            chunk = launches[start : start + LAUNCHES_MAX]
            if len(chunk) == 1:
                messages.append((node, chunk[0], [chunk[0].job_id]))
            else:
                batch = Launches(node=node, launches=tuple(chunk))
                messages.append((node, batch, [launch.job_id for launch in chunk]))
    return messages


def launch_message(
    job: LaunchJob,
    devices: Sequence[Device],
    *,
    node: str,
    units: float,
    gang: Sequence[GangMember] = (),
) -> Launch:
    """The launch of the job's current attempt on ``devices`` of ``node``, which hold ``units``
    GPU units; for a multi-node gang, ``gang`` is its members (``node`` among them), whose
    rendezvous the launch's env carries (raises ProtocolError if the stored job cannot be
    expressed as a valid launch)."""
    message = Launch(
        node=node,
        job_id=job.pk,
        attempt=job.attempt,
        name=job.name,
        team=job.team,
        user=job.user,
        image=job.image,
        command=tuple(str(arg) for arg in job.command or ()),
        env=launch_env(job, gang=gang, node=node),
        devices=tuple(devices),
        time_limit_s=float(job.time_limit_s) if job.time_limit_s else None,
        policy=container_policy(job, units=units),
    )
    checked(message)
    return message


def launch_env(
    job: LaunchJob | Job, *, gang: Sequence[GangMember] = (), node: str = ""
) -> dict[str, str]:
    """The job's env; for a member of a job array PORTAL_ARRAY_ID and PORTAL_ARRAY_INDEX (a
    user may not set PORTAL_* names, so these are the portal's own); for ``node``'s part of a
    multi-node gang its rendezvous (portal.jobs.gangs), over the user's values."""
    env = {str(k): str(v) for k, v in (job.env or {}).items()}
    if job.array_id is not None:
        env["PORTAL_ARRAY_ID"] = str(job.array_id)
        env["PORTAL_ARRAY_INDEX"] = str(job.array_index)
    if gang:
        env.update(rendezvous_env(gang, node=node, job_id=job.pk))
    return env


def container_policy(job: LaunchJob, *, units: float) -> ContainerPolicy:
    """How the job's container is confined on a node where it holds ``units`` GPU units: the
    operator's limits per unit, the team's network, image allow-list and read-only choice.
    The node's agent checks it again against its own policy file (docs/agent.md)."""
    # Rounded up, after the float noise of adding unit fractions (7 x 1/7) is rounded away.
    memory_mb = math.ceil(round(units * settings.JOB_MEMORY_MB_PER_UNIT, 6))
    cpus = math.ceil(round(units * settings.JOB_CPUS_PER_UNIT * 100, 6)) / 100
    return ContainerPolicy(
        memory_mb=max(1, memory_mb),
        cpus=max(0.01, cpus),
        pids_limit=settings.JOB_PIDS_LIMIT,
        network=job.job_network or "none",
        read_only_rootfs=job.read_only_rootfs or settings.JOB_READ_ONLY_ROOTFS,
        image_prefixes=job.image_prefixes,
    )


@dataclass(frozen=True, slots=True)
class AllocatedSlice:
    """What a launch says of one allocated slice (the columns of ``_SLICE_COLUMNS``)."""

    key: str
    kind: str
    profile: str
    mig_uuid: str
    units: float
    gpu_uuid: str
    gpu_index: int
    gpu_memory_mb: int | None


_SLICE_COLUMNS = (
    "slice__key",
    "slice__kind",
    "slice__profile",
    "slice__mig_uuid",
    "slice__units",
    "slice__gpu__uuid",
    "slice__gpu__index",
    "slice__gpu__memory_mb",
)


def device_of(item: AllocatedSlice) -> Device:
    """The protocol's view of one allocated slice."""
    if item.kind == "mig":
        match = _MIG_MEMORY.search(item.profile)
        return Device(
            slice_id=item.key,
            kind="mig",
            gpu_uuid=item.gpu_uuid,
            gpu_index=item.gpu_index,
            mig_uuid=item.mig_uuid,
            profile=item.profile,
            memory_mb=int(match.group(2)) * 1024 if match else None,
        )
    if item.kind == "mps":
        return Device(
            slice_id=item.key,
            kind="mps",
            gpu_uuid=item.gpu_uuid,
            gpu_index=item.gpu_index,
            mps_fraction=item.units,
            memory_mb=int(item.gpu_memory_mb * item.units) if item.gpu_memory_mb else None,
        )
    return Device(
        slice_id=item.key,
        kind="whole",
        gpu_uuid=item.gpu_uuid,
        gpu_index=item.gpu_index,
        memory_mb=item.gpu_memory_mb or None,
    )


def _fail_unlaunchable(job: LaunchJob, error: str) -> None:
    log.error("job %s cannot be launched: %s", job.pk, error)
    attempt_end(
        job_id=job.pk,
        attempt=job.attempt,
        to=JobState.FAILED,
        from_states=[JobState.ASSIGNED],
        message=f"cannot be launched: {error}",
        fields={"reason": f"cannot be launched: {error}", "finished_at": timezone.now()},
    )


# --- stop -----------------------------------------------------------------------------------


def request_stop(job_id: int) -> None:
    """Send agent.stop for a job whose stop was asked for (cancel, preemption, time limit).

    Does nothing for a job that holds no slices or has no stop request. Safe to call twice.
    """
    request_stops([job_id])


def request_stops(job_ids: Iterable[int], *, now: datetime | None = None) -> int:
    """``request_stop`` for many jobs in a few queries; returns messages sent."""
    ids = list(dict.fromkeys(job_ids))
    sent = 0
    for start in range(0, len(ids), _CHUNK):
        sent += _send_stop_chunk(ids[start : start + _CHUNK], now or timezone.now())
    return sent


def _send_stop_chunk(job_ids: Sequence[int], now: datetime) -> int:
    jobs = {
        pk: (attempt, reason if reason in STOP_REASONS else "cancel", node)
        for pk, attempt, reason, node in Job.objects.filter(
            pk__in=job_ids, state__in=HOLDING_STATES, stop_requested_at__isnull=False
        ).values_list("pk", "attempt", "stop_reason", "node__name")
    }
    nodes: dict[int, list[str]] = defaultdict(list)
    held = (
        Allocation.objects.filter(job_id__in=list(jobs), released_at__isnull=True)
        .values_list("job_id", "attempt", "slice__gpu__node__name")
        .order_by("job_id", "slice__gpu__node__name")
        .distinct()
    )
    for job_id, attempt, node in held:
        if attempt == jobs[job_id][0] and node not in nodes[job_id]:
            nodes[job_id].append(node)
    sent = 0
    stopped: list[tuple[int, int]] = []
    keys = node_keys(
        {n for targets in nodes.values() for n in targets} | {j[2] for j in jobs.values() if j[2]}
    )
    for job_id, (attempt, reason, job_node) in jobs.items():
        targets = nodes.get(job_id) or ([job_node] if job_node else [])
        ok = False
        for node in targets:
            ok = send_stop_attempt(node, job_id, attempt, reason, keys=keys) or ok
            sent += 1
        if ok:
            stopped.append((job_id, attempt))
    record_dispatch(Dispatch.Kind.STOP, stopped, now)
    return sent


def send_stop_attempt(
    node: str, job_id: int, attempt: int, reason: str, *, keys: dict[str, bytes] | None = None
) -> bool:
    """Stop one attempt on one node, whatever the database says (for orphans: attempts an
    agent runs that the portal no longer gives it)."""
    grace = _grace_for(reason)
    message = Stop(node=node, job_id=job_id, attempt=attempt, reason=reason, grace_s=grace)  # type: ignore[arg-type]
    return publish(TASK_STOP, message, node, keys=keys)


def send_queries(wanted: Iterable[tuple[str, int, int]], *, now: datetime | None = None) -> int:
    """``send_query`` for (node, job, attempt) triples, each recorded for the reaper."""
    asked: list[tuple[int, int]] = []
    items = list(wanted)
    keys = node_keys({node for node, _, _ in items})
    for node, job_id, attempt in items:
        message = Query(node=node, job_id=job_id, attempt=attempt)
        if publish(TASK_QUERY, message, node, keys=keys):
            asked.append((job_id, attempt))
    record_dispatch(Dispatch.Kind.QUERY, asked, now or timezone.now())
    return len(asked)


def send_ack(ack: Ack, *, key: bytes | None = None) -> bool:
    """Tell an agent which of its reports (and which heartbeat) the portal applied; ``key``
    is the node's key when the caller has it already (it just verified the report)."""
    return publish(TASK_ACK, ack, ack.node, keys={ack.node: key} if key else None)


def _grace_for(reason: str) -> float:
    if reason == "preempt":
        return scheduler_config().grace_period_s
    return settings.STOP_GRACE_S


# --- sending and recording ---------------------------------------------------------------------


# Publishing is a round trip to the broker each: a pass's many launches go out over a few
# threads at once (the order among them does not matter; each is its own message).
_PUBLISH_THREADS = 8
_PUBLISH_IN_PARALLEL_FROM = 32


def _publish_all(
    task: str, messages: Sequence[tuple[str, Message]], keys: dict[str, bytes]
) -> list[bool]:
    """``publish`` each (node, message); whether each was sent, in order. Signed here, sent
    from the threads (which touch no database)."""
    sealed = [(node, message, seal_for(node, message, keys=keys)) for node, message in messages]

    def send(item: tuple[str, Message, dict[str, str] | None]) -> bool:
        node, message, envelope = item
        return envelope is not None and _send(task, envelope, node, message)

    if len(sealed) < _PUBLISH_IN_PARALLEL_FROM:
        return [send(item) for item in sealed]
    with ThreadPoolExecutor(max_workers=_PUBLISH_THREADS, thread_name_prefix="publish") as pool:
        return list(pool.map(send, sealed))


def publish(
    task: str, message: Message, node: str, *, keys: dict[str, bytes] | None = None
) -> bool:
    """Sign ``message`` with ``node``'s key and send it to the node's queue; log (never
    raise) a broker failure. False when it was not sent (no key, no broker)."""
    envelope = seal_for(node, message, keys=keys)
    return envelope is not None and _send(task, envelope, node, message)


def _send(task: str, envelope: dict[str, str], node: str, message: Message) -> bool:
    try:
        # Straight onto the node's list in Redis, which is all a node's agent consumes: no
        # queue declared first (two round trips to the broker on each first send to a node,
        # changing nothing on Redis), and none of send_task's routing and signals
        # (PortalCelery.send_to_queue: half the CPU of a publish).
        app.send_to_queue(task, envelope, queue=node_queue(node), expires_s=MESSAGE_EXPIRES_S)
    except Exception as error:  # noqa: BLE001 - any broker failure is the same to us
        log.warning(
            "could not send %s for job %s to %s (it is sent again): %s",
            task,
            getattr(message, "job_id", "-"),
            node,
            error,
        )
        return False
    return True


def recently_sent(kind: str, jobs: list[tuple[int, int]], since: datetime) -> set[tuple[int, int]]:
    """The (job, attempt)s among ``jobs`` sent a ``kind`` message since ``since``."""
    if not jobs:
        return set()
    wanted = set(jobs)
    rows = Dispatch.objects.filter(
        kind=kind, job_id__in=[job_id for job_id, _ in jobs], last_sent_at__gte=since
    ).values_list("job_id", "attempt")
    return {row for row in rows if row in wanted}


def record_dispatch(kind: str, sent: Sequence[tuple[int, int]], now: datetime) -> None:
    """Remember when each (job, attempt) was last sent a ``kind`` message: one upsert (a new
    row, or the existing one's last send time and one more send)."""
    if not sent:
        return
    insert_rows(
        Dispatch,
        ("job", "attempt", "kind", "first_sent_at", "last_sent_at", "sends"),
        [(job_id, attempt, kind, now, now, 1) for job_id, attempt in dict.fromkeys(sent)],
        on_conflict=(("job", "attempt", "kind"), ("last_sent_at",), ("sends",)),
    )

"""What the portal does when a node's inventory changes under its jobs.

An agent reads its GPUs again on SIGHUP, every PORTAL_AGENT_INVENTORY_S and on a critical
Xid error (workers.hardware); its next heartbeat carries the new inventory, which
``sync_inventory`` writes. Then, in the heartbeat's transaction:

1. **Drained first**: the slices that are gone are absent (``present=False``) before anything
   else, and a scheduling pass that is running commits first (``wait_for_running_pass``), so
   no pass places a job on them afterwards; a pass that placed one just before is seen below.
2. **Their jobs end with the reason**: every attempt holding a slice that is gone is asked to
   stop through the one stop path (``attempt_request_stops``), with the portal's reason
   ``gpu_lost``, ``mig_reconfigured`` or ``gpu_reconfigured``. The agent has usually stopped it
   already (it reports ``lost`` with GPU_LOST: ... itself); either way its ``finished`` report
   ends the attempt LOST with that code, and the job is requeued within
   PORTAL_JOB_MAX_RETRIES as for any loss. Nothing is requeued before the agent says the
   attempt stopped, so a job is never run twice.
3. **An event on the node** per GPU: ``gpu_lost`` (with why: off the bus, Xid n),
   ``reconfigured`` (its new slices) or ``gpu_back``. A GPU that comes back, and the slices of
   a new MIG layout, are placeable at once (present again; a pass is asked for).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.db import transaction

from portal.agents.dispatch import request_stops
from portal.cluster.models import Node, NodeEvent
from portal.cluster.services import GoneSlice, InventoryChange
from portal.jobs.attempts import HARDWARE_STOPS, StopAsked, StopWanted, attempt_request_stops
from portal.jobs.models import Allocation
from portal.scheduling.lock import wait_for_running_pass
from workers.inventory import GPU_LOST, MIG_RECONFIGURED, slice_gone_reason
from workers.protocol import Inventory

log = logging.getLogger("portal.agents")

E = NodeEvent.Kind
_STOP_FOR_CODE = {code: reason for reason, code in HARDWARE_STOPS.items()}


def record_inventory_change(
    node: Node, inventory: Inventory, change: InventoryChange, *, now: datetime
) -> list[int]:
    """Inside the heartbeat's transaction, after ``sync_inventory``: stop the attempts on
    slices that are gone and record the change on the node (see the module docstring).
    Returns the jobs asked to stop now."""
    if not change or change.registered:
        return []  # nothing changed, or the node's first inventory (nothing to compare)
    stopped: list[int] = []
    by_gpu: dict[tuple[str, int], list[GoneSlice]] = defaultdict(list)
    for gone in change.gone:
        by_gpu[(gone.gpu_uuid, gone.gpu_index)].append(gone)
    if change.gone:
        wait_for_running_pass()
    holders = _holders([g.pk for g in change.gone])
    new_by_gpu = _new_slices_by_gpu(inventory, change.new)
    lost_gpus = {uuid for uuid, _ in change.gpus_gone}
    for (uuid, index), slices in sorted(by_gpu.items(), key=lambda item: item[0][1]):
        why = slice_gone_reason(uuid, index, inventory, was_mig=slices[0].kind == "mig")
        code = why.split(":", 1)[0]
        jobs = {job: attempt for s in slices for job, attempt in holders.get(s.pk, {}).items()}
        asked = _stop(jobs, code, why, now)
        stopped += asked
        keys = ", ".join(sorted(s.key for s in slices))
        jobs_text = (
            f"; jobs {', '.join(str(j) for j in asked)} asked to stop ({code}, requeued "
            "within their retries)"
            if asked
            else "; no job held them"
        )
        if uuid in lost_gpus or code == GPU_LOST:
            _record(node, E.GPU_LOST, now, f"{why}; slices drained: {keys}{jobs_text}")
        else:
            added = new_by_gpu.pop(uuid, [])
            new_text = f"; new slices: {', '.join(added)}" if added else ""
            _record(node, E.RECONFIGURED, now, f"{why}; slices gone: {keys}{new_text}{jobs_text}")
    came = [(g, "is in the inventory again") for g in change.gpus_back]
    came += [(g, "joined the inventory") for g in change.gpus_new]
    for (uuid, index), how in sorted(came, key=lambda item: item[0][1]):
        added = new_by_gpu.pop(uuid, [])
        _record(
            node,
            E.GPU_BACK,
            now,
            f"GPU {index} ({uuid}) {how}: {len(added)} slice(s) placeable"
            + (f" ({', '.join(added)})" if added else ""),
        )
    for uuid, added in sorted(new_by_gpu.items()):
        # New slices on a GPU that lost none (MIG devices created in free space).
        gpu = next(g for g in inventory.gpus if g.uuid == uuid)
        layout = ", ".join(m.profile for m in gpu.mig)
        _record(
            node,
            E.RECONFIGURED,
            now,
            f"{MIG_RECONFIGURED}: GPU {gpu.index} ({uuid}) now has MIG {layout}; new slices: "
            f"{', '.join(added)}",
        )
    if stopped:
        transaction.on_commit(lambda: request_stops(stopped, now=now))
    return stopped


def _stop(jobs: dict[int, int], code: str, why: str, now: datetime) -> list[int]:
    if not jobs:
        return []
    reason = _STOP_FOR_CODE.get(code, "gpu_lost")
    wanted = [
        StopWanted(job_id=job, attempt=attempt, message=f"stop requested: {why}")
        for job, attempt in jobs.items()
    ]
    asked = attempt_request_stops(wanted=wanted, reason=reason, at=now)
    jobs_asked = sorted(j for j, found in asked.items() if found == StopAsked.REQUESTED)
    if jobs_asked:
        log.error("%s: stopping jobs %s", why, jobs_asked)
    return jobs_asked


def _holders(slice_pks: list[int]) -> dict[int, dict[int, int]]:
    """Slice pk -> {job pk: attempt} of the attempts holding it now."""
    held: dict[int, dict[int, int]] = defaultdict(dict)
    if not slice_pks:
        return held
    rows = Allocation.objects.filter(released_at__isnull=True, slice_id__in=slice_pks).values_list(
        "slice_id", "job_id", "attempt"
    )
    for slice_id, job_id, attempt in rows:
        held[slice_id][job_id] = attempt
    return held


def _new_slices_by_gpu(inventory: Inventory, keys: list[str]) -> dict[str, list[str]]:
    offered = inventory.slice_keys()
    by_gpu: dict[str, list[str]] = defaultdict(list)
    for key in sorted(keys):
        gpu = offered.get(key)
        if gpu is not None:
            by_gpu[gpu.uuid].append(key)
    return dict(by_gpu)


def _record(node: Node, kind: str, at: datetime, message: str) -> None:
    NodeEvent.objects.create(node_id=node.pk, kind=kind, by="", at=at, message=message)
    log.warning("node %s: %s", node.name, message)

"""The pure scheduling core: ``schedule(snapshot, *, now, config) -> Decisions``.

No Django, no Celery, no I/O, no clock: the portal's shell and the simulator build a
``Snapshot``, call ``schedule`` and apply the ``Decisions``.
"""

from scheduler.config import ALL_CACHES, Cache, Policy, SchedulerConfig
from scheduler.core import schedule
from scheduler.memo import Carry
from scheduler.model import (
    MIG_COMPUTE_SLICES_PER_GPU,
    Assign,
    Decisions,
    Dependency,
    DependencyKind,
    DependencyState,
    Fail,
    GpuRequest,
    Job,
    Node,
    Pending,
    PendingCode,
    Preempt,
    Reason,
    RunningJob,
    RunTime,
    RunTimes,
    Slice,
    SliceKind,
    Snapshot,
    Team,
)
from scheduler.standing import JobPriority, Standing, TeamStanding, UserStanding
from scheduler.units import billed_units, decay, mig_units, parse_mig_profile

__all__ = [
    "Carry",
    "ALL_CACHES",
    "MIG_COMPUTE_SLICES_PER_GPU",
    "Assign",
    "Cache",
    "Decisions",
    "Dependency",
    "DependencyKind",
    "DependencyState",
    "Fail",
    "GpuRequest",
    "Job",
    "JobPriority",
    "Node",
    "Pending",
    "PendingCode",
    "Policy",
    "Preempt",
    "Reason",
    "RunTime",
    "RunTimes",
    "RunningJob",
    "SchedulerConfig",
    "Slice",
    "SliceKind",
    "Snapshot",
    "Standing",
    "Team",
    "TeamStanding",
    "UserStanding",
    "billed_units",
    "decay",
    "mig_units",
    "parse_mig_profile",
    "schedule",
]

"""Load the core's ``Snapshot`` from the database in a fixed number of queries.

Ten queries whatever the size of the cluster or the queue (a test pins the count): slices
with their GPU and node, teams, members with a limit of their own, usage balances, this
month's GPU-hours, pending jobs, their dependencies, jobs holding slices, active
allocations, and the run times of recently finished jobs (``Snapshot.run_times``, for start
estimates only: at most ``RUN_TIME_HISTORY_JOBS`` jobs of the last ``RUN_TIME_HISTORY_S``). Rows are read with
``values_list`` (no model instances) because a pass reads tens of thousands of them, and each
row is unpacked into names in the order of its query's column tuple, never indexed. (Unpacking
a plain tuple is the cheapest way to name its values; a NamedTuple per row made the load
measurably slower.)

Identifiers the core sees: a slice is its ``Slice.key`` (the GPU UUID, the MIG UUID or
``<GPU UUID>/mps/<i>``, stable across re-registrations), a node its name, a GPU its UUID, a
job ``str(pk)``, a team its name, a user its username. ``LoadedSnapshot`` keeps the maps
back to primary keys for ``apply``. Times are epoch seconds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import FloatField, Func, QuerySet

from portal.accounting.selectors import budget_period_start, decayed_balances, gpu_hours_in_period
from portal.accounting.usage import hold_charge
from portal.cluster.core import core_slice
from portal.cluster.models import Node, Slice
from portal.jobs.models import HOLDING_STATES, Allocation, Job, JobDependency, JobState
from portal.tenants.models import Membership, Team
from scheduler.config import SchedulerConfig
from scheduler.model import (
    Dependency,
    DependencyKind,
    DependencyState,
    GpuRequest,
    RunningJob,
    RunTimes,
    SliceKind,
    Snapshot,
)
from scheduler.model import Job as CoreJob
from scheduler.model import Node as CoreNode
from scheduler.model import Slice as CoreSlice
from scheduler.model import Team as CoreTeam
from scheduler.runtimes import run_times_from
from scheduler.units import billed_units

# Nodes the core sees: ready ones take work; drained ones still hold their running jobs'
# slices (so reservations and estimates know them) but take nothing new. Lost nodes are out.
_VISIBLE_NODE_STATES = (Node.State.READY, Node.State.DRAINED)

_DEPENDENCY_STATE = {
    JobState.SUCCEEDED: DependencyState.SUCCEEDED,
    JobState.FAILED: DependencyState.FAILED,
    JobState.CANCELLED: DependencyState.FAILED,
    JobState.TIMED_OUT: DependencyState.FAILED,
}


def dependency_state(job_state: str) -> DependencyState:
    """What a pending job sees of a job it depends on, from that job's state."""
    return _DEPENDENCY_STATE.get(job_state, DependencyState.WAITING)


# Run-time history (scheduler.runtimes): the most recent finished jobs, of at most this age.
RUN_TIME_HISTORY_JOBS = 5000
RUN_TIME_HISTORY_S = 30 * 86400.0
# A job that ended these ways ran for its real run time (a failure may be a crash at start,
# a cancel a person's choice); one that timed out ran its whole limit.
_FINISHED_RUNS = (JobState.SUCCEEDED, JobState.TIMED_OUT)

_TIME_COLUMNS = frozenset(
    {
        "submitted_at",
        "queued_since",
        "assigned_at",
        "started_at",
        "stop_requested_at",
        "finished_at",
    }
)


class Epoch(Func):
    """A timestamp as epoch seconds, computed by PostgreSQL (decoding tens of thousands of
    timestamps into datetimes in Python is a large part of a pass otherwise)."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
    output_field = FloatField()


@dataclass(frozen=True, slots=True)
class PendingRow:
    attempt: int
    preemptible: bool = True  # whether reclaim may take back capacity it borrows


@dataclass(frozen=True, slots=True)
class HoldingRow:
    attempt: int
    stop_requested: bool


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    snapshot: Snapshot
    now: datetime
    slice_pks: Mapping[str, int]  # slice id -> Slice pk
    node_pks: Mapping[str, int]  # node name -> Node pk
    pending: Mapping[int, PendingRow]  # job pk -> row
    holding: Mapping[int, HoldingRow]  # job pk -> row


_SLICE_COLUMNS = (
    "pk",
    "key",
    "kind",
    "units",
    "profile",
    "gpu__uuid",
    "gpu__model",
    "gpu__node_id",
    "gpu__node__name",
    "gpu__node__state",
)
# A job's columns: the core job's, then its attempt; a job holding slices adds how it holds
# them. Unpacked in the pending and holding loops of ``load_snapshot`` and in ``_core_job``.
_PENDING_COLUMNS = (
    "pk",
    "team_id",
    "user_id",
    "user__username",
    "gpu_kind",
    "gpu_count",
    "gpu_min_count",
    "gpu_profile",
    "gpu_model",
    "multi_node",
    "priority",
    "time_limit_s",
    "preemptible",
    "submitted_at",
    "queued_since",
    "array_id",
    "array__max_running",
    "attempt",
)
_HOLDING_COLUMNS = (
    *_PENDING_COLUMNS,
    "borrowed",
    "assigned_at",
    "started_at",
    "stop_requested_at",
)

_LoadedNodes = tuple[
    tuple[CoreNode, ...],
    Mapping[str, int],  # slice id -> Slice pk
    Mapping[str, int],  # node name -> Node pk
    Mapping[str, str],  # slice id -> GPU model
]

# The node tuple of the last pass, reused while the slices do not change: the core caches
# its cluster index by the identity of this tuple.
_node_cache: tuple[list[tuple[Any, ...]], _LoadedNodes] | None = None


def load_snapshot(*, now: datetime, config: SchedulerConfig) -> LoadedSnapshot:
    at = now.timestamp()
    nodes, slice_pks, node_pks, slice_model = _load_nodes()
    team_rows = list(
        Team.objects.values_list(
            "pk",
            "name",
            "weight",
            "guaranteed_units",
            "limit_units",
            "max_priority",
            "member_limit_units",
            "budget_gpu_hours",
        )
    )
    team_names = {pk: name for pk, name, *_ in team_rows}
    # Members with a limit of their own (set by a team admin; portal/tenants/members.py).
    member_limits: dict[int, dict[str, float]] = defaultdict(dict)
    for team_id, username, own_limit in Membership.objects.filter(
        limit_units__isnull=False
    ).values_list("team_id", "user__username", "limit_units"):
        member_limits[team_id][username] = own_limit
    team_usage, user_usage_by_id = decayed_balances(now=now, half_life_s=config.usage_half_life_s)
    period_hours = gpu_hours_in_period(now=now)

    pending_rows = _job_rows(Job.objects.filter(state=JobState.PENDING), _PENDING_COLUMNS)
    depends_on, dependency_states = _load_dependencies()
    holding_rows = _job_rows(Job.objects.filter(state__in=HOLDING_STATES), _HOLDING_COLUMNS)
    allocations = _load_allocations(slice_model, config)
    run_times = _load_run_times(at, team_names)

    jobs = _JobBuilder(team_names)
    usernames: dict[int, str] = {}
    pending_jobs = []
    pending: dict[int, PendingRow] = {}
    array_limits: dict[str, int] = {}  # throttled arrays with pending members
    for row in pending_rows:
        (
            pk,
            team_id,
            user_id,
            username,
            *_job_columns,  # read by _JobBuilder.build
            array_id,
            max_running,
            attempt,
        ) = row
        usernames[user_id] = username
        core_job = jobs.build(pk, team_id, row, depends_on.get(pk, ()))
        pending_jobs.append(core_job)
        pending[pk] = PendingRow(attempt=attempt, preemptible=core_job.preemptible)
        if max_running is not None:
            array_limits[str(array_id)] = max_running

    period_start = budget_period_start(now).timestamp()
    running = []
    holding: dict[int, HoldingRow] = {}
    period_hours_running: dict[int, float] = defaultdict(float)
    for row in holding_rows:
        (
            job_id,
            team_id,
            user_id,
            username,
            *_job_columns,  # read by _JobBuilder.build
            attempt,
            borrowed,
            assigned_at,
            started_at,
            stop_requested_at,
        ) = row
        usernames[user_id] = username
        slice_ids, node_names, units = allocations.get((job_id, attempt), ((), (), 0.0))
        held_from = assigned_at if assigned_at is not None else at
        charge = hold_charge(units, held_from, at)
        team_usage[team_id] = team_usage.get(team_id, 0.0) + charge
        user_key = (team_id, user_id)
        user_usage_by_id[user_key] = user_usage_by_id.get(user_key, 0.0) + charge
        period_hours_running[team_id] += units * max(0.0, at - max(held_from, period_start)) / 3600
        running.append(
            RunningJob(
                job=jobs.build(job_id, team_id, row, ()),
                node=node_names[0] if node_names else "",
                slice_ids=slice_ids,
                started_at=started_at if started_at is not None else held_from,
                borrowed=borrowed,
                # Any stop already asked for (preemption, cancel, time limit): the job must
                # not be picked as a victim again, and its slices free up soon.
                preempting_since=stop_requested_at,
            )
        )
        holding[job_id] = HoldingRow(attempt=attempt, stop_requested=stop_requested_at is not None)
    jobs.keep()

    teams = {
        name: CoreTeam(
            name=name,
            weight=weight,
            guaranteed=guaranteed,
            limit=limit,
            max_priority=max_priority,
            usage=team_usage.get(pk, 0.0),
            member_limit=member_limit,
            member_limits=member_limits.get(pk, {}),
            budget_gpu_hours=budget,
            used_gpu_hours=period_hours.get(pk, 0.0) + period_hours_running.get(pk, 0.0),
        )
        for pk, name, weight, guaranteed, limit, max_priority, member_limit, budget in team_rows
    }
    user_usage = {
        (team_names[team_id], usernames[user_id]): value
        for (team_id, user_id), value in user_usage_by_id.items()
        if user_id in usernames and team_id in team_names
    }
    snapshot = Snapshot(
        nodes=nodes,
        teams=teams,
        pending=tuple(pending_jobs),
        running=tuple(running),
        user_usage=user_usage,
        dependency_states=dependency_states,
        array_limits=array_limits,
        run_times=run_times,
    )
    return LoadedSnapshot(
        snapshot=snapshot,
        now=now,
        slice_pks=slice_pks,
        node_pks=node_pks,
        pending=pending,
        holding=holding,
    )


def _load_nodes() -> _LoadedNodes:
    """Visible nodes with their present slices, sorted by node name, GPU index and key, and
    the maps from slice ids and node names back to the database."""
    global _node_cache
    rows = _fetch(
        Slice.objects.filter(
            present=True, gpu__present=True, gpu__node__state__in=_VISIBLE_NODE_STATES
        )
        .order_by("gpu__node__name", "gpu__index", "key")
        .values_list(*_SLICE_COLUMNS)
    )
    cached = _node_cache
    if cached is not None and cached[0] == rows:
        return cached[1]
    slice_pks: dict[str, int] = {}
    node_pks: dict[str, int] = {}
    slice_model: dict[str, str] = {}
    by_node: dict[str, list[CoreSlice]] = defaultdict(list)
    schedulable: dict[str, bool] = {}
    for pk, key, kind, units, profile, gpu_uuid, model, node_id, node, state in rows:
        slice_pks[key] = pk
        node_pks[node] = node_id
        slice_model[key] = model
        by_node[node].append(core_slice(key, kind, units, profile, gpu_uuid, model, node))
        schedulable[node] = state == Node.State.READY
    nodes = tuple(
        CoreNode(name=name, slices=tuple(slices), schedulable=schedulable[name])
        for name, slices in by_node.items()
    )
    loaded = (nodes, slice_pks, node_pks, slice_model)
    _node_cache = (rows, loaded)
    return loaded


def _load_allocations(
    slice_model: Mapping[str, str], config: SchedulerConfig
) -> dict[tuple[int, int], tuple[tuple[str, ...], tuple[str, ...], float]]:
    """(job pk, attempt) -> (slice ids, node names in order of first slice, billed units)."""
    slices: dict[tuple[int, int], list[str]] = defaultdict(list)
    nodes: dict[tuple[int, int], list[str]] = defaultdict(list)
    units: dict[tuple[int, int], float] = defaultdict(float)
    rows = _fetch(
        Allocation.objects.filter(released_at__isnull=True)
        .order_by("job_id", "slice__key")
        .values_list("job_id", "attempt", "slice__key", "slice__units", "slice__gpu__node__name")
    )
    for job_id, attempt, key, slice_units, node in rows:
        held = (job_id, attempt)
        slices[held].append(key)
        if node not in nodes[held]:
            nodes[held].append(node)
        units[held] += billed_units(slice_units, slice_model.get(key, ""), config.model_weights)
    return {held: (tuple(keys), tuple(nodes[held]), units[held]) for held, keys in slices.items()}


_RUN_COLUMNS = (
    "team_id",
    "user__username",
    "gpu_kind",
    "gpu_count",
    "gpu_profile",
    "gpu_model",
    "time_limit_s",
    "started_at",
    "finished_at",
)


# The run-time history of the last pass with the rows and team names it was built from:
# built again only when they differ (a job finished, one aged out of the window), not on every
# pass. Comparing the rows costs a small part of building thousands of shapes and summaries.
_run_times_cache: tuple[list[tuple[Any, ...]], dict[int, str], RunTimes] | None = None


def _load_run_times(at: float, team_names: Mapping[int, str]) -> RunTimes:
    """How long the most recent finished jobs ran, by shape (one bounded query)."""
    global _run_times_cache
    since = datetime.fromtimestamp(at - RUN_TIME_HISTORY_S, tz=UTC)
    rows = _job_rows(
        Job.objects.filter(
            state__in=_FINISHED_RUNS, finished_at__gte=since, started_at__isnull=False
        ),
        _RUN_COLUMNS,
        newest_first=True,
        limit=RUN_TIME_HISTORY_JOBS,
    )
    cached = _run_times_cache
    if cached is not None and cached[0] == rows and cached[1] == team_names:
        return cached[2]
    run_times = _run_times_of(rows, team_names)
    _run_times_cache = (rows, dict(team_names), run_times)
    return run_times


def _run_times_of(rows: list[tuple[Any, ...]], team_names: Mapping[int, str]) -> RunTimes:
    finished = []
    for team_id, username, kind, count, profile, model, limit, started, ended in rows:
        team = team_names.get(team_id)
        if team is None or ended is None:
            continue
        shape = CoreJob(
            id="",
            team=team,
            user=username,
            request=GpuRequest(kind=SliceKind(kind), count=count, profile=profile, model=model),
            submitted_at=started,
            time_limit_s=float(limit) if limit else None,
        )
        finished.append((shape, max(0.0, ended - started)))
    return run_times_from(finished, newest_first=True)


def _load_dependencies() -> tuple[dict[int, tuple[Dependency, ...]], dict[str, DependencyState]]:
    depends_on: dict[int, list[Dependency]] = defaultdict(list)
    states: dict[str, DependencyState] = {}
    rows = (
        JobDependency.objects.filter(job__state=JobState.PENDING)
        .order_by("job_id", "depends_on_id")
        .values_list("job_id", "depends_on_id", "kind", "depends_on__state")
    )
    for job_id, other_id, kind, other_state in rows:
        depends_on[job_id].append(Dependency(job_id=str(other_id), kind=DependencyKind(kind)))
        states[str(other_id)] = _DEPENDENCY_STATE.get(other_state, DependencyState.WAITING)
    return {job_id: tuple(deps) for job_id, deps in depends_on.items()}, states


def _job_rows(
    queryset: QuerySet[Job],
    columns: tuple[str, ...],
    *,
    newest_first: bool = False,
    limit: int | None = None,
) -> list[tuple[Any, ...]]:
    """``values_list(*columns)`` ordered by pk (or newest first, at most ``limit`` rows),
    with the time columns as epoch floats."""
    queryset = queryset.order_by("-pk" if newest_first else "pk")
    if connection.vendor == "postgresql":
        epochs = {f"{name}_epoch": Epoch(name) for name in columns if name in _TIME_COLUMNS}
        names = [f"{name}_epoch" if name in _TIME_COLUMNS else name for name in columns]
        return _fetch(queryset.annotate(**epochs).values_list(*names)[:limit])
    times = [i for i, name in enumerate(columns) if name in _TIME_COLUMNS]
    rows = []
    for row in queryset.values_list(*columns)[:limit]:
        values = list(row)
        for i in times:
            if values[i] is not None:
                values[i] = values[i].timestamp()
        rows.append(tuple(values))
    return rows


def _fetch(queryset: QuerySet[Any]) -> list[tuple[Any, ...]]:
    """The rows of a ``values_list`` whose columns need no conversion (no datetimes or JSON
    on SQLite, none at all on PostgreSQL), fetched at once without Django's per-value
    converters, which cost more than the query for tens of thousands of rows."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# Core jobs of the last pass by job id, with the row they were built from: a job whose row did
# not change is not built again (most of the queue, pass after pass). A job that starts holding
# slices is built once more, since its row gains the holding columns.
_JobKey = tuple[tuple[Any, ...], str, tuple[Dependency, ...]]
_job_cache: dict[int, tuple[_JobKey, CoreJob]] = {}


class _JobBuilder:
    def __init__(self, team_names: Mapping[int, str]) -> None:
        self.team_names = team_names
        self.built: dict[int, tuple[_JobKey, CoreJob]] = {}

    def build(
        self, pk: int, team_id: int, row: tuple[Any, ...], depends_on: tuple[Dependency, ...]
    ) -> CoreJob:
        """The core job of a pending or holding ``row`` (unpacked by the caller into ``pk``
        and ``team_id``)."""
        team = self.team_names[team_id]
        key = (row, team, depends_on)
        cached = _job_cache.get(pk)
        job = cached[1] if cached is not None and cached[0] == key else None
        if job is None:
            job = _core_job(row, team, depends_on)
        self.built[pk] = (key, job)
        return job

    def keep(self) -> None:
        global _job_cache
        _job_cache = self.built


def _core_job(row: tuple[Any, ...], team: str, depends_on: tuple[Dependency, ...]) -> CoreJob:
    (
        pk,
        _team_id,
        _user_id,
        username,
        kind,
        count,
        min_count,
        profile,
        model,
        multi_node,
        priority,
        time_limit_s,
        preemptible,
        submitted_at,
        queued_since,
        array_id,
        _max_running,  # (in Snapshot.array_limits)
        _attempt,
        *_holding,  # a holding row's further columns
    ) = row
    return CoreJob(
        id=str(pk),
        team=team,
        user=username,
        request=GpuRequest(
            kind=SliceKind(kind),
            count=count,
            profile=profile,
            model=model,
            min_count=min_count,
            multi_node=multi_node,
        ),
        submitted_at=submitted_at,
        priority=priority,
        time_limit_s=float(time_limit_s) if time_limit_s else None,
        preemptible=preemptible,
        depends_on=depends_on,
        queued_since=queued_since,
        array="" if array_id is None else str(array_id),
    )

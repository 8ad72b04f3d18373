"""Speed of one scheduling pass through the database: snapshot -> schedule() -> apply.

The scenario is the core benchmark's (``bench/core_pass.py``, same seed): 1,000 nodes x 8 GPUs
(whole, MIG and MPS), about nine in ten slices held by running jobs, 10,000 pending jobs. It is
written to a scratch database, created next to the one DATABASE_URL names (PostgreSQL) or in a
temporary file (SQLite, when DATABASE_URL is unset) and dropped afterwards; no other database
is touched. Each repeat runs ``run_schedule_pass`` at the same instant on the same rows: the
pass's writes (assignments, allocations, events, stop requests, explanations) are undone
between repeats, untimed.

Timed: the whole pass (lock, snapshot, decide, apply, commit), with its parts. Not timed: the
launch messages after commit (``dispatch_ms`` reports them separately, broker stubbed; each
node has a key, so this includes deriving the keys and signing every launch).

``python -m bench.db_pass [--repeats N]`` prints the figures; ``run()`` returns them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

SCRATCH_SUFFIX = "_db_pass_bench"
_BATCH = 2_000


def run(repeats: int = 5) -> dict[str, Any]:
    import django

    django.setup()
    from django.db import connection

    from bench.core_pass import build_snapshot

    with scratch_database() as vendor:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        now = datetime.now(tz=UTC).replace(microsecond=0)
        sizes = _populate(now, build_snapshot())
        connection.close()  # start the timed passes on a fresh connection, as a worker does
        figures = _time_passes(now, repeats)
    return {"database": vendor, **sizes, **figures}


# --- the scratch database ----------------------------------------------------------------------


@contextmanager
def scratch_database(suffix: str = SCRATCH_SUFFIX) -> Iterator[str]:
    """Point Django's connection at a fresh database next to the configured one (PostgreSQL:
    `<name><suffix>`; SQLite: a temporary file) for the block, and drop it afterwards; yields
    the vendor. No other database is touched."""
    from django.db import connection

    settings_dict = connection.settings_dict
    original = settings_dict["NAME"]
    vendor = connection.vendor
    if vendor == "postgresql":
        scratch = f"{original}{suffix}"
        _postgres_admin(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        _postgres_admin(f'CREATE DATABASE "{scratch}"')
        cleanup = lambda: _postgres_admin(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')  # noqa: E731
    else:
        folder = tempfile.mkdtemp(prefix="db-pass-bench-")
        scratch = str(Path(folder) / "bench.sqlite3")
        cleanup = lambda: _remove_tree(Path(folder))  # noqa: E731
    connection.close()
    settings_dict["NAME"] = scratch
    try:
        yield vendor
    finally:
        connection.close()
        settings_dict["NAME"] = original
        cleanup()


def _postgres_admin(sql: str) -> None:
    """Run CREATE/DROP DATABASE on the server of the configured database (autocommit)."""
    from django.db import connection

    with connection._nodb_cursor() as cursor:  # Django's own way to reach the maintenance db
        cursor.execute(sql)


def _remove_tree(folder: Path) -> None:
    for path in sorted(folder.glob("*"), reverse=True):
        path.unlink()
    folder.rmdir()


# --- rows for the core benchmark's snapshot -------------------------------------------------------


def _populate(now: datetime, snapshot: Any) -> dict[str, int]:
    """Write `snapshot` (a core Snapshot, `bench.core_pass.build_snapshot`) as portal rows:
    nodes with their keys, GPUs, slices, teams and members, usage, running jobs with their
    allocations, pending jobs with their dependencies."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from bench.core_pass import NOW
    from portal.accounting.models import UsageBalance
    from portal.agents.models import NodeCredential
    from portal.cluster.models import Gpu, Node, Slice
    from portal.jobs.models import Allocation, Job, JobDependency, JobState
    from portal.tenants.models import Membership, Team
    from workers.signing import derive_node_key, key_digest, new_salt

    def at(t: float) -> datetime:
        return now + timedelta(seconds=t - NOW)

    with transaction.atomic():
        nodes = Node.objects.bulk_create(
            [
                Node(
                    name=n.name,
                    hostname=n.name,
                    driver="described",
                    state=Node.State.READY if n.schedulable else Node.State.DRAINED,
                    last_heartbeat_at=now,
                )
                for n in snapshot.nodes
            ],
            batch_size=_BATCH,
        )
        node_pk = {n.name: n.pk for n in nodes}
        # Each node has its key, as `manage.py node_add` makes it: launches are signed with it.
        secret = settings.NODE_KEY_SECRET.encode("utf-8")
        credentials = []
        for n in nodes:
            salt = new_salt()
            key = derive_node_key(secret, node=n.name, salt=salt)
            credentials.append(
                NodeCredential(node_id=n.pk, salt=salt, digest=key_digest(key), created_at=now)
            )
        NodeCredential.objects.bulk_create(credentials, batch_size=_BATCH)
        gpu_rows: dict[tuple[str, str], Gpu] = {}
        for n in snapshot.nodes:
            for s in n.slices:
                if (n.name, s.gpu) not in gpu_rows:
                    gpu_rows[(n.name, s.gpu)] = Gpu(
                        node_id=node_pk[n.name],
                        uuid=f"GPU-{n.name}-{s.gpu}",
                        index=int(s.gpu.lstrip("g")),
                        model=s.model,
                        memory_mb=81920,
                        mode=s.kind.value,
                    )
        Gpu.objects.bulk_create(gpu_rows.values(), batch_size=_BATCH)
        slices = Slice.objects.bulk_create(
            [
                Slice(
                    gpu_id=gpu_rows[(n.name, s.gpu)].pk,
                    key=s.id,
                    kind=s.kind.value,
                    profile=s.profile,
                    mig_uuid=f"MIG-{s.id}" if s.profile else "",
                    units=s.units,
                )
                for n in snapshot.nodes
                for s in n.slices
            ],
            batch_size=_BATCH,
        )
        slice_pk = {s.key: s.pk for s in slices}

        teams = Team.objects.bulk_create(
            [
                Team(
                    name=t.name,
                    weight=t.weight,
                    guaranteed_units=t.guaranteed,
                    limit_units=t.limit,
                    max_priority=t.max_priority,
                    member_limit_units=t.member_limit,
                )
                for t in snapshot.teams.values()
            ]
        )
        team_pk = {t.name: t.pk for t in teams}
        names = sorted(
            {j.user for j in snapshot.pending}
            | {r.job.user for r in snapshot.running}
            | {u for _, u in snapshot.user_usage}
        )
        users = get_user_model().objects.bulk_create(
            [get_user_model()(username=name, password="!") for name in names]
        )
        user_pk = {u.username: u.pk for u in users}
        Membership.objects.bulk_create(
            [
                Membership(team_id=team_pk[team], user_id=user_pk[user])
                for team, user in sorted(
                    {(j.team, j.user) for j in snapshot.pending}
                    | {(r.job.team, r.job.user) for r in snapshot.running}
                    | set(snapshot.user_usage)
                )
            ],
            batch_size=_BATCH,
        )
        UsageBalance.objects.bulk_create(
            [
                UsageBalance(team_id=team_pk[t.name], unit_seconds=t.usage, as_of=now)
                for t in snapshot.teams.values()
            ]
            + [
                UsageBalance(team_id=team_pk[t], user_id=user_pk[u], unit_seconds=v, as_of=now)
                for (t, u), v in snapshot.user_usage.items()
            ]
        )

        def job_row(job: Any, **fields: Any) -> Job:
            request = job.request
            return Job(
                team_id=team_pk[job.team],
                user_id=user_pk[job.user],
                name=job.id,
                image="python:3.11-slim",
                command=["python", "-c", "pass"],
                gpu_kind=request.kind.value,
                gpu_count=request.count,
                gpu_min_count=request.min_count,
                gpu_profile=request.profile,
                gpu_model=request.model,
                multi_node=request.multi_node,
                priority=job.priority,
                time_limit_s=int(job.time_limit_s) if job.time_limit_s else None,
                preemptible=job.preemptible,
                submitted_at=at(job.submitted_at),
                queued_since=at(job.queued_since or job.submitted_at),
                **fields,
            )

        running = Job.objects.bulk_create(
            [
                job_row(
                    r.job,
                    state=JobState.RUNNING,
                    attempt=1,
                    node_id=node_pk[r.node],
                    borrowed=r.borrowed,
                    assigned_at=at(r.started_at),
                    started_at=at(r.started_at),
                    stop_requested_at=at(r.preempting_since) if r.preempting_since else None,
                    stop_reason="preempt" if r.preempting_since else "",
                )
                for r in snapshot.running
            ],
            batch_size=_BATCH,
        )
        Allocation.objects.bulk_create(
            [
                Allocation(
                    job_id=row.pk, attempt=1, slice_id=slice_pk[s], created_at=row.assigned_at
                )
                for row, r in zip(running, snapshot.running, strict=True)
                for s in r.slice_ids
            ],
            batch_size=_BATCH,
        )
        pending = Job.objects.bulk_create(
            [job_row(j, state=JobState.PENDING, attempt=0) for j in snapshot.pending],
            batch_size=_BATCH,
        )
        pending_pk = {row.name: row.pk for row in pending}
        JobDependency.objects.bulk_create(
            [
                JobDependency(
                    job_id=pending_pk[j.id], depends_on_id=pending_pk[d.job_id], kind=d.kind.value
                )
                for j in snapshot.pending
                for d in j.depends_on
                if d.job_id in pending_pk
            ],
            batch_size=_BATCH,
        )
    return {
        "nodes": len(snapshot.nodes),
        "gpus": len(gpu_rows),
        "slices": len(slices),
        "pending": len(pending),
        "running": len(running),
    }


# --- timing ----------------------------------------------------------------------------------


def _time_passes(now: datetime, repeats: int) -> dict[str, Any]:
    from portal.scheduling import service

    captured: list[tuple[list[int], list[int]]] = []
    real_dispatch = service.dispatch_after_pass
    service.dispatch_after_pass = lambda a, p: captured.append((list(a), list(p)))  # type: ignore[assignment]
    try:
        totals, parts, dispatch = [], [], []
        result = None
        for _ in range(repeats):
            marks = _marks()
            began = time.perf_counter()
            result = service.run_schedule_pass(now=now)
            totals.append((time.perf_counter() - began) * 1000)
            parts.append((result.load_ms, result.decide_ms, result.apply_ms))
            dispatch.append(_time_dispatch(real_dispatch, *captured[-1]))
            _undo(marks)
    finally:
        service.dispatch_after_pass = real_dispatch  # type: ignore[assignment]
    assert result is not None and result.status == "ran"
    return {
        "repeats": repeats,
        "median_ms": round(statistics.median(totals), 1),
        "p95_ms": round(_p95(totals), 1),
        "first_ms": round(totals[0], 1),
        "load_ms": round(statistics.median(p[0] for p in parts), 1),
        "decide_ms": round(statistics.median(p[1] for p in parts), 1),
        "apply_ms": round(statistics.median(p[2] for p in parts), 1),
        "dispatch_ms": round(statistics.median(dispatch), 1),
        "assigned": len(result.assigned),
        "preempted": len(result.preempted),
        "explanations_written": result.explanations_written,
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _time_dispatch(dispatch: Any, assigned: list[int], preempted: list[int]) -> float:
    from portal.agents.testing import capture_sent_messages

    with capture_sent_messages():
        began = time.perf_counter()
        dispatch(assigned, preempted)
        return (time.perf_counter() - began) * 1000


def _marks() -> dict[str, Any]:
    from django.db.models import Max

    from portal.jobs.models import Allocation, Job, JobEvent, JobState

    return {
        "event": JobEvent.objects.aggregate(m=Max("id"))["m"] or 0,
        "allocation": Allocation.objects.aggregate(m=Max("id"))["m"] or 0,
        "pending": list(Job.objects.filter(state=JobState.PENDING).values_list("pk", flat=True)),
        "stopping": set(
            Job.objects.filter(stop_requested_at__isnull=False).values_list("pk", flat=True)
        ),
    }


def _undo(marks: dict[str, Any]) -> None:
    """Put back the rows the pass changed, so the next repeat does the same work."""
    from django.db import transaction

    from portal.agents.models import Dispatch
    from portal.jobs.models import Allocation, Job, JobEvent, JobState

    with transaction.atomic():
        Allocation.objects.filter(id__gt=marks["allocation"]).delete()
        JobEvent.objects.filter(id__gt=marks["event"]).delete()
        Dispatch.objects.all().delete()
        pending = marks["pending"]
        for start in range(0, len(pending), _BATCH):
            Job.objects.filter(pk__in=pending[start : start + _BATCH]).update(
                state=JobState.PENDING,
                attempt=0,
                node=None,
                borrowed=False,
                assigned_at=None,
                finished_at=None,
                reason="",
                pending_code="",
                pending_message="",
                pending_numbers={},
                queue_position=None,
                estimated_start_at=None,
            )
        Job.objects.filter(stop_reason="preempt").exclude(pk__in=marks["stopping"]).update(
            stop_requested_at=None, stop_reason=""
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.db_pass", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(run(repeats=args.repeats), indent=2))


if __name__ == "__main__":
    main()

"""GPU samples over time: a node's `metrics` batch stored as exact rows (its own devices and
attempts only, once however often it arrives, at a bounded cost), the rollup into exact
5-minute means after the raw window and the retention, and idle-GPU detection on hand-made
series: a warning at Y minutes, and at Y + Z a stop through the real stop path that ends the
job CANCELLED with reason IDLE_RECLAIMED, its slices freed, never requeued."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from portal.agents.gpu_metrics import record_gpu_samples, rollup_cutoff, rollup_gpu_samples
from portal.agents.idle import IDLE_WARNING, check_idle_jobs
from portal.agents.models import DeviceGpuSample, JobGpuSample, JobMetrics
from portal.agents.testing import capture_sent_messages, deliver, finished, register_node
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.signals import job_idle
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.inventory import stable_uuid
from workers.protocol import AttemptSample, DeviceSample, Metrics

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU0 = stable_uuid("GPU", NODE, 0)
GPU1 = stable_uuid("GPU", NODE, 1)
MIG0 = stable_uuid("MIG", NODE, 2, 0, "3g.40gb")
MIG1 = stable_uuid("MIG", NODE, 2, 1, "2g.20gb")
ELSEWHERE = stable_uuid("GPU", "node-2", 0)


@pytest.fixture
def node() -> Any:
    return register_node(NODE)


@pytest.fixture
def team() -> Any:
    return make_team("vision", limit_units=None)


@pytest.fixture
def alice(team: Any) -> Any:
    return make_user("alice", team=team)


def running_job(team: Any, user: Any, *, on: str = GPU0, started_at: datetime | None = None) -> Job:
    job = make_job(
        team=team,
        user=user,
        state=JobState.RUNNING,
        started_at=started_at or timezone.now() - timedelta(hours=3),
    )
    allocate(job, [on])
    return job


def ts(when: datetime) -> float:
    return when.timestamp()


# --- storing a batch ------------------------------------------------------------------------


def test_a_batch_is_stored_as_exact_rows_of_its_own_devices_and_attempts(
    node: Any, team: Any, alice: Any
) -> None:
    job = running_job(team, alice)
    other = make_job(team=team, user=alice, state=JobState.RUNNING)  # never placed on node-1
    now = timezone.now().replace(microsecond=0)
    t1, t2 = now - timedelta(seconds=60), now - timedelta(seconds=30)
    batch = Metrics(
        node=NODE,
        devices=(
            DeviceSample(
                at=ts(t1),
                uuid=GPU0,
                sm_util_pct=80.0,
                mem_util_pct=30.0,
                memory_used_mb=20000,
                memory_total_mb=81920,
                processes=1,
                power_w=300.5,
                temperature_c=60.0,
            ),
            DeviceSample(at=ts(t1), uuid=MIG0, memory_used_mb=1200, processes=0),
            DeviceSample(at=ts(t1), uuid=ELSEWHERE, sm_util_pct=1.0),  # not node-1's
            DeviceSample(at=ts(now - timedelta(hours=25)), uuid=GPU0),  # older than the window
        ),
        attempts=(
            AttemptSample(
                at=ts(t1), job_id=job.pk, attempt=1, sm_util_pct=80.0, memory_used_mb=20000
            ),
            AttemptSample(at=ts(t2), job_id=job.pk, attempt=1, sm_util_pct=0.0, processes=0),
            AttemptSample(at=ts(t2), job_id=other.pk, attempt=1, sm_util_pct=50.0),
        ),
    ).to_dict()

    assert deliver(batch) == "metrics"
    assert deliver(batch) == "metrics"  # the broker delivered it twice (a new envelope)

    assert list(
        JobGpuSample.objects.order_by("at").values_list(
            "job_id",
            "attempt",
            "at",
            "period_s",
            "samples",
            "sm_util_pct",
            "memory_used_mb",
            "processes",
        )
    ) == [
        (job.pk, 1, t1, 0, 1, 80.0, 20000.0, None),
        (job.pk, 1, t2, 0, 1, 0.0, None, 0.0),
    ]
    assert list(
        DeviceGpuSample.objects.order_by("uuid").values_list(
            "node__name",
            "uuid",
            "at",
            "sm_util_pct",
            "mem_util_pct",
            "memory_used_mb",
            "memory_total_mb",
            "processes",
            "power_w",
            "temperature_c",
            "error",
        )
    ) == sorted(
        [
            (NODE, GPU0, t1, 80.0, 30.0, 20000.0, 81920.0, 1.0, 300.5, 60.0, ""),
            (NODE, MIG0, t1, None, None, 1200.0, None, 0.0, None, None, ""),
        ],
        key=lambda row: row[1],
    )
    # The latest sample with memory is what /metrics exports.
    latest = JobMetrics.objects.get(job=job)
    assert (latest.attempt, latest.gpu_util_pct, latest.memory_used_mb, latest.sampled_at) == (
        1,
        80.0,
        20000,
        t1,
    )


def test_a_batch_costs_the_same_statements_whatever_its_size(
    node: Any, team: Any, alice: Any
) -> None:
    jobs = [running_job(team, alice, on=key) for key in (GPU0, GPU1, MIG0)]
    start = timezone.now() - timedelta(hours=1)

    def batch(size: int, offset: int) -> Metrics:
        return Metrics(
            node=NODE,
            attempts=tuple(
                AttemptSample(
                    at=ts(start + timedelta(seconds=offset + i)),
                    job_id=jobs[i % 3].pk,
                    attempt=1,
                    sm_util_pct=50.0,
                    memory_used_mb=100,
                )
                for i in range(size // 2)
            ),
            devices=tuple(
                DeviceSample(at=ts(start + timedelta(seconds=offset + i)), uuid=GPU0)
                for i in range(size // 2)
            ),
        )

    with CaptureQueriesContext(connection) as small:
        record_gpu_samples(batch(10, 0), now=timezone.now())
    with CaptureQueriesContext(connection) as large:
        record_gpu_samples(batch(2000, 100), now=timezone.now())

    assert JobGpuSample.objects.count() == 5 + 1000

    def inserts(captured: CaptureQueriesContext) -> list[str]:
        return [q["sql"] for q in captured.captured_queries if q["sql"].startswith("INSERT")]

    def others(captured: CaptureQueriesContext) -> int:
        return len(captured.captured_queries) - len(inserts(captured))

    # The same reads whatever the size; rows inserted in bulk, many per statement (SQLite
    # caps the parameters of one statement, PostgreSQL takes 1,000 rows at once).
    assert others(large) == others(small)
    assert len(inserts(large)) <= 2_000 // 50


# --- rolling up ------------------------------------------------------------------------------

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def job_sample(job: Job, at: datetime, util: float | None, processes: float | None) -> None:
    JobGpuSample.objects.create(
        job=job, attempt=1, at=at, sm_util_pct=util, processes=processes, memory_used_mb=1000.0
    )


def test_raw_samples_a_day_old_become_exact_five_minute_means(
    node: Any, team: Any, alice: Any
) -> None:
    job = running_job(team, alice)
    cutoff = rollup_cutoff(NOW)
    assert cutoff == datetime(2026, 3, 9, 11, 55, tzinfo=UTC)  # a whole period before
    period = datetime(2026, 3, 9, 11, 0, tzinfo=UTC)
    for seconds, util, processes in [(0, 10.0, 1.0), (90, 20.0, None), (299, 60.0, 2.0)]:
        job_sample(job, period + timedelta(seconds=seconds), util, processes)
    job_sample(job, period + timedelta(minutes=5), 99.0, 3.0)  # the next period, alone
    job_sample(job, cutoff, 50.0, 1.0)  # not older than the cutoff: stays raw
    for seconds, temperature in [(10, 40.0), (20, 50.0)]:
        DeviceGpuSample.objects.create(
            node=node, uuid=GPU0, at=period + timedelta(seconds=seconds), temperature_c=temperature
        )

    result = rollup_gpu_samples(now=NOW)

    assert result.as_dict() == {"means_written": 3, "raw_rolled_up": 6, "pruned": 0}
    assert list(
        JobGpuSample.objects.order_by("at").values_list(
            "at", "period_s", "samples", "sm_util_pct", "processes", "memory_used_mb"
        )
    ) == [
        (period, 300, 3, 30.0, 1.5, 1000.0),
        (period + timedelta(minutes=5), 300, 1, 99.0, 3.0, 1000.0),
        (cutoff, 0, 1, 50.0, 1.0, 1000.0),
    ]
    assert list(
        DeviceGpuSample.objects.values_list("uuid", "at", "period_s", "samples", "temperature_c")
    ) == [(GPU0, period, 300, 2, 45.0)]
    # Nothing is rolled up twice.
    assert rollup_gpu_samples(now=NOW).as_dict() == {
        "means_written": 0,
        "raw_rolled_up": 0,
        "pruned": 0,
    }


@override_settings(METRICS_KEEP_DAYS=7.0)
def test_samples_older_than_the_retention_are_deleted(node: Any, team: Any, alice: Any) -> None:
    job = running_job(team, alice)
    old = NOW - timedelta(days=7, seconds=1)
    JobGpuSample.objects.create(job=job, attempt=1, at=old, period_s=300, samples=10)
    DeviceGpuSample.objects.create(node=node, uuid=GPU0, at=old, period_s=300, samples=10)
    kept = NOW - timedelta(days=6)
    JobGpuSample.objects.create(job=job, attempt=1, at=kept, period_s=300, samples=10)

    assert rollup_gpu_samples(now=NOW).pruned == 2
    assert list(JobGpuSample.objects.values_list("at", flat=True)) == [kept]
    assert DeviceGpuSample.objects.count() == 0


# --- idle GPUs -------------------------------------------------------------------------------

T0 = datetime(2026, 3, 10, 8, 0, tzinfo=UTC)


def idle_series(job: Job, *, until: datetime, start: datetime = T0) -> None:
    """Under 5 % (2 %) every 30 s from ``start`` to ``until``; busy (80 %) in the minute
    before T0 when ``start`` is T0."""
    if start == T0:
        for seconds in (60, 30):
            job_sample(job, T0 - timedelta(seconds=seconds), 80.0, 1.0)
    at = start
    while at <= until:
        job_sample(job, at, 2.0, 1.0)
        at += timedelta(seconds=30)


@pytest.mark.parametrize(
    ("last", "warned"),
    [
        ((1.0, 1.0), True),  # under 5 %
        ((None, 0.0), True),  # MIG: no utilisation, but no process on its GPUs either
        ((5.0, 1.0), False),  # not under 5 %
        ((None, 1.0), False),  # MIG with a process: nothing says it is idle
        ((None, None), False),  # nothing known
    ],
)
def test_an_idle_stretch_starts_after_the_last_busy_sample(
    node: Any, team: Any, alice: Any, last: tuple[float | None, float | None], warned: bool
) -> None:
    team.idle_warn_minutes = 2
    team.save()
    job = running_job(team, alice)
    job_sample(job, T0, 90.0, 1.0)
    job_sample(job, T0 + timedelta(minutes=1), 1.0, 1.0)
    job_sample(job, T0 + timedelta(minutes=2), None, 0.0)
    job_sample(job, T0 + timedelta(minutes=3), *last)

    result = check_idle_jobs(now=T0 + timedelta(minutes=3, seconds=10))

    assert result.warned == ([job.pk] if warned else [])
    if warned:
        assert job.events.get(message__startswith=IDLE_WARNING).message == (
            "GPU idle: utilisation under 5% since 2026-03-10 08:01:00 UTC (2 min); it keeps its "
            "slices"
        )


def test_an_idle_job_is_warned_at_y_minutes_and_stopped_at_y_plus_z_through_the_stop_path(
    node: Any, team: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    team.idle_util_pct, team.idle_warn_minutes, team.idle_reclaim_minutes = 5.0, 30, 60
    team.save()
    job = running_job(team, alice, started_at=T0 - timedelta(minutes=5))
    told: list[dict[str, Any]] = []

    def listener(sender: Any, **kwargs: Any) -> None:
        told.append(kwargs)

    job_idle.connect(listener)
    try:
        idle_series(job, until=T0 + timedelta(minutes=29, seconds=30))
        with django_capture_on_commit_callbacks(execute=True):
            early = check_idle_jobs(now=T0 + timedelta(minutes=29, seconds=40))
        assert early.as_dict() == {"warned": 0, "reclaimed": 0}

        idle_series(job, start=T0 + timedelta(minutes=30), until=T0 + timedelta(minutes=30))
        at_y = T0 + timedelta(minutes=30, seconds=5)
        with django_capture_on_commit_callbacks(execute=True):
            warned = check_idle_jobs(now=at_y)
        assert warned.warned == [job.pk]
    finally:
        job_idle.disconnect(listener)
    warning = job.events.get(message__startswith=IDLE_WARNING)
    assert (warning.at, warning.from_state, warning.to_state, warning.attempt) == (
        at_y,
        "RUNNING",
        "RUNNING",
        1,
    )
    assert warning.message == (
        "GPU idle: utilisation under 5% since 2026-03-10 08:00:00 UTC (30 min); if it stays "
        "idle it is stopped and its slices freed at 2026-03-10 09:30:05 UTC (IDLE_RECLAIMED)"
    )
    assert told == [
        {
            "signal": job_idle,
            "job_id": job.pk,
            "attempt": 1,
            "idle_since": T0,
            "util_pct": 5.0,
            "reclaim_at": at_y + timedelta(minutes=60),
        }
    ]
    # Warned once per idle stretch.
    assert check_idle_jobs(now=at_y + timedelta(minutes=1)).as_dict() == {
        "warned": 0,
        "reclaimed": 0,
    }

    # Still idle, but not yet Z minutes after the warning: it keeps its slices.
    idle_series(job, start=T0 + timedelta(minutes=30, seconds=30), until=T0 + timedelta(minutes=90))
    assert check_idle_jobs(now=at_y + timedelta(minutes=59, seconds=50)).reclaimed == []

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        reclaimed = check_idle_jobs(now=at_y + timedelta(minutes=60))
    assert reclaimed.reclaimed == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.stop_reason, job.stop_requested_at) == (
        "RUNNING",
        "idle_reclaim",
        at_y + timedelta(minutes=60),
    )
    assert [(m["job_id"], m["attempt"], m["reason"]) for m, _ in sent.stops()] == [
        (job.pk, 1, "cancel")
    ]
    # Asked once: the next look finds it stopping.
    assert check_idle_jobs(now=at_y + timedelta(minutes=61)).reclaimed == []

    # The agent stops it and reports the end: CANCELLED, reason IDLE_RECLAIMED, slices freed,
    # never requeued (the same holds when the agent can only say the attempt was lost).
    assert deliver(finished(job.pk, 1, outcome="cancelled", exit_code=143)) == "finished"
    job.refresh_from_db()
    assert (job.state, job.reason, job.exit_code, job.attempt) == (
        "CANCELLED",
        "IDLE_RECLAIMED",
        143,
        1,
    )
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert list(job.events.order_by("at", "id").values_list("to_state", flat=True))[-1] == (
        "CANCELLED"
    )


def test_a_job_reported_lost_while_reclaimed_ends_cancelled_not_requeued(
    node: Any, team: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    team.idle_warn_minutes, team.idle_reclaim_minutes = 10, 5
    team.save()
    job = running_job(team, alice, started_at=T0)
    idle_series(job, start=T0 + timedelta(seconds=30), until=T0 + timedelta(minutes=20))
    with django_capture_on_commit_callbacks(execute=True):
        assert check_idle_jobs(now=T0 + timedelta(minutes=11)).warned == [job.pk]
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        assert check_idle_jobs(now=T0 + timedelta(minutes=16)).reclaimed == [job.pk]

    deliver(finished(job.pk, 1, outcome="fenced", exit_code=None, error="lease lapsed"))

    job.refresh_from_db()
    assert (job.state, job.reason, job.attempt) == ("CANCELLED", "IDLE_RECLAIMED", 1)


def test_busy_stale_and_unwatched_jobs_are_left_alone_and_the_default_only_warns(
    node: Any, team: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    busy = running_job(team, alice, on=GPU0)
    idle_series(busy, until=T0 + timedelta(minutes=40))
    job_sample(busy, T0 + timedelta(minutes=40, seconds=30), 75.0, 1.0)  # busy again
    stale = running_job(team, alice, on=GPU1)
    idle_series(stale, until=T0 + timedelta(minutes=30))  # nothing since: 11 min old at +41
    other_team = make_team("nlp", idle_warn_minutes=0)  # no detection for this team
    unwatched = running_job(other_team, make_user("bob", team=other_team), on=MIG0)
    idle_series(unwatched, until=T0 + timedelta(minutes=41))

    with django_capture_on_commit_callbacks(execute=True):
        result = check_idle_jobs(now=T0 + timedelta(minutes=41))
    assert result.as_dict() == {"warned": 0, "reclaimed": 0}
    assert not Job.objects.filter(events__message__startswith=IDLE_WARNING).exists()

    # The site's defaults (PORTAL_IDLE_WARN_MINUTES 30, no reclaim): a warning, nothing more.
    fresh = running_job(team, alice, on=MIG1)
    idle_series(fresh, until=T0 + timedelta(minutes=120))
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert check_idle_jobs(now=T0 + timedelta(minutes=60)).warned == [fresh.pk]
        assert check_idle_jobs(now=T0 + timedelta(minutes=120)).as_dict() == {
            "warned": 0,
            "reclaimed": 0,
        }
    assert sent.stops() == []
    assert fresh.events.get(message__startswith=IDLE_WARNING).message == (
        "GPU idle: utilisation under 5% since 2026-03-10 08:00:00 UTC (60 min); it keeps its slices"
    )

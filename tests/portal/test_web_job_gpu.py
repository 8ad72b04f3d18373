"""The job page's GPU part (issue 9.7): run time, GPU-unit-hours charged, utilisation and
memory over time as server-rendered SVG charts with the same numbers in a table, a failed
job's last log lines next to its exit code, a cancelled job shown as neutral; and the page's
queries, pinned, not growing with the length of the series."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from portal.accounting.models import UsageRecord
from portal.agents.models import JobGpuSample
from portal.jobs.models import Job, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.web.job_gpu import MAX_POINTS

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, 8, 0, tzinfo=UTC)


@pytest.fixture
def team() -> Any:
    return make_team("vision", limit_units=None)


@pytest.fixture
def alice(team: Any) -> Any:
    return make_user("alice", team=team)


@pytest.fixture
def node() -> Any:
    return make_node("node-1", gpus=[{"mode": "whole"}, {"mode": "whole"}])


def page(user: Any, job: Job) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("web:job_detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def sample(job: Job, at: datetime, **values: Any) -> None:
    JobGpuSample.objects.create(job=job, attempt=job.attempt, at=at, **values)


def table_rows(html: str) -> list[list[str]]:
    table = html.split('id="job-gpu-table"', 1)[1]
    body = table.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_a_running_job_shows_its_gpu_use_over_time_in_a_chart_and_a_table(
    team: Any, alice: Any, node: Any
) -> None:
    started = timezone.now() - timedelta(minutes=90)
    job = make_job(team=team, user=alice, state=JobState.RUNNING, started_at=started)
    allocate(job, ["GPU-node-1-0", "GPU-node-1-1"])
    job.allocations.update(created_at=started)
    sample(job, T0, sm_util_pct=80.0, mem_util_pct=30.0, memory_used_mb=20480.0,
           processes=2.0, power_w=600.0, temperature_c=61.0)  # fmt: skip
    sample(job, T0 + timedelta(seconds=30), sm_util_pct=None, memory_used_mb=1024.0)
    sample(job, T0 + timedelta(seconds=60), sm_util_pct=2.5, mem_util_pct=0.0,
           memory_used_mb=512.0, processes=1.0, power_w=90.0, temperature_c=40.0)  # fmt: skip

    html = page(alice, job)

    assert f'<svg id="job-{job.pk}-gpu-util" class="chart"' in html
    assert f'<svg id="job-{job.pk}-gpu-memory" class="chart"' in html
    # One marker per known value, each with its numbers; a gap where NVML could not tell.
    assert "<title>2026-03-10 08:00:00 UTC: SM utilisation 80 %</title>" in html
    assert "<title>2026-03-10 08:01:00 UTC: SM utilisation 2.5 %</title>" in html
    assert "08:00:30 UTC: SM utilisation" not in html
    assert "<title>2026-03-10 08:00:30 UTC: memory used 1 GiB</title>" in html
    assert 'id="job-gpu-util-legend"' in html and "SM utilisation" in html
    # Newest first, a dash where NVML could not tell.
    assert table_rows(html) == [
        ["08:01:00", "2.5", "0.0", "0.50", "1", "90", "40"],
        ["08:00:30", "—", "—", "1.00", "—", "—", "—"],
        ["08:00:00", "80.0", "30.0", "20.00", "2", "600", "61"],
    ]
    assert "From 3 samples of the job" in html
    assert re.search(r'id="job-run-time">1h 30m</dd>', html)
    # Two whole GPUs held for 90 minutes: 3 GPU-unit-hours so far, nothing charged yet.
    assert re.search(r'id="job-unit-hours">0.00 charged · 3.00 so far', html)


def test_a_long_series_is_shown_as_exact_means_of_equal_stretches(
    team: Any, alice: Any, node: Any
) -> None:
    job = make_job(team=team, user=alice, state=JobState.RUNNING, started_at=T0)
    count = 2 * MAX_POINTS
    for i in range(count):
        sample(job, T0 + timedelta(seconds=30 * i), sm_util_pct=10.0 if i % 2 else 30.0)

    rows = table_rows(page(alice, job))

    assert len(rows) == MAX_POINTS
    assert {row[1] for row in rows} == {"20.0"}


def test_a_failed_job_shows_its_exit_code_and_last_log_lines_and_what_it_was_charged(
    team: Any, alice: Any, node: Any
) -> None:
    job = make_job(
        team=team,
        user=alice,
        state=JobState.FAILED,
        started_at=T0,
        finished_at=T0 + timedelta(minutes=45),
        exit_code=3,
        reason="failed",
    )
    JobLogChunk.objects.create(
        job=job, attempt=1, seq=0, data="".join(f"line {n}\n" for n in range(1, 31))
    )
    UsageRecord.objects.create(
        job=job,
        attempt=1,
        team=team,
        user=alice,
        gpu_units=2.0,
        started_at=T0,
        ended_at=T0 + timedelta(minutes=45),
        unit_seconds=2.0 * 45 * 60,
    )

    html = page(alice, job)

    assert '<div class="reason-box bad" id="job-reason"' in html
    assert 'id="job-failure-exit">Exit code <strong>3</strong>' in html
    tail = html.split('id="job-failure-tail">', 1)[1].split("</pre>", 1)[0]
    assert tail == "\n".join(f"line {n}" for n in range(11, 31))
    assert re.search(r'id="job-run-time">45m 00s</dd>', html)
    assert re.search(r'id="job-unit-hours">1.50 charged</dd>', html)
    assert "2026-03-10 08:45:00 UTC" in html  # times say their timezone
    assert "No GPU samples of this attempt" in html


def test_a_cancelled_job_is_shown_as_neutral(team: Any, alice: Any) -> None:
    job = make_job(
        team=team,
        user=alice,
        state=JobState.CANCELLED,
        started_at=T0,
        finished_at=T0 + timedelta(minutes=5),
        reason="IDLE_RECLAIMED",
        exit_code=143,
    )

    html = page(alice, job)

    assert '<div class="reason-box" id="job-reason"' in html and "IDLE_RECLAIMED" in html
    assert "job-failure-tail" not in html


# The job page's queries for a running job with GPU samples: the session, the user, the job,
# its log, slices, events, the viewer's memberships (actions), then the GPU part: samples,
# charges, held slices.
JOB_PAGE_QUERIES = 10


def test_the_job_pages_queries_are_pinned_and_do_not_grow_with_its_samples(
    team: Any, alice: Any, node: Any
) -> None:
    job = make_job(team=team, user=alice, state=JobState.RUNNING, started_at=T0)
    allocate(job, ["GPU-node-1-0"])
    client = Client()
    client.force_login(alice)
    url = reverse("web:job_detail", args=[job.pk])

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured.captured_queries)

    for i in range(10):
        sample(job, T0 + timedelta(seconds=30 * i), sm_util_pct=50.0, memory_used_mb=100.0)
    few = queries()
    for i in range(10, 500):
        sample(job, T0 + timedelta(seconds=30 * i), sm_util_pct=50.0, memory_used_mb=100.0)
    many = queries()

    assert few == many == JOB_PAGE_QUERIES

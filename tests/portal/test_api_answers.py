"""The job answers the views build by hand are exactly what the schema's DRF serializers
would render (portal/api/serializers.py builds them without a serializer, for speed)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from portal.api.serializers import (
    JOB_SUMMARY_COLUMNS,
    JobDetailSerializer,
    JobSummarySerializer,
    job_detail_data,
    job_summary_data,
)
from portal.jobs.models import Job, JobArray, JobDependency, JobEvent, JobState
from portal.jobs.selectors import job_slices
from portal.jobs.testing import allocate, make_job, make_node

pytestmark = pytest.mark.django_db


def rendered(data: Any) -> Any:
    """What a client reads: the JSON the API's renderer writes, parsed."""
    return json.loads(JSONRenderer().render(data))


@pytest.fixture
def jobs(world) -> list[Job]:
    """Jobs of every shape the answers show: waiting with an explanation and a start band,
    running on slices, ended, in an array, with dependencies and notify, elastic."""
    make_node(gpus=[{"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}, {"mode": "whole"}])
    now = timezone.now().replace(microsecond=123456)
    waiting = make_job(
        team=world.vision,
        user=world.alice,
        name="waiting",
        pending_code="QUOTA_LIMIT",
        pending_message="team uses 4.0 of 4.0 units",
        pending_numbers={"uses": 4.0, "limit": 4.0},
        queue_position=3,
        estimated_start_at=now + timedelta(minutes=30),
        estimated_start_earliest_at=now + timedelta(minutes=10),
        estimated_start_latest_at=None,
        notify=["end", "fail"],
        env={"LR": "0.1"},
        time_limit_s=600,
        gpu_min_count=1,
        gpu_count=2,
        multi_node=True,
    )
    fresh = make_job(team=world.vision, user=world.alice, name="fresh")
    running = make_job(
        team=world.vision,
        user=world.alice,
        name="running",
        state=JobState.RUNNING,
        gpu_kind="mig",
        gpu_profile="3g.40gb",
        started_at=now,
        assigned_at=now,
        borrowed=True,
    )
    allocate(running, ["MIG-node-1-0-0"])
    ended = make_job(
        team=world.vision,
        user=world.alice,
        name="ended",
        state=JobState.FAILED,
        started_at=now - timedelta(hours=1),
        finished_at=now,
        exit_code=3,
        reason="failed",
        stop_requested_at=now,
        stop_reason="cancel",
    )
    allocate(ended, ["GPU-node-1-1"], released=True)
    array = JobArray.objects.create(
        team=world.vision, user=world.alice, name="sweep", size=2, values=[], created_at=now
    )
    member = make_job(
        team=world.vision, user=world.alice, name="member", array=array, array_index=1
    )
    JobDependency.objects.create(job=member, depends_on=ended, kind="after_any")
    JobDependency.objects.create(job=member, depends_on=running, kind="after_ok")
    JobEvent.objects.create(
        job=member, at=now, from_state="PENDING", to_state="HELD", attempt=0, message="held"
    )
    return [waiting, fresh, running, ended, member]


def test_a_summary_is_what_the_summary_serializer_renders(jobs):
    rows = {
        row["id"]: row
        for row in Job.objects.filter(pk__in=[job.pk for job in jobs]).values(*JOB_SUMMARY_COLUMNS)
    }
    for job in Job.objects.filter(pk__in=rows).select_related("team", "user", "node"):
        expected = rendered(JobSummarySerializer(job).data)
        assert rendered(job_summary_data(rows[job.pk])) == expected


def test_a_detail_is_what_the_detail_serializer_renders(jobs):
    for job in Job.objects.filter(pk__in=[job.pk for job in jobs]).select_related(
        "team", "user", "node"
    ):
        expected = rendered(JobDetailSerializer(job).data)
        data = job_detail_data(
            job,
            dependencies=job.dependencies.all(),
            events=job.events.all(),
            slices=job_slices(job=job),
        )
        assert rendered(data) == expected
    shown = {job.name: job for job in jobs}
    assert (
        rendered(job_detail_data(shown["running"], dependencies=[], events=[], slices=[]))[
            "borrowed"
        ]
        is True
    )


def test_the_submit_answer_is_the_job_as_read_back_afterwards(world, alice_api):
    make_node(gpus=[{"mode": "whole", "model": "NVIDIA A100-SXM4-80GB"}] * 2)
    before = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)
    body = {
        "name": "train",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": "python3 -c 'print(1)'",
        "env": {"LR": "0.1"},
        "gpu": {"kind": "whole", "count": 2, "min_count": 1, "model": "a100"},
        "priority": "low",
        "time_limit_s": 60,
        "preemptible": False,
        "depends_on": [{"job": before.pk, "kind": "after_any"}],
        "notify": ["start"],
    }
    submitted = alice_api.post("/api/v1/jobs/", body, format="json")
    assert submitted.status_code == 201, submitted.json()

    read_back = alice_api.get(f"/api/v1/jobs/{submitted.json()['id']}/")

    assert submitted.json() == read_back.json()
    assert submitted.json()["gpu"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert submitted.json()["depends_on"] == [{"job": before.pk, "kind": "after_any"}]

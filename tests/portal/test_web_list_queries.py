"""The list pages that other files do not pin (teams, tokens, nodes, the submit form with its
cluster offer, a job's page with a long history) cost the same queries for a small world as
for one ten times bigger: no query per row.

The job list, usage, team, cluster (1 and 100 nodes), fair share, array and notifications
pages are pinned in their own files (test_web.py, test_web_job_actions.py,
test_web_usage.py, test_team_members.py, test_cluster_capacity.py, test_fairshare.py,
test_web_arrays.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.jobs.models import JobEvent, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, make_team, make_user
from portal.tenants.models import Membership
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return World()


def _queries(user: Any, path: str) -> int:
    client = Client()
    client.force_login(user)
    client.get(path)  # the session's first write out of the way
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return len(queries.captured_queries)


def _grow(world: World, times: int, *, first: int = 0) -> None:
    """``times`` more of everything the list pages show a row for: teams with members and
    jobs, nodes with GPUs and running jobs, the site admin's and alice's tokens."""
    for number in range(first, first + times):
        team = make_team(f"team{number}", limit_units=8.0)
        Membership.objects.create(team=team, user=world.admin)
        Membership.objects.create(team=team, user=world.alice)
        user = make_user(f"user{number}", team=team)
        node = make_node(
            f"node{number}",
            gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}],
        )
        job = make_job(team=team, user=user, state=JobState.RUNNING, name=f"run{number}")
        allocate(job, [f"GPU-node{number}-0"])
        make_job(team=team, user=user, name=f"wait{number}")
        token_issue(user=world.admin, name=f"admin token {number}")
        token_issue(user=world.alice, name=f"alice token {number}")
        assert node.pk


def _pinned(user: Callable[[World], Any], path: str, world: World) -> tuple[int, int]:
    _grow(world, 1)  # one of each, so no part of the page is skipped for being empty
    few = _queries(user(world), path)
    _grow(world, 10, first=1)
    return few, _queries(user(world), path)


@pytest.mark.parametrize(
    ("who", "path"),
    [
        (lambda w: w.alice, "/teams/"),
        (lambda w: w.admin, "/teams/"),
        (lambda w: w.alice, "/tokens/"),
        (lambda w: w.admin, "/tokens/"),
        (lambda w: w.admin, "/nodes/"),
        (lambda w: w.alice, "/jobs/new/"),
        (lambda w: w.admin, "/jobs/new/"),
    ],
    ids=[
        "teams-member",
        "teams-site-admin",
        "tokens-member",
        "tokens-site-admin",
        "nodes-site-admin",
        "submit-member",
        "submit-site-admin",
    ],
)
def test_a_list_page_costs_the_same_queries_for_ten_times_the_rows(world, who, path) -> None:
    few, many = _pinned(who, path, world)
    assert many == few


def test_a_jobs_page_costs_the_same_queries_however_long_its_history(world) -> None:
    make_node("node-a", gpus=[{"mode": "whole"}])
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING, name="long")
    allocate(job, ["GPU-node-a-0"])
    path = f"/jobs/{job.pk}/"
    few = _queries(world.alice, path)
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job=job, at=job.submitted_at, from_state="PENDING", to_state="PENDING", message=""
            )
            for _ in range(50)
        ]
    )
    assert _queries(world.alice, path) == few

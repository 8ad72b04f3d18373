"""A job array's page: counts by state, its jobs, cancel-all and resubmit-failed for those who
may act, and the link to it from each member's page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.jobs.arrays import array_submit, validate_array_request
from portal.jobs.models import Job, JobArray, JobState
from portal.jobs.testing import World, make_node, make_user

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
BODY = {
    "name": "sweep",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "train.py"],
    "gpu": {"kind": "whole", "count": 1},
}


@pytest.fixture
def world() -> World:
    make_node(gpus=[{"mode": "whole"}])
    return World()


def _array(world: World, spec: dict[str, Any]) -> tuple[JobArray, list[Job]]:
    request = validate_array_request({**BODY, "array": spec}, user=world.alice)
    return array_submit(user=world.alice, request=request)


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def buttons(page: str) -> list[str]:
    return re.findall(r'class="button[^"]*"[^>]*>([^<]+)</button>', page)


def test_the_page_counts_the_members_by_state_and_lists_them_with_their_values(world):
    array, jobs = _array(world, {"values": {"lr": [0.1, 0.01], "bs": [32]}, "max_running": 1})
    Job.objects.filter(pk=jobs[0].pk).update(state=JobState.RUNNING)
    Job.objects.filter(pk=jobs[1].pk).update(
        pending_code="ARRAY_THROTTLE", pending_message="array 1 runs 1 of at most 1"
    )

    response = client_for(world.alice).get(reverse("web:array_detail", args=[array.pk]))

    page = response.content.decode()
    assert response.status_code == 200
    counts = page[page.index('id="array-counts"') : page.index("</dl>")]
    assert re.findall(r"state-(\w+)\">\w+</span></dt><dd>(\d+)</dd>", counts) == [
        ("PENDING", "1"),
        ("RUNNING", "1"),
    ]
    assert "at most 1 running at once" in page
    row = page[page.index(f'id="array-job-{jobs[1].pk}"') :]
    row = row[: row.index("</tr>")]
    assert re.findall(r'class="mono" data-label="(\w+)">([^<]+)<', row) == [
        ("lr", "0.01"),
        ("bs", "32"),
    ]
    assert "ARRAY_THROTTLE" in row and "array 1 runs 1 of at most 1" in row
    assert buttons(page) == ["Cancel all"]  # nothing failed: no resubmit
    assert 'hx-trigger="every 2s"' in page  # members can still change: the page polls


def test_each_members_page_links_to_its_array(world):
    array, jobs = _array(world, {"count": 2})
    page = client_for(world.alice).get(reverse("web:job_detail", args=[jobs[1].pk]))
    assert (
        f'<a id="job-array" href="/arrays/{array.pk}/">array {array.pk}</a>, index 1'
        in page.content.decode()
    )


def test_cancel_all_from_the_page_cancels_the_waiting_members(world):
    array, jobs = _array(world, {"count": 3})
    Job.objects.filter(pk=jobs[2].pk).update(state=JobState.SUCCEEDED)
    url = reverse("web:array_cancel", args=[array.pk])

    response = client_for(world.alice).post(url, **HTMX)

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="array-live"') and "<html" not in fragment
    states = dict(Job.objects.filter(array=array).values_list("pk", "state"))
    assert states == {
        jobs[0].pk: JobState.CANCELLED,
        jobs[1].pk: JobState.CANCELLED,
        jobs[2].pk: JobState.SUCCEEDED,
    }
    assert buttons(fragment) == []  # all ended, none failed
    assert "hx-trigger" not in fragment  # and the page stops polling


def test_resubmit_failed_without_javascript_redirects_back_with_a_message(world):
    array, jobs = _array(world, {"count": 3})
    Job.objects.filter(pk=jobs[1].pk).update(state=JobState.FAILED)
    client = client_for(world.alice)
    assert buttons(client.get(reverse("web:array_detail", args=[array.pk])).content.decode()) == [
        "Resubmit failed",
        "Cancel all",
    ]

    response = client.post(reverse("web:array_resubmit_failed", args=[array.pk]))

    assert response.status_code == 302
    assert response["Location"] == reverse("web:array_detail", args=[array.pk])
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said == [f"1 failed job(s) of array {array.pk} resubmitted."]
    new = Job.objects.filter(array=array, array_index=1).latest("pk")
    assert new.pk != jobs[1].pk and new.state == JobState.PENDING
    page = client.get(response["Location"]).content.decode()
    assert f"job {jobs[1].pk}</a> (index 1, FAILED)" in page


def test_others_see_no_array_of_another_team_and_team_mates_get_no_buttons(world):
    array, _ = _array(world, {"count": 2})
    url = reverse("web:array_detail", args=[array.pk])
    assert client_for(world.bob).get(url).status_code == 404

    carol = client_for(make_user("carol", team=world.vision))
    page = carol.get(url)
    assert page.status_code == 200 and buttons(page.content.decode()) == []
    assert carol.post(reverse("web:array_cancel", args=[array.pk])).status_code == 403
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.PENDING}


def test_the_page_costs_the_same_queries_for_3_members_as_for_300(world):
    client = client_for(world.alice)

    def queries(count: int) -> int:
        array, _ = _array(world, {"count": count})
        with CaptureQueriesContext(connection) as done:
            assert client.get(reverse("web:array_detail", args=[array.pk])).status_code == 200
        return len(done)

    assert queries(3) == queries(300)


def test_a_page_that_is_no_number_is_a_400_naming_it_and_one_past_the_end_the_last(world):
    array, jobs = _array(world, {"count": 3})
    client = client_for(world.alice)
    url = reverse("web:array_detail", args=[array.pk])

    wrong = client.get(url, {"page": "two"})
    past_the_end = client.get(url, {"page": "9"})

    assert wrong.status_code == 400
    page = wrong.content.decode()
    assert "Page: &#x27;two&#x27; is not a page number; allowed: a whole number from 1" in page
    assert f'id="array-job-{jobs[0].pk}"' in page  # the first page, shown all the same
    assert past_the_end.status_code == 200
    assert f'id="array-job-{jobs[2].pk}"' in past_the_end.content.decode()
    assert 'id="array-problem"' not in past_the_end.content.decode()

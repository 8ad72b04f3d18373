"""The submit form's what-if: the real pass on the current snapshot plus the candidate job.

Each answer is checked twice: against exact numbers on a small cluster, and against what a
real pass decides after the same request is submitted for real at the same instant. Asking
writes nothing (the query log holds no INSERT, UPDATE or DELETE) and takes no lock; the form's
fragment and ``POST /api/v1/jobs/what-if/`` show the selector's numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from portal.jobs import cluster_fit
from portal.jobs.models import Job, JobState
from portal.jobs.services import job_submit
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.jobs.validation import JobRequest, validate_job_request
from portal.scheduling import whatif
from portal.scheduling.models import SchedulerState
from portal.scheduling.service import run_schedule_pass
from portal.scheduling.whatif import CANDIDATE_ID, what_if
from portal.tenants.models import Membership
from portal.tenants.tokens import token_issue
from portal.web.forms import JOB_FORM_DEFAULTS

pytestmark = pytest.mark.django_db

A100 = "NVIDIA A100-SXM4-80GB"
WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


@pytest.fixture(autouse=True)
def fresh_snapshot() -> Iterator[None]:
    whatif.clear_snapshot_cache()
    yield
    whatif.clear_snapshot_cache()


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def world(now) -> dict[str, Any]:
    """node-a: 2 whole A100s and a MIG A100 (3g.40gb + 2 x 1g.10gb). Team vision is
    guaranteed 1 unit (limit 4), nlp 1 unit (limit 3); carol is in both teams."""
    make_node(
        "node-a",
        gpus=[
            {"mode": "whole", "model": A100},
            {"mode": "whole", "model": A100},
            {"mode": "mig", "model": A100, "profiles": ["3g.40gb", "1g.10gb", "1g.10gb"]},
        ],
    )
    vision = make_team("vision", guaranteed_units=1.0, limit_units=4.0)
    nlp = make_team("nlp", guaranteed_units=1.0, limit_units=3.0)
    carol = make_user("carol", team=vision)
    Membership.objects.create(team=nlp, user=carol)
    return {
        "vision": vision,
        "nlp": nlp,
        "alice": make_user("alice", team=vision),
        "bob": make_user("bob", team=nlp),
        "carol": carol,
        "now": now,
    }


def running(world, user, team, slices, *, name, minutes_ago=30, time_limit_s=None, **fields):
    started = world["now"] - timedelta(minutes=minutes_ago)
    job = make_job(
        team=world[team],
        user=world[user],
        name=name,
        state=JobState.RUNNING,
        gpu_count=len(slices),
        submitted_at=started,
        assigned_at=started,
        started_at=started,
        time_limit_s=time_limit_s,
        **fields,
    )
    allocate(job, slices)
    return job


def request(user, team="vision", **gpu) -> JobRequest:
    data = {
        "name": "candidate",
        "team": team,
        "image": "python:3.11-slim",
        "command": ["python3", "-c", "print(1)"],
        "gpu": {"kind": "whole", "count": 1, **gpu},
    }
    return validate_job_request(data, user=user)


def submit_for_real(world, user, job_request):
    """Submit the same request and run a real pass at the what-if's instant."""
    job = job_submit(user=user, request=job_request)
    result = run_schedule_pass(now=world["now"])
    assert result.status == "ran"
    job.refresh_from_db()
    return job, result


# --- exact answers, and the real pass agrees ------------------------------------------------


def test_a_job_that_fits_now_is_first_and_starts_now(world):
    alice = world["alice"]
    asked = request(alice, model="a100")

    answer = what_if(request=asked, user=alice, now=world["now"])

    assert answer.request.model == A100  # resolved by the submit's own validation
    assert (answer.slices.exist, answer.slices.free, answer.slices.largest_free_on_one_node) == (
        2,
        2,
        2,
    )
    assert (answer.starts_now, answer.position, answer.start_at) == (True, 1, world["now"])
    assert answer.node == "node-a" and len(answer.slice_ids) == 1
    assert answer.reason_code == "" and answer.fails == "" and answer.preempts == ()
    g = answer.guarantee
    assert (g.team, g.guaranteed, g.limit, g.holds, g.job_units) == ("vision", 1.0, 4.0, 0.0, 1.0)
    assert (g.from_guarantee, g.borrowed, g.would_borrow) == (1.0, 0.0, False)
    assert not answer.reclaimable

    job, _ = submit_for_real(world, alice, asked)
    assert job.state == JobState.ASSIGNED and job.node.name == answer.node
    assert list(job.allocations.values_list("slice__key", flat=True)) == list(answer.slice_ids)
    assert job.borrowed is False


def test_a_job_that_must_wait_gets_the_position_reason_and_start_of_the_real_pass(world):
    now = world["now"]
    # bob holds both whole GPUs with a 1-hour limit; he may not be preempted.
    running(
        world,
        "bob",
        "nlp",
        ["GPU-node-a-0", "GPU-node-a-1"],
        name="bob-train",
        time_limit_s=3600,
        preemptible=False,
    )
    # alice waits already for a GPU (and holds the reservation); her new job queues behind it.
    make_job(
        team=world["vision"],
        user=world["alice"],
        name="ahead",
        submitted_at=now - timedelta(minutes=5),
    )
    alice = world["alice"]
    asked = request(alice)

    answer = what_if(request=asked, user=alice, now=now)

    assert (answer.slices.exist, answer.slices.free) == (2, 0)
    assert answer.starts_now is False and answer.preempts == ()
    assert answer.position == 2
    assert (answer.reason_code, answer.reason_message, answer.reason_numbers) == (
        "NO_FIT",
        "needs 1 x whole, at most 0 free on any node",
        {"needs": 1, "largest_free": 0, "kind": "whole"},
    )
    # bob's job ends at the latest 30 minutes from now (started 30 minutes ago, 1-hour limit),
    # freeing both GPUs: one for the job ahead, one for this one.
    assert answer.start_at == now + timedelta(minutes=30)
    assert (answer.guarantee.holds, answer.guarantee.would_borrow) == (0.0, False)

    job, _ = submit_for_real(world, alice, asked)
    assert job.state == JobState.PENDING
    assert (job.queue_position, job.pending_code, job.pending_message) == (
        answer.position,
        answer.reason_code,
        answer.reason_message,
    )
    assert job.pending_numbers == answer.reason_numbers
    assert job.estimated_start_at == answer.start_at


def test_a_job_above_the_guarantee_would_borrow_and_be_preemptible(world):
    alice = world["alice"]
    running(world, "alice", "vision", ["GPU-node-a-0"], name="first")  # vision's 1 unit
    asked = request(alice)

    answer = what_if(request=asked, user=alice, now=world["now"])

    assert answer.starts_now and answer.slice_ids == ("GPU-node-a-1",)
    g = answer.guarantee
    assert (g.holds, g.job_units, g.from_guarantee, g.borrowed) == (1.0, 1.0, 0.0, 1.0)
    assert g.would_borrow and answer.preemptible and answer.reclaimable

    job, _ = submit_for_real(world, alice, asked)
    assert job.state == JobState.ASSIGNED and job.borrowed is True


def test_a_job_not_preemptible_still_borrows_but_is_not_reclaimable(world):
    alice = world["alice"]
    running(world, "alice", "vision", ["GPU-node-a-0"], name="first")
    asked = validate_job_request(
        {
            "name": "keep",
            "team": "vision",
            "image": "python:3.11-slim",
            "command": "true",
            "gpu": {"kind": "whole"},
            "preemptible": False,
        },
        user=alice,
    )

    answer = what_if(request=asked, user=alice, now=world["now"])

    assert answer.guarantee.would_borrow and not answer.preemptible
    assert not answer.reclaimable


def test_a_job_under_its_guarantee_would_preempt_the_borrowing_job_it_names(world):
    now = world["now"]
    victim = running(world, "bob", "nlp", ["GPU-node-a-0", "GPU-node-a-1"], name="bob-train")
    carol = world["carol"]  # in both teams: she may see nlp's job names
    asked = request(carol)

    answer = what_if(request=asked, user=carol, now=now)

    assert answer.starts_now is False
    assert [(v.job_id, v.team, v.name, v.user, v.units, v.reason) for v in answer.preempts] == [
        (victim.pk, "nlp", "bob-train", "bob", 2.0, "reclaim")
    ]
    assert answer.reason_code == "WAITING_FOR_PREEMPTION"
    assert answer.position == 1
    assert answer.start_at == now + timedelta(seconds=30)  # the victims' grace period

    # alice is not in nlp: the same answer, without the job's name or owner.
    seen_by_alice = what_if(request=request(world["alice"]), user=world["alice"], now=now)
    assert [(v.job_id, v.team, v.name, v.user) for v in seen_by_alice.preempts] == [
        (victim.pk, "nlp", "", "")
    ]

    job, result = submit_for_real(world, carol, asked)
    assert result.preempted == (victim.pk,)
    victim.refresh_from_db()
    assert victim.stop_requested_at is not None
    assert (job.pending_code, job.queue_position, job.estimated_start_at) == (
        answer.reason_code,
        answer.position,
        answer.start_at,
    )


def test_a_job_that_depends_on_a_waiting_job_waits_for_it(world):
    alice = world["alice"]
    first = make_job(team=world["vision"], user=alice, name="first", state=JobState.HELD)
    asked = validate_job_request(
        {
            "name": "second",
            "team": "vision",
            "image": "python:3.11-slim",
            "command": "true",
            "gpu": {"kind": "whole"},
            "depends_on": [{"job": first.pk}],
        },
        user=alice,
    )

    answer = what_if(request=asked, user=alice, now=world["now"])

    assert answer.reason_code == "DEPENDENCY" and not answer.starts_now
    job, _ = submit_for_real(world, alice, asked)
    assert (job.pending_code, job.pending_message) == (answer.reason_code, answer.reason_message)


def test_the_candidate_id_is_never_a_database_id():
    assert int(CANDIDATE_ID) < 1


# --- nothing written, nothing locked --------------------------------------------------------


def _writes(queries) -> list[str]:
    return [q["sql"] for q in queries if WRITES.match(q["sql"])]


def test_asking_writes_nothing_and_takes_no_lock(world):
    running(world, "bob", "nlp", ["GPU-node-a-0", "GPU-node-a-1"], name="bob-train")
    carol = world["carol"]
    asked = request(carol)
    jobs_before = list(Job.objects.order_by("pk").values_list("pk", "state", "stop_requested_at"))

    with CaptureQueriesContext(connection) as queries:
        answer = what_if(request=asked, user=carol)

    assert answer.preempts  # a pass would have written a stop request and an explanation
    assert _writes(queries) == []
    assert not any(
        word in q["sql"].upper()
        for q in queries
        for word in ("FOR UPDATE", "PG_ADVISORY", "SAVEPOINT", "BEGIN")
    )
    assert list(Job.objects.order_by("pk").values_list("pk", "state", "stop_requested_at")) == (
        jobs_before
    )
    assert not SchedulerState.objects.exists()


def test_the_form_fragment_and_the_api_write_nothing_either(world, settings):
    settings.API_THROTTLE_USER = None  # its counter is the throttle's write, not the what-if's
    running(world, "bob", "nlp", ["GPU-node-a-0", "GPU-node-a-1"], name="bob-train")
    web = Client()
    web.force_login(world["carol"])
    api = APIClient()
    api.force_login(world["carol"])

    with CaptureQueriesContext(connection) as queries:
        page = web.post(reverse("web:job_whatif"), {**JOB_FORM_DEFAULTS, "team": "vision"})
        answer = api.post("/api/v1/jobs/what-if/", _body(), format="json")

    assert page.status_code == 200 and answer.status_code == 200
    assert answer.json()["would_preempt"][0]["name"] == "bob-train"
    assert _writes(queries) == []
    assert Job.objects.count() == 1


# --- the kept snapshot ----------------------------------------------------------------------


def test_the_snapshot_is_kept_a_few_seconds_until_a_pass_runs_or_a_job_comes(world, monkeypatch):
    alice = world["alice"]
    first = what_if(request=request(alice), user=alice)
    again = what_if(request=request(alice), user=alice)
    assert (first.cached, again.cached) == (False, True)
    assert again.snapshot_at == first.snapshot_at

    run_schedule_pass()  # the pass counter moves: what is free may have changed
    assert what_if(request=request(alice), user=alice).cached is False

    make_job(team=world["vision"], user=alice, name="new")  # a new job in the queue
    after_submit = what_if(request=request(alice), user=alice)
    # It is seen at once: placed ahead of the candidate, it counts in what the team holds.
    assert after_submit.cached is False and after_submit.guarantee.holds == 1.0

    assert what_if(request=request(alice), user=alice).cached is True
    clock = whatif.time.monotonic() + whatif.SNAPSHOT_TTL_S + 0.1
    monkeypatch.setattr(whatif.time, "monotonic", lambda: clock)
    assert what_if(request=request(alice), user=alice).cached is False


# --- the API --------------------------------------------------------------------------------


def _body(**gpu) -> dict[str, Any]:
    return {
        "name": "candidate",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", "print(1)"],
        "gpu": {"kind": "whole", "count": 1, **gpu},
    }


def test_the_api_answers_with_the_selectors_numbers_for_a_read_token(world):
    alice = world["alice"]
    running(world, "alice", "vision", ["GPU-node-a-0"], name="first")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=alice, scopes=['read'])}")

    response = client.post("/api/v1/jobs/what-if/", _body(model="A100"), format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    body.pop("snapshot_at")
    assert body == {
        "request": {
            "kind": "whole",
            "count": 1,
            "min_count": 0,
            "profile": "",
            "model": A100,
            "multi_node": False,
        },
        "slices": {"exist": 2, "free": 1, "largest_free_on_one_node": 1},
        "guarantee": {
            "team": "vision",
            "guaranteed_units": 1.0,
            "limit_units": 4.0,
            "holds_units": 1.0,
            "job_units": 1.0,
            "from_guarantee_units": 0.0,
            "borrowed_units": 1.0,
            "would_borrow": True,
        },
        "preemptible": True,
        "reclaimable": True,
        "starts_now": True,
        "node": "node-a",
        "slice_ids": ["GPU-node-a-1"],
        "queue_position": 1,
        "estimated_start_at": body["estimated_start_at"],
        # It starts now: now, all three.
        "estimated_start_band": {
            "earliest": body["estimated_start_at"],
            "likely": body["estimated_start_at"],
            "latest": body["estimated_start_at"],
        },
        "reason": None,
        "fails": "",
        "would_preempt": [],
    }
    assert body["estimated_start_at"] is not None
    assert Job.objects.count() == 1  # only the running one


def test_the_api_refuses_a_bad_request_with_the_submits_messages_and_stores_nothing(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=world['alice'])}")

    response = client.post(
        "/api/v1/jobs/what-if/", {**_body(count=3), "priority": "urgent"}, format="json"
    )

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["gpu.count"] == (
        "at most 2 whole GPUs fit on one node of this cluster (nodes have 2); ask for 2 or fewer"
    )
    assert set(errors) == {"gpu.count", "priority"}
    assert "allowed" in errors["priority"]
    assert Job.objects.count() == 0


def test_the_api_needs_a_login():
    response = APIClient().post("/api/v1/jobs/what-if/", _body(), format="json")
    assert response.status_code in (401, 403)


# --- the form's fragment --------------------------------------------------------------------


def _fragment(user, **values) -> str:
    client = Client()
    client.force_login(user)
    form = {**JOB_FORM_DEFAULTS, "team": "vision", **values}
    response = client.post(reverse("web:job_whatif"), form)
    assert response.status_code == 200
    return response.content.decode()


def _text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">(.*?)</dd>', html, re.S)
    assert found, f"no #{element_id} in {html}"
    return " ".join(re.sub(r"<[^>]+>", "", found.group(1)).split())


def test_the_fragment_shows_the_numbers_before_the_name_and_command_are_typed(world):
    running(world, "alice", "vision", ["GPU-node-a-0"], name="first")

    html = _fragment(world["alice"], gpu_count="1")  # no name, no command yet

    assert _text(html, "whatif-slices") == "2 whole GPUs in the cluster, 1 free now"
    assert _text(html, "whatif-guarantee") == (
        "draws 0 of its 1 GPU unit from team vision's guarantee of 1 "
        "(the team holds 1 before it; limit 4)"
    )
    assert _text(html, "whatif-borrow").startswith("yes, 1 unit above the guarantee: preemptible")
    assert _text(html, "whatif-start") == "now, first in the queue: on node-a (GPU-node-a-1)"
    assert _text(html, "whatif-preempts") == "nothing"


def test_the_fragment_checks_the_request_against_the_cluster_once(world, monkeypatch):
    loads = []
    real = cluster_fit.load_cluster_shape
    monkeypatch.setattr(cluster_fit, "load_cluster_shape", lambda: loads.append(1) or real())

    empty = _fragment(world["alice"], gpu_count="1")  # no name, no command yet
    bad_name = _fragment(world["alice"], gpu_count="1", name="x" * 300, command="python t.py")

    assert "whatif-start" in empty and "whatif-start" in bad_name
    # Once for the empty form; twice only for a typed part that is wrong (checked again
    # with its stand-in).
    assert len(loads) == 3


def test_the_fragment_shows_a_bigger_request_waiting_with_its_reason(world):
    running(
        world,
        "bob",
        "nlp",
        ["GPU-node-a-0"],
        name="bob-train",
        time_limit_s=3600,
        preemptible=False,
    )

    html = _fragment(world["alice"], gpu_count="2")

    assert _text(html, "whatif-slices") == "2 whole GPUs in the cluster, 1 free now"
    start = _text(html, "whatif-start")
    assert start.startswith("position 1 in the queue; estimated start ")
    # (bob's job started 30 minutes before the fixture's clock, the fragment asks a bit later)
    assert re.search(r"UTC \(in (29|30)\sminutes\)$", start), start
    assert _text(html, "whatif-reason").startswith("RESERVED ")


def test_the_fragment_lists_only_the_problems_of_what_the_scheduler_reads(world):
    html = _fragment(world["alice"], gpu_count="3", image="Not An Image")

    assert 'id="whatif-problems"' in html
    assert "at most 2 whole GPUs fit on one node of this cluster" in html
    assert "Image" not in html  # the submit itself reports that one


def test_the_fragment_needs_a_team_first(world):
    html = _fragment(world["alice"], team="")
    assert 'id="whatif-problems"' in html and "Team" in html


@pytest.mark.parametrize(
    "gpu",
    [
        {"kind": "mig", "profile": "1g.10gb", "count": 2},
        {"kind": "mig", "profile": "3g.40gb"},
        {"kind": "whole", "count": 2, "min_count": 1},
        {"kind": "whole", "count": 2, "multi_node": True},
    ],
    ids=["mig-gang", "mig-big", "elastic", "multi-node"],
)
def test_every_kind_of_request_gets_an_answer_the_real_pass_agrees_with(world, gpu):
    alice = world["alice"]
    running(world, "bob", "nlp", ["GPU-node-a-0"], name="bob-train", time_limit_s=600)
    asked = request(alice, **gpu)

    answer = what_if(request=asked, user=alice, now=world["now"])

    job, _ = submit_for_real(world, alice, asked)
    assert answer.starts_now == (job.state == JobState.ASSIGNED)
    if answer.starts_now:
        held = sorted(job.allocations.values_list("slice__key", flat=True))
        assert held == sorted(answer.slice_ids)
        assert answer.guarantee.job_units == pytest.approx(
            sum(job.allocations.values_list("slice__units", flat=True))
        )
    else:
        assert (job.pending_code, job.queue_position) == (answer.reason_code, answer.position)


def test_a_cluster_with_no_gpu_yet_answers_that_no_such_slice_exists(now):
    team = make_team("vision", guaranteed_units=1.0, limit_units=None)
    alice = make_user("alice", team=team)

    answer = what_if(request=request(alice), user=alice, now=now)

    assert (answer.slices.exist, answer.slices.free) == (0, 0)
    assert (answer.starts_now, answer.reason_code) == (False, "NO_MATCHING_SLICES")

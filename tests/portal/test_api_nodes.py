"""/api/v1/nodes/: site admins list nodes and cordon, uncordon and drain them (admin scope);
anyone else is refused, and a bad deadline or an unknown node is answered in words."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.cluster.models import Node, NodeEvent
from portal.jobs.models import Job, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, token_client
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db

NODES = "/api/v1/nodes/"


@pytest.fixture
def node() -> Node:
    return make_node("node-1", gpus=[{"mode": "whole"}, {"mode": "whole"}])


@pytest.fixture
def admin_api(world: World) -> APIClient:
    return token_client(world.admin)


def _running(world: World) -> Job:
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])
    return job


def test_a_site_admin_lists_nodes_with_state_cordon_deadline_and_jobs(world, node, admin_api):
    job = _running(world)

    listed = admin_api.get(NODES)

    assert listed.status_code == 200
    (row,) = listed.json()
    assert {k: row[k] for k in ("name", "state", "status", "cordoned", "drain_deadline_at")} == {
        "name": "node-1",
        "state": "ready",
        "status": "ready",
        "cordoned": False,
        "drain_deadline_at": None,
    }
    assert (row["slices"], row["slices_held"], row["jobs_running"], row["job_ids"]) == (
        2,
        1,
        1,
        [job.pk],
    )


def test_drain_answers_the_node_draining_with_its_deadline_and_event(world, node, admin_api):
    job = _running(world)

    answer = admin_api.post(f"{NODES}node-1/drain/", {"deadline_s": 900}, format="json")

    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["state"], body["status"], body["cordoned"], body["cordoned_by"]) == (
        "drained",
        "draining",
        True,
        "admin",
    )
    assert body["drain_deadline_at"] is not None and body["job_ids"] == [job.pk]
    assert [(e["kind"], e["by"]) for e in body["events"]] == [("drain", "admin")]
    assert admin_api.get(f"{NODES}node-1/").json()["status"] == "draining"


def test_cordon_and_uncordon_through_the_api(node, admin_api):
    cordoned = admin_api.post(f"{NODES}node-1/cordon/")
    assert cordoned.status_code == 200
    assert (cordoned.json()["status"], cordoned.json()["cordoned"]) == ("drained", True)

    back = admin_api.post(f"{NODES}node-1/uncordon/")

    assert back.status_code == 200
    body = back.json()
    # The node's agent never sent a heartbeat (a row made by the test): lost, not ready.
    assert (body["cordoned"], body["state"]) == (False, "lost")
    assert [e["kind"] for e in body["events"]] == ["uncordon", "cordon"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", NODES, None),
        ("get", f"{NODES}node-1/", None),
        ("post", f"{NODES}node-1/cordon/", None),
        ("post", f"{NODES}node-1/uncordon/", None),
        ("post", f"{NODES}node-1/drain/", {"deadline_s": 60}),
    ],
)
def test_a_member_is_refused(node, alice_api, method, path, body):
    answer = alice_api.get(path) if method == "get" else alice_api.post(path, body, format="json")

    assert answer.status_code == 403
    assert answer.json() == {"errors": {"detail": "only site admins may see and change nodes"}}
    node.refresh_from_db()
    assert node.state == Node.State.READY and not NodeEvent.objects.exists()


def test_a_site_admin_token_without_the_admin_scope_cannot_drain(world, node):
    client = APIClient()
    key = token_issue(user=world.admin, scopes=["read", "submit"])
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")

    answer = client.post(f"{NODES}node-1/drain/", {"deadline_s": 60}, format="json")

    assert answer.status_code == 403
    assert "lacks the 'admin' scope" in answer.json()["errors"]["scope"]
    assert client.get(NODES).status_code == 200  # reading needs `read` only
    node.refresh_from_db()
    assert node.state == Node.State.READY


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"deadline_s": -5}, "-5 is not allowed; allowed: a whole number of seconds from 0"),
        ({"deadline_s": 10**7}, "10000000 is not allowed"),
        ({"deadline_s": "soon"}, "'soon' is not allowed"),
        ({"deadline_s": None}, "required; allowed"),
        ({}, "required; allowed"),
    ],
)
def test_a_bad_deadline_is_a_400_naming_the_field(node, admin_api, body, expected):
    answer = admin_api.post(f"{NODES}node-1/drain/", body, format="json")

    assert answer.status_code == 400
    errors = answer.json()["errors"]
    assert list(errors) == ["deadline_s"] and expected in errors["deadline_s"]
    assert "604800 (7 days)" in errors["deadline_s"]
    node.refresh_from_db()
    assert node.state == Node.State.READY


def test_an_unknown_field_or_a_body_that_is_no_object_is_a_400(node, admin_api):
    unknown = admin_api.post(
        f"{NODES}node-1/drain/", {"deadline_s": 60, "force": True}, format="json"
    )
    assert unknown.status_code == 400
    assert unknown.json() == {"errors": {"force": "unknown field; allowed: deadline_s"}}

    not_object = admin_api.post(f"{NODES}node-1/drain/", [60], format="json")
    assert not_object.status_code == 400
    assert "deadline_s" in not_object.json()["errors"]["detail"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", f"{NODES}nope/"),
        ("post", f"{NODES}nope/cordon/"),
        ("post", f"{NODES}nope/uncordon/"),
        ("post", f"{NODES}nope/drain/"),
    ],
)
def test_an_unknown_node_is_a_404(node, admin_api, method, path):
    if method == "get":
        answer = admin_api.get(path)
    else:
        answer = admin_api.post(path, {"deadline_s": 60}, format="json")

    assert answer.status_code == 404
    assert answer.json() == {"errors": {"detail": "no node 'nope'"}}

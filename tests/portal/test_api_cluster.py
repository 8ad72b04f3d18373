"""``GET /api/v1/cluster/``: the Cluster page's data for notebooks, from the same selector.

Any user with a token that has the ``read`` scope; other teams' jobs appear only as the team
holding the slice; a site admin sees every job.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.jobs.models import JobState
from portal.jobs.testing import World, allocate, make_job, make_node, make_user
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db


def client_with(user, *scopes: str) -> APIClient:
    client = APIClient()
    key = token_issue(user=user, scopes=scopes or ("read",))
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def held(world: World) -> dict:
    make_node("node-1", gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["1g.10gb"]}])
    resnet = make_job(team=world.vision, user=world.alice, name="resnet", state=JobState.RUNNING)
    bert = make_job(team=world.nlp, user=world.bob, name="bert", state=JobState.RUNNING)
    allocate(resnet, ["GPU-node-1-0"])
    allocate(bert, ["MIG-node-1-1-0"])
    return {"resnet": resnet, "bert": bert}


def holders(body: dict) -> dict:
    return {
        s["key"]: s["holder"]
        for node in body["nodes"]
        for gpu in node["gpus"]
        for s in gpu["slices"]
    }


def test_a_read_token_gets_the_cluster_with_other_teams_jobs_hidden(world, held):
    response = client_with(world.alice, "read").get("/api/v1/cluster/")
    assert response.status_code == 200
    body = response.json()
    assert sorted(body) == ["as_of", "free_by_kind", "lease_s", "nodes", "units", "utilisation"]
    by_key = holders(body)
    assert by_key["GPU-node-1-0"]["team"] == "vision"
    assert by_key["GPU-node-1-0"]["job"] == {
        "id": held["resnet"].pk,
        "name": "resnet",
        "user": "alice",
        "state": "RUNNING",
    }
    assert (by_key["MIG-node-1-1-0"]["team"], by_key["MIG-node-1-1-0"]["job"]) == ("nlp", None)
    assert "bert" not in response.content.decode()
    assert body["units"] == {
        "free": 0.0,
        "held": 1.142857,
        "draining": 0.0,
        "lost": 0.0,
        "in_service": 1.142857,
    }
    assert [(t["kind"], t["profile"], t["free"], t["held"]) for t in body["free_by_kind"]] == [
        ("whole", "", 0, 1),
        ("mig", "1g.10gb", 0, 1),
    ]
    assert len(body["utilisation"]["series"]) == 24


def test_a_site_admin_sees_every_job(world, held):
    body = client_with(world.admin, "read").get("/api/v1/cluster/").json()
    assert holders(body)["MIG-node-1-1-0"]["job"]["name"] == "bert"


def test_someone_in_no_team_sees_the_teams_holding_slices_only(world, held):
    body = client_with(make_user("loner"), "read").get("/api/v1/cluster/").json()
    assert [(h["team"], h["job"]) for h in holders(body).values()] == [
        ("vision", None),
        ("nlp", None),
    ]


def test_it_needs_a_token_with_the_read_scope(world, held):
    assert APIClient().get("/api/v1/cluster/").status_code == 401
    refused = client_with(world.alice, "submit").get("/api/v1/cluster/")
    assert refused.status_code == 403
    assert refused.json()["errors"]["scope"].startswith(
        "this token lacks the 'read' scope, which reading jobs, logs, teams, tokens and the "
        "cluster needs; its scopes: submit."
    )


def test_it_only_reads(world, held):
    response = client_with(world.admin, "read", "submit", "admin").post("/api/v1/cluster/", {})
    assert response.status_code == 405

"""Bad input through the API: a 400/401 whose message names the field, and nothing stored."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from portal.jobs.models import Job, JobDependency, JobEvent
from portal.jobs.testing import World
from portal.jobs.validation import MIG_PROFILES_ALLOWED
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db

GOOD = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
}
HOW_TO = (
    "send the header 'Authorization: Token <key>'; "
    "get a key with `python manage.py issue_token <username>`"
)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def token(world) -> str:
    return token_issue(user=world.alice)


def stored() -> tuple[int, int, int]:
    return Job.objects.count(), JobEvent.objects.count(), JobDependency.objects.count()


def post(body: Any, *, authorization: str | None, **extra: Any) -> Any:
    client = APIClient()
    if authorization is not None:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    return client.post("/api/v1/jobs/", body, **extra)


@pytest.mark.parametrize(
    ("change", "errors"),
    [
        pytest.param(
            {"gpu": {"kind": "gpu", "count": 1}},
            {"gpu.kind": "unknown kind 'gpu'; allowed: whole, mig, mps"},
            id="wrong-gpu-kind",
        ),
        pytest.param(
            {"gpu": {"kind": "whole", "count": -2}},
            {"gpu.count": "-2 is out of range; allowed: a whole number from 1 to 64"},
            id="wrong-gpu-count",
        ),
        pytest.param(
            {"gpu": {"kind": "mig", "profile": "5g.50gb"}},
            {"gpu.profile": f"unknown MIG profile '5g.50gb'; allowed: {MIG_PROFILES_ALLOWED}"},
            id="unknown-mig-profile",
        ),
        pytest.param(
            {"gpu": {"kind": "whole", "count": 5}},
            {
                "gpu.count": "over-limit count: 5 x whole GPU = 5 GPU units, above team "
                "vision's limit of 4 units; allowed: at most 4"
            },
            id="over-limit-count",
        ),
        pytest.param(
            {"command": []},
            {
                "command": "required, must not be empty; allowed: a list of non-empty strings "
                'such as ["python", "train.py"], or a shell-like line'
            },
            id="empty-command",
        ),
        pytest.param(
            {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
            {
                "env.CUDA_VISIBLE_DEVICES": "CUDA_VISIBLE_DEVICES is reserved: the portal sets "
                "CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_MPS_* and PORTAL_* for the "
                "job's slice"
            },
            id="reserved-env",
        ),
        pytest.param(
            {"priority": "high"},
            {"priority": "'high' is above team vision's maximum (normal); allowed: low, normal"},
            id="priority-above-team-maximum",
        ),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field_and_stores_nothing(token, change, errors):
    before = stored()

    response = post({**GOOD, **change}, authorization=f"Token {token}", format="json")

    assert response.status_code == 400
    assert response.json() == {"errors": errors}
    assert stored() == before


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        pytest.param(None, f"authentication required; {HOW_TO}", id="missing"),
        pytest.param(
            "Token",
            "Authorization header: malformed, expected exactly 'Token <key>' (one key, no spaces in it); "
            + HOW_TO,
            id="no-key",
        ),
        pytest.param(
            "Token abc def",
            "Authorization header: malformed, expected exactly 'Token <key>' (one key, no spaces in it); "
            + HOW_TO,
            id="two-keys",
        ),
        pytest.param(
            "Basic YWxpY2U6cHc=",
            f"Authorization header: unknown scheme 'Basic'; {HOW_TO}",
            id="wrong-scheme",
        ),
        pytest.param(
            "Token 0000000000000000000000000000000000000000",
            f"Authorization header: unknown or revoked token; {HOW_TO}",
            id="unknown-key",
        ),
    ],
)
def test_a_missing_or_malformed_token_is_a_401_with_a_message(world, authorization, message):
    before = stored()

    response = post(GOOD, authorization=authorization, format="json")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json() == {"errors": {"authorization": message}}
    assert stored() == before


def test_a_token_of_an_inactive_user_is_refused(world, token):
    world.alice.is_active = False
    world.alice.save()
    response = post(GOOD, authorization=f"Token {token}", format="json")
    assert response.status_code == 401
    assert response.json() == {
        "errors": {"authorization": "Authorization header: the token's user is inactive"}
    }


def test_a_body_that_is_not_json_is_a_400(token):
    before = stored()
    response = post(
        '{"name": "hello",', authorization=f"Token {token}", content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["errors"]["detail"].startswith("JSON parse error")
    assert response.json()["errors"]["detail"].endswith("; send a JSON object")
    assert stored() == before


def test_a_json_list_is_a_400(token):
    response = post([GOOD], authorization=f"Token {token}", format="json")
    assert response.status_code == 400
    assert response.json() == {"errors": {"request": "must be a JSON object with the job's fields"}}


def test_a_form_encoded_body_is_refused_asking_for_json(token):
    before = stored()
    response = post({"name": "hello"}, authorization=f"Token {token}")  # multipart by default
    assert response.status_code == 415
    assert response.json()["errors"]["detail"].endswith(
        "Send the body as JSON with the header Content-Type: application/json"
    )
    assert stored() == before


def test_a_bad_state_filter_names_the_allowed_states(token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.get("/api/v1/jobs/?state=DONE")
    assert response.status_code == 400
    assert response.json() == {
        "errors": {
            "state": "unknown state DONE; allowed: PENDING, HELD, ASSIGNED, RUNNING, SUCCEEDED, "
            "FAILED, CANCELLED, TIMED_OUT, PREEMPTED, LOST"
        }
    }

"""The API's front door: every error is JSON and names the field; a database outage is a 503;
bad strings, deep JSON, huge numbers and big bodies are refused before they reach anything."""

from __future__ import annotations

import json
import logging
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from portal.jobs.models import Job
from portal.jobs.testing import World, token_client
from portal.tenants.models import Team

pytestmark = pytest.mark.django_db

GOOD = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
}


@pytest.fixture
def alice(world: World) -> APIClient:
    return token_client(world.alice)


def post_raw(client: APIClient, body: str | bytes, path: str = "/api/v1/jobs/") -> Any:
    return client.generic("POST", path, body, content_type="application/json")


def errors(response: Any) -> dict[str, str]:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.json()["errors"]


# --- the database out of reach -----------------------------------------------------------------


def unreachable(*args: Any, **kwargs: Any) -> None:
    # What Django raises when PostgreSQL is down or refuses connections.
    raise OperationalError('connection to server at "db" (10.0.0.5), port 5432 failed')


def test_a_database_outage_is_a_json_503_asking_to_try_again(world, alice, monkeypatch) -> None:
    monkeypatch.setattr(connection, "ensure_connection", unreachable)

    response = alice.get("/api/v1/jobs/")

    assert response.status_code == 503
    assert errors(response) == {"detail": "database unavailable, try again"}
    assert response["Retry-After"] == "5"


def test_a_database_outage_during_a_submit_and_a_session_request_is_a_503(
    world, alice, monkeypatch
) -> None:
    session = APIClient()
    session.force_login(world.bob)
    monkeypatch.setattr(connection, "ensure_connection", unreachable)

    assert post_raw(alice, json.dumps(GOOD)).status_code == 503
    response = session.get("/api/v1/teams/")
    assert response.status_code == 503
    assert errors(response) == {"detail": "database unavailable, try again"}


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_unexpected_exception_is_a_json_500_and_its_traceback_is_logged(world, alice) -> None:
    collect = Collect()
    request_log = logging.getLogger("django.request")
    request_log.addHandler(collect)
    try:
        with mock.patch(
            "portal.api.views.job_list_shape", side_effect=RuntimeError("the selector broke")
        ):
            response = alice.get("/api/v1/jobs/")
    finally:
        request_log.removeHandler(collect)

    assert response.status_code == 500
    assert errors(response) == {
        "detail": "internal error; it has been logged for the operators, try again later"
    }
    # Logged once, with the traceback (Django does not log the 500 a second time).
    (record,) = collect.records
    assert record.levelname == "ERROR"
    assert record.getMessage() == "Internal Server Error: /api/v1/jobs/"
    text = logging.Formatter().format(record)
    assert "Traceback" in text
    assert "RuntimeError: the selector broke" in text


def test_an_unknown_api_url_is_a_json_404(alice) -> None:
    response = alice.get("/api/v1/nothing-here/")
    assert response.status_code == 404
    assert errors(response) == {
        "detail": "no API endpoint /api/v1/nothing-here/; the endpoints are listed at /api/docs/"
    }


def test_a_job_id_beyond_bigint_is_a_404_not_a_crash(alice) -> None:
    response = alice.get(f"/api/v1/jobs/{10**30}/")
    assert response.status_code == 404
    assert "no job" in errors(response)["detail"]


# --- pagination ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("limit=501", "limit", "'501' is out of range; allowed: a whole number from 1 to 500"),
        ("limit=0", "limit", "'0' is out of range; allowed: a whole number from 1 to 500"),
        (
            f"limit={2**64}",
            "limit",
            "'18446744073709551616' is out of range; allowed: a whole number from 1 to 500",
        ),
        (
            "limit=ten",
            "limit",
            "'ten' is not a whole number; allowed: a whole number from 1 to 500",
        ),
        ("limit=-5", "limit", "'-5' is not a whole number; allowed: a whole number from 1 to 500"),
        (
            "offset=50",
            "offset",
            "this list is paged by cursor, not by offset; allowed: none (follow the next link, "
            "or send the cursor of a page's next or previous link)",
        ),
        (
            "cursor=bm90LWEtY3Vyc29y",
            "cursor",
            "'bm90LWEtY3Vyc29y' is not a cursor; "
            "allowed: the cursor of a page's next or previous link",
        ),
        (
            # Well-formed JSON, but an id beyond any job's.
            "cursor=eyJkIjogIm5leHQiLCAidCI6ICIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgImkiOiA5MjIzMzcyMDM2ODU0Nzc1ODA4fQ",
            "cursor",
            "'eyJkIjogIm5leHQiLCAidCI6ICIyMDI2LTAxL...' is not a cursor; "
            "allowed: the cursor of a page's next or previous link",
        ),
    ],
)
def test_a_bad_limit_offset_or_cursor_is_a_400_naming_it(alice, query, field, message) -> None:
    response = alice.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400
    assert errors(response) == {field: message}


def test_a_limit_within_the_maximum_pages_the_list(alice) -> None:
    response = alice.get("/api/v1/jobs/?limit=500")
    assert response.status_code == 200
    assert response.json() == {"next": None, "previous": None, "results": []}


# --- strings the database cannot store -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {**GOOD, "name": "hel\x00lo"},
            "name",
            "must not contain a NUL character",
        ),
        (
            {**GOOD, "env": {"DATA": {"nested": ["ok", "bad\x00"]}}},
            "env.DATA.nested.1",
            "must not contain a NUL character",
        ),
        (
            {**GOOD, "env": {"KEY\x00": "value"}},
            "env.KEY\\x00",
            "this key must not contain a NUL character",
        ),
    ],
)
def test_a_nul_anywhere_in_the_body_is_a_400_naming_the_field(alice, body, field, message) -> None:
    response = post_raw(alice, json.dumps(body))
    assert response.status_code == 400
    assert errors(response) == {field: message}
    assert Job.objects.count() == 0


def test_a_lone_surrogate_in_the_body_is_a_400_naming_the_field(alice) -> None:
    # JSON may spell a lone surrogate as an escape; UTF-8 (and so the database) cannot hold it.
    body = json.dumps({**GOOD, "command": ["python", "-c"]})[:-1] + ', "name": "x\\ud800y"}'
    body = body.replace('"name": "hello", ', "")
    response = post_raw(alice, body)
    assert response.status_code == 400
    assert errors(response) == {
        "name": "must not contain a lone surrogate (U+D800); send valid UTF-8 text"
    }
    assert Job.objects.count() == 0


def test_a_nul_in_a_query_parameter_or_path_is_a_400_naming_it(alice) -> None:
    response = alice.get("/api/v1/jobs/?team=vis%00ion")
    assert response.status_code == 400
    assert errors(response) == {"team": "must not contain a NUL character"}

    response = alice.get("/api/v1/teams/vis%00ion/")
    assert response.status_code == 400
    assert errors(response) == {"name": "must not contain a NUL character"}


# --- deep JSON, huge numbers, big bodies -------------------------------------------------------


def test_json_nested_deeper_than_the_limit_is_a_400_naming_where(alice) -> None:
    deep: Any = "leaf"
    for _ in range(20):
        deep = {"x": deep}
    response = post_raw(alice, json.dumps({**GOOD, "env": deep}))
    assert response.status_code == 400
    field, message = next(iter(errors(response).items()))
    assert field.startswith("env.x.x.x")
    assert message == "nested too deeply; allowed: at most 16 levels of objects and lists"


def test_json_too_deep_for_the_json_parser_itself_is_a_400(alice) -> None:
    response = post_raw(alice, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    assert errors(response) == {
        "detail": "nested too deeply; allowed: at most 16 levels of objects and lists"
    }


@pytest.mark.parametrize("number", ["1" + "0" * 400, "1e400", "1000001"])
def test_a_huge_number_in_a_quota_field_is_a_400_naming_it(world, number) -> None:
    admin = token_client(world.admin)
    response = post_raw(admin, "{}", path="/api/v1/teams/vision/")  # POST is not allowed
    assert response.status_code == 405
    response = admin.generic(
        "PATCH",
        "/api/v1/teams/vision/",
        '{"guaranteed_units": ' + number + "}",
        content_type="application/json",
    )
    assert response.status_code == 400
    message = errors(response)["guaranteed_units"]
    assert message.endswith("is out of range; allowed: a number from 0 to 1000000")
    assert len(message) < 120
    assert Team.objects.get(name="vision").guaranteed_units == 2.0


def test_a_body_over_the_limit_is_a_413_naming_the_limit(alice, settings) -> None:
    settings.API_MAX_BODY_BYTES = 2048
    body = json.dumps({**GOOD, "env": {"BIG": "x" * 4096}})
    response = post_raw(alice, body)
    assert response.status_code == 413
    assert errors(response) == {
        "body": f"{len(body)} bytes is too large; allowed: at most 2048 bytes "
        "(PORTAL_MAX_BODY_BYTES)"
    }
    assert Job.objects.count() == 0

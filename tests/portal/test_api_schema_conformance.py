"""The API against its own OpenAPI schema, by schemathesis (issue 10, item 8).

Every operation of the schema the portal serves at ``/api/schema/`` (drf-spectacular) is
called in-process through the WSGI app, with requests schemathesis makes from the schema:
its boundary and invalid values (the coverage phase) and a bounded number of generated ones,
valid and invalid (the fuzzing phase). Each answer must be no 5xx, have a status code the
operation documents, a content type it documents and a body that matches its documented
schema.

- As a member (alice) with a real token with the ``read`` and ``submit`` scopes: the whole
  schema. Writes that need ``admin`` answer her a 403 before reading the body, so:
- as a site admin with every scope: those writes and the node endpoints (site admins
  only), so their bodies and answers are checked too.

Deterministic: derandomized, a fixed seed, no example database. Each request runs in a
savepoint rolled back after it, so every example starts from the same fixture world; that
is also why nothing is excluded: revoking the test's own token, removing a member or
draining the node lasts one request. Nothing here needs a broker: what a request asks to
send after commit (a scheduling pass, a stop) never runs inside the test's transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from django.urls import resolve
from django.utils import timezone
from hypothesis import strategies as st

from portal.api import urls as api_urls
from portal.api.auth import ADMIN
from portal.jobs.arrays import array_submit, validate_array_request
from portal.jobs.models import JobLogChunk, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, token_client
from portal.tenants.models import ApiToken
from portal.tenants.tokens import token_issue

# The checks this test is about (schemathesis's names): no 5xx, a documented status code,
# the documented content type, a body that matches the documented schema; and a method an
# endpoint does not have is a 405 naming those it has (Allow).
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.unsupported_method,
]
# Generated examples per operation (the coverage phase adds its own fixed set); bounded so
# that both runs over the whole schema take about a minute on two cores.
MAX_EXAMPLES = 20

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 20240601,
        "generation": {
            "mode": "all",  # valid and invalid requests
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
    }
)
SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    # A fixture world made once per operation, values drawn from it: by design here.
    suppress_health_check=list(hypothesis.HealthCheck),
)

# Values the generated requests may use instead of their own, half the time, so that a
# share of them reach a real job, team, member, token or node (not only 404s) and make a
# valid submit or member change (not only 400s). Filled by the `world` fixture.
KNOWN_PATH: dict[str, list[Any]] = {}
KNOWN_BODY: dict[str, list[Any]] = {
    "name": ["nightly"],
    "team": ["vision", "nlp"],
    "image": ["python:3.11-slim"],
    "command": [["python", "train.py"]],
    "gpu": [{"kind": "whole", "count": 1}, {"kind": "mig", "profile": "1g.10gb"}],
    "username": ["alice", "vera", "bob", "nobody"],
    "scopes": [["read"], ["read", "submit"]],
    "expires_at": [None],
    "url": ["https://hooks.example.com/portal", ""],
    "webhook_url": ["https://hooks.example.com/portal", ""],
}


class Fixtures:
    """Two teams and their people (``World``), a node with a whole GPU and two MIG slices,
    jobs of each kind of state (one with a log, one running on a slice, one of the other
    team), an array, and the tokens the requests are sent with."""

    def __init__(self) -> None:
        w = self.world = World()
        node = make_node(
            "node-1",
            gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["1g.10gb", "3g.40gb"]}],
        )
        now = timezone.now()
        pending = make_job(team=w.vision, user=w.alice, name="pending")
        held = make_job(team=w.vision, user=w.alice, name="held", state=JobState.HELD)
        running = make_job(
            team=w.vision, user=w.alice, name="running", state=JobState.RUNNING, started_at=now
        )
        allocate(running, ["GPU-node-1-0"])
        failed = make_job(
            team=w.vision,
            user=w.alice,
            name="failed",
            state=JobState.FAILED,
            started_at=now,
            finished_at=now,
            exit_code=1,
        )
        JobLogChunk.objects.create(job=failed, attempt=1, seq=0, data="step 1\nTraceback\n")
        other = make_job(team=w.nlp, user=w.bob, name="nlp job")
        array, _ = array_submit(
            user=w.alice,
            request=validate_array_request(
                {
                    "name": "sweep",
                    "team": "vision",
                    "image": "python:3.11-slim",
                    "command": ["python", "train.py"],
                    "gpu": {"kind": "mig", "profile": "1g.10gb"},
                    "array": {"values": {"LR": ["0.1", "0.01"]}},
                },
                user=w.alice,
            ),
        )
        token_issue(user=w.alice, name="spare", scopes=["read"])
        # The keys the requests carry: a member's, with read and submit (not admin) ...
        self.member_key = token_issue(user=w.alice, name="schemathesis", scopes=["read", "submit"])
        # ... and a site admin's, with every scope.
        self.admin_key = token_issue(user=w.admin, name="schemathesis")
        self.known_path = {
            "job_id": [pending.pk, held.pk, running.pk, failed.pk, other.pk],
            "array_id": [array.pk],
            "token_id": list(
                ApiToken.objects.filter(user__in=[w.alice, w.admin]).values_list("pk", flat=True)
            ),
            "name": ["vision", "nlp"],
            "username": ["alice", "vera", "bob"],
            "node": [node.name],
        }


@pytest.fixture
def wsgi_in_test_transaction() -> Iterator[None]:
    """The WSGI handler closes the database connection after each request (as it must in
    production); here that would end the test's transaction. Django's test client does this."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(db, settings, wsgi_in_test_transaction) -> Fixtures:  # noqa: ANN001 - pytest-django
    # Rates are not what this checks: hundreds of requests a minute must not become 429s.
    settings.API_THROTTLE_USER = None
    settings.API_THROTTLE_TOKEN = None
    made = Fixtures()
    KNOWN_PATH.clear()
    KNOWN_PATH.update(made.known_path)
    return made


# The schema the portal serves, fetched through its WSGI app (serving it needs no database).
schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler(), config=CONFIG)


def _half_known(value: dict[str, Any] | None, known: dict[str, list[Any]]) -> Any:
    """`value` as generated, or with its known keys replaced by known values."""
    real = {name: st.sampled_from(known[name]) for name in value or {} if known.get(name)}
    if not real:
        return st.just(value)
    return st.one_of(
        st.just(value), st.fixed_dictionaries(real).map(lambda values: {**value, **values})
    )


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    return _half_known(path_parameters, KNOWN_PATH)


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    return _half_known(body, KNOWN_BODY) if isinstance(body, dict) else st.just(body)


def _needs_more_than_a_member_token(ctx: Any) -> bool:
    """Writes whose view wants the admin scope, and the nodes (site admins only)."""
    operation = ctx.operation
    if operation.path.startswith("/api/v1/nodes/"):
        return True
    view = resolve(re.sub(r"\{[^}]+\}", "1", operation.path)).func.view_class
    return operation.method.upper() != "GET" and getattr(view, "write_scope", None) == ADMIN


def _call(case: Any, key: str) -> None:
    with transaction.atomic():
        case.call_and_validate(headers={"Authorization": f"Token {key}"}, checks=CHECKS)
        # Every example starts from the same world: what this request wrote goes.
        transaction.set_rollback(True)


@schema.parametrize()
@SETTINGS
def test_every_operation_answers_a_member_as_its_schema_says(case: Any, world: Fixtures) -> None:
    _call(case, world.member_key)


@schema.include(_needs_more_than_a_member_token).parametrize()
@SETTINGS
def test_admin_operations_answer_a_site_admin_as_their_schema_says(
    case: Any, world: Fixtures
) -> None:
    _call(case, world.admin_key)


def test_every_api_url_is_an_operation_of_the_schema() -> None:
    """What the runs above cover is the whole API: each URL of portal/api/urls.py is a path
    of the schema served (so a new endpoint without a schema is caught here)."""
    served = {result.ok().path for result in schema.get_all_operations()}
    routes = {
        "/api/v1/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        for pattern in api_urls.urlpatterns
    }
    assert routes - served == set()


# --- what it found, pinned -----------------------------------------------------------------


def test_an_empty_log_is_still_text_plain(world: Fixtures) -> None:
    """DRF drops the Content-Type of an empty bytes body: a job with no output yet was a 200
    with no content type at all."""
    client = token_client(world.world.alice)
    job_id = KNOWN_PATH["job_id"][0]  # pending: no output
    response = client.get(f"/api/v1/jobs/{job_id}/log/")
    assert (response.status_code, response.content) == (200, b"")
    assert response["Content-Type"] == "text/plain; charset=utf-8"


def test_a_dependency_beyond_any_job_id_is_an_unknown_job_not_a_500(world: Fixtures) -> None:
    client = token_client(world.world.alice)
    body = {
        "name": "after",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": ["true"],
        "gpu": {"kind": "whole"},
        "depends_on": [{"job": 81112588700097871872}],
    }
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "errors": {
            "depends_on": "unknown job 81112588700097871872; allowed: ids of jobs of your teams"
        }
    }


def test_objects_in_the_schema_name_all_their_fields() -> None:
    """A request field the schema does not name is a 400, so the schema says there are none."""
    components = schema.raw_schema["components"]["schemas"]
    assert components["JobSubmit"]["additionalProperties"] is False
    assert components["GpuRequest"]["additionalProperties"] is False
    # A job's env is data: any variable name.
    assert components["JobSubmit"]["properties"]["env"]["additionalProperties"] == {
        "type": "string"
    }


def test_a_method_an_endpoint_lacks_is_a_405_whatever_the_token_scopes(world: Fixtures) -> None:
    """It was a 403 saying the read+submit token lacked the admin scope."""
    client = token_client(world.world.alice)
    client.credentials(HTTP_AUTHORIZATION=f"Token {world.member_key}")
    response = client.put("/api/v1/jobs/", {}, format="json")
    assert response.status_code == 405
    assert response["Allow"] == "GET, POST, HEAD, OPTIONS"

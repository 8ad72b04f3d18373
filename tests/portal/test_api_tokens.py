"""Tokens people manage: created with a name, scopes and an expiry (the key shown once),
listed without their keys, revoked by their owner only; expired and revoked tokens get 401,
a token without the scope a request needs gets 403 naming it."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.jobs.models import Job, JobState
from portal.jobs.testing import World, make_job
from portal.tenants.models import ApiToken
from portal.tenants.tokens import TOKENS_PER_USER_MAX, token_create, token_digest

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"
ALLOWED_SCOPES = "allowed: read, submit, admin"
JOB = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python3", "-c", "print(1)"],
    "gpu": {"kind": "whole", "count": 1},
}


def session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def with_key(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def token_for(user: Any, *scopes: str, expires_at: Any = None) -> tuple[ApiToken, str]:
    return token_create(user=user, name="test", scopes=list(scopes), expires_at=expires_at)


# --- create, list, revoke ----------------------------------------------------------------


def test_a_created_token_shows_its_key_once_and_the_list_never_does(world: World) -> None:
    alice = session(world.alice)
    expires = (timezone.now() + timedelta(days=30)).replace(microsecond=0)

    created = alice.post(
        TOKENS,
        {"name": "laptop", "scopes": ["read", "submit"], "expires_at": expires.isoformat()},
        format="json",
    )

    assert created.status_code == 201, created.json()
    body = created.json()
    key = body["key"]
    assert created["Location"] == f"/api/v1/tokens/{body['id']}/"
    assert created["Cache-Control"] == "no-store"
    assert (body["name"], body["scopes"], body["prefix"]) == ("laptop", ["read", "submit"], key[:8])
    assert body["expires_at"] == expires.isoformat().replace("+00:00", "Z")
    assert (body["expired"], body["last_used_at"]) == (False, None)
    # Only the digest is kept, and the key works.
    token = ApiToken.objects.get(pk=body["id"])
    assert token.digest == token_digest(key)
    assert key not in [str(value) for value in ApiToken.objects.values_list().get()]
    assert with_key(key).get("/api/v1/jobs/").status_code == 200

    listed = alice.get(TOKENS)
    one = alice.get(f"{TOKENS}{body['id']}/")

    assert listed.status_code == 200
    assert [t["name"] for t in listed.json()] == ["laptop"]
    assert set(listed.json()[0]) == {
        "id",
        "name",
        "prefix",
        "scopes",
        "expires_at",
        "expired",
        "last_used_at",
        "created_at",
    }
    assert listed.json()[0]["last_used_at"] is not None  # the request above used it
    assert key not in listed.content.decode() and key not in one.content.decode()
    assert token.digest not in listed.content.decode()


def test_the_list_shows_only_my_tokens_newest_first(world: World) -> None:
    token_create(user=world.alice, name="first", scopes=["read"])
    token_create(user=world.alice, name="second", scopes=["read"])
    token_create(user=world.bob, name="bobs", scopes=["read"])

    names = [t["name"] for t in session(world.alice).get(TOKENS).json()]

    assert names == ["second", "first"]


def test_a_revoked_token_is_refused_with_401(world: World) -> None:
    token, key = token_for(world.alice, "read", "submit")
    assert with_key(key).get("/api/v1/jobs/").status_code == 200

    revoked = session(world.alice).delete(f"{TOKENS}{token.pk}/")
    refused = with_key(key).get("/api/v1/jobs/")

    assert revoked.status_code == 204
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert refused.status_code == 401
    assert "unknown or revoked token" in refused.json()["errors"]["authorization"]


def test_another_users_token_cannot_be_seen_or_revoked(world: World) -> None:
    bobs, bob_key = token_for(world.bob, "read")
    _, alice_admin_key = token_for(world.alice, "read", "admin")

    for client in (session(world.alice), with_key(alice_admin_key)):
        revoke = client.delete(f"{TOKENS}{bobs.pk}/")
        see = client.get(f"{TOKENS}{bobs.pk}/")
        assert (revoke.status_code, see.status_code) == (404, 404)
        assert revoke.json() == {"errors": {"detail": f"no token {bobs.pk} among your tokens"}}

    assert with_key(bob_key).get("/api/v1/jobs/").status_code == 200


def test_an_unknown_token_id_is_a_404(world: World) -> None:
    alice = session(world.alice)
    assert alice.delete(f"{TOKENS}999/").status_code == 404
    assert alice.delete(f"{TOKENS}{2**70}/").status_code == 404


def test_a_token_may_revoke_itself_with_the_admin_scope(world: World) -> None:
    token, key = token_for(world.alice, "admin")

    assert with_key(key).delete(f"{TOKENS}{token.pk}/").status_code == 204
    assert with_key(key).delete(f"{TOKENS}{token.pk}/").status_code == 401


# --- who may create and revoke -------------------------------------------------------------


def test_an_admin_scoped_token_creates_tokens_and_lesser_ones_may_not(world: World) -> None:
    _, admin_key = token_for(world.alice, "admin")
    _, submit_key = token_for(world.alice, "read", "submit")
    request = {"name": "ci", "scopes": ["read"]}

    made = with_key(admin_key).post(TOKENS, request, format="json")
    refused = with_key(submit_key).post(TOKENS, request, format="json")

    assert made.status_code == 201
    assert with_key(made.json()["key"]).get("/api/v1/teams/").status_code == 200
    assert refused.status_code == 403
    assert refused.json()["errors"]["scope"].startswith(
        "this token lacks the 'admin' scope, which creating and revoking tokens, changing "
        "teams and cordoning or draining nodes needs; its scopes: read, submit."
    )
    assert ApiToken.objects.filter(name="ci").count() == 1


def test_a_token_without_admin_cannot_revoke(world: World) -> None:
    other, _ = token_for(world.alice, "read")
    _, read_key = token_for(world.alice, "read", "submit")

    refused = with_key(read_key).delete(f"{TOKENS}{other.pk}/")

    assert refused.status_code == 403
    assert "'admin' scope" in refused.json()["errors"]["scope"]
    assert ApiToken.objects.filter(pk=other.pk).exists()


# --- expiry --------------------------------------------------------------------------------


def test_an_expired_token_is_refused_with_401_naming_when(world: World) -> None:
    soon = timezone.now() + timedelta(hours=1)
    token, key = token_for(world.alice, "read", expires_at=soon)
    assert with_key(key).get("/api/v1/jobs/").status_code == 200

    past = timezone.now() - timedelta(seconds=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=past)
    refused = with_key(key).get("/api/v1/jobs/")

    assert refused.status_code == 401
    assert refused.json()["errors"]["authorization"] == (
        f"Authorization header: the token {token.prefix}... ('test') expired at "
        f"{past.isoformat()}; create a new one on the Tokens page (/tokens/) or with "
        "`python manage.py issue_token`"
    )
    listed = session(world.alice).get(TOKENS).json()
    assert listed[0]["expired"] is True


# --- scopes --------------------------------------------------------------------------------


def test_a_read_token_reads_but_cannot_submit_or_act_on_jobs(world: World) -> None:
    _, key = token_for(world.alice, "read")
    client = with_key(key)
    job = make_job(team=world.vision, user=world.alice, state=JobState.PENDING)

    assert client.get("/api/v1/jobs/").status_code == 200
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    submit = client.post("/api/v1/jobs/", JOB, format="json")
    assert submit.status_code == 403
    assert submit.json() == {
        "errors": {
            "scope": "this token lacks the 'submit' scope, which submitting, cancelling, "
            "holding, releasing and resubmitting jobs needs; its scopes: read. Create a token "
            "with 'submit' on the Tokens page (/tokens/) or through POST /api/v1/tokens/"
        }
    }
    for action in ("cancel", "hold", "release", "resubmit"):
        response = client.post(f"/api/v1/jobs/{job.pk}/{action}/")
        assert response.status_code == 403, action
        assert "'submit' scope" in response.json()["errors"]["scope"]
    assert Job.objects.count() == 1
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_a_submit_token_submits_and_cancels_but_cannot_read_without_read(world: World) -> None:
    _, key = token_for(world.alice, "submit")
    client = with_key(key)

    submitted = client.post("/api/v1/jobs/", JOB, format="json")
    assert submitted.status_code == 201, submitted.json()
    job_id = submitted.json()["id"]
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").json()["state"] == "CANCELLED"

    listing = client.get("/api/v1/jobs/")
    assert listing.status_code == 403
    assert "'read' scope" in listing.json()["errors"]["scope"]


def test_changing_a_quota_needs_the_admin_scope(world: World) -> None:
    _, submit_key = token_for(world.admin, "read", "submit")
    _, admin_key = token_for(world.admin, "admin")
    change = {"limit_units": 5.0}

    refused = with_key(submit_key).patch("/api/v1/teams/vision/", change, format="json")
    allowed = with_key(admin_key).patch("/api/v1/teams/vision/", change, format="json")

    assert refused.status_code == 403
    assert "'admin' scope" in refused.json()["errors"]["scope"]
    assert allowed.status_code == 200
    assert allowed.json()["limit_units"] == 5.0


def test_a_session_holds_every_scope(world: World) -> None:
    alice = session(world.alice)
    assert alice.post("/api/v1/jobs/", JOB, format="json").status_code == 201
    assert alice.post(TOKENS, {"name": "nb", "scopes": ["read"]}, format="json").status_code == 201


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_body", "field", "message"),
    [
        ({"name": "nb", "scopes": ["read", "write"]}, "scopes", "unknown scope 'write'; "),
        ({"name": "nb", "scopes": []}, "scopes", "at least one scope is required; "),
        ({"name": "nb"}, "scopes", "at least one scope is required; "),
        ({"name": "nb", "scopes": "read"}, "scopes", 'must be a list of scopes such as ["read"]; '),
        ({"name": "", "scopes": ["read"]}, "name", "required; allowed: 1 to 64 characters"),
        ({"name": "   ", "scopes": ["read"]}, "name", "required; "),
        ({"scopes": ["read"]}, "name", "required; "),
        ({"name": "x" * 65, "scopes": ["read"]}, "name", "65 characters is too long; allowed: "),
        ({"name": 5, "scopes": ["read"]}, "name", "must be text; "),
        ({"name": "a\nb", "scopes": ["read"]}, "name", "must not contain control characters"),
        (
            {"name": "nb", "scopes": ["read"], "expires_at": "2020-01-01T00:00:00Z"},
            "expires_at",
            "2020-01-01T00:00:00+00:00 is not in the future (now: ",
        ),
        (
            {"name": "nb", "scopes": ["read"], "expires_at": "next tuesday"},
            "expires_at",
            "'next tuesday' is not a date and time; allowed: a date and time after now",
        ),
        (
            {"name": "nb", "scopes": ["read"], "expires_at": "2027-02-30T00:00:00Z"},
            "expires_at",
            "'2027-02-30T00:00:00Z' is not a date and time; ",
        ),
        (
            {"name": "nb", "scopes": ["read"], "expires_at": 1893456000},
            "expires_at",
            "a int is not a date and time; ",
        ),
        ({"name": "nb", "scopes": ["read"], "owner": "bob"}, "owner", "unknown field; allowed: "),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_stored(
    world: World, request_body: dict[str, Any], field: str, message: str
) -> None:
    response = session(world.alice).post(TOKENS, request_body, format="json")

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors[field].startswith(message), errors
    if field == "scopes":
        assert errors[field].endswith(ALLOWED_SCOPES)
    assert not ApiToken.objects.exists()


def test_every_bad_field_is_named_at_once(world: World) -> None:
    response = session(world.alice).post(
        TOKENS, {"name": "", "scopes": ["root"], "expires_at": "yesterday"}, format="json"
    )
    assert set(response.json()["errors"]) == {"name", "scopes", "expires_at"}


def test_an_expiry_without_offset_is_utc_and_scopes_are_stored_once_in_order(
    world: World,
) -> None:
    year = timezone.now().year + 1
    created = session(world.alice).post(
        TOKENS,
        {"name": "nb", "scopes": ["admin", "read", "admin"], "expires_at": f"{year}-06-01T12:00"},
        format="json",
    )
    assert created.status_code == 201
    assert created.json()["scopes"] == ["read", "admin"]
    assert created.json()["expires_at"] == f"{year}-06-01T12:00:00Z"


def test_a_user_holds_at_most_the_token_limit(world: World) -> None:
    for number in range(TOKENS_PER_USER_MAX):
        token_create(user=world.alice, name=f"t{number}", scopes=["read"])

    response = session(world.alice).post(
        TOKENS, {"name": "one more", "scopes": ["read"]}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["errors"]["detail"] == (
        f"you hold {TOKENS_PER_USER_MAX} tokens, the most a user may; revoke one first"
    )
    assert ApiToken.objects.count() == TOKENS_PER_USER_MAX


# --- last used -----------------------------------------------------------------------------


def test_last_used_is_written_at_most_once_a_minute(world: World) -> None:
    token, key = token_for(world.alice, "read")
    client = with_key(key)

    def writes() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/api/v1/teams/").status_code == 200
        return [q["sql"] for q in captured.captured_queries if "tenants_apitoken" in q["sql"]]

    first = writes()
    token.refresh_from_db()
    used = token.last_used_at
    again = writes()

    assert used is not None and timezone.now() - used < timedelta(seconds=5)
    if connection.vendor == "postgresql":
        # Lookup, conditional UPDATE and rate-limit counters in one WITH (token_use): the
        # UPDATE runs each time and writes only when a minute has passed (checked below).
        assert [sql.split()[0] for sql in first] == ["WITH"]
        assert [sql.split()[0] for sql in again] == ["WITH"]
    else:
        assert [sql.split()[0] for sql in first] == ["SELECT", "UPDATE"]
        assert [sql.split()[0] for sql in again] == ["SELECT"]  # within the minute: no write
    token.refresh_from_db()
    assert token.last_used_at == used

    ApiToken.objects.filter(pk=token.pk).update(last_used_at=used - timedelta(seconds=61))
    writes()
    token.refresh_from_db()
    assert token.last_used_at > used


# --- tokens from before, and the command -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tokens_from_before_the_migration_get_every_scope_and_no_expiry(world: World) -> None:
    executor = MigrationExecutor(connection)
    before = [("tenants", "0004_team_container_policy")]
    after = [("tenants", "0005_token_scopes_expiry")]
    executor.migrate(before)
    try:
        old_token = executor.loader.project_state(before).apps.get_model("tenants", "ApiToken")
        old_token.objects.create(user_id=world.alice.pk, digest=token_digest("k" * 40), prefix="k")
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    token = ApiToken.objects.get(prefix="k")
    assert (token.name, token.scopes, token.expires_at, token.last_used_at) == (
        "unnamed",
        ["read", "submit", "admin"],
        None,
        None,
    )
    assert with_key("k" * 40).post("/api/v1/jobs/", JOB, format="json").status_code == 201


def run_issue_token(*args: str) -> str:
    out = io.StringIO()
    call_command("issue_token", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_issue_token_takes_a_name_scopes_and_an_expiry(world: World) -> None:
    key = run_issue_token("alice", "--name", "ci runner", "--scopes", "read", "--expires-days", "7")

    token = ApiToken.objects.get(digest=token_digest(key))
    assert (token.name, token.scopes) == ("ci runner", ["read"])
    assert token.expires_at is not None
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)
    assert with_key(key).post("/api/v1/jobs/", JOB, format="json").status_code == 403


def test_issue_token_by_default_gives_every_scope_and_no_expiry(world: World) -> None:
    token = ApiToken.objects.get(digest=token_digest(run_issue_token("alice")))
    assert (token.name, token.scopes, token.expires_at) == (
        "issue_token",
        ["read", "submit", "admin"],
        None,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--scopes", "read,write"],
            "--scopes: unknown scope 'write'; allowed: read, submit, admin",
        ),
        (
            ["--scopes", ""],
            "--scopes: at least one scope is required; allowed: read, submit, admin",
        ),
        (["--name", ""], "--name: required; allowed: 1 to 64 characters, no control characters"),
        (["--expires-days", "0"], "--expires-days 0: allowed: a whole number from 1 to 36500"),
    ],
)
def test_issue_token_refuses_bad_options_and_stores_nothing(
    world: World, args: list[str], message: str
) -> None:
    with pytest.raises(CommandError) as caught:
        run_issue_token("alice", *args)
    assert str(caught.value).startswith(message)
    assert not ApiToken.objects.exists()

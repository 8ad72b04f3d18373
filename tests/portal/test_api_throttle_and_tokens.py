"""API tokens stored as digests (old plaintext ones converted and still working), and the
per-user and per-token rate limits."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from portal.env import ConfigError, env_rate
from portal.jobs.testing import World
from portal.tenants.models import AccessCounter, ApiToken
from portal.tenants.tokens import token_create, token_digest, token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return World()


def api(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


# --- tokens ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_plaintext_token_from_before_the_migration_becomes_a_digest_and_keeps_working(world):
    legacy_key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"
    with connection.cursor() as cursor:
        # The table DRF's authtoken app left behind, as it was.
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamp NOT NULL, user_id bigint NOT NULL)"
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
                [legacy_key, "2025-01-02 03:04:05", world.alice.pk],
            )
        migration = importlib.import_module(
            "portal.tenants.migrations.0003_api_tokens_from_plaintext"
        )
        with connection.schema_editor() as editor:
            migration.convert_plaintext_tokens(apps, editor)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            left = cursor.fetchone()[0]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")

    assert left == 0  # no plaintext left behind
    token = ApiToken.objects.get()
    assert token.user == world.alice
    assert token.digest == token_digest(legacy_key)
    assert token.prefix == legacy_key[:8]
    assert token.created_at.year == 2025
    assert api(legacy_key).get("/api/v1/jobs/").status_code == 200


def test_a_revoked_token_is_refused(world):
    key = token_issue(user=world.alice)
    ApiToken.objects.filter(digest=token_digest(key)).delete()
    response = api(key).get("/api/v1/jobs/")
    assert response.status_code == 401
    assert "unknown or revoked token" in response.json()["errors"]["authorization"]


# --- rate limits -----------------------------------------------------------------------------


def test_a_token_over_its_rate_gets_429_with_retry_after_and_another_token_goes_on(world, settings):
    settings.API_THROTTLE_TOKEN = (3, 60.0)
    settings.API_THROTTLE_USER = (100, 60.0)
    first, second = token_issue(user=world.alice), token_issue(user=world.alice)

    assert [api(first).get("/api/v1/jobs/").status_code for _ in range(3)] == [200] * 3
    refused = api(first).get("/api/v1/jobs/")

    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json() == {
        "errors": {
            "detail": "too many requests for this user or token; "
            f"try again in {refused['Retry-After']} s"
        }
    }
    assert api(second).get("/api/v1/jobs/").status_code == 200


def test_a_user_over_the_rate_is_refused_whichever_token_or_session(world, settings):
    settings.API_THROTTLE_TOKEN = (100, 60.0)
    settings.API_THROTTLE_USER = (2, 60.0)
    session = APIClient()
    session.force_login(world.alice)

    assert api(token_issue(user=world.alice)).get("/api/v1/teams/").status_code == 200
    assert session.get("/api/v1/teams/").status_code == 200
    assert api(token_issue(user=world.alice)).get("/api/v1/teams/").status_code == 429
    assert session.get("/api/v1/teams/").status_code == 429
    # Bob has his own allowance.
    assert api(token_issue(user=world.bob)).get("/api/v1/teams/").status_code == 200


def test_a_new_window_starts_when_the_old_one_has_passed(world, settings):
    settings.API_THROTTLE_USER = (1, 60.0)
    key = token_issue(user=world.alice)
    assert api(key).get("/api/v1/jobs/").status_code == 200
    assert api(key).get("/api/v1/jobs/").status_code == 429

    AccessCounter.objects.update(window_started_at=timezone.now() - timedelta(seconds=61))

    assert api(key).get("/api/v1/jobs/").status_code == 200
    assert AccessCounter.objects.get(scope="api-user").count == 1


def test_only_requests_that_pass_the_token_and_scope_checks_are_counted(world, settings):
    """What ApiThrottle counts after authentication and the scope check, whether the
    token's own statement counts it (PostgreSQL) or ApiThrottle does (elsewhere)."""
    settings.API_THROTTLE_USER = (100, 60.0)
    settings.API_THROTTLE_TOKEN = (100, 60.0)
    _, key = token_create(user=world.alice, name="reader", scopes=["read"])

    def counts() -> dict[str, int]:
        return dict(AccessCounter.objects.values_list("scope", "count"))

    assert api(key).get("/api/v1/jobs/").status_code == 200
    assert api(key).put("/api/v1/jobs/", {}, format="json").status_code == 405
    assert counts() == {"api-user": 2, "api-token": 2}
    assert api(key).post("/api/v1/jobs/", {}, format="json").status_code == 403  # no submit
    assert counts() == {"api-user": 2, "api-token": 2}
    assert api(key).get("/api/v1/jobs/?q=%00").status_code == 400  # refused before auth
    assert counts() == {"api-user": 2, "api-token": 2}

    ApiToken.objects.filter(digest=token_digest(key)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert api(key).get("/api/v1/jobs/").status_code == 401
    world.alice.is_active = False
    world.alice.save()
    assert api(token_issue(user=world.alice)).get("/api/v1/jobs/").status_code == 401
    assert counts() == {"api-user": 2, "api-token": 2}


def test_off_turns_a_limit_off(world, settings):
    settings.API_THROTTLE_USER = None
    settings.API_THROTTLE_TOKEN = None
    key = token_issue(user=world.alice)
    assert all(api(key).get("/api/v1/jobs/").status_code == 200 for _ in range(5))
    assert not AccessCounter.objects.exists()


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("120/min", (120, 60.0)), ("5/s", (5, 1.0)), ("1000/hours", (1000, 3600.0)), ("off", None)],
)
def test_rates_are_read_from_the_environment(monkeypatch, raw, parsed):
    monkeypatch.setenv("PORTAL_API_THROTTLE_USER", raw)
    assert env_rate("PORTAL_API_THROTTLE_USER", "600/min") == parsed


@pytest.mark.parametrize("raw", ["120", "120/fortnight", "-3/min", "lots/min", "0/min"])
def test_a_bad_rate_names_the_variable_and_the_format(monkeypatch, raw):
    monkeypatch.setenv("PORTAL_API_THROTTLE_USER", raw)
    with pytest.raises(ConfigError) as caught:
        env_rate("PORTAL_API_THROTTLE_USER", "600/min")
    assert str(caught.value) == (
        f"PORTAL_API_THROTTLE_USER={raw!r}: expected requests per period such as 120/min "
        "(periods: s, min, hour, day), or off"
    )


def test_the_counters_skip_the_write_ahead_log_on_postgresql(postgres_db):
    # Each API request counts a hit: logged, its commit waited for the disk (migration 0008).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relpersistence FROM pg_class WHERE relname = %s",
            [AccessCounter._meta.db_table],
        )
        assert cursor.fetchone() == ("u",)

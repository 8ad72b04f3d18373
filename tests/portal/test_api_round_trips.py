"""What an API request costs in round trips to PostgreSQL, pinned: the statements Django logs
plus the hidden ``SELECT 1`` of its connection health check. And the one-statement submit
stores exactly what the ORM's submit stores."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from portal.jobs.models import Job, JobEvent
from portal.jobs.services import job_submit
from portal.jobs.testing import make_node, token_client
from portal.jobs.validation import validate_job_request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_db")]

BODY = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "env": {"SEED": "7"},
    "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
    "priority": "low",
    "time_limit_s": 600,
    "preemptible": False,
    "notify": ["end", "fail"],
}


def round_trips(send: Callable[[], Any]) -> tuple[list[str], int]:
    """One request's statements (their first words) and its health checks (each a hidden
    ``SELECT 1``). It starts as a server's request does (``request_started`` runs
    ``close_if_unusable_or_obsolete``; Django's test client leaves it out)."""
    connection.close_if_unusable_or_obsolete()
    with (
        mock.patch.object(connection, "is_usable", wraps=connection.is_usable) as checks,
        CaptureQueriesContext(connection) as captured,
    ):
        send()
    return [query["sql"].split()[0] for query in captured.captured_queries], checks.call_count


def test_a_prepared_statement_stands_for_the_health_check_and_the_next_request_checks(
    world,
) -> None:
    client = token_client(world.alice)
    assert client.get("/api/v1/teams/").status_code == 200

    statements, health_checks = round_trips(lambda: client.get("/api/v1/teams/"))

    assert len(statements) >= 2 and health_checks == 0  # the token's statement came first
    connection.close_if_unusable_or_obsolete()  # the next request's start
    assert connection.health_check_done is False
    statements, health_checks = round_trips(lambda: list(Job.objects.all()))
    assert (statements, health_checks) == (["SELECT"], 1)  # an ORM query first: checked


def test_a_submit_stores_its_job_and_event_in_one_statement(world, settings) -> None:
    make_node(gpus=[{"mode": "mig", "profiles": ["1g.10gb"]}])
    client = token_client(world.alice)
    assert client.post("/api/v1/jobs/", BODY, format="json").status_code == 201  # warm
    settings.INVENTORY_RECHECK_S = 60.0  # the version read by the submit before

    statements, health_checks = round_trips(
        lambda: client.post("/api/v1/jobs/", BODY, format="json").status_code == 201 or 1 / 0
    )

    # The token with its user, last use and both rate-limit counters; the member's teams;
    # the job and its event. No health check, no BEGIN or COMMIT, no inventory version.
    assert (statements, health_checks) == (["WITH", "SELECT", "WITH"], 0)


def test_a_page_of_one_job_costs_two_round_trips(world) -> None:
    client = token_client(world.alice)
    assert client.get("/api/v1/jobs/?limit=1").status_code == 200

    statements, health_checks = round_trips(lambda: client.get("/api/v1/jobs/?limit=1"))

    # The token with its user, last use and both rate-limit counters; the page.
    assert (statements, health_checks) == (["WITH", "SELECT"], 0)


def test_the_one_statement_submit_stores_what_the_orm_submit_stores(world, settings) -> None:
    make_node(gpus=[{"mode": "mig", "profiles": ["1g.10gb"]}])
    request = validate_job_request(BODY, user=world.alice)
    at = datetime(2026, 12, 5, 12, 0, 0, 123456, tzinfo=UTC)
    with mock.patch("django.utils.timezone.now", return_value=at):
        with CaptureQueriesContext(connection) as one:
            by_one_statement = job_submit(user=world.alice, request=request)
        with transaction.atomic():  # a caller's transaction: the ORM's bulk_create path
            by_orm = job_submit(user=world.alice, request=request)

    assert [query["sql"].split()[0] for query in one.captured_queries] == ["WITH"]

    def stored(job: Job) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        (row,) = Job.objects.filter(pk=job.pk).values()  # every column, by its attname
        del row["id"]
        events = list(
            JobEvent.objects.filter(job=job)
            .order_by("pk")
            .values("at", "from_state", "to_state", "attempt", "message")
        )
        assert len(row) == len(Job._meta.concrete_fields) - 1
        return row, events

    assert stored(by_one_statement) == stored(by_orm)
    assert stored(by_orm)[1] == [
        {
            "at": at,
            "from_state": "",
            "to_state": "PENDING",
            "attempt": 0,
            "message": "submitted by alice",
        }
    ]
    assert by_one_statement.pk is not None and not by_one_statement._state.adding

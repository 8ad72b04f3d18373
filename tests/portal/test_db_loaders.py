"""Times read from PostgreSQL go through ``portal.db_loaders.TzLoader`` (psycopg's compiled
loader) and come out exactly as Django's own loader gives them: the same instant, the same
time zone object, microseconds and all, also for times written with other offsets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from psycopg.pq import Format
from psycopg.types.datetime import TimestamptzLoader

from portal import db_loaders
from portal.jobs.models import Job
from portal.jobs.testing import World, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_db")]

TEXTS = [
    "2026-12-07 15:02:11.525123+00",
    "2026-12-07 15:02:11+00",
    "1999-12-31 23:59:59.999999+05:30",
    "2024-02-29 00:00:00.5-08",
    "1901-02-03 04:05:06.789012+00",
    "9999-12-31 23:59:59+00",
]


def test_every_connection_reads_times_with_the_portals_loader() -> None:
    connection.ensure_connection()
    adapters = connection.connection.adapters
    loader = adapters.get_loader(adapters.types["timestamptz"].oid, Format.TEXT)
    assert loader.__module__ == db_loaders.__name__
    assert loader.timezone is connection.timezone  # so Django's cursors keep it
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::timestamptz", ["2026-12-07 15:02:11.5+02"])
        (value,) = cursor.fetchone()
    assert value == datetime(2026, 12, 7, 13, 2, 11, 500_000, tzinfo=UTC)
    assert value.tzinfo is connection.timezone


def test_the_same_values_as_djangos_loader() -> None:
    """Each text as the server sends it (in the session's zone), loaded by both."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT x::timestamptz::text FROM unnest(%s::text[]) AS x ORDER BY x", [TEXTS]
        )
        sent = [row[0].encode() for row in cursor.fetchall()]
    raw = connection.connection
    zone = connection.timezone

    class Djangos(BaseTzLoader):
        timezone = zone

    ours = db_loaders.tz_loader(zone)(raw.adapters.types["timestamptz"].oid, raw)
    theirs = Djangos(raw.adapters.types["timestamptz"].oid, raw)
    python = TimestamptzLoader(raw.adapters.types["timestamptz"].oid, raw)
    for data in sent:
        mine, expected = ours.load(data), theirs.load(data)
        assert (mine, mine.tzinfo, mine.isoformat()) == (
            expected,
            expected.tzinfo,
            expected.isoformat(),
        )
        assert mine == python.load(data)
    assert len(sent) == len(TEXTS)


def test_model_times_round_trip(world: World) -> None:
    submitted = datetime(2026, 3, 29, 1, 30, 0, 123_456, tzinfo=timezone(timedelta(hours=2)))
    job = make_job(team=world.vision, user=world.alice, submitted_at=submitted)
    read = Job.objects.values_list("submitted_at", flat=True).get(pk=job.pk)
    assert read == submitted
    assert read.tzinfo is connection.timezone
    assert read.microsecond == 123_456

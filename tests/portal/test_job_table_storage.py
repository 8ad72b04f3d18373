"""The job table leaves room on its pages for its rows' next versions (migration
jobs/0009_job_fillfactor), so part of the explanations a pass rewrites stay on their page
without new index entries (heap-only tuples)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from portal.jobs.models import Job
from portal.jobs.testing import World, make_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_db")]


def _table_stat(column: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {column} FROM pg_stat_user_tables WHERE relname = %s",  # noqa: S608
            [Job._meta.db_table],
        )
        return int(cursor.fetchone()[0])


def test_the_job_table_is_filled_to_80_percent() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Job._meta.db_table])
        (options,) = cursor.fetchone()
    assert "fillfactor=80" in options


def test_a_pass_rewrites_a_fifth_of_the_explanations_in_place(world: World) -> None:
    """A pass rewrites every changed explanation in one statement, in one transaction: the
    rows' old versions stay until it commits, so the room a page keeps (a fifth of it) is
    what its rows' new versions can take there. With pages filled to 100% none could."""
    if connection.pg_version < 150000:
        pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
    jobs = [make_job(team=world.vision, user=world.alice) for _ in range(200)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    before_updates, before_hot = _table_stat("n_tup_upd"), _table_stat("n_tup_hot_upd")
    with transaction.atomic():
        Job.objects.filter(pk__in=[job.pk for job in jobs]).update(
            pending_code="NO_FIT", pending_message="needs 8 x whole", queue_position=1
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    updates = _table_stat("n_tup_upd") - before_updates
    hot = _table_stat("n_tup_hot_upd") - before_hot
    assert updates == len(jobs)
    assert hot >= len(jobs) // 10

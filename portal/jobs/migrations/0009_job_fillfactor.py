"""Room on each page of the job table for its rows' next versions (PostgreSQL's fillfactor).

Every scheduling pass rewrites the explanation of each pending job that changed (reason,
numbers, position, estimated start), in one statement and one transaction. None of those
columns is indexed, so PostgreSQL can write a row's new version on the row's own page without
touching any of the table's indexes (a heap-only tuple), but only where the page has room.
With the default fillfactor (100) a page is full once rows are inserted, and the old versions
of a pass's rows cannot be cleared before it commits: every rewrite went to another page and
added an entry to each of the table's indexes. Pages filled to 80% take about a fifth of
their rows' new versions in place (44 of 200 in `tests/portal/test_job_table_storage.py`, 0
at 100%): `python -m bench.db_pass`, 10,000 pending jobs explained afresh, apply 554 and 562
-> 446 and 427 ms. Pages written before this migration keep their fill until they are
rewritten (VACUUM FULL, CLUSTER). SQLite has no such setting: nothing changes there.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FILLFACTOR = 80


def _set_fillfactor(percent: int | None) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        table = schema_editor.quote_name(apps.get_model("jobs", "Job")._meta.db_table)
        if percent is None:
            schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
        else:
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {percent})")

    return run


class Migration(migrations.Migration):
    dependencies = [("jobs", "0008_job_start_band")]

    operations = [
        migrations.RunPython(_set_fillfactor(FILLFACTOR), _set_fillfactor(None)),
    ]

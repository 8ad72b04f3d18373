"""The access counters (API rate limits, login failures) in an UNLOGGED table on PostgreSQL.

Every API request counts a hit in this table. Logged, each of those one-row commits waited
for the write-ahead log to reach the disk: about 3.5 ms of every request's time, for numbers
that only matter for a minute or five. Unlogged, they skip the write-ahead log; the price is
that a crash of PostgreSQL (not a clean restart) empties the table, which forgets the current
windows and lockouts. SQLite has no such thing: nothing changes there.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _set_persistence(logged: bool) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        table = schema_editor.quote_name(apps.get_model("tenants", "AccessCounter")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} SET {'LOGGED' if logged else 'UNLOGGED'}")

    return run


class Migration(migrations.Migration):
    dependencies = [("tenants", "0007_idle_settings")]

    operations = [
        migrations.RunPython(_set_persistence(logged=False), _set_persistence(logged=True)),
    ]

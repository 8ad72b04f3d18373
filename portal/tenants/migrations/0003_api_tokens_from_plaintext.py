"""Move the plaintext keys of DRF's authtoken table into ApiToken digests.

Tokens already handed out keep working: each key becomes its SHA-256 digest and prefix, and
the plaintext rows are deleted. The authtoken app is no longer installed, so its table is
read with plain SQL when an older database still has it.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from django.db import migrations

LEGACY_TABLE = "authtoken_token"


def convert_plaintext_tokens(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if LEGACY_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("tenants", "ApiToken")
    quoted = schema_editor.quote_name(LEGACY_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {quoted}")  # noqa: S608
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        digest = hashlib.sha256(key.encode()).hexdigest()
        token, _ = ApiToken.objects.get_or_create(
            digest=digest, defaults={"user_id": user_id, "prefix": key[:8]}
        )
        # Keep the token's age: auto_now_add set it to now. SQLite hands back a naive UTC
        # time (or its text), PostgreSQL an aware one.
        if isinstance(created, str):
            created = datetime.fromisoformat(created)
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        ApiToken.objects.filter(pk=token.pk).update(created_at=created)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {quoted}")  # noqa: S608


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0002_api_tokens_and_access_counters"),
    ]

    operations = [
        migrations.RunPython(convert_plaintext_tokens, migrations.RunPython.noop, elidable=False),
    ]

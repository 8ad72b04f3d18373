"""API tokens get a name, scopes, an optional expiry and the time of their last use.

Tokens issued before keep working as they did: every scope (read, submit, admin), no
expiry, the name "unnamed" (their user can see and revoke them on the Tokens page).
"""

from __future__ import annotations

from django.db import migrations, models

import portal.tenants.models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_team_container_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="name",
            field=models.CharField(default="unnamed", max_length=64),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="scopes",
            field=models.JSONField(default=portal.tenants.models.every_token_scope),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(blank=True, help_text="empty = never", null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="last_used_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

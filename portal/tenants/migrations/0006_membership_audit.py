"""Team admins manage their members: each membership may have its own limit (GPU units,
tightening the team's per-member limit), and every change to a team's members or quota is
written to the team's audit log."""

from __future__ import annotations

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0005_token_scopes_expiry"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="membership",
            name="limit_units",
            field=models.FloatField(
                blank=True,
                help_text="empty = the team's per-member limit",
                null=True,
                validators=[django.core.validators.MinValueValidator(0.0)],
            ),
        ),
        migrations.CreateModel(
            name="TeamAuditEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("actor_name", models.CharField(max_length=150)),
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("member_added", "member added"),
                            ("member_removed", "member removed"),
                            ("role_changed", "role changed"),
                            ("limit_changed", "member limit changed"),
                            ("quota_changed", "quota changed"),
                        ],
                        max_length=32,
                    ),
                ),
                (
                    "subject",
                    models.CharField(blank=True, help_text="the member, if any", max_length=150),
                ),
                ("field", models.CharField(blank=True, max_length=64)),
                ("old_value", models.CharField(blank=True, max_length=64)),
                ("new_value", models.CharField(blank=True, max_length=64)),
                ("at", models.DateTimeField()),
                (
                    "actor",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="audit_entries",
                        to="tenants.team",
                    ),
                ),
            ],
            options={
                "verbose_name": "team audit entry",
                "verbose_name_plural": "team audit entries",
                "ordering": ["-at", "-id"],
                "indexes": [models.Index(fields=["team", "-at", "-id"], name="team_audit_latest")],
            },
        ),
    ]

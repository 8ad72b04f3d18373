"""Idle-GPU detection settings per team (docs/agent.md, "Idle GPUs")."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_membership_audit"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="idle_reclaim_minutes",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="minutes after the warning, still idle, before the job is stopped and its slices freed (IDLE_RECLAIMED); 0 = never; empty = PORTAL_IDLE_RECLAIM_MINUTES",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="team",
            name="idle_util_pct",
            field=models.FloatField(
                blank=True,
                help_text="a job whose GPUs stay under this utilisation (%) is idle; empty = PORTAL_IDLE_UTIL_PCT",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(0.0),
                    django.core.validators.MaxValueValidator(100.0),
                ],
            ),
        ),
        migrations.AddField(
            model_name="team",
            name="idle_warn_minutes",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="minutes idle before the job gets a warning; 0 = no idle detection; empty = PORTAL_IDLE_WARN_MINUTES",
                null=True,
            ),
        ),
    ]

"""Job arrays (issue 10 item 4): JobArray, and each member's array and index."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_notify"),
        ("tenants", "0006_membership_audit"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="JobArray",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=128)),
                ("size", models.PositiveIntegerField()),
                ("max_running", models.PositiveIntegerField(blank=True, null=True)),
                ("values", models.JSONField(blank=True, default=list)),
                ("created_at", models.DateTimeField()),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="arrays",
                        to="tenants.team",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="job_arrays",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "job array",
                "ordering": ["-created_at", "-id"],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="array",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="jobs.jobarray",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="array_index",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]

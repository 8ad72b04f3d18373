"""Dispatch and JobMetrics moved here from the cluster app.

State only: both keep their tables (``cluster_dispatch``, ``cluster_jobmetrics``), their rows
and the constraint ``one_dispatch_per_attempt_kind``; nothing runs against the database.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("cluster", "0004_move_allocation_dispatch_jobmetrics"),
        ("jobs", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="JobMetrics",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("attempt", models.PositiveIntegerField()),
                        (
                            "gpu_util_pct",
                            models.FloatField(
                                blank=True, help_text="null: NVML cannot tell", null=True
                            ),
                        ),
                        ("memory_used_mb", models.PositiveIntegerField()),
                        ("sampled_at", models.DateTimeField()),
                        (
                            "job",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="metrics",
                                to="jobs.job",
                            ),
                        ),
                    ],
                    options={"db_table": "cluster_jobmetrics"},
                ),
                migrations.CreateModel(
                    name="Dispatch",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("attempt", models.PositiveIntegerField()),
                        (
                            "kind",
                            models.CharField(
                                choices=[("launch", "Launch"), ("stop", "Stop")], max_length=8
                            ),
                        ),
                        ("first_sent_at", models.DateTimeField()),
                        ("last_sent_at", models.DateTimeField()),
                        ("sends", models.PositiveIntegerField(default=1)),
                        (
                            "job",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="dispatches",
                                to="jobs.job",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "cluster_dispatch",
                        "ordering": ["-last_sent_at"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("job", "attempt", "kind"),
                                name="one_dispatch_per_attempt_kind",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

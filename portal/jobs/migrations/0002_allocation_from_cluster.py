"""Allocation (a job's hold on a slice) moved here from the cluster app.

State only: the model keeps its table ``cluster_allocation``, its rows, its index and its
constraint ``one_active_allocation_per_slice``; nothing runs against the database.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0004_move_allocation_dispatch_jobmetrics"),
        ("jobs", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Allocation",
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
                        ("created_at", models.DateTimeField()),
                        ("released_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "job",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="allocations",
                                to="jobs.job",
                            ),
                        ),
                        (
                            "slice",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="allocations",
                                to="cluster.slice",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "cluster_allocation",
                        "ordering": ["-created_at"],
                        "indexes": [
                            models.Index(
                                fields=["job", "attempt"], name="cluster_all_job_id_8be6fa_idx"
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("released_at__isnull", True)),
                                fields=("slice",),
                                name="one_active_allocation_per_slice",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

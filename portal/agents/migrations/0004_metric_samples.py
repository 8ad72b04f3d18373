"""GPU samples over time, per job attempt and per device (docs/agent.md, "GPU metrics")."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0003_verbose_names"),
        ("cluster", "0006_node_drain"),
        ("jobs", "0004_job_notify"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeviceGpuSample",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField()),
                (
                    "period_s",
                    models.PositiveIntegerField(
                        default=0, help_text="0: a raw sample; else a mean"
                    ),
                ),
                (
                    "samples",
                    models.PositiveIntegerField(default=1, help_text="raw samples behind this row"),
                ),
                ("sm_util_pct", models.FloatField(blank=True, null=True)),
                ("mem_util_pct", models.FloatField(blank=True, null=True)),
                ("memory_used_mb", models.FloatField(blank=True, null=True)),
                ("processes", models.FloatField(blank=True, null=True)),
                ("power_w", models.FloatField(blank=True, null=True)),
                ("temperature_c", models.FloatField(blank=True, null=True)),
                ("uuid", models.CharField(help_text="GPU or MIG device UUID", max_length=64)),
                ("memory_total_mb", models.FloatField(blank=True, null=True)),
                ("mps_clients", models.FloatField(blank=True, null=True)),
                (
                    "error",
                    models.CharField(
                        blank=True, help_text="what NVML answered instead", max_length=200
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="gpu_samples",
                        to="cluster.node",
                    ),
                ),
            ],
            options={
                "verbose_name": "device GPU sample",
                "ordering": ["uuid", "at"],
                "indexes": [
                    models.Index(fields=["period_s", "at"], name="agents_devgpusample_age"),
                    models.Index(fields=["node", "at"], name="agents_devgpusample_node_at"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("uuid", "period_s", "at"), name="one_device_gpu_sample_per_time"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="JobGpuSample",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField()),
                (
                    "period_s",
                    models.PositiveIntegerField(
                        default=0, help_text="0: a raw sample; else a mean"
                    ),
                ),
                (
                    "samples",
                    models.PositiveIntegerField(default=1, help_text="raw samples behind this row"),
                ),
                ("sm_util_pct", models.FloatField(blank=True, null=True)),
                ("mem_util_pct", models.FloatField(blank=True, null=True)),
                ("memory_used_mb", models.FloatField(blank=True, null=True)),
                ("processes", models.FloatField(blank=True, null=True)),
                ("power_w", models.FloatField(blank=True, null=True)),
                ("temperature_c", models.FloatField(blank=True, null=True)),
                ("attempt", models.PositiveIntegerField()),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="gpu_samples",
                        to="jobs.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job GPU sample",
                "ordering": ["job", "attempt", "at"],
                "indexes": [
                    models.Index(fields=["period_s", "at"], name="agents_jobgpusample_age")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "attempt", "period_s", "at"),
                        name="one_job_gpu_sample_per_time",
                    )
                ],
            },
        ),
    ]

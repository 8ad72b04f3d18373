import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import portal.notify.models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("jobs", "0004_job_notify"),
        ("tenants", "0005_token_scopes_expiry"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="NotificationSettings",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "events",
                    models.JSONField(
                        blank=True,
                        default=portal.notify.models.no_events,
                        help_text="subset of end, fail, preempt, start",
                    ),
                ),
                (
                    "email",
                    models.BooleanField(
                        default=True, help_text="send wanted events to the user's e-mail"
                    ),
                ),
                ("webhook_url", models.CharField(blank=True, max_length=500)),
                ("webhook_secret", models.CharField(blank=True, max_length=64)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notification_settings",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "notification settings",
            },
        ),
        migrations.CreateModel(
            name="TeamWebhook",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("url", models.CharField(max_length=500)),
                ("secret", models.CharField(max_length=64)),
                (
                    "events",
                    models.JSONField(
                        blank=True,
                        default=portal.notify.models.end_and_fail,
                        help_text="subset of end, fail, preempt, start",
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "team",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="webhook",
                        to="tenants.team",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="Delivery",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_attempt", models.PositiveIntegerField()),
                ("to_state", models.CharField(max_length=16)),
                ("event", models.CharField(max_length=16)),
                (
                    "channel",
                    models.CharField(
                        choices=[("email", "Email"), ("webhook", "Webhook")], max_length=8
                    ),
                ),
                ("recipient", models.CharField(max_length=32)),
                ("target", models.CharField(help_text="address or URL", max_length=500)),
                ("payload", models.JSONField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("delivered", "Delivered"),
                            ("failed", "Failed"),
                        ],
                        default="pending",
                        max_length=10,
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("last_error", models.TextField(blank=True)),
                ("created_at", models.DateTimeField()),
                ("next_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="jobs.job",
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="tenants.team",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notification_deliveries",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "deliveries",
                "ordering": ["-created_at", "-id"],
                "indexes": [
                    models.Index(
                        fields=["status", "next_attempt_at"], name="notify_deli_status_68e9fe_idx"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "job_attempt", "to_state", "channel", "recipient"),
                        name="one_delivery_per_change_channel_recipient",
                    )
                ],
            },
        ),
    ]

"""Who is told about which job events, how (e-mail, webhook), and every delivery made."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from portal.jobs.models import NOTIFY_EVENTS, Job
from portal.tenants.models import Team

WEBHOOK_URL_MAX_CHARS = 500


def no_events() -> list[str]:
    return []


def end_and_fail() -> list[str]:
    return ["end", "fail"]


class NotificationSettings(models.Model):
    """A user's own notifications: the events of every job of theirs they want (a job's
    ``notify`` replaces them for that job), by e-mail and/or to their webhook."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_settings"
    )
    events = models.JSONField(
        default=no_events, blank=True, help_text=f"subset of {', '.join(NOTIFY_EVENTS)}"
    )
    email = models.BooleanField(default=True, help_text="send wanted events to the user's e-mail")
    webhook_url = models.CharField(max_length=WEBHOOK_URL_MAX_CHARS, blank=True)
    # Signs the webhook's body; kept as is because signing needs it, shown once when made.
    webhook_secret = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"notifications of {self.user}"


class TeamWebhook(models.Model):
    """A team's webhook: told about every job of the team (its admins choose the events)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="webhook")
    url = models.CharField(max_length=WEBHOOK_URL_MAX_CHARS)
    secret = models.CharField(max_length=64)
    events = models.JSONField(
        default=end_and_fail, blank=True, help_text=f"subset of {', '.join(NOTIFY_EVENTS)}"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"webhook of team {self.team}"


class Delivery(models.Model):
    """One notification of one job state change to one recipient over one channel.

    (job, attempt, to_state, channel, recipient) is unique, so a change announced twice is
    delivered once. ``attempts`` counts tries; the control worker claims a try by a
    conditional UPDATE on it, so two messages for the same try never both send.
    """

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="deliveries")
    job_attempt = models.PositiveIntegerField()
    to_state = models.CharField(max_length=16)
    event = models.CharField(max_length=16)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    # "user:<id>" (their e-mail or webhook) or "team:<id>" (the team's webhook).
    recipient = models.CharField(max_length=32)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="notification_deliveries",
    )
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    target = models.CharField(max_length=WEBHOOK_URL_MAX_CHARS, help_text="address or URL")
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    # When the next try is due (a claimed try: when it is given up on); null once settled.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "job_attempt", "to_state", "channel", "recipient"],
                name="one_delivery_per_change_channel_recipient",
            )
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} of job {self.job_id} by {self.channel} to {self.target}"

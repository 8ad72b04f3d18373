"""Teams (tenants), their quotas in GPU units, and who belongs to them."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

PRIORITY_CLASSES = ("low", "normal", "high")  # lowest first, as the scheduler reads them
PRIORITY_CHOICES = [(name, name) for name in PRIORITY_CLASSES]


class Team(models.Model):
    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[
            RegexValidator(r"^[a-z0-9][a-z0-9_-]*$", "lower-case letters, digits, - and _")
        ],
    )
    description = models.CharField(max_length=200, blank=True)
    # Fair-share weight among teams with waiting work.
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    # GPU units the team always gets back (nominal quota), and the most it may hold.
    guaranteed_units = models.FloatField(default=0.0, validators=[MinValueValidator(0.0)])
    limit_units = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0)], help_text="empty = no limit"
    )
    max_priority = models.CharField(max_length=16, choices=PRIORITY_CHOICES, default="normal")
    member_limit_units = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0)], help_text="empty = no limit"
    )
    budget_gpu_hours = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0)],
        help_text="GPU-unit-hours per calendar month; empty = no budget",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(limit_units__isnull=True)
                | models.Q(limit_units__gte=models.F("guaranteed_units")),
                name="team_limit_not_below_guarantee",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "member"
        ADMIN = "admin", "team admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """An API token. Only the SHA-256 of its key is stored: the key is shown once, at creation.

    The key is 160 random bits, so a plain digest cannot be reversed by guessing; no pepper
    is mixed in, so rotating PORTAL_SECRET_KEY does not invalidate every notebook's token.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    digest = models.CharField(max_length=64, unique=True)
    # The key's first characters: enough to tell a user's tokens apart, useless to an attacker.
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username", "created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}... of {self.user}"


class AccessCounter(models.Model):
    """A fixed-window counter shared by every web process: failed logins per username and per
    client address, API requests per user and per token.

    It lives in the database because the portal configures no shared cache; each web
    process's own memory would let an attacker spread attempts over the processes.
    """

    scope = models.CharField(max_length=32)
    key = models.CharField(max_length=200)
    window_started_at = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)
    # Set when a login lockout starts: attempts before this instant are refused unchecked.
    locked_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="one_access_counter_per_key")
        ]
        indexes = [models.Index(fields=["window_started_at"], name="access_counter_window")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key}: {self.count} since {self.window_started_at}"

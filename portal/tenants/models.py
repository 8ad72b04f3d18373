"""Teams (tenants), their quotas in GPU units, and who belongs to them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from workers.images import prefix_problem
from workers.protocol import FORBIDDEN_NETWORKS, NETWORK_NAME_PATTERN

PRIORITY_CLASSES = ("low", "normal", "high")  # lowest first, as the scheduler reads them
PRIORITY_CHOICES = [(name, name) for name in PRIORITY_CLASSES]
# What an API token may do (docs/api.md, "Scopes"): read anything its user may see; submit
# and act on jobs; manage tokens and administer teams. A browser session may do all three.
TOKEN_SCOPES = ("read", "submit", "admin")
TOKEN_NAME_MAX_CHARS = 64


def every_token_scope() -> list[str]:
    """The scopes of a token made before tokens had scopes (they could do everything)."""
    return list(TOKEN_SCOPES)


def validate_image_prefixes(value: Any) -> None:
    """A team's image allow-list: a list of prefixes (workers/images.py says how they match)."""
    if not isinstance(value, list):
        raise ValidationError(
            'must be a list of image prefixes, e.g. ["registry.example.org/vision/"]'
        )
    for index, prefix in enumerate(value):
        problem = prefix_problem(prefix)
        if problem is not None:
            raise ValidationError(f"item {index + 1} {problem}")


def validate_job_network(value: str) -> None:
    if value in FORBIDDEN_NETWORKS or value == "none":
        raise ValidationError(
            f"{value!r} cannot be a team's network: leave it empty for no network; the host "
            "network is never given to jobs"
        )


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
    # The container policy of the team's jobs (docs/agent.md, "Container policy"); each GPU
    # host's agent checks it again against its own policy file, which wins.
    allowed_image_prefixes = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_image_prefixes],
        help_text=(
            'images the team may run, as prefixes: ["registry.example.org/vision/", "python:"]. '
            "A prefix ending in / or : allows what follows it; any other names a whole "
            "repository (followed by nothing, :tag, @digest or /path). Empty = any image"
        ),
    )
    job_network = models.CharField(
        max_length=128,
        blank=True,
        validators=[
            RegexValidator(NETWORK_NAME_PATTERN, "a Docker network name"),
            validate_job_network,
        ],
        help_text="a Docker network the team's jobs join (the hosts must allow it); "
        "empty = no network",
    )
    read_only_rootfs = models.BooleanField(
        default=False,
        help_text="the team's containers get a read-only root filesystem (they write to /scratch)",
    )
    # Idle-GPU detection (docs/agent.md, "Idle GPUs"); empty = the site's default.
    idle_util_pct = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="a job whose GPUs stay under this utilisation (%) is idle; "
        "empty = PORTAL_IDLE_UTIL_PCT",
    )
    idle_warn_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="minutes idle before the job gets a warning; 0 = no idle detection; "
        "empty = PORTAL_IDLE_WARN_MINUTES",
    )
    idle_reclaim_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="minutes after the warning, still idle, before the job is stopped and its "
        "slices freed (IDLE_RECLAIMED); 0 = never; empty = PORTAL_IDLE_RECLAIM_MINUTES",
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

    def image_prefixes(self) -> tuple[str, ...]:
        """The allow-list as a tuple of prefixes (``image_prefixes_of``)."""
        return image_prefixes_of(self.allowed_image_prefixes)


def image_prefixes_of(value: Any) -> tuple[str, ...]:
    """A team's ``allowed_image_prefixes`` value as a tuple of prefixes, also when a row was
    written around the field's validation (a bare text counts as one prefix)."""
    if isinstance(value, str):
        return (value,)
    return tuple(p for p in value if isinstance(p, str)) if isinstance(value, list) else ()


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "member"
        ADMIN = "admin", "team admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # This member's own limit, set by a team admin: GPU units they may hold at most. It can
    # only tighten the team's per-member limit (``Team.member_limit_units``, a site admin's);
    # the scheduler applies the smaller of the two (docs/scheduling.md, "Quotas").
    limit_units = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0)],
        help_text="empty = the team's per-member limit",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TeamAuditEntry(models.Model):
    """One change to a team's members or quota: who made it, when, and the value before and
    after (as text, "" for none). Written by the services that make the change, in the same
    transaction (portal/tenants/audit.py); never edited."""

    class Action(models.TextChoices):
        MEMBER_ADDED = "member_added", "member added"
        MEMBER_REMOVED = "member_removed", "member removed"
        ROLE_CHANGED = "role_changed", "role changed"
        LIMIT_CHANGED = "limit_changed", "member limit changed"
        QUOTA_CHANGED = "quota_changed", "quota changed"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="audit_entries")
    # The name is kept as text too, so the log still says who when an account is deleted.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=Action.choices)
    subject = models.CharField(max_length=150, blank=True, help_text="the member, if any")
    field = models.CharField(max_length=64, blank=True)
    old_value = models.CharField(max_length=64, blank=True)
    new_value = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["team", "-at", "-id"], name="team_audit_latest")]
        verbose_name = "team audit entry"
        verbose_name_plural = "team audit entries"

    def __str__(self) -> str:
        return f"{self.team} {self.action} {self.subject or self.field} by {self.actor_name}"


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
    # The defaults are what tokens from before names and scopes got (migration 0005); new
    # tokens are made by tokens.token_create, which always sets both.
    name = models.CharField(max_length=TOKEN_NAME_MAX_CHARS, default="unnamed")
    # A subset of TOKEN_SCOPES, in that order (tokens.token_create checks it).
    scopes = models.JSONField(default=every_token_scope)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty = never")
    # Written at most once a minute per token (tokens.token_touch), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username", "created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}... ({self.name}) of {self.user}"

    def has_scope(self, scope: str) -> bool:
        return isinstance(self.scopes, list) and scope in self.scopes

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


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

"""GPU hosts as their agents describe them, their slices, and who holds which slice."""

from __future__ import annotations

from django.db import models


class Node(models.Model):
    class State(models.TextChoices):
        READY = "ready"
        LOST = "lost"  # missed heartbeats beyond the lease
        DRAINED = "drained"  # an operator took it out of scheduling

    name = models.CharField(max_length=128, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    driver = models.CharField(max_length=16, blank=True, help_text="nvml or described")
    agent_version = models.CharField(max_length=32, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    class Mode(models.TextChoices):
        WHOLE = "whole"
        MIG = "mig"
        MPS = "mps"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=64, unique=True)
    index = models.PositiveIntegerField()
    model = models.CharField(max_length=128, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.WHOLE)
    # False when the GPU disappeared from the agent's last inventory.
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["node__name", "index"]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class Slice(models.Model):
    """One allocatable thing: a whole GPU, a MIG instance or one MPS share of a GPU."""

    class Kind(models.TextChoices):
        WHOLE = "whole"
        MIG = "mig"
        MPS = "mps"

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="slices")
    # Stable id across re-registrations: the GPU UUID, the MIG UUID, or "<GPU UUID>/mps/<i>".
    key = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    profile = models.CharField(max_length=32, blank=True)  # MIG profile, e.g. 1g.10gb
    mig_uuid = models.CharField(max_length=64, blank=True)
    units = models.FloatField(help_text="GPU units: whole 1.0, MIG slices/7, MPS its fraction")
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["gpu__node__name", "gpu__index", "key"]

    def __str__(self) -> str:
        return self.key


class Allocation(models.Model):
    """A job's hold on a slice for one attempt; released_at is set when the hold ends."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="allocations")
    attempt = models.PositiveIntegerField()
    slice = models.ForeignKey(Slice, on_delete=models.PROTECT, related_name="allocations")
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Even if two scheduling passes raced, a slice can never be booked twice.
            models.UniqueConstraint(
                fields=["slice"],
                condition=models.Q(released_at__isnull=True),
                name="one_active_allocation_per_slice",
            ),
        ]
        indexes = [models.Index(fields=["job", "attempt"])]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt} on {self.slice_id}"


class Dispatch(models.Model):
    """The last time a launch or stop of one attempt was sent to its agent.

    Messages can be lost; the reaper re-sends a launch or a stop that got no answer, and this
    row keeps it from re-sending on every beat.
    """

    class Kind(models.TextChoices):
        LAUNCH = "launch"
        STOP = "stop"

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="dispatches")
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    first_sent_at = models.DateTimeField()
    last_sent_at = models.DateTimeField()
    sends = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-last_sent_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "kind"], name="one_dispatch_per_attempt_kind"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job_id}#{self.attempt} x{self.sends}"


class JobMetrics(models.Model):
    """The latest GPU-use sample of a job's current attempt, as its agent reported it."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="metrics")
    attempt = models.PositiveIntegerField()
    gpu_util_pct = models.FloatField(null=True, blank=True, help_text="null: NVML cannot tell")
    memory_used_mb = models.PositiveIntegerField()
    sampled_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"metrics of job {self.job_id}#{self.attempt}"

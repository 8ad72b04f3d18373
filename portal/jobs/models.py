"""Jobs, their history of state changes, their dependencies, their output and their slices."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from portal.tenants.models import PRIORITY_CHOICES


class JobState(models.TextChoices):
    PENDING = "PENDING"
    HELD = "HELD"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT}
)
# States in which a job holds slices.
HOLDING_STATES = frozenset({JobState.ASSIGNED, JobState.RUNNING})
# What a job's owner may be told about (Job.notify; portal.notify maps states to them): start
# = RUNNING; end = any end state; fail = FAILED or TIMED_OUT; preempt = PREEMPTED.
NOTIFY_EVENTS = ("end", "fail", "preempt", "start")


class GpuKind(models.TextChoices):
    WHOLE = "whole"
    MIG = "mig"
    MPS = "mps"


class JobArray(models.Model):
    """Jobs made by one submit from one request (a sweep, Slurm's ``--array``): member ``i``
    has ``PORTAL_ARRAY_INDEX=i`` and, for a sweep, the ``i``-th combination of ``values`` in
    its env. At most ``max_running`` members hold slices at once (None: no throttle)."""

    team = models.ForeignKey("tenants.Team", on_delete=models.PROTECT, related_name="arrays")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays"
    )
    name = models.CharField(max_length=128)
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(null=True, blank=True)
    # The swept values as [[name, [value, ...]], ...] in the order of the product (a list,
    # since jsonb keeps no key order); [] for an array of a plain count.
    values = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "job array"

    def __str__(self) -> str:
        return f"array {self.pk} {self.name}"


class Job(models.Model):
    team = models.ForeignKey("tenants.Team", on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    name = models.CharField(max_length=128)
    image = models.CharField(max_length=255)
    command = models.JSONField(help_text="argv list")
    env = models.JSONField(default=dict, blank=True)

    # The GPU request.
    gpu_kind = models.CharField(max_length=8, choices=GpuKind.choices)
    gpu_count = models.PositiveIntegerField(default=1)
    gpu_min_count = models.PositiveIntegerField(default=0, help_text="elastic minimum; 0 = rigid")
    gpu_profile = models.CharField(max_length=32, blank=True)
    gpu_model = models.CharField(max_length=128, blank=True)
    multi_node = models.BooleanField(default=False)

    priority = models.CharField(max_length=16, choices=PRIORITY_CHOICES, default="normal")
    time_limit_s = models.PositiveIntegerField(null=True, blank=True)
    preemptible = models.BooleanField(default=True)
    # The events (start, end, fail, preempt) the owner is told about for this job; null: the
    # owner's own notification settings (portal.notify).
    notify = models.JSONField(null=True, blank=True, default=None)
    # Member ``array_index`` of a job array (a resubmitted member keeps its index: the
    # newest job of an index is the array's member now).
    array = models.ForeignKey(
        JobArray, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    array_index = models.PositiveIntegerField(null=True, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    attempt = models.PositiveIntegerField(default=0, help_text="0 until first assigned")
    submitted_at = models.DateTimeField()
    queued_since = models.DateTimeField(help_text="kept across requeues: the job's place")
    assigned_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="why the job ended as it did")

    # Where it runs now (ASSIGNED/RUNNING) or ran last.
    node = models.ForeignKey(
        "cluster.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    borrowed = models.BooleanField(default=False, help_text="placed above the team's guarantee")
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=16, blank=True)  # cancel | preempt | time_limit

    # The scheduler's latest explanation while PENDING.
    pending_code = models.CharField(max_length=32, blank=True)
    pending_message = models.TextField(blank=True)
    pending_numbers = models.JSONField(default=dict, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)  # the likely start
    # The band around it (scheduler.eta): the earliest and latest expected start.
    estimated_start_earliest_at = models.DateTimeField(null=True, blank=True)
    estimated_start_latest_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state"]),
            models.Index(fields=["team", "state"]),
            # The job list, newest first (the API's cursor pages, the Jobs page): a page reads
            # its rows off one of these instead of sorting every job the user may see.
            models.Index(fields=["-submitted_at", "-id"], name="jobs_job_newest_idx"),
            models.Index(fields=["team", "-submitted_at", "-id"], name="jobs_job_team_newest_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class JobEvent(models.Model):
    """One change of a job's state (or another notable thing that happened to it)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    attempt = models.PositiveIntegerField(default=0)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state} -> {self.to_state}"


class JobDependency(models.Model):
    class Kind(models.TextChoices):
        AFTER_OK = "after_ok"
        AFTER_ANY = "after_any"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    depends_on = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="dependents")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.AFTER_OK)

    class Meta:
        verbose_name_plural = "job dependencies"
        constraints = [
            models.UniqueConstraint(fields=["job", "depends_on"], name="one_dependency_per_pair")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.kind} job {self.depends_on_id}"


class JobLogChunk(models.Model):
    """A piece of a job's output as the agent shipped it; (job, attempt, part, seq) makes it
    idempotent. ``part`` is the rank of the node that ran it in a multi-node gang (each node's
    agent numbers its own chunks from 0), 0 for every other job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveIntegerField()
    part = models.PositiveIntegerField(default=0)
    seq = models.PositiveIntegerField()
    data = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["attempt", "part", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "part", "seq"], name="one_log_chunk_per_part_seq"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt} log {self.part}/{self.seq}"


class GangPart(models.Model):
    """One node's part of one attempt of a multi-node gang, as that node's agent reported it
    (portal.jobs.attempts: the gang is RUNNING once every part started, and ends once every
    part ended). One row per (job, attempt, node), made by the part's first report."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gang_parts")
    attempt = models.PositiveIntegerField()
    node = models.ForeignKey("cluster.Node", on_delete=models.CASCADE, related_name="gang_parts")
    rank = models.PositiveIntegerField(help_text="NODE_RANK: 0 is the first node")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="as its agent saw it end")
    # When the portal learnt of the end: the first part to end otherwise than succeeded
    # decides the gang's end state.
    recorded_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, help_text="empty while it runs")
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "attempt", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "node"], name="one_gang_part_per_node"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt} rank {self.rank} on {self.node_id}"


class Allocation(models.Model):
    """A job's hold on a slice for one attempt; released_at is set when the hold ends."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    attempt = models.PositiveIntegerField()
    slice = models.ForeignKey("cluster.Slice", on_delete=models.PROTECT, related_name="allocations")
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Born in the cluster app; the table kept its name when the model moved here.
        db_table = "cluster_allocation"
        ordering = ["-created_at"]
        constraints = [
            # Even if two scheduling passes raced, a slice can never be booked twice.
            models.UniqueConstraint(
                fields=["slice"],
                condition=models.Q(released_at__isnull=True),
                name="one_active_allocation_per_slice",
            ),
        ]
        indexes = [models.Index(fields=["job", "attempt"], name="cluster_all_job_id_8be6fa_idx")]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt} on {self.slice_id}"

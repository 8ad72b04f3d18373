"""What the control plane remembers about talking to agents: sends, the latest samples and
the GPU samples over time."""

from __future__ import annotations

from django.db import models


class Dispatch(models.Model):
    """The last time a launch or stop of one attempt was sent to its agent.

    Messages can be lost; the reaper re-sends a launch or a stop that got no answer, and this
    row keeps it from re-sending on every beat.
    """

    class Kind(models.TextChoices):
        LAUNCH = "launch"
        STOP = "stop"
        QUERY = "query"  # "what do you know of this attempt?" (docs/agent.md)

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="dispatches")
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    first_sent_at = models.DateTimeField()
    last_sent_at = models.DateTimeField()
    sends = models.PositiveIntegerField(default=1)

    class Meta:
        # Born in the cluster app; the table kept its name when the model moved here.
        db_table = "cluster_dispatch"
        ordering = ["-last_sent_at"]
        verbose_name_plural = "dispatches"
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

    class Meta:
        db_table = "cluster_jobmetrics"
        verbose_name = verbose_name_plural = "job metrics"

    def __str__(self) -> str:
        return f"metrics of job {self.job_id}#{self.attempt}"


class GpuSampleValues(models.Model):
    """What one GPU sample holds, raw or a mean (docs/agent.md, "GPU metrics").

    ``period_s`` 0 is one raw sample taken at ``at``; otherwise the row is the mean of the
    ``samples`` raw samples taken in [``at``, ``at`` + ``period_s``) (portal.agents.gpu_metrics
    makes those means once the raw samples are a day old). Each value is null where NVML could
    not tell; a mean averages the values that were there."""

    at = models.DateTimeField()
    period_s = models.PositiveIntegerField(default=0, help_text="0: a raw sample; else a mean")
    samples = models.PositiveIntegerField(default=1, help_text="raw samples behind this row")
    sm_util_pct = models.FloatField(null=True, blank=True)
    mem_util_pct = models.FloatField(null=True, blank=True)
    memory_used_mb = models.FloatField(null=True, blank=True)
    processes = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True


class JobGpuSample(GpuSampleValues):
    """One attempt's use of its GPUs over time, as its agent sampled it."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="gpu_samples")
    attempt = models.PositiveIntegerField()

    class Meta:
        ordering = ["job", "attempt", "at"]
        verbose_name = "job GPU sample"
        constraints = [
            # A batch the broker delivered twice is stored once.
            models.UniqueConstraint(
                fields=["job", "attempt", "period_s", "at"], name="one_job_gpu_sample_per_time"
            )
        ]
        indexes = [models.Index(fields=["period_s", "at"], name="agents_jobgpusample_age")]

    def __str__(self) -> str:
        return f"job {self.job_id}#{self.attempt} at {self.at:%Y-%m-%d %H:%M:%S}"


class DeviceGpuSample(GpuSampleValues):
    """One GPU device of a node over time: a whole GPU (also one in MPS mode, for all of its
    shares), a GPU in MIG mode or one of its MIG instances (``uuid``)."""

    node = models.ForeignKey("cluster.Node", on_delete=models.CASCADE, related_name="gpu_samples")
    uuid = models.CharField(max_length=64, help_text="GPU or MIG device UUID")
    memory_total_mb = models.FloatField(null=True, blank=True)
    mps_clients = models.FloatField(null=True, blank=True)
    error = models.CharField(max_length=200, blank=True, help_text="what NVML answered instead")

    class Meta:
        ordering = ["uuid", "at"]
        verbose_name = "device GPU sample"
        constraints = [
            models.UniqueConstraint(
                fields=["uuid", "period_s", "at"], name="one_device_gpu_sample_per_time"
            )
        ]
        indexes = [
            models.Index(fields=["period_s", "at"], name="agents_devgpusample_age"),
            models.Index(fields=["node", "at"], name="agents_devgpusample_node_at"),
        ]

    def __str__(self) -> str:
        return f"{self.uuid} at {self.at:%Y-%m-%d %H:%M:%S}"


class NodeCredential(models.Model):
    """A node's key, as `manage.py node_add` made it: the salt it is derived from and a digest
    of it (never the key), and which run of the node's agent the portal listens to now."""

    node = models.OneToOneField("cluster.Node", on_delete=models.CASCADE, related_name="credential")
    salt = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, help_text="SHA-256 of the key, hex")
    created_at = models.DateTimeField()
    # The agent run (its `boot` id) whose heartbeats renew the node's lease; another run is
    # accepted only as its successor on the same work directory, or once the lease lapsed.
    boot = models.CharField(max_length=64, blank=True)
    boot_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"key of {self.node_id}"


class RefusedMessage(models.Model):
    """A message from the broker that was not applied: its signature failed, its node has no
    key or is not the key's, it was a replay, it was stale, or it claimed what is not its own
    (another node's GPU, a second agent for a live node)."""

    at = models.DateTimeField(db_index=True)
    node = models.CharField(max_length=128, blank=True, help_text="as the message claimed it")
    kind = models.CharField(max_length=32, blank=True, help_text="message type, as claimed")
    reason = models.CharField(max_length=32)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.reason}: {self.kind or 'message'} from {self.node or '?'}"


class SeenNonce(models.Model):
    """Nonces of applied messages, within the freshness window: a replay is refused."""

    node = models.CharField(max_length=128)
    nonce = models.CharField(max_length=128)
    seen_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "nonce"], name="one_use_per_nonce")]

    def __str__(self) -> str:
        return f"{self.node}/{self.nonce}"

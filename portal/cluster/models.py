"""GPU hosts as their agents describe them, their GPUs and the slices those offer."""

from __future__ import annotations

from django.db import models


class Node(models.Model):
    class State(models.TextChoices):
        READY = "ready"
        LOST = "lost"  # missed heartbeats beyond the lease
        # An operator took it out of scheduling (cordoned): its jobs run on, no new job is
        # placed on it. Drained in the strict sense once nothing holds its slices.
        DRAINED = "drained"

    name = models.CharField(max_length=128, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    # Where other hosts reach this one, as its agent reports it (PORTAL_AGENT_ADDRESS): a
    # multi-node gang's MASTER_ADDR when this is its first node. Empty from older agents.
    address = models.CharField(max_length=253, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    # Who cordoned it and when (state DRAINED), for the Nodes page; the history is NodeEvent.
    cordoned_at = models.DateTimeField(null=True, blank=True)
    cordoned_by = models.CharField(max_length=150, blank=True)
    drain_deadline_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a drain in progress: jobs still holding its slices then are preempted",
    )
    driver = models.CharField(max_length=16, blank=True, help_text="nvml or described")
    agent_version = models.CharField(max_length=32, blank=True)
    launch_batches = models.BooleanField(
        default=False,
        help_text="its agent takes several launches in one message (its last heartbeat said so)",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeEvent(models.Model):
    """One operator action on a node, or what came of it (cordon, drain, drained...), or a
    change of its hardware (a GPU lost or back, a new MIG layout): who, when, what. ``by`` is
    a username; empty when the portal itself acted (a drain deadline, an inventory change)."""

    class Kind(models.TextChoices):
        CORDON = "cordon"
        UNCORDON = "uncordon"
        DRAIN = "drain"
        DRAIN_CALLED_OFF = "drain_called_off"
        PREEMPT = "preempt"  # a drain's deadline passed: its jobs were asked to stop
        DRAINED = "drained"  # a drain ended: nothing holds the node's slices
        # The inventory its agent reports changed (portal.agents.hardware): a GPU left it
        # (fell off the bus, a critical Xid error, removed), came (back) into it, or a GPU
        # that stays got other slices (a new MIG layout).
        GPU_LOST = "gpu_lost"
        GPU_BACK = "gpu_back"
        RECONFIGURED = "reconfigured"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=24, choices=Kind.choices)
    by = models.CharField(max_length=150, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["node", "at"], name="cluster_nodeevent_node_at")]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.kind}"


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
        verbose_name = "GPU"
        verbose_name_plural = "GPUs"

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


class InventoryVersion(models.Model):
    """One row: a new random ``token`` each time the inventory (nodes' GPUs and slices)
    changes, so a process may keep what it derived from the inventory (the cluster's shape a
    submit is checked against) for as long as the token stays the same."""

    token = models.CharField(max_length=32)

    def __str__(self) -> str:
        return f"inventory {self.token}"

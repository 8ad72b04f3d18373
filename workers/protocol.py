"""The message contract between the portal (control plane) and the GPU host agents.

Both sides import this module and nothing else from each other. Every message is a frozen
msgspec Struct; the union of them is tagged on ``"type"``, every message carries ``"v"``
(the protocol version), unknown fields are refused, and per-field rules live in the types
(``Annotated[int, Meta(gt=0)]``). Rules across fields are checked in ``__post_init__``.
``parse(d)`` validates a received dict and returns the message; ``checked(message)`` validates
a message built in code (msgspec checks types on decoding, not on construction), so a bad
message fails where it is built, not on the other side of the broker. Every error is a
``ProtocolError`` naming the field by its dotted path.

Messages never travel bare: ``workers.signing`` wraps each one in a signed envelope
(HMAC-SHA256 with the node's key, a timestamp and a nonce).

Control plane -> agent (task names in ``TASK_*``, queue ``node.<name>``): ``Launch``,
``Launches`` (several launches of one node in one message, to agents whose heartbeat says
``launch_batches``), ``Stop``, ``Query`` (what do you know of this attempt?) and ``Ack``
(these reports and this heartbeat are applied; your lease runs on).

Agent -> control plane (task ``portal.agent_report``, queue ``control``): ``Heartbeat``,
``Started``, ``LogChunk``, ``Finished``, ``Reports`` and ``Metrics``. ``Started``,
``LogChunk`` and ``Finished`` are *reports*: they wait in the agent's outbox until
acknowledged, and each is identified by ``report_key()`` = (kind, job_id, attempt, seq) so
that the portal applies it once however often it arrives. An agent sends them in batches,
``Reports`` (``report_batches``): one signed message, applied in one transaction, acknowledged
in one ``ack``; each report in it keeps its own key.

Devices: one ``Device`` per portal slice. A job holding two MPS shares of one GPU gets two
``Device`` entries (each with its own ``slice_id`` and ``mps_fraction``, e.g. 0.25 + 0.25); the
agent adds up the fractions and memory of the shares it got on the same GPU.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta

PROTOCOL_VERSION = 2

# Celery names shared by both sides; the portal defines `portal.agent_report`.
TASK_LAUNCH = "agent.launch"
TASK_STOP = "agent.stop"
TASK_QUERY = "agent.query"
TASK_ACK = "agent.ack"
TASK_AGENT_REPORT = "portal.agent_report"
CONTROL_QUEUE = "control"
# Heartbeats travel apart from reports, so a backlog of reports (log chunks after an outage)
# never delays the acknowledgements that keep the agents' leases: the control-plane worker
# consumes both queues, taking from each in turn.
LEASE_QUEUE = "control.lease"

# A log chunk carries at most this many bytes of UTF-8 text.
LOG_CHUNK_MAX_BYTES = 64 * 1024
# The shape of the GPU samples a `metrics` message carries (`samples_v`): a receiver refuses a
# version it does not know, so the samples can change without a new protocol version.
SAMPLES_VERSION = 1
# One `metrics` message carries at most this many samples, devices and attempts together (a
# bound on the portal's write cost per message); an agent with more sends several.
METRICS_MAX_SAMPLES = 2_000
# One ack names at most this many reports (a heartbeat can settle many at once).
ACK_MAX_REPORTS = 10_000
# One `reports` message carries at most this many reports, and at most this much log text
# (UTF-8 bytes) in them: the portal applies a batch in one transaction, so both bound its cost.
REPORTS_MAX = 500
REPORTS_MAX_LOG_BYTES = 1024 * 1024
# One `launches` message carries at most this many launches (one node's share of a pass).
LAUNCHES_MAX = 64

SliceKind = Literal["whole", "mig", "mps"]
GpuMode = Literal["whole", "mig", "mps"]
InventoryDriver = Literal["nvml", "described"]
StopReason = Literal["cancel", "preempt", "time_limit"]
# succeeded/failed: the command's own exit. cancelled/preempted/timed_out: stopped on request.
# launch_error: never started. fenced: the agent lost its lease and stopped the attempt itself.
# lost: the attempt died with an earlier run of the agent (kill -9, host reboot).
# unknown: the agent has no record of the attempt (answer to a query; it will never run it).
# superseded: a newer attempt of the job was seen here first (fencing token): never started.
Outcome = Literal[
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "preempted",
    "launch_error",
    "fenced",
    "lost",
    "unknown",
    "superseded",
]
ReportKind = Literal["started", "log", "finished"]

SLICE_KINDS: tuple[str, ...] = get_args(SliceKind)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
OUTCOMES: tuple[str, ...] = get_args(Outcome)

NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Where other hosts reach a node (a multi-node gang's MASTER_ADDR): a host name, an IPv4 or an
# IPv6 address; empty from agents older than the field.
ADDRESS_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9.:_-]{0,252})?$"
# A Docker network a job's container may join (never `host`, never `container:<id>`).
NETWORK_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NO_NETWORK = "none"
# Networks no policy may name: the host's own network stack (the broker, the database, the
# cloud's metadata service) is what `none` keeps jobs away from.
FORBIDDEN_NETWORKS = frozenset({"host"})

JobId = Annotated[int, Meta(gt=0)]
AttemptNo = Annotated[int, Meta(ge=0)]
Seq = Annotated[int, Meta(ge=0)]
NodeName = Annotated[str, Meta(pattern=NODE_NAME_PATTERN)]
NonEmpty = Annotated[str, Meta(min_length=1)]
# Comparisons refuse NaN and the bounds refuse infinities: JSON has neither.
Epoch = Annotated[float, Meta(ge=0, le=1e11)]
Seconds = Annotated[float, Meta(ge=0, le=1e9)]
# GPU readings (workers.metrics): null wherever NVML cannot tell.
Percent = Annotated[float, Meta(ge=0, le=100)]
MegaBytes = Annotated[int, Meta(ge=0, le=2**40)]
Count = Annotated[int, Meta(ge=0, le=1_000_000)]
Watts = Annotated[float, Meta(ge=0, le=100_000)]
Celsius = Annotated[float, Meta(ge=-100, le=300)]


def node_queue(node: str) -> str:
    """The Celery queue an agent consumes: one per node."""
    return f"node.{node}"


class ProtocolError(ValueError):
    """A message that does not match the contract; `field` is a dotted path into it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def _require(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise ProtocolError(field, problem)


class _Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A nested record of the contract."""

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class _Message(_Record, frozen=True, tag_field="type", kw_only=True):
    """Base of every message: tagged on ``type``, versioned by ``v``."""

    TYPE: ClassVar[str]
    v: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        _require(
            self.v == PROTOCOL_VERSION,
            "v",
            f"unsupported protocol version {self.v}; this side speaks {PROTOCOL_VERSION}",
        )
        self._check()

    def _check(self) -> None:
        """Rules across fields; raise ProtocolError naming the field."""


# --- shared records -------------------------------------------------------------------------


class Device(_Record, frozen=True, kw_only=True):
    """One allocated slice: a whole GPU, a MIG instance or an MPS share of a GPU.

    `mig_uuid` and `profile` are set for kind 'mig' only; `mps_fraction` (0 < f <= 1, the
    share of the GPU's compute, 0.25 for one of 4 shares) for kind 'mps' only. `memory_mb`
    is the slice's memory when known (for MPS it becomes the pinned device memory limit).
    """

    slice_id: NonEmpty
    kind: SliceKind
    gpu_uuid: NonEmpty
    gpu_index: Annotated[int, Meta(ge=0)]
    mig_uuid: str = ""
    profile: str = ""
    mps_fraction: Annotated[float, Meta(gt=0, le=1)] | None = None
    memory_mb: Annotated[int, Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        if self.kind == "mig":
            _require(bool(self.mig_uuid), "mig_uuid", "is required for kind 'mig'")
            _require(bool(self.profile), "profile", "is required for kind 'mig'")
        else:
            _require(not self.mig_uuid, "mig_uuid", "is only allowed for kind 'mig'")
            _require(not self.profile, "profile", "is only allowed for kind 'mig'")
        if self.kind == "mps":
            _require(self.mps_fraction is not None, "mps_fraction", "is required for kind 'mps'")
        else:
            _require(self.mps_fraction is None, "mps_fraction", "is only allowed for kind 'mps'")


class MigDevice(_Record, frozen=True, kw_only=True):
    uuid: Annotated[str, Meta(pattern=r"^MIG-")]
    profile: NonEmpty


class Gpu(_Record, frozen=True, kw_only=True):
    """A physical GPU as the agent sees it. `mig` lists the MIG instances (mode 'mig');
    `mps_shares` is how many MPS shares the operator declared (mode 'mps')."""

    uuid: Annotated[str, Meta(pattern=r"^GPU-")]
    index: Annotated[int, Meta(ge=0)]
    model: NonEmpty
    memory_mb: Annotated[int, Meta(gt=0)]
    mode: GpuMode
    mig: tuple[MigDevice, ...] = ()
    mps_shares: Annotated[int, Meta(ge=0)] = 0

    def __post_init__(self) -> None:
        if self.mode != "mig":
            _require(not self.mig, "mig", "must be empty unless mode is 'mig'")
        if self.mode == "mps":
            _require(self.mps_shares >= 1, "mps_shares", "must be 1 or more for mode 'mps'")
        else:
            _require(self.mps_shares == 0, "mps_shares", "must be 0 unless mode is 'mps'")


class LostGpu(_Record, frozen=True, kw_only=True):
    """A GPU the agent had and cannot use now (it fell off the bus: NVML answers GPU_IS_LOST,
    or it reported a critical Xid error). Not in `Inventory.gpus`; `reason` says why, first
    the code (`GPU_LOST: ...`)."""

    uuid: Annotated[str, Meta(pattern=r"^GPU-")]
    index: Annotated[int, Meta(ge=0)]
    reason: Annotated[str, Meta(min_length=1, max_length=500)]


class Inventory(_Record, frozen=True, kw_only=True):
    hostname: NonEmpty
    driver: InventoryDriver
    gpus: tuple[Gpu, ...]
    # Added in the same protocol version (optional, empty by default): GPUs that are out of
    # service on the node, so the portal can say why their slices went.
    lost: tuple[LostGpu, ...] = ()

    def __post_init__(self) -> None:
        seen_uuids: set[str] = set()
        seen_indexes: set[int] = set()
        for i, gpu in enumerate(self.gpus):
            _require(gpu.index not in seen_indexes, f"gpus[{i}].index", f"duplicate {gpu.index}")
            for uuid in (gpu.uuid, *(m.uuid for m in gpu.mig)):
                _require(uuid not in seen_uuids, f"gpus[{i}]", f"duplicate uuid {uuid}")
                seen_uuids.add(uuid)
            seen_indexes.add(gpu.index)
        for i, lost in enumerate(self.lost):
            _require(lost.uuid not in seen_uuids, f"lost[{i}].uuid", f"{lost.uuid} is in gpus")
            seen_uuids.add(lost.uuid)

    def uuids(self) -> set[str]:
        """Every GPU and MIG device UUID this inventory claims."""
        return {u for g in self.gpus for u in (g.uuid, *(m.uuid for m in g.mig))}

    def slice_keys(self) -> dict[str, Gpu]:
        """Every allocatable slice's key (`Device.slice_id`) -> its GPU: the GPU's UUID for a
        whole GPU, the MIG device's UUID, or `<GPU UUID>/mps/<i>` for each MPS share."""
        keys: dict[str, Gpu] = {}
        for gpu in self.gpus:
            if gpu.mode == "mig":
                keys.update((m.uuid, gpu) for m in gpu.mig)
            elif gpu.mode == "mps":
                keys.update((mps_slice_key(gpu.uuid, i), gpu) for i in range(gpu.mps_shares))
            else:
                keys[gpu.uuid] = gpu
        return keys


def mps_slice_key(gpu_uuid: str, share: int) -> str:
    """The slice key of MPS share `share` of a GPU."""
    return f"{gpu_uuid}/mps/{share}"


class JobRef(_Record, frozen=True, kw_only=True):
    job_id: JobId
    attempt: AttemptNo


class RunningAttempt(_Record, frozen=True, kw_only=True):
    """An attempt the agent supervises now; `started_at` is null while it is still starting."""

    job_id: JobId
    attempt: AttemptNo
    started_at: Epoch | None = None
    pid: int | None = None
    container_id: str | None = None


class ReportKey(_Record, frozen=True, kw_only=True):
    """What identifies a report: a `started` and a `finished` have seq 0, a `log` its own."""

    kind: ReportKind
    job_id: JobId
    attempt: AttemptNo
    seq: Seq = 0

    def as_tuple(self) -> tuple[str, int, int, int]:
        return (self.kind, self.job_id, self.attempt, self.seq)


class ContainerPolicy(_Record, frozen=True, kw_only=True):
    """How the job's container is confined, as the portal asks it (Docker launcher).

    Every default is the safe one. `memory_mb`, `cpus` and `pids_limit` are the container's
    limits (null: the host's maximum); `network` is `none` unless the job's team is allowed a
    named network; `read_only_rootfs` makes the image's filesystem read-only (the job writes
    to /scratch); `image_prefixes` is the team's image allow-list (empty: any image). The agent
    checks all of it against its host's own policy file, which wins (docs/agent.md).
    """

    memory_mb: Annotated[int, Meta(gt=0, le=2**40)] | None = None
    cpus: Annotated[float, Meta(ge=0.01, le=4096)] | None = None
    pids_limit: Annotated[int, Meta(gt=0, le=2**22)] | None = None
    network: Annotated[str, Meta(pattern=NETWORK_NAME_PATTERN)] = NO_NETWORK
    read_only_rootfs: bool = False
    image_prefixes: tuple[NonEmpty, ...] = ()

    def __post_init__(self) -> None:
        _require(
            self.network not in FORBIDDEN_NETWORKS,
            "network",
            f"{self.network!r} is never allowed for a job; use 'none' or a network made for jobs",
        )


# --- control -> agent -----------------------------------------------------------------------


class Launch(_Message, frozen=True, tag="launch", kw_only=True):
    """Start attempt `attempt` of job `job_id` on `node`, on exactly `devices`. `env` is what
    the user asked for; the agent's slice variables (CUDA_VISIBLE_DEVICES, ...) win over it.
    The attempt number is a fencing token: an agent that saw a newer attempt of the job
    refuses this one. `policy` is how its container is confined (the agent's host file wins)."""

    TYPE: ClassVar[str] = "launch"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo
    name: str
    team: str
    user: str
    image: NonEmpty
    command: Annotated[tuple[str, ...], Meta(min_length=1)]
    env: dict[str, str]
    devices: Annotated[tuple[Device, ...], Meta(min_length=1)]
    time_limit_s: Annotated[float, Meta(gt=0, le=1e9)] | None = None
    # Optional, so a launch without it stays valid: the safe defaults apply.
    policy: ContainerPolicy = ContainerPolicy()

    def _check(self) -> None:
        for key in self.env:
            _require(
                bool(key) and "=" not in key and "\0" not in key,
                f"env.{key}",
                "a variable name must be non-empty, without '=' or NUL",
            )
        slice_ids = [d.slice_id for d in self.devices]
        _require(len(set(slice_ids)) == len(slice_ids), "devices", "slice_id listed twice")


class Stop(_Message, frozen=True, tag="stop", kw_only=True):
    """Stop an attempt: SIGTERM (or docker stop), then kill after `grace_s` seconds."""

    TYPE: ClassVar[str] = "stop"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo
    reason: StopReason
    grace_s: Seconds = 10.0


class Query(_Message, frozen=True, tag="query", kw_only=True):
    """What do you know of this attempt? The agent re-sends its reports of it, or, when it has
    no record of it, reports `finished` with outcome `unknown` and never runs it afterwards.
    That answer is the only way, besides an expired lease, for the portal to declare an
    attempt lost."""

    TYPE: ClassVar[str] = "query"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo


class Ack(_Message, frozen=True, tag="ack", kw_only=True):
    """The portal applied these reports (they may leave the outbox) and, when `heartbeat_seq`
    is set, accepted that heartbeat of agent run `boot`: the agent's lease runs `lease_s`
    from the heartbeat's own send time."""

    TYPE: ClassVar[str] = "ack"

    node: NodeName
    boot: str = ""
    heartbeat_seq: Seq | None = None
    lease_s: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    reports: Annotated[tuple[ReportKey, ...], Meta(max_length=ACK_MAX_REPORTS)] = ()


# --- agent -> control -----------------------------------------------------------------------


class Started(_Message, frozen=True, tag="started", kw_only=True):
    """The attempt runs: `pid` for a local process, `container_id` for a container."""

    TYPE: ClassVar[str] = "started"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo
    started_at: Epoch
    pid: int | None = None
    container_id: str | None = None

    def _check(self) -> None:
        _require(
            self.pid is not None or bool(self.container_id),
            "pid",
            "one of pid or container_id is required",
        )

    def report_key(self) -> ReportKey:
        return ReportKey(kind="started", job_id=self.job_id, attempt=self.attempt)


class LogChunk(_Message, frozen=True, tag="log", kw_only=True):
    """Output of an attempt, in order: `seq` counts from 0 per attempt."""

    TYPE: ClassVar[str] = "log"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo
    seq: Seq
    data: str

    def _check(self) -> None:
        size = len(self.data.encode("utf-8", errors="surrogatepass"))
        _require(
            size <= LOG_CHUNK_MAX_BYTES,
            "data",
            f"chunk is {size} bytes; at most {LOG_CHUNK_MAX_BYTES} allowed",
        )

    def report_key(self) -> ReportKey:
        return ReportKey(kind="log", job_id=self.job_id, attempt=self.attempt, seq=self.seq)


class Finished(_Message, frozen=True, tag="finished", kw_only=True):
    """The attempt ended. `exit_code` is null when there was no process (launch_error) or
    the agent could not learn it; `error` says what went wrong, empty on success.
    `started_at` (null if it never started) lets the portal record the start even when this
    report overtakes `started`; `log_chunks` is how many log chunks the attempt shipped."""

    TYPE: ClassVar[str] = "finished"

    node: NodeName
    job_id: JobId
    attempt: AttemptNo
    exit_code: int | None
    outcome: Outcome
    finished_at: Epoch
    error: str = ""
    started_at: Epoch | None = None
    log_chunks: Seq = 0

    def report_key(self) -> ReportKey:
        return ReportKey(kind="finished", job_id=self.job_id, attempt=self.attempt)


class Launches(_Message, frozen=True, tag="launches", kw_only=True):
    """Several launches for one node in one message (the node's share of a scheduling pass):
    each is handled as if it had come alone. Every launch names this message's node, and no
    attempt is listed twice."""

    TYPE: ClassVar[str] = "launches"

    node: NodeName
    launches: Annotated[tuple[Launch, ...], Meta(min_length=1, max_length=LAUNCHES_MAX)]

    def _check(self) -> None:
        seen: set[tuple[int, int]] = set()
        for i, launch in enumerate(self.launches):
            _require(launch.node == self.node, f"launches[{i}].node", "must be the message's node")
            key = (launch.job_id, launch.attempt)
            _require(key not in seen, f"launches[{i}]", f"job {key[0]} attempt {key[1]} twice")
            seen.add(key)


class Heartbeat(_Message, frozen=True, tag="heartbeat", kw_only=True):
    """Registration (first one of a run) and liveness: what the node has and runs.

    `boot` names this run of the agent (new at every start); `previous_boot` the run before it
    on the same work directory, so the portal can tell a restart from a second agent claiming
    the node. `seq` counts heartbeats within the run. `running` lists every attempt the agent
    supervises; `finished` every ended attempt whose `finished` report is not acknowledged
    yet, so the portal can settle from the heartbeat what a report has not told it.
    `address` is where other hosts reach this one (a gang's MASTER_ADDR), empty from agents
    older than the field."""

    TYPE: ClassVar[str] = "heartbeat"

    node: NodeName
    boot: NonEmpty
    address: Annotated[str, Meta(pattern=ADDRESS_PATTERN)] = ""
    previous_boot: str = ""
    seq: Seq = 0
    agent_version: str
    sent_at: Epoch
    inventory: Inventory
    running: tuple[RunningAttempt, ...] = ()
    finished: tuple[Finished, ...] = ()
    # Added in the same protocol version (optional, false by default): this agent takes
    # `launches` messages, so the portal may send it one node's launches together.
    launch_batches: bool = False

    def _check(self) -> None:
        for i, item in enumerate(self.finished):
            _require(item.node == self.node, f"finished[{i}].node", "must be the heartbeat's node")


class DeviceSample(_Record, frozen=True, kw_only=True):
    """One reading of one GPU device through NVML at `at`: a whole GPU (also one in MPS mode,
    whose shares all read the same device), a GPU in MIG mode (its power and temperature) or
    one of its MIG instances (`uuid` MIG-...). Every value is null where NVML cannot tell: no
    utilisation on MIG (not supported there), no power or temperature per MIG instance.
    `processes` counts the compute processes on the device, MPS clients included, once each;
    `mps_clients` the MPS clients alone (GPUs in MPS mode). `error` is what NVML answered when
    the device could not be read (a GPU that fell off the bus), else empty."""

    at: Epoch
    uuid: Annotated[str, Meta(pattern=r"^(GPU|MIG)-")]
    sm_util_pct: Percent | None = None
    mem_util_pct: Percent | None = None
    memory_used_mb: MegaBytes | None = None
    memory_total_mb: MegaBytes | None = None
    processes: Count | None = None
    mps_clients: Count | None = None
    power_w: Watts | None = None
    temperature_c: Celsius | None = None
    error: Annotated[str, Meta(max_length=200)] = ""


class AttemptSample(_Record, frozen=True, kw_only=True):
    """One attempt's use of its devices at `at` (workers.metrics says how each is read): the
    mean utilisation, the memory and processes added up, the power of its whole GPUs, their
    highest temperature. Null where any of its devices cannot tell."""

    at: Epoch
    job_id: JobId
    attempt: AttemptNo
    sm_util_pct: Percent | None = None
    mem_util_pct: Percent | None = None
    memory_used_mb: MegaBytes | None = None
    processes: Count | None = None
    power_w: Watts | None = None
    temperature_c: Celsius | None = None


class Metrics(_Message, frozen=True, tag="metrics", kw_only=True):
    """GPU samples of the node (only where NVML is available), in batches: `devices` and
    `attempts` (at most METRICS_MAX_SAMPLES together), in the shape `samples_v` names.

    The single-sample fields (`job_id`, `attempt`, `gpu_util_pct`, `memory_used_mb`,
    `sampled_at`: one attempt's latest sample) are what agents sent before batches; the
    portal still takes them. They come together or not at all (`gpu_util_pct` may be null)."""

    TYPE: ClassVar[str] = "metrics"

    node: NodeName
    job_id: JobId | None = None
    attempt: AttemptNo | None = None
    gpu_util_pct: Percent | None = None
    memory_used_mb: MegaBytes | None = None
    sampled_at: Epoch | None = None
    samples_v: int = SAMPLES_VERSION
    devices: Annotated[tuple[DeviceSample, ...], Meta(max_length=METRICS_MAX_SAMPLES)] = ()
    attempts: Annotated[tuple[AttemptSample, ...], Meta(max_length=METRICS_MAX_SAMPLES)] = ()

    def _check(self) -> None:
        single = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "memory_used_mb": self.memory_used_mb,
            "sampled_at": self.sampled_at,
        }
        missing = [name for name, value in single.items() if value is None]
        if len(missing) < len(single):
            _require(
                not missing,
                missing[0] if missing else "",
                "a single sample needs job_id, attempt, memory_used_mb and sampled_at together",
            )
        else:
            _require(
                self.gpu_util_pct is None,
                "gpu_util_pct",
                "belongs to a single sample: job_id, attempt, memory_used_mb and sampled_at",
            )
            _require(
                bool(self.devices or self.attempts),
                "devices",
                "a metrics message needs samples (devices or attempts) or a single sample",
            )
        _require(
            self.samples_v == SAMPLES_VERSION,
            "samples_v",
            f"unsupported samples version {self.samples_v}; this side reads {SAMPLES_VERSION}",
        )
        count = len(self.devices) + len(self.attempts)
        _require(
            count <= METRICS_MAX_SAMPLES,
            "devices",
            f"{count} samples; at most {METRICS_MAX_SAMPLES} in one message",
        )


Report = Started | LogChunk | Finished


def _log_bytes(report: Report) -> int:
    if not isinstance(report, LogChunk):
        return 0
    return len(report.data.encode("utf-8", errors="surrogatepass"))


class Reports(_Message, frozen=True, tag="reports", kw_only=True):
    """Reports of one node sent together (what waited in its outbox): the portal applies
    them in one transaction and acknowledges them in one ``ack``, each by its own
    ``report_key()``, exactly as if each had come alone. Every report names this message's
    node; at most REPORTS_MAX of them and REPORTS_MAX_LOG_BYTES of log text."""

    TYPE: ClassVar[str] = "reports"

    node: NodeName
    reports: Annotated[
        tuple[Started | LogChunk | Finished, ...], Meta(min_length=1, max_length=REPORTS_MAX)
    ]

    def _check(self) -> None:
        size = 0
        for i, report in enumerate(self.reports):
            _require(report.node == self.node, f"reports[{i}].node", "must be the message's node")
            size += _log_bytes(report)
        _require(
            size <= REPORTS_MAX_LOG_BYTES,
            "reports",
            f"{size} bytes of log; at most {REPORTS_MAX_LOG_BYTES} in one message",
        )


def report_batches(node: str, reports: Iterable[Report]) -> list[Reports]:
    """``reports`` (in order) as few ``Reports`` messages as the bounds allow."""
    batches: list[Reports] = []
    current: list[Report] = []
    size = 0
    for report in reports:
        weight = _log_bytes(report)
        if current and (len(current) >= REPORTS_MAX or size + weight > REPORTS_MAX_LOG_BYTES):
            batches.append(Reports(node=node, reports=tuple(current)))
            current, size = [], 0
        current.append(report)
        size += weight
    if current:
        batches.append(Reports(node=node, reports=tuple(current)))
    return batches


Message = (
    Launch
    | Launches
    | Stop
    | Query
    | Ack
    | Heartbeat
    | Started
    | LogChunk
    | Finished
    | Reports
    | Metrics
)

MESSAGE_TYPES: dict[str, type[_Message]] = {
    cls.TYPE: cls
    for cls in (
        Launch,
        Launches,
        Stop,
        Query,
        Ack,
        Heartbeat,
        Started,
        LogChunk,
        Finished,
        Reports,
        Metrics,
    )
}
# Which side may send what: the portal verifies that reports come from agents and agents that
# orders come from the portal (a node's key signs both directions).
TO_AGENT_TYPES = frozenset({"launch", "launches", "stop", "query", "ack"})
TO_PORTAL_TYPES = frozenset({"heartbeat", "started", "log", "finished", "reports", "metrics"})

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
# One step of msgspec's error path: `.field`, `[3]`, or `[...]` (a dict's value).
_STEP = re.compile(r"\.(?P<field>[^.\[]+)|\[[^\]]*\]")


def _unwrap(hint: Any) -> Any:
    """The type under its constraints (Annotated) and its `| None`."""
    while True:
        if get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
            continue
        if get_origin(hint) in (Union, types.UnionType):
            options = [a for a in get_args(hint) if a is not type(None)]
            if len(options) == 1:
                hint = options[0]
                continue
        return hint


def _allowed_values(kind: str, path: str) -> tuple[Any, ...]:
    """The values, in declared order, the Literal at `path` (".devices[0].kind") of a `kind`
    message allows; () when the path does not lead to one. msgspec names only the value."""
    hint: Any = MESSAGE_TYPES[kind]
    for step in _STEP.finditer(path):
        hint = _unwrap(hint)
        if step["field"] is not None:
            if not (isinstance(hint, type) and issubclass(hint, msgspec.Struct)):
                return ()
            hint = get_type_hints(hint, include_extras=True).get(step["field"])
        elif get_origin(hint) is dict:
            hint = get_args(hint)[1]
        elif get_origin(hint) is tuple:
            hint = get_args(hint)[0]
        else:
            return ()
    hint = _unwrap(hint)
    return get_args(hint) if get_origin(hint) is Literal else ()


def _protocol_error(error: msgspec.ValidationError, kind: str) -> ProtocolError:
    """msgspec's 'Expected `int` >= 1 - at `$.devices[0].gpu_index`' as a ProtocolError whose
    field is 'launch.devices[0].gpu_index'; a refused Literal value gets the allowed ones."""
    match = _AT.match(str(error))
    problem, path = (match["problem"], match["path"] or "") if match else (str(error), "")
    inner = problem.split(": ", 1)
    # A rule raised in __post_init__ already names its field ("mig_uuid: is required ...").
    if len(inner) == 2 and re.fullmatch(r"[A-Za-z_][^\s:]*", inner[0]):
        path, problem = f"{path}.{inner[0]}" if path else f".{inner[0]}", inner[1]
    unknown = re.match(r"Object contains unknown field `(.+)`", problem)
    if unknown:
        path, problem = f"{path}.{unknown[1]}", "unknown field"
    missing = re.match(r"Object missing required field `(.+)`", problem)
    if missing:
        path, problem = f"{path}.{missing[1]}", "missing required field"
    enum = re.fullmatch(r"Invalid enum value (.+)", problem, re.DOTALL)
    allowed = _allowed_values(kind, path) if enum else ()
    if enum and allowed:
        problem = f"must be one of {', '.join(repr(v) for v in allowed)}; got {enum[1]}"
    return ProtocolError(f"{kind}{path}", problem)


def parse(d: Any) -> Message:
    """Validate a received dict and return the message it carries, or raise ProtocolError."""
    if not isinstance(d, dict):
        raise ProtocolError("", f"a message must be an object; got {type(d).__name__}")
    kind = d.get("type")
    if kind not in MESSAGE_TYPES:
        allowed = ", ".join(repr(t) for t in MESSAGE_TYPES)
        raise ProtocolError("type", f"must be one of {allowed}; got {kind!r}")
    version = d.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProtocolError("v", f"must be an integer protocol version; got {version!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            "v", f"unsupported protocol version {version}; this side speaks {PROTOCOL_VERSION}"
        )
    try:
        return msgspec.convert(d, MESSAGE_TYPES[kind])  # type: ignore[return-value]
    except msgspec.ValidationError as error:
        raise _protocol_error(error, kind) from None


def checked(message: Message) -> Message:
    """Validate a message built in code (types, constraints, cross-field rules) the way the
    other side will; returns it, or raises ProtocolError."""
    return parse(message.to_dict())


def to_json(message: Message) -> bytes:
    """The JSON text of a valid message (checked first: msgspec would write NaN as null)."""
    return msgspec.json.encode(checked(message))

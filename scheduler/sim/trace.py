"""Reading job traces and team quotas from CSV.

Two trace layouts are understood, chosen by the header:

- the Philly layout of ``../shared/traces/philly/jobs.csv``:
  ``job_id,submit_s,duration_s,gpus,tenant`` (optionally ``user`` and ``mig_profile``);
- the Tiresias toy layout (``job_id,num_gpu,submit_time,...,duration``), which has no team:
  every job goes to ``default_tenant``.

Reading files is I/O, so this module is for the simulator's shell only; the event loop works
on the ``TraceJob`` values it returns.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PHILLY_COLUMNS = ("job_id", "submit_s", "duration_s", "gpus", "tenant")
TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")
QUOTA_COLUMNS = ("vc", "node num")


class TraceError(ValueError):
    """A trace or quota file the simulator cannot use; the message names the row and field."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: a rigid gang of ``gpus`` slices that runs ``duration_s``."""

    id: str
    tenant: str
    gpus: int
    submit_s: float
    duration_s: float
    user: str = ""  # empty: the simulator uses one user per team
    mig_profile: str = ""  # empty: whole GPUs; else ``gpus`` MIG instances of this profile


def load_trace(
    path: str | Path, *, default_tenant: str = "default", limit: int | None = None
) -> list[TraceJob]:
    """Read a trace file, sorted by submit time (ties keep file order)."""
    with open(path, newline="", encoding="utf-8") as handle:
        return parse_trace(csv.DictReader(handle), default_tenant=default_tenant, limit=limit)


def parse_trace(
    rows: Iterable[Mapping[str, str]], *, default_tenant: str = "default", limit: int | None = None
) -> list[TraceJob]:
    if limit is not None and limit < 1:
        raise TraceError(f"limit-jobs must be a positive number of jobs, got {limit}")
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        if line == 2:
            _check_header(row.keys())
        job = _parse_row(row, line, default_tenant)
        if job.id in seen:
            raise TraceError(f"line {line}: job_id {job.id!r} appears twice")
        seen.add(job.id)
        jobs.append(job)
        if limit is not None and len(jobs) >= limit:
            break
    if not jobs:
        raise TraceError("the trace has no jobs")
    jobs.sort(key=lambda job: job.submit_s)  # stable: simultaneous jobs keep file order
    return jobs


def _check_header(columns: Iterable[str]) -> None:
    present = set(columns)
    if set(PHILLY_COLUMNS) <= present or set(TIRESIAS_COLUMNS) <= present:
        return
    raise TraceError(
        f"the trace header must hold {','.join(PHILLY_COLUMNS)} (Philly layout) or "
        f"{','.join(TIRESIAS_COLUMNS)} (Tiresias layout); found {','.join(sorted(present))}"
    )


def _parse_row(row: Mapping[str, str], line: int, default_tenant: str) -> TraceJob:
    philly = "submit_s" in row
    gpus = _number(row, "gpus" if philly else "num_gpu", line)
    if gpus < 1 or gpus != int(gpus):
        raise TraceError(f"line {line}: gpus must be a whole number >= 1, got {gpus:g}")
    duration = _number(row, "duration_s" if philly else "duration", line)
    if duration < 0:
        raise TraceError(f"line {line}: duration must be >= 0 seconds, got {duration:g}")
    tenant = (row.get("tenant") or "").strip() or default_tenant
    job_id = (row.get("job_id") or "").strip()
    if not job_id:
        raise TraceError(f"line {line}: job_id is empty")
    return TraceJob(
        id=job_id,
        tenant=tenant,
        gpus=int(gpus),
        submit_s=_number(row, "submit_s" if philly else "submit_time", line),
        duration_s=duration,
        user=(row.get("user") or "").strip(),
        mig_profile=(row.get("mig_profile") or "").strip(),
    )


def _number(row: Mapping[str, str], column: str, line: int) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"line {line}: {column} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(f"line {line}: {column} must be finite, got {text!r}")
    return value


def load_quotas(path: str | Path) -> dict[str, float]:
    """Read ``vc,node num`` rows: each team's quota in nodes (weight and guarantee)."""
    with open(path, newline="", encoding="utf-8") as handle:
        return parse_quotas(list(csv.DictReader(handle)))


def parse_quotas(rows: Sequence[Mapping[str, str]]) -> dict[str, float]:
    quotas: dict[str, float] = {}
    for line, row in enumerate(rows, start=2):
        if line == 2 and not set(QUOTA_COLUMNS) <= set(row.keys()):
            raise TraceError(
                f"the quota header must hold {','.join(QUOTA_COLUMNS)}; "
                f"found {','.join(sorted(row.keys()))}"
            )
        team = (row.get("vc") or "").strip()
        if not team:
            raise TraceError(f"quota line {line}: vc is empty")
        nodes = _number(row, "node num", line)
        if nodes <= 0:
            raise TraceError(f"quota line {line}: node num must be > 0, got {nodes:g}")
        if team in quotas:
            raise TraceError(f"quota line {line}: team {team!r} appears twice")
        quotas[team] = nodes
    return quotas

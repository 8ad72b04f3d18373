"""A short chaos run (20 faults, fixed seed) must pass every check of the harness.

It starts its own PostgreSQL (as the postgres user, so it needs root) and Redis and the whole
portal as subprocesses, through `python -m tests.chaos`, and judges what really ran against
the database: no job lost, none run twice, no slice double-booked, logs whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from services import require_service

from .backing import why_not_runnable

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).absolute().parents[2]
FAULTS = 20
SEED = 7
BUDGET_S = 600


@pytest.mark.timeout(BUDGET_S + 60)
def test_a_short_chaos_run_loses_no_job_and_runs_none_twice(tmp_path: Path) -> None:
    reason = why_not_runnable()
    if reason:
        require_service(f"the chaos harness ({reason})")
    out = tmp_path / "chaos.json"
    argv = [
        sys.executable, "-m", "tests.chaos", "--faults", str(FAULTS), "--seed", str(SEED),
        "--agents", "3", "--jobs", "24", "--settle-timeout", "180", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(  # noqa: S603 - our own argv
        argv, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=BUDGET_S
    )
    report = done.stdout[-12000:] + done.stderr[-4000:]
    assert out.exists(), f"no results file; harness output:\n{report}"
    results = json.loads(out.read_text())

    injected = [fault for fault in results["faults"] if fault["injected_at"] is not None]
    assert len(injected) == FAULTS, report
    failed = [f"{c['name']}: {c['summary']}" for c in results["checks"] if c["passed"] is False]
    assert not failed, "\n".join(failed) + f"\n\nharness output:\n{report}"
    assert done.returncode == 0, report

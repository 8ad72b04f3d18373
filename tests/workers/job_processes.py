"""Helpers for the tests that run real jobs through the process launcher and its shim."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.launchers.process import ProcessLauncher, ProcessRun
from workers.outbox import AttemptJournal
from workers.supervisor import Supervisor

TESTS_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS_DIR.parent.parent
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="job uids and network namespaces need a root agent (CI runs as root)"
)


def others_may_run(program: str) -> bool:
    """Whether a uid other than ours may execute `program` (every directory on its path, the
    link's and the target's, must let others through)."""
    for path in {Path(program).absolute(), Path(os.path.realpath(program))}:
        for directory in path.parents:
            if not directory.stat().st_mode & stat.S_IXOTH:
                return False
    return bool(os.stat(program).st_mode & stat.S_IXOTH)


def python_for_job_uids() -> tuple[str, dict[str, str]]:
    """An interpreter a job uid may run, and the env that gives it this project's packages
    (the venv's interpreter may live under a private home, /root/.pyenv for example)."""
    if others_may_run(sys.executable):
        return sys.executable, {}
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None or not others_may_run(system):
        pytest.skip("no python interpreter that other users may run")
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    return system, {"PYTHONPATH": site}


@contextlib.contextmanager
def scratch_dir_others_may_enter() -> Iterator[Path]:
    """A scratch directory other users may pass through (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="portal-jobs-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def launcher(workdir: Path, **options: Any) -> ProcessLauncher:
    """A process launcher working in `workdir` (its MPS root inside it unless given)."""
    options.setdefault("mps_root", workdir / "mps")
    return ProcessLauncher(workdir=workdir, **options)


def supervisor_for(
    jobs: ProcessLauncher,
    report: Callable[[Any], object],
    journal: Path,
    *,
    node: str = "node-t",
    kill_grace_s: float = 1.0,
) -> Supervisor:
    """A supervisor over `jobs` whose reports go to `report` (a RecordingSender)."""
    return Supervisor(
        node=node,
        launcher=jobs,
        report=lambda message: report(message) or True,
        journal=AttemptJournal(journal),
        kill_grace_s=kill_grace_s,
    )


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def eventually(check: Callable[[], bool], *, within: float) -> float:
    """Seconds until `check()` held; fails after `within` seconds."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > within:
            raise AssertionError(f"not true within {within}s")
        time.sleep(0.02)
    return time.monotonic() - began


def first_line(run: ProcessRun) -> str:
    text = b""
    for data in run.output():
        text += data
        if b"\n" in text:
            break
    return text.decode().split("\n", 1)[0]


# A stand-in for the agent: a separate process that starts one job through the launcher,
# prints what the test needs, then idles until the test kills or freezes it.
AGENT_SCRIPT = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from agent_doubles import make_launch
from workers.launchers.process import ProcessLauncher

spec = json.loads(sys.argv[1])
launcher = ProcessLauncher(
    workdir=Path(spec["workdir"]),
    mps_root=Path(spec["workdir"]) / "mps",
    lease_path=Path(spec["lease"]) if spec["lease"] else None,
    fence_grace_s=spec["fence_grace_s"],
    job_uids=tuple(spec["uids"]) if spec["uids"] else None,
    network=spec["network"],
)
run = launcher.start(make_launch(spec["command"], env=spec["env"]))
text, output = b"", run.output()
while b"\\n" not in text:
    text += next(output)
print(json.dumps({{"pgid": run.pid, "line": text.decode().strip(),
                  "attempt_dir": str(run.attempt_dir)}}), flush=True)
time.sleep(300)
"""


def start_agent(
    *,
    workdir: Path,
    command: list[str],
    lease: Path | None = None,
    uids: tuple[int, int] | None = None,
    network: str = "host",
    fence_grace_s: float = 2.0,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    spec = {
        "workdir": str(workdir),
        "lease": str(lease) if lease else "",
        "uids": list(uids) if uids else None,
        "network": network,
        "fence_grace_s": fence_grace_s,
        "command": command,
        "env": env or {},
    }
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT_SCRIPT.format(tests=str(TESTS_DIR)), json.dumps(spec)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    line = agent.stdout.readline()
    if not line:
        agent.wait()
        raise AssertionError(f"the stand-in agent failed (exit code {agent.returncode})")
    return agent, json.loads(line)

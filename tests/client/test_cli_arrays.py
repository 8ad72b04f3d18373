"""`gpu-portal submit` making a job array (--array-count, --array-values, --max-running), in a
subprocess against Django's live server, and the client's array methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_runner import Cli
from portal_client import PortalClient, ValidationError

from portal.jobs.models import Job, JobArray, JobState
from portal.jobs.testing import World
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.usefixtures("transactional_db")

FLAGS = ("--team", "vision", "--image", "python:3.11-slim", "--gpu", "whole")


@pytest.fixture(autouse=True)
def no_scheduling_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker here: a submit's pass is dropped."""
    monkeypatch.setattr("portal.passes.request_schedule_pass", lambda: None)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def cli(live_server: Any, world: World, tmp_path: Path) -> Cli:
    return Cli(live_server.url, token_issue(user=world.alice), tmp_path / "gpu-portal" / "c.json")


def test_submit_with_array_values_makes_the_sweep_and_prints_the_array(cli: Cli) -> None:
    done = cli(
        "submit", *FLAGS, "--name", "sweep", "--array-values", "lr=0.1,0.01",
        "--array-values", "bs=32,64", "--max-running", "2", "--", "python3", "train.py",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    array = JobArray.objects.get()
    jobs = list(Job.objects.filter(array=array).order_by("array_index"))
    assert done.stdout == (
        f"submitted array {array.pk} 'sweep' to team vision: 4 jobs "
        f"{jobs[0].pk}..{jobs[-1].pk}, at most 2 at once\n"
    )
    assert (array.size, array.max_running) == (4, 2)
    assert [job.env for job in jobs] == [
        {"lr": "0.1", "bs": "32"},
        {"lr": "0.1", "bs": "64"},
        {"lr": "0.01", "bs": "32"},
        {"lr": "0.01", "bs": "64"},
    ]


def test_submit_with_array_count_quiet_prints_the_array_id(cli: Cli) -> None:
    done = cli("submit", "-q", *FLAGS, "--array-count", "3", "--", "python3", "train.py")
    assert done.returncode == 0, done.stderr
    array = JobArray.objects.get()
    assert done.stdout == f"{array.pk}\n"
    assert array.jobs.count() == 3


def test_array_flags_that_cannot_work_are_usage_errors(cli: Cli) -> None:
    alone = cli("submit", *FLAGS, "--max-running", "2", "--", "python3", "train.py")
    assert alone.returncode == 2
    assert "--max-running is for a job array" in alone.stderr
    bad = cli("submit", *FLAGS, "--array-values", "lr", "--", "python3", "train.py")
    assert bad.returncode == 2
    assert "'lr' is not NAME=V1,V2,..." in bad.stderr
    waiting = cli("submit", *FLAGS, "--array-count", "2", "--wait", "--", "python3", "x.py")
    assert waiting.returncode == 2
    assert JobArray.objects.count() == 0


def test_a_spec_the_portal_refuses_exits_3_naming_the_field(cli: Cli) -> None:
    done = cli("submit", *FLAGS, "--array-count", "5000", "--", "python3", "train.py")
    assert done.returncode == 3
    assert "array.count" in done.stderr and "from 1 to 1000" in done.stderr


def test_the_client_submits_reads_cancels_and_resubmits_an_array(
    live_server: Any, world: World
) -> None:
    with PortalClient(live_server.url, token_issue(user=world.alice)) as portal:
        request = {
            "name": "sweep",
            "team": "vision",
            "image": "python:3.11-slim",
            "command": ["python3", "train.py"],
            "gpu": {"kind": "whole"},
        }
        made = portal.submit_array({"count": 3, "max_running": 1}, **request)  # type: ignore[arg-type]
        assert made["size"] == 3 and len(made["job_ids"]) == 3
        with pytest.raises(TypeError):
            portal.submit(**request, array={"count": 2})  # type: ignore[call-arg]
        with pytest.raises(ValidationError) as refused:
            portal.submit_array({"count": 0}, **request)  # type: ignore[arg-type]
        assert "array.count" in refused.value.errors

        Job.objects.filter(pk=made["job_ids"][0]).update(state=JobState.FAILED)
        again = portal.resubmit_failed(made["id"])
        assert [r["index"] for r in again["resubmitted"]] == [0]
        cancelled = portal.cancel_array(made["id"])
        assert len(cancelled["cancelled"]) == 3
        assert portal.array(made["id"])["counts"]["CANCELLED"] == 3

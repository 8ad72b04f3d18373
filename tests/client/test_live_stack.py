"""The client and `gpu-portal` on real jobs: the whole portal (web server, control-plane
worker, beat, one agent) as subprocesses (tests/stack.py), jobs run by the agent."""

from __future__ import annotations

import io
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Cli
from django.contrib.auth import get_user_model
from django.core.management import call_command
from portal_client import PortalClient, PortalUnavailable
from stack import PortalStack

from portal.tenants.tokens import token_issue

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JOB_TIMEOUT_S = 90.0
# Prints a line every 0.4 s, so a follower sees the log grow while the job runs.
COUNTDOWN = [
    "python3",
    "-c",
    "import time\nfor n in range(6):\n    print('step', n, flush=True)\n    time.sleep(0.4)\n",
]
STEPS = [f"step {n}" for n in range(6)]


def steps(log: str) -> list[str]:
    """The job's own lines (the process launcher adds a line of its own about the image)."""
    return [line for line in log.splitlines() if line.startswith("step ")]


def alice_token() -> str:
    return token_issue(user=get_user_model().objects.get(username="alice"))


def test_the_client_runs_a_job_shows_progress_follows_its_log_and_resubmits_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("seed_demo", stdout=io.StringIO())
    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        portal = PortalClient(stack.url, alice_token(), retries=1, backoff=0.05)
        request: dict[str, Any] = {
            "team": "vision",
            "image": "python:3.11-slim",
            "gpu": {"kind": "mps", "count": 1},
        }
        countdown = portal.submit(name="countdown", command=COUNTDOWN, **request)
        # Waits for the countdown to succeed: the scheduler says so while it waits.
        after = portal.submit(
            name="after",
            command=["python3", "-c", "print('after')"],
            depends_on=[{"job": countdown.id, "kind": "after_ok"}],
            **request,
        )
        followed = io.StringIO()
        follower = threading.Thread(
            target=lambda: countdown.logs(follow=True, file=followed, poll=0.2), daemon=True
        )
        follower.start()

        done = after.wait(timeout=JOB_TIMEOUT_S, poll=0.2)
        follower.join(JOB_TIMEOUT_S)

        assert (done.state, done.exit_code) == ("SUCCEEDED", 0), portal.log(after.id)
        assert not follower.is_alive()
        assert followed.getvalue() == portal.log(countdown.id)
        assert steps(followed.getvalue()) == STEPS
        assert countdown.state == "SUCCEEDED"  # logs(follow=True) refreshed it at the end
        shown = capsys.readouterr().err
        assert f"job {after.id} PENDING · DEPENDENCY · " in shown
        assert f"job {after.id} SUCCEEDED · exit 0 · elapsed" in shown

        again = countdown.resubmit().wait(timeout=JOB_TIMEOUT_S, progress=False)

        assert (again.state, steps(again.logs())) == ("SUCCEEDED", STEPS)
        assert again.id not in (countdown.id, after.id)
        assert again.slice is not None and "mps" in again.slice

    with pytest.raises(PortalUnavailable) as stopped:  # the stack's web server is gone
        portal.job(countdown.id)
    assert stopped.value.url == f"{stack.url.rstrip('/')}/api/v1/jobs/{countdown.id}/"


def test_the_cli_runs_jobs_follows_their_logs_and_exits_by_their_result(tmp_path: Path) -> None:
    call_command("seed_demo", stdout=io.StringIO())
    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        cli = Cli(stack.url, alice_token(), tmp_path / "config" / "gpu-portal.json")
        logged_in = cli("login", "--url", stack.url, stdin=cli.token + "\n", logged_in=False)
        assert logged_in.returncode == 0, logged_in.stderr

        submitted = cli("submit", "-q", "--team", "vision", "--image", "python:3.11-slim",
                        "--gpu", "mps", "--name", "countdown", "--", *COUNTDOWN, logged_in=False)  # fmt: skip
        followed = cli("logs", "-f", logged_in=False)  # the job submitted last

        assert submitted.returncode == 0, submitted.stderr
        job_id = int(submitted.stdout)
        assert followed.returncode == 0, followed.stderr
        assert steps(followed.stdout) == STEPS
        assert cli("wait", str(job_id), logged_in=False).returncode == 0

        failing = cli("submit", "--wait", "--team", "vision", "--image", "python:3.11-slim",
                      "--gpu", "whole", "--name", "fails", "--",
                      "python3", "-c", "import sys; print('bad input'); sys.exit(3)")  # fmt: skip
        failed_id = int(failing.stdout.split()[2])
        failed_log = cli("logs", "-f", str(failed_id))

        assert failing.returncode == 1, failing.stderr
        assert f"job {failed_id} FAILED · exit 3" in failing.stdout
        assert failed_log.returncode == 1
        assert failed_log.stdout.endswith("bad input\n")
        assert cli("wait", str(failed_id)).returncode == 1

        watching = cli.start("ls", "--watch", "0.5")
        time.sleep(2.0)  # a few rounds
        watching.send_signal(signal.SIGINT)
        out, err = watching.communicate(timeout=30)

        assert watching.returncode == 0, err
        assert out.count("every 0.5 s; Ctrl-C ends") >= 2
        assert re.search(rf"^{failed_id} +fails +vision +alice +FAILED ", out, re.MULTILINE)
        assert re.search(rf"^{job_id} +countdown +vision +alice +SUCCEEDED ", out, re.MULTILINE)

"""From a clone to a job's output, as the issue's "done means" says: `pip install
./clients/python` into a clean venv (no Django, nothing of the server), then the README's
commands, `gpu-portal login` and `gpu-portal submit ... && gpu-portal logs -f`, against a live
portal (tests/stack.py). The install uses no index: the dependency wheels come from the
folder scripts/client-wheelhouse.sh fills (`make install` does; this test too, when missing)."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from cli_runner import Cli
from django.contrib.auth import get_user_model
from django.core.management import call_command
from stack import PortalStack

from portal.jobs.models import Job
from portal.tenants.tokens import token_issue

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".var" / "client-wheelhouse"
README_URL = "http://127.0.0.1:8000/"
SERVER_MODULES = ("django", "rest_framework", "celery", "psycopg", "redis", "portal", "workers")


def readme_commands() -> list[str]:
    """The README's `gpu-portal` block, one command a line, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    (block,) = [block for block in blocks if block.startswith("gpu-portal login")]
    return [shlex.join(shlex.split(line, comments=True)) for line in block.splitlines()]


def clean_venv(tmp_path: Path) -> Path:
    """A new venv with the client installed from a copy of clients/python, offline."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "client-wheelhouse.sh"), str(WHEELHOUSE)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PY": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    source = tmp_path / "clone" / "clients" / "python"
    shutil.copytree(
        ROOT / "clients" / "python",
        source,
        ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"),
    )
    home = tmp_path / "clean-venv"
    # No pip of its own (ensurepip is most of a venv's making): this venv's pip installs
    # into it (`pip --python`), as the venv's own would.
    venv.create(home, with_pip=False, clear=True)
    pip = [sys.executable, "-m", "pip", "--python", str(home / "bin" / "python"), "install"]
    done = subprocess.run(
        [*pip, "--disable-pip-version-check", "--quiet", "--no-index", "--find-links",
         str(WHEELHOUSE), "./clients/python"],  # as the README says, from the clone
        capture_output=True, text=True, timeout=600, cwd=source.parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return home


def test_a_clean_venv_installs_the_client_and_runs_the_readme_commands(tmp_path: Path) -> None:
    home = clean_venv(tmp_path)
    python, gpu_portal = home / "bin" / "python", home / "bin" / "gpu-portal"
    probe = (
        "import importlib.util, json, portal_client; "
        f"print(json.dumps([portal_client.__file__, [m for m in {SERVER_MODULES!r} "
        "if importlib.util.find_spec(m)]]))"
    )
    where = subprocess.run(
        [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(f'["{home}/lib/')  # the venv's copy, not the checkout
    assert where.stdout.strip().endswith("[]]")  # no server package reachable at all
    login, submit, follow, _watch = readme_commands()
    assert (login.split()[:2], follow) == (["gpu-portal", "login"], "gpu-portal logs -f")

    call_command("seed_demo", stdout=io.StringIO())
    alice = get_user_model().objects.get(username="alice")
    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        cli = Cli(stack.url, token_issue(user=alice), tmp_path / "cfg" / "config.json", gpu_portal)
        env = {
            **cli.environment(logged_in=False),  # no PORTAL_URL / PORTAL_TOKEN: the login's
            "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}",
        }
        # The token pasted at the prompt; the README's URL is the live portal's here.
        logged_in = subprocess.run(
            ["bash", "-c", login.replace(README_URL, stack.url)],
            input=cli.token + "\n", capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        ran = subprocess.run(
            ["bash", "-c", f"{submit} && {follow}"],
            capture_output=True, text=True, timeout=180, env=env,
        )  # fmt: skip
        listed = cli("ls", logged_in=False)

    assert logged_in.returncode == 0, logged_in.stderr
    assert "logged in to" in logged_in.stdout and "vision" in logged_in.stdout
    assert ran.returncode == 0, ran.stderr
    job = Job.objects.get(user=alice)
    assert (job.state, job.exit_code, job.team.name) == ("SUCCEEDED", 0, "vision")
    submitted, *followed = ran.stdout.splitlines()
    assert submitted.startswith(f"submitted job {job.id} 'python3' to team vision: ")
    assert followed[-1] == "hi", ran.stdout
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{job.id} +python3 +vision +alice +SUCCEEDED ", listed.stdout, re.M)

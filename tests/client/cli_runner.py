"""`Cli`: runs the installed `gpu-portal` command in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

GPU_PORTAL = Path(sys.executable).with_name("gpu-portal")


class Cli:
    """Runs ``gpu-portal`` (this venv's, or ``program``) with a config file of its own and,
    unless told otherwise, the portal's URL and a token in PORTAL_URL / PORTAL_TOKEN (nothing
    else of PORTAL_* leaks in)."""

    def __init__(self, url: str, token: str, config: Path, program: Path = GPU_PORTAL) -> None:
        self.url = url
        self.token = token
        self.config = config
        self.program = program

    def __call__(
        self, *args: str, stdin: str = "", logged_in: bool = True, **extra_env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.program), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.environment(logged_in=logged_in, **extra_env),
            timeout=120,
        )

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """The command running in the background (``ls --watch``), its output piped. Its
        SIGINT is the default, as a terminal's Ctrl-C finds it: a test run started in the
        background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and
        Python keeps an ignored SIGINT, so the test's Ctrl-C would never reach the CLI."""
        return subprocess.Popen(
            [str(self.program), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environment(logged_in=True),
            preexec_fn=_default_sigint,
        )

    def environment(self, *, logged_in: bool, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PORTAL_")}
        env["GPU_PORTAL_CONFIG"] = str(self.config)
        if logged_in:
            env.update(PORTAL_URL=self.url, PORTAL_TOKEN=self.token)
        env.update(extra)
        return env


def _default_sigint() -> None:
    """In the child, before exec: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

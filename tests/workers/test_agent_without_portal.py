"""The agent never loads the portal, even with DJANGO_SETTINGS_MODULE in its environment
(runportal's children inherit it): Celery's Django fixup would otherwise set Django up inside
the agent and register the portal's tasks on the agent's app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from workers.agent import make_celery_app
app = make_celery_app("memory://", "probe-node")
app.loader.import_default_modules()  # what a starting worker does: the fixup's hook
print(json.dumps({
    "tasks": sorted(name for name in app.tasks if not name.startswith("celery.")),
    "portal": sorted(m for m in sys.modules if m.startswith("portal")),
    "django_set_up": "django.apps" in sys.modules and sys.modules["django.apps"].apps.ready,
}))
"""


def test_the_agents_celery_app_sets_up_no_django(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PORTAL_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe == {"tasks": [], "portal": [], "django_set_up": False}

"""The client is a package of its own: it installs and imports without the server."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
SERVER_PACKAGES = ("django", "rest_framework", "celery", "kombu", "psycopg", "redis", "portal")
SERVER_PACKAGES += ("scheduler", "workers", "docker", "msgspec")


def test_the_client_and_its_cli_import_with_no_server_package_reachable() -> None:
    # Every server package refused at import, and the client taken from clients/python.
    probe = f"""
import json, sys
blocked = {SERVER_PACKAGES!r}
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError("the client imported " + name)
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, {str(CLIENT)!r})
import portal_client, portal_client.cli
portal_client.cli.build_parser().parse_args(["ls", "--json"])
loaded = sorted(name for name in sys.modules if name.split(".")[0] in blocked)
print(json.dumps({{"file": portal_client.__file__, "loaded": loaded}}))
"""
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["file"] == str(CLIENT / "portal_client" / "__init__.py")
    assert seen["loaded"] == []


def test_the_package_declares_no_server_dependency_and_the_gpu_portal_command() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]

    names = {
        requirement.split(">")[0].split("=")[0].strip() for requirement in project["dependencies"]
    }
    assert names == {"httpx", "tqdm", "PyYAML"}
    assert project["scripts"] == {"gpu-portal": "portal_client.cli:main"}
    assert project["name"] == "gpu-portal-client"


def test_the_installed_command_runs() -> None:
    command = Path(sys.executable).with_name("gpu-portal")

    done = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60)

    assert (done.returncode, done.stdout.strip()) == (0, "gpu-portal 0.2.0")

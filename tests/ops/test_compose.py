"""docker-compose.yml is a valid production shape, checked by Debian's docker-compose when present."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed")


def compose(*args: str) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    return subprocess.run(
        [
            COMPOSE,
            "--project-directory",
            str(PROJECT),
            "-f",
            str(PROJECT / "docker-compose.yml"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    result = compose("config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_docker_compose_config_accepts_the_file() -> None:
    result = compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_it_has_every_service_of_the_production_shape(config: dict[str, Any]) -> None:
    assert set(config["services"]) == {"postgres", "redis", "web", "worker", "beat", "agent"}


def test_the_agent_reserves_every_nvidia_gpu_and_uses_docker(config: dict[str, Any]) -> None:
    agent = config["services"]["agent"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert agent["environment"]["PORTAL_AGENT_LAUNCHER"] == "docker"
    assert "/var/run/docker.sock:/var/run/docker.sock" in str(agent["volumes"])
    assert "DATABASE_URL" not in agent["environment"]


def test_the_control_plane_talks_to_postgres_and_redis(config: dict[str, Any]) -> None:
    for name in ("web", "worker", "beat"):
        env = config["services"][name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://"), name
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
    assert "-Q control" in " ".join(config["services"]["worker"]["command"])
    assert "migrate" in " ".join(config["services"]["web"]["command"])


def test_every_variable_in_env_example_reaches_a_service() -> None:
    """A setting in .env.example that no service receives would silently do nothing."""
    text = (PROJECT / "docker-compose.yml").read_text()
    names = []
    for line in (PROJECT / ".env.example").read_text().splitlines():
        setting = line.removeprefix("# ").strip()
        name = setting.split("=", 1)[0]
        if "=" in setting and name.isupper() and " " not in name:
            names.append(name)
    assert len(names) > 20
    unused = [name for name in names if "${" + name not in text and f" {name}:" not in text]
    assert unused == []

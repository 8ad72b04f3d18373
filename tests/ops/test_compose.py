"""docker-compose.yml is a valid production shape, checked by Debian's docker-compose when
present, and read directly (with its ${...} defaults filled in) where it is not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")

needs_compose = pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed")


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


@needs_compose
def test_docker_compose_config_accepts_the_file() -> None:
    result = compose("config", "-q")
    assert result.returncode == 0, result.stderr


@needs_compose
def test_it_has_every_service_of_the_production_shape(config: dict[str, Any]) -> None:
    assert set(config["services"]) == {
        "postgres",
        "redis",
        "web",
        "worker",
        "lease",
        "beat",
        "agent",
        "watchdog",
    }


@needs_compose
def test_the_agent_reserves_every_nvidia_gpu_and_uses_docker(config: dict[str, Any]) -> None:
    agent = config["services"]["agent"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert agent["environment"]["PORTAL_AGENT_LAUNCHER"] == "docker"
    assert "/var/run/docker.sock:/var/run/docker.sock" in str(agent["volumes"])
    assert "DATABASE_URL" not in agent["environment"]


@needs_compose
def test_the_control_plane_talks_to_postgres_and_redis(config: dict[str, Any]) -> None:
    for name in ("web", "worker", "lease", "beat"):
        env = config["services"][name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://"), name
        assert env["REDIS_URL"].startswith("redis://:"), name
        assert env["REDIS_URL"].endswith("@redis:6379/0"), name
    assert "-Q control.lease,control" in " ".join(config["services"]["worker"]["command"])
    assert "-Q control.lease " in " ".join(config["services"]["lease"]["command"]) + " "
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


# --- read directly: the file as docker-compose fills it in with no .env ----------------------

_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?::(?P<op>[-?])(?P<default>[^}]*))?\}")
AGENT_COMPOSE = PROJECT / "docker-compose.agent.yml"


class MissingVariable(ValueError):
    """A ${NAME:?message} with NAME unset: docker-compose refuses the file with the message."""


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """docker-compose's ${NAME}, ${NAME:-default} and ${NAME:?error} (and $$ for a $)."""
    if isinstance(value, str):

        def fill(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            if match["op"] == "?" and not env.get(match["name"]):
                raise MissingVariable(f"{match['name']}: {match['default']}")
            return env.get(match["name"]) or (match["default"] or "")

        return _VARIABLE.sub(fill, value)
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    return value


def compose_file(
    env: dict[str, str] | None = None, path: Path = PROJECT / "docker-compose.yml"
) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text())
    return interpolate(raw, env or {})


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container gets it: a name without a value is passed
    only when set in .env or the shell, and here neither is."""
    return {key: str(value) for key, value in service["environment"].items() if value is not None}


def test_redis_requires_a_password_and_every_url_carries_it() -> None:
    services = compose_file({"REDIS_PASSWORD": "s3cret-pw"})["services"]
    redis_command = " ".join(services["redis"]["command"])
    assert '--requirepass "$REDIS_PASSWORD"' in redis_command
    assert 'if [ -z "$REDIS_PASSWORD" ]' in redis_command  # no password: it does not start
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == "s3cret-pw"
    assert "REDISCLI_AUTH" in " ".join(services["redis"]["healthcheck"]["test"])
    for name in ("web", "worker", "beat"):
        assert services[name]["environment"]["REDIS_URL"] == "redis://:s3cret-pw@redis:6379/0"
    assert services["agent"]["environment"]["PORTAL_BROKER_URL"] == (
        "redis://:s3cret-pw@redis:6379/0"
    )


def test_redis_urls_switch_to_tls_with_the_documented_variables() -> None:
    env = {
        "REDIS_PASSWORD": "pw",
        "REDIS_SCHEME": "rediss",
        "REDIS_PORT": "6380",
        "REDIS_URL_OPTIONS": "?ssl_cert_reqs=required&ssl_ca_certs=/tls/ca.crt",
    }
    services = compose_file(env)["services"]
    expected = "rediss://:pw@redis:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/tls/ca.crt"
    assert services["web"]["environment"]["REDIS_URL"] == expected
    assert services["agent"]["environment"]["PORTAL_BROKER_URL"] == expected
    for name in ("REDIS_PASSWORD=", "# REDIS_SCHEME=rediss", "# REDIS_URL_OPTIONS="):
        assert name in (PROJECT / ".env.example").read_text()


def test_job_containers_get_no_network_and_the_agent_no_database() -> None:
    agent = compose_file()["services"]["agent"]
    assert agent["environment"]["PORTAL_AGENT_DOCKER_NETWORK"] == "none"
    assert "DATABASE_URL" not in agent["environment"]


def test_the_agent_gets_its_node_key_from_env_and_nothing_else_holds_it() -> None:
    services = compose_file()["services"]
    # Passed through from .env (no default: the agent refuses to start without one).
    assert "PORTAL_AGENT_KEY" in services["agent"]["environment"]
    assert services["agent"]["environment"]["PORTAL_AGENT_KEY"] is None
    others = [name for name, service in services.items() if name != "agent"]
    assert [n for n in others if "PORTAL_AGENT_KEY" in str(services[n])] == []


@pytest.mark.parametrize("env", [{}, {"PORTAL_AGENT_NODE": "gpu-host-7"}])
def test_a_watchdog_service_guards_the_agents_containers_and_starts_first(
    env: dict[str, str],
) -> None:
    """The agent's containers must stop once its lease lapses even when the agent's own
    container was killed (every process in it dies): the watchdog runs beside it, as root,
    on the same image, work directory, node and Docker engine, and never stands down."""
    services = compose_file(env)["services"]
    agent, watchdog = services["agent"], services["watchdog"]
    node = agent["environment"]["PORTAL_AGENT_NODE"]
    assert node == env.get("PORTAL_AGENT_NODE", "gpu-host-1")
    assert (watchdog["image"], watchdog["build"]) == (agent["image"], agent["build"])
    assert (watchdog["user"], watchdog["restart"]) == ("root", "unless-stopped")
    assert watchdog["volumes"] == agent["volumes"]
    assert watchdog["command"] == [
        "python",
        "-m",
        "workers.watchdog",
        f"--workdir={agent['environment']['PORTAL_AGENT_WORKDIR']}",
        f"--node={node}",
        "--stay",
    ]
    # It needs neither the broker nor the database: it must keep working when they are away.
    assert "environment" not in watchdog and "depends_on" not in watchdog
    # Healthy once it holds the watchdog lock; the agent waits for that, so the agent finds
    # it running instead of starting a watchdog that would die with the agent's container.
    assert "watchdog.pid" in " ".join(watchdog["healthcheck"]["test"])
    assert agent["depends_on"]["watchdog"] == {"condition": "service_healthy"}


def test_the_portal_services_run_as_production() -> None:
    for name in ("web", "worker", "beat"):
        env = compose_file()["services"][name]["environment"]
        assert env["PORTAL_DEPLOYMENT"] == "production", name


def test_check_deploy_is_clean_with_the_web_services_environment(tmp_path: Path) -> None:
    """`manage.py check --deploy` with exactly what the web container gets, plus the two
    secrets an operator must put in .env."""
    secrets = {"PORTAL_SECRET_KEY": "throwaway-" + "x1y2z3" * 10, "REDIS_PASSWORD": "pw"}
    web = service_env(compose_file(secrets)["services"]["web"])
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PORTAL_", "DATABASE_URL", "REDIS_URL", "DJANGO_"))
    }
    # The image's own ENV (Dockerfile) sets the var dir; here a temporary one stands in.
    env = {**inherited, **web, "PORTAL_VAR_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_the_web_service_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    web = service_env(compose_file({"REDIS_PASSWORD": "pw"})["services"]["web"])
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_"))}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        env={**inherited, **web, "PORTAL_VAR_DIR": str(tmp_path)},
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("portal: configuration error: PORTAL_SECRET_KEY is not set")


def test_the_agent_has_what_mps_needs_and_says_why() -> None:
    """The MPS daemons the agent starts must share the host IPC namespace with the job
    containers (ipc_mode=host), and their pipe directories must sit at the same path inside
    and outside, under a volume the job containers can mount from the host."""
    agent = compose_file()["services"]["agent"]
    assert agent["ipc"] == "host" and agent["init"] is True
    root = agent["environment"]["PORTAL_AGENT_MPS_ROOT"]
    same_path = [v.split(":")[0] for v in agent["volumes"] if v.split(":")[0] == v.split(":")[1]]
    assert any(root.startswith(path + "/") for path in same_path)
    text = (PROJECT / "docker-compose.yml").read_text()
    assert "hand their work to through shared memory" in text  # the why, next to ipc: host


# --- the agent alone, for one more GPU host (docker-compose.agent.yml) ------------------------

AGENT_HOST_ENV = {"PORTAL_BROKER_URL": "rediss://:pw@portal.example.org:6380/0",
                  "PORTAL_AGENT_NODE": "gpu-host-2"}  # fmt: skip


def test_the_agent_only_compose_file_runs_the_agent_and_names_no_database() -> None:
    config = compose_file(AGENT_HOST_ENV, AGENT_COMPOSE)
    services = config["services"]
    assert set(services) == {"agent", "watchdog"}
    agent = services["agent"]
    assert agent["environment"]["PORTAL_BROKER_URL"] == AGENT_HOST_ENV["PORTAL_BROKER_URL"]
    assert agent["environment"]["PORTAL_AGENT_NODE"] == "gpu-host-2"
    assert "--node=gpu-host-2" in services["watchdog"]["command"]
    # Nothing in it names a database, its URL, its port, or the portal's secrets.
    as_text = str(config).lower()
    for word in ("postgres", "database_url", "5432", "portal_secret_key", "redis_url"):
        assert word not in as_text, word
    assert set(agent["depends_on"]) == {"watchdog"}
    assert "ports" not in agent and "ports" not in services["watchdog"]


@pytest.mark.parametrize("name", ["PORTAL_BROKER_URL", "PORTAL_AGENT_NODE"])
def test_the_agent_only_compose_file_refuses_to_start_without_broker_or_node(name: str) -> None:
    env = {key: value for key, value in AGENT_HOST_ENV.items() if key != name}
    with pytest.raises(MissingVariable, match=f"^{name}: set {name} to"):
        compose_file(env, AGENT_COMPOSE)


def test_the_agent_only_services_are_the_production_files_agent_and_watchdog() -> None:
    """The same agent and watchdog as docker-compose.yml, but the broker: a URL, not the
    `redis` service of that file (which is not there)."""
    env = {**AGENT_HOST_ENV, "REDIS_PASSWORD": "pw"}
    alone = compose_file(env, AGENT_COMPOSE)["services"]
    full = compose_file(env)["services"]
    assert alone["watchdog"] == full["watchdog"]
    agent, production = alone["agent"], full["agent"]
    assert {k: v for k, v in agent.items() if k not in ("environment", "depends_on")} == {
        k: v for k, v in production.items() if k not in ("environment", "depends_on")
    }
    differ = {k for k in production["environment"] if agent["environment"].get(k, "-") !=
              production["environment"][k]}  # fmt: skip
    assert differ == {"PORTAL_BROKER_URL"}
    assert set(agent["environment"]) == set(production["environment"])
    assert production["depends_on"] == {
        **agent["depends_on"],
        "redis": {"condition": "service_healthy"},
    }


@needs_compose
def test_docker_compose_config_accepts_the_agent_only_file() -> None:
    assert COMPOSE is not None
    result = subprocess.run(
        [COMPOSE, "--project-directory", str(PROJECT), "-f", str(AGENT_COMPOSE), "config", "-q"],
        capture_output=True, text=True, timeout=60, cwd=PROJECT,
        env={**os.environ, **AGENT_HOST_ENV},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr

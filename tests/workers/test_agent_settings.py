"""Agent settings from the environment, the start-up errors, and the MPS directories."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from workers.agent import main
from workers.inventory import discover
from workers.mps import prepare_mps
from workers.settings import AgentSettings, SettingsError


def test_defaults_use_the_hostname_the_embedded_broker_and_the_process_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = AgentSettings.from_env({})
    node = socket.gethostname().split(".")[0]
    assert settings.node == node
    assert settings.broker_url == f"redis+socket://{tmp_path / '.var' / 'redis.sock'}"
    assert settings.launcher == "process"
    assert settings.heartbeat_s == 5.0
    assert settings.workdir == tmp_path / ".var" / "agent" / node
    assert settings.mps_root == tmp_path / ".var" / "agent" / node / "mps"
    assert settings.gpu_source == "auto"


def test_the_broker_comes_from_portal_broker_url_before_redis_url() -> None:
    both = {"PORTAL_BROKER_URL": "redis+socket:///run/r.sock", "REDIS_URL": "redis://h:6379/0"}
    assert AgentSettings.from_env(both).broker_url == "redis+socket:///run/r.sock"
    assert (
        AgentSettings.from_env({"REDIS_URL": "redis://h:6379/0"}).broker_url == "redis://h:6379/0"
    )


def test_explicit_values_are_used(tmp_path: Path) -> None:
    settings = AgentSettings.from_env(
        {
            "PORTAL_AGENT_NODE": "gpu-host-3",
            "PORTAL_AGENT_HEARTBEAT_S": "2.5",
            "PORTAL_AGENT_LAUNCHER": "docker",
            "PORTAL_AGENT_WORKDIR": str(tmp_path / "w"),
            "PORTAL_AGENT_MPS_ROOT": str(tmp_path / "m"),
            "PORTAL_AGENT_GPU_SOURCE": "described",
            "PORTAL_AGENT_KILL_GRACE_S": "30",
            "PORTAL_AGENT_CONCURRENCY": "2",
            "REDIS_URL": "redis://127.0.0.1:6379/7",
        }
    )
    assert (settings.node, settings.heartbeat_s, settings.launcher) == ("gpu-host-3", 2.5, "docker")
    assert (settings.workdir, settings.mps_root) == (tmp_path / "w", tmp_path / "m")
    assert (settings.gpu_source, settings.kill_grace_s, settings.concurrency) == (
        "described",
        30.0,
        2,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"PORTAL_AGENT_LAUNCHER": "k8s"},
            "PORTAL_AGENT_LAUNCHER: must be one of process, docker; got 'k8s'",
        ),
        (
            {"PORTAL_AGENT_GPU_SOURCE": "cuda"},
            "PORTAL_AGENT_GPU_SOURCE: must be one of auto, nvml, described; got 'cuda'",
        ),
        (
            {"PORTAL_AGENT_HEARTBEAT_S": "fast"},
            "PORTAL_AGENT_HEARTBEAT_S: must be a positive number of seconds; got 'fast'",
        ),
        (
            {"PORTAL_AGENT_HEARTBEAT_S": "0"},
            "PORTAL_AGENT_HEARTBEAT_S: must be a positive number of seconds; got '0'",
        ),
        (
            {"PORTAL_AGENT_KILL_GRACE_S": "nan"},
            "PORTAL_AGENT_KILL_GRACE_S: must be a positive number of seconds",
        ),
        (
            {"PORTAL_AGENT_CONCURRENCY": "1.5"},
            "PORTAL_AGENT_CONCURRENCY: must be a positive whole number; got '1.5'",
        ),
        ({"PORTAL_AGENT_NODE": "gpu host"}, "PORTAL_AGENT_NODE: 'gpu host' is not a node name"),
        (
            {"PORTAL_BROKER_URL": "amqp://guest@rabbit//"},
            "PORTAL_BROKER_URL: unsupported scheme 'amqp'; expected redis://",
        ),
    ],
)
def test_a_bad_variable_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env(env)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORTAL_AGENT_LAUNCHER": "k8s"}, "agent: PORTAL_AGENT_LAUNCHER: must be one of"),
        (
            {"PORTAL_AGENT_GPU_SOURCE": "described", "PORTAL_AGENT_INVENTORY": '{"gpus": 3}'},
            "agent: PORTAL_AGENT_INVENTORY: gpus: must be a non-empty list",
        ),
    ],
)
def test_the_agent_exits_with_code_2_and_one_line_on_bad_settings(
    env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(env) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_described_mps_gpus_get_their_pipe_and_log_directories_and_no_daemon(
    tmp_path: Path,
) -> None:
    calls: list[Any] = []
    inventory = discover("node-m", source="described")
    daemons = prepare_mps(
        inventory,
        tmp_path,
        which=lambda name: "/usr/bin/" + name,
        run=lambda *a, **k: calls.append(a),
    )
    (mps_gpu,) = [g for g in inventory.gpus if g.mode == "mps"]
    assert (tmp_path / mps_gpu.uuid / "pipe").is_dir()
    assert (tmp_path / mps_gpu.uuid / "log").is_dir()
    assert calls == [] and daemons.environments == []


def test_with_a_driver_one_mps_daemon_starts_per_gpu_on_its_own_pipe(tmp_path: Path) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []
    described = discover("node-m", source="described")
    inventory = described.__class__(hostname="h", driver="nvml", gpus=described.gpus)

    def record(args: list[str], **kwargs: Any) -> None:
        calls.append((args, kwargs["env"]))

    daemons = prepare_mps(inventory, tmp_path, which=lambda name: f"/usr/bin/{name}", run=record)
    (mps_gpu,) = [g for g in inventory.gpus if g.mode == "mps"]
    ((args, env),) = calls
    assert args == ["/usr/bin/nvidia-cuda-mps-control", "-d"]
    assert env["CUDA_VISIBLE_DEVICES"] == mps_gpu.uuid
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / mps_gpu.uuid / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / mps_gpu.uuid / "log")

    stops: list[tuple[list[str], str]] = []
    daemons.stop(run=lambda args, **kwargs: stops.append((args, kwargs["input"])))
    assert stops == [(["/usr/bin/nvidia-cuda-mps-control"], "quit\n")]

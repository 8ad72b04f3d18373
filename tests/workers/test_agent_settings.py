"""Agent settings from the environment, the start-up errors, and the MPS directories."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from workers.agent import main
from workers.settings import AgentSettings, SettingsError
from workers.signing import KEY_BYTES, key_to_text

NODE_KEY = bytes(range(KEY_BYTES))
# The smallest environment an agent starts with: its node key is the one required variable.
KEYED = {"PORTAL_AGENT_KEY": key_to_text(NODE_KEY)}


def test_defaults_use_the_hostname_the_embedded_broker_and_the_process_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = AgentSettings.from_env(KEYED)
    node = socket.gethostname().split(".")[0]
    assert settings.node == node
    assert settings.broker_url == f"redis+socket://{tmp_path / '.var' / 'redis.sock'}"
    assert settings.launcher == "process"
    assert settings.heartbeat_s == 2.0  # docs/agent.md: several within the fence point
    assert settings.workdir == tmp_path / ".var" / "agent" / node
    assert settings.mps_root == tmp_path / ".var" / "agent" / node / "mps"
    assert settings.gpu_source == "auto"
    assert settings.key == NODE_KEY
    assert (settings.fence_fraction, settings.fence_grace_s) == (0.5, 2.0)


def test_the_broker_comes_from_portal_broker_url_before_redis_url() -> None:
    both = {
        **KEYED,
        "PORTAL_BROKER_URL": "redis+socket:///run/r.sock",
        "REDIS_URL": "redis://h:6379/0",
    }
    assert AgentSettings.from_env(both).broker_url == "redis+socket:///run/r.sock"
    redis_only = {**KEYED, "REDIS_URL": "redis://h:6379/0"}
    assert AgentSettings.from_env(redis_only).broker_url == "redis://h:6379/0"


def test_explicit_values_are_used(tmp_path: Path) -> None:
    settings = AgentSettings.from_env(
        {
            **KEYED,
            "PORTAL_AGENT_NODE": "gpu-host-3",
            "PORTAL_AGENT_HEARTBEAT_S": "2.5",
            "PORTAL_AGENT_LAUNCHER": "docker",
            "PORTAL_AGENT_WORKDIR": str(tmp_path / "w"),
            "PORTAL_AGENT_MPS_ROOT": str(tmp_path / "m"),
            "PORTAL_AGENT_GPU_SOURCE": "described",
            "PORTAL_AGENT_KILL_GRACE_S": "30",
            "PORTAL_AGENT_CONCURRENCY": "2",
            "REDIS_URL": "redis://127.0.0.1:6379/7",
            "PORTAL_AGENT_FENCE_FRACTION": "0.4",
        }
    )
    assert (settings.node, settings.heartbeat_s, settings.launcher) == ("gpu-host-3", 2.5, "docker")
    assert (settings.workdir, settings.mps_root) == (tmp_path / "w", tmp_path / "m")
    assert (settings.gpu_source, settings.kill_grace_s, settings.concurrency) == (
        "described",
        30.0,
        2,
    )
    assert settings.fence_fraction == 0.4


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
        AgentSettings.from_env({**KEYED, **env})
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("fraction", ["0", "1", "1.5", "-0.2", "half", "nan"])
def test_a_fence_fraction_outside_zero_to_one_is_refused_naming_it(fraction: str) -> None:
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({**KEYED, "PORTAL_AGENT_FENCE_FRACTION": fraction})
    assert str(caught.value) == (
        "PORTAL_AGENT_FENCE_FRACTION: must be a number between 0 and 1 (exclusive); "
        f"got {fraction!r}"
    )


def test_it_refuses_to_start_without_a_node_key() -> None:
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({"PORTAL_AGENT_NODE": "gpu-host-3"})
    message = str(caught.value)
    assert message.startswith("PORTAL_AGENT_KEY: required: this node's key")
    assert "manage.py node_add" in message and "PORTAL_AGENT_KEY_FILE" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not a key!", "not a node key (expected the text `manage.py node_add` printed)"),
        (key_to_text(b"short"), "not a node key: decodes to 5 bytes, expected 32"),
        (key_to_text(NODE_KEY) + "AAAA", "not a node key: decodes to 35 bytes, expected 32"),
    ],
)
def test_a_garbled_node_key_is_refused_naming_the_variable(text: str, problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({"PORTAL_AGENT_KEY": text})
    assert str(caught.value).startswith(f"PORTAL_AGENT_KEY: {problem}")


def test_the_node_key_can_come_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "node.key"
    key_file.write_text(key_to_text(NODE_KEY) + "\n")
    settings = AgentSettings.from_env({"PORTAL_AGENT_KEY_FILE": str(key_file)})
    assert settings.key == NODE_KEY


def test_the_key_variable_wins_over_the_key_file(tmp_path: Path) -> None:
    other = bytes(reversed(NODE_KEY))
    key_file = tmp_path / "node.key"
    key_file.write_text(key_to_text(other))
    settings = AgentSettings.from_env({**KEYED, "PORTAL_AGENT_KEY_FILE": str(key_file)})
    assert settings.key == NODE_KEY


def test_an_unreadable_or_garbled_key_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent.key"
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({"PORTAL_AGENT_KEY_FILE": str(missing)})
    assert str(caught.value).startswith(f"PORTAL_AGENT_KEY_FILE: cannot read {missing}: ")

    garbled = tmp_path / "garbled.key"
    garbled.write_text("hello world")
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({"PORTAL_AGENT_KEY_FILE": str(garbled)})
    assert str(caught.value).startswith("PORTAL_AGENT_KEY_FILE: not a node key")

    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({"PORTAL_AGENT_KEY_FILE": str(empty)})
    assert str(caught.value).startswith(f"PORTAL_AGENT_KEY_FILE: {empty} is empty")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORTAL_AGENT_LAUNCHER": "k8s"}, "agent: PORTAL_AGENT_LAUNCHER: must be one of"),
        ({"PORTAL_AGENT_KEY": ""}, "agent: PORTAL_AGENT_KEY: required"),
        (
            {"PORTAL_AGENT_GPU_SOURCE": "described", "PORTAL_AGENT_INVENTORY": '{"gpus": 3}'},
            "agent: PORTAL_AGENT_INVENTORY: gpus: must be a non-empty list",
        ),
    ],
)
def test_the_agent_exits_with_code_2_and_one_line_on_bad_settings(
    env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main({**KEYED, **env}) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_the_address_is_the_local_end_of_the_route_to_the_broker_by_default() -> None:
    loopback = {**KEYED, "REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert AgentSettings.from_env(loopback).address == "127.0.0.1"
    # A broker on a unix socket is on this host: so is the rest of a one-host portal.
    assert AgentSettings.from_env(KEYED).address == "127.0.0.1"
    nowhere = {**KEYED, "REDIS_URL": "redis://no-such-broker.invalid:6379/0"}
    assert AgentSettings.from_env(nowhere).address == socket.gethostname()


@pytest.mark.parametrize("address", ["10.1.2.3", "fd00::7", "gpu-host-3.example.org"])
def test_an_address_set_by_the_operator_is_used(address: str) -> None:
    settings = AgentSettings.from_env({**KEYED, "PORTAL_AGENT_ADDRESS": address})
    assert settings.address == address


@pytest.mark.parametrize("address", ["gpu host", "-x", "a/b", "x" * 254])
def test_a_bad_address_is_refused_naming_the_variable(address: str) -> None:
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({**KEYED, "PORTAL_AGENT_ADDRESS": address})
    assert str(caught.value) == (
        "PORTAL_AGENT_ADDRESS: must be a host name, an IPv4 or an IPv6 address (letters, "
        f"digits, '.', ':', '_', '-'; at most 253 characters); got {address!r}"
    )

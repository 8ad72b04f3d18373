"""The host's container policy: its file, its built-in maximums, and how it bounds what the
portal asks (workers/policy.py). The launcher's use of it is in test_docker_request.py, the
engine's enforcement in test_docker_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from agent_doubles import make_launch

from workers.launch import LaunchError
from workers.policy import (
    ContainerLimits,
    HostPolicy,
    check_image,
    host_size,
    load_host_policy,
    resolve_policy,
)
from workers.protocol import ContainerPolicy
from workers.settings import AgentSettings, SettingsError
from workers.signing import KEY_BYTES, key_to_text

KEYED = {"PORTAL_AGENT_KEY": key_to_text(bytes(range(KEY_BYTES)))}
HOST = HostPolicy(memory_mb_max=8192, cpus_max=4.0, pids_limit_max=512, networks=("lab",))


def write_policy(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_without_a_file_the_host_allows_what_it_has_and_nothing_more() -> None:
    memory_mb, cpus = host_size()
    assert load_host_policy(None) == HostPolicy(
        memory_mb_max=memory_mb,
        cpus_max=cpus,
        pids_limit_max=4096,
        networks=(),  # no network but none
        image_prefixes=(),  # any image the team allows
        default_user="65534:65534",
        read_only_rootfs=False,
        scratch_root="",
    )
    assert memory_mb > 0 and cpus >= 1


def test_a_host_file_narrows_the_built_in_policy(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        {
            "memory_mb_max": 65536,
            "cpus_max": 16,
            "pids_limit_max": 2048,
            "networks": ["jobs-net"],
            "image_prefixes": ["registry.internal/"],
            "default_user": "60000:60000",
            "read_only_rootfs": True,
            "scratch_root": "/srv/scratch",
        },
    )
    assert load_host_policy(path) == HostPolicy(
        memory_mb_max=65536,
        cpus_max=16.0,
        pids_limit_max=2048,
        networks=("jobs-net",),
        image_prefixes=("registry.internal/",),
        default_user="60000:60000",
        read_only_rootfs=True,
        scratch_root="/srv/scratch",
    )
    # The fields it leaves out keep their built-in values.
    only_pids = load_host_policy(write_policy(tmp_path, {"pids_limit_max": 100}))
    assert (only_pids.pids_limit_max, only_pids.memory_mb_max) == (100, host_size()[0])


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "cannot read a JSON policy"),
        ("[]", "must be a JSON object of policy fields"),
        ({"memory_mb_max": 0}, "Expected `int` >= 1 - at `$.memory_mb_max`"),
        ({"cpus_max": "all"}, "Expected `float`, got `str` - at `$.cpus_max`"),
        ({"networks": ["host"]}, "networks: 'host' cannot be listed"),
        ({"networks": ["none"]}, "networks: 'none' cannot be listed"),
        ({"networks": ["container:db"]}, "at `$.networks[0]`"),
        ({"image_prefixes": ["ok/", ""]}, "image_prefixes[1]: must be a non-empty text"),
        ({"default_user": "0:0"}, "default_user: must be uid:gid, both numbers from 1"),
        ({"default_user": "nobody"}, "default_user: must be uid:gid"),
        ({"scratch_root": "scratch"}, "scratch_root: must be an absolute path"),
        ({"memory": 1}, "Object contains unknown field `memory`"),
    ],
)
def test_a_bad_host_file_stops_the_agent_naming_the_variable_and_the_field(
    tmp_path: Path, content: object, problem: str
) -> None:
    path = write_policy(tmp_path, content)
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({**KEYED, "PORTAL_AGENT_POLICY_FILE": str(path)})
    assert str(caught.value).startswith(f"PORTAL_AGENT_POLICY_FILE: {path}: ")
    assert problem in str(caught.value)


def test_a_host_file_that_is_missing_is_an_error_not_the_built_in_policy(tmp_path: Path) -> None:
    # A typo must not drop the operator's allow-list.
    with pytest.raises(SettingsError, match="PORTAL_AGENT_POLICY_FILE: .*cannot read"):
        AgentSettings.from_env({**KEYED, "PORTAL_AGENT_POLICY_FILE": str(tmp_path / "nope")})


def test_the_agent_reads_its_host_file_at_start(tmp_path: Path) -> None:
    path = write_policy(tmp_path, {"networks": ["lab"]})
    settings = AgentSettings.from_env({**KEYED, "PORTAL_AGENT_POLICY_FILE": str(path)})
    assert settings.container_policy is not None
    assert settings.container_policy.networks == ("lab",)
    assert AgentSettings.from_env(KEYED).container_policy == load_host_policy(None)


def test_one_network_for_every_job_is_no_longer_an_agent_setting() -> None:
    assert AgentSettings.from_env({**KEYED, "PORTAL_AGENT_DOCKER_NETWORK": "none"})
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({**KEYED, "PORTAL_AGENT_DOCKER_NETWORK": "jobs-net"})
    assert str(caught.value).startswith(
        "PORTAL_AGENT_DOCKER_NETWORK: only 'none' is accepted; got 'jobs-net'."
    )


# --- what a container gets -------------------------------------------------------------------


def test_the_portals_limits_within_the_hosts_are_kept() -> None:
    asked = ContainerPolicy(memory_mb=4096, cpus=1.5, pids_limit=256, network="lab")
    assert resolve_policy(asked, HOST, image_user="") == ContainerLimits(
        user="65534:65534",
        memory_mb=4096,
        cpus=1.5,
        pids_limit=256,
        network="lab",
        read_only_rootfs=False,
    )


def test_a_launch_without_a_policy_gets_no_network_and_the_hosts_maximums() -> None:
    assert resolve_policy(ContainerPolicy(), HOST, image_user="") == ContainerLimits(
        user="65534:65534",
        memory_mb=8192,
        cpus=4.0,
        pids_limit=512,
        network="none",
        read_only_rootfs=False,
    )


@pytest.mark.parametrize(
    ("asked", "problem"),
    [
        (
            ContainerPolicy(memory_mb=8193),
            "memory_mb 8193 is above this host's maximum of 8192 (memory_mb_max)",
        ),
        (ContainerPolicy(cpus=4.01), "cpus 4.01 is above this host's maximum of 4 (cpus_max)"),
        (
            ContainerPolicy(pids_limit=100_000),
            "pids_limit 100000 is above this host's maximum of 512 (pids_limit_max)",
        ),
        (
            ContainerPolicy(network="bridge"),
            "network 'bridge' is not allowed on this host; allowed: none, lab (networks)",
        ),
    ],
)
def test_anything_above_the_hosts_policy_is_refused_not_clamped(
    asked: ContainerPolicy, problem: str
) -> None:
    with pytest.raises(LaunchError) as caught:
        resolve_policy(asked, HOST, image_user="")
    assert str(caught.value) == (
        f"container policy refused by this host's PORTAL_AGENT_POLICY_FILE: {problem}"
    )


def test_read_only_from_either_side_wins() -> None:
    read_only_host = HostPolicy(memory_mb_max=1024, cpus_max=1.0, read_only_rootfs=True)
    assert resolve_policy(ContainerPolicy(), read_only_host, image_user="").read_only_rootfs
    asked = ContainerPolicy(read_only_rootfs=True)
    assert resolve_policy(asked, HOST, image_user="").read_only_rootfs


def test_the_images_numeric_user_or_the_hosts_default_user() -> None:
    host = HostPolicy(memory_mb_max=1024, cpus_max=1.0, default_user="60000:60001")
    assert resolve_policy(ContainerPolicy(), host, image_user="1234").user == "1234:1234"
    assert resolve_policy(ContainerPolicy(), host, image_user="root").user == "60000:60001"


def test_the_image_must_pass_the_teams_allow_list_and_the_hosts() -> None:
    launch = make_launch(["true"])  # python:3.11-slim of team vision
    team_allows = ContainerPolicy(image_prefixes=("python:",))
    check_image(launch, HOST)  # no list on either side: any image
    both = HostPolicy(memory_mb_max=1, cpus_max=1.0, image_prefixes=("python",))
    check_image(msgspec.structs.replace(launch, policy=team_allows), both)
    with pytest.raises(LaunchError, match="not allowed for team vision; allowed prefixes: ml/"):
        check_image(
            msgspec.structs.replace(launch, policy=ContainerPolicy(image_prefixes=("ml/",))), both
        )
    host_only = HostPolicy(memory_mb_max=1, cpus_max=1.0, image_prefixes=("registry.internal/",))
    with pytest.raises(LaunchError, match="not allowed on this host"):
        check_image(msgspec.structs.replace(launch, policy=team_allows), host_only)

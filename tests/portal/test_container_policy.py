"""A team's container policy on the portal's side: the image allow-list checked at submit, the
policy each launch carries (limits per GPU unit on the node, the team's network, read-only
root filesystem and allow-list), and the team's fields in its API."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from rest_framework.test import APIClient

from portal.agents.dispatch import send_launch
from portal.agents.testing import capture_sent_messages, register_node
from portal.jobs.models import Job, JobState
from portal.jobs.testing import World, allocate, make_job
from portal.tenants.models import Team
from portal.tenants.tokens import token_issue
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

NODE = "node-1"
BODY = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "-c", "print('hi')"],
    "gpu": {"kind": "whole", "count": 1},
}
PREFIXES = ["registry.example.org/vision/", "python:"]


def set_team(team: Team, **fields: Any) -> None:
    Team.objects.filter(pk=team.pk).update(**fields)


# --- the image allow-list at submit --------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    ["registry.example.org/vision2/detector:1", "registry.example.org/vis:1", "ubuntu:22.04"],
)
def test_an_image_outside_the_teams_allow_list_is_a_400_naming_image_and_the_prefixes(
    world: World, alice_api: APIClient, image: str
) -> None:
    set_team(world.vision, allowed_image_prefixes=PREFIXES)
    response = alice_api.post("/api/v1/jobs/", {**BODY, "image": image}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "errors": {
            "image": f"{image!r} is not allowed for team vision; allowed: images starting with "
            "registry.example.org/vision/, python:"
        }
    }
    assert not Job.objects.exists()


@pytest.mark.parametrize("image", ["registry.example.org/vision/detector:1", "python:3.11-slim"])
def test_an_image_inside_the_allow_list_is_accepted(
    world: World, alice_api: APIClient, image: str
) -> None:
    set_team(world.vision, allowed_image_prefixes=PREFIXES)
    response = alice_api.post("/api/v1/jobs/", {**BODY, "image": image}, format="json")
    assert response.status_code == 201, response.json()
    assert Job.objects.get().image == image


def test_an_empty_allow_list_accepts_any_image(world: World, alice_api: APIClient) -> None:
    response = alice_api.post("/api/v1/jobs/", {**BODY, "image": "ubuntu:22.04"}, format="json")
    assert response.status_code == 201, response.json()


def test_the_allow_list_is_the_teams_own(world: World) -> None:
    set_team(world.nlp, allowed_image_prefixes=["registry.example.org/nlp/"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=world.bob)}")
    refused = client.post("/api/v1/jobs/", {**BODY, "team": "nlp"}, format="json")
    assert refused.status_code == 400
    assert (
        "allowed: images starting with registry.example.org/nlp/"
        in (refused.json()["errors"]["image"])
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"allowed_image_prefixes": "python:"}, "allowed_image_prefixes"),
        ({"allowed_image_prefixes": ["ok/", "with space/"]}, "allowed_image_prefixes"),
        ({"job_network": "host"}, "job_network"),
        ({"job_network": "container:db"}, "job_network"),
    ],
)
def test_a_bad_team_policy_is_refused_by_the_models_validation(
    world: World, fields: dict[str, Any], field: str
) -> None:
    team = world.vision
    for name, value in fields.items():
        setattr(team, name, value)
    with pytest.raises(ValidationError) as caught:
        team.full_clean()
    assert set(caught.value.message_dict) == {field}


# --- the policy in the launch ----------------------------------------------------------------


def launch_of(world: World, slice_keys: list[str]) -> dict[str, Any]:
    """The launch message sent for a job of team vision holding ``slice_keys`` on NODE."""
    register_node(NODE)
    job = make_job(
        team=world.vision, user=world.alice, state=JobState.ASSIGNED, assigned_at=timezone.now()
    )
    allocate(job, slice_keys)
    with capture_sent_messages() as sent:
        send_launch(job.pk)
    ((message, _queue),) = sent.launches()
    return message


def test_a_launch_carries_the_safe_default_policy_for_a_whole_gpu(world: World) -> None:
    launch = launch_of(world, [stable_uuid("GPU", NODE, 0)])
    assert launch["policy"] == {
        "memory_mb": 16384,  # PORTAL_JOB_MEMORY_MB_PER_UNIT x 1 unit
        "cpus": 4.0,  # PORTAL_JOB_CPUS_PER_UNIT x 1 unit
        "pids_limit": 4096,
        "network": "none",
        "read_only_rootfs": False,
        "image_prefixes": [],
    }


def test_the_limits_are_the_operators_per_unit_figures_times_the_units_on_the_node(
    world: World, settings: Any
) -> None:
    settings.JOB_MEMORY_MB_PER_UNIT = 7000
    settings.JOB_CPUS_PER_UNIT = 3.5
    settings.JOB_PIDS_LIMIT = 256
    # Both whole GPUs of the node: 2 units.
    two = launch_of(world, [stable_uuid("GPU", NODE, 0), stable_uuid("GPU", NODE, 1)])
    assert (two["policy"]["memory_mb"], two["policy"]["cpus"]) == (14000, 7.0)
    assert two["policy"]["pids_limit"] == 256


def test_a_mig_slice_gets_its_fraction_of_the_per_unit_limits_rounded_up(world: World) -> None:
    launch = launch_of(world, [stable_uuid("MIG", NODE, 2, 0, "3g.40gb")])  # 3/7 of a unit
    assert (launch["policy"]["memory_mb"], launch["policy"]["cpus"]) == (7022, 1.72)


def test_two_mps_shares_add_up(world: World) -> None:
    gpu = stable_uuid("GPU", NODE, 3)
    launch = launch_of(world, [f"{gpu}/mps/0", f"{gpu}/mps/1"])  # 0.25 + 0.25
    assert (launch["policy"]["memory_mb"], launch["policy"]["cpus"]) == (8192, 2.0)


def test_the_teams_network_read_only_choice_and_allow_list_travel_in_the_launch(
    world: World,
) -> None:
    set_team(
        world.vision,
        job_network="vision-jobs",
        read_only_rootfs=True,
        allowed_image_prefixes=["python:"],
    )
    policy = launch_of(world, [stable_uuid("GPU", NODE, 0)])["policy"]
    assert (policy["network"], policy["read_only_rootfs"], policy["image_prefixes"]) == (
        "vision-jobs",
        True,
        ["python:"],
    )


def test_the_operator_can_make_every_root_filesystem_read_only(world: World, settings: Any) -> None:
    settings.JOB_READ_ONLY_ROOTFS = True
    assert launch_of(world, [stable_uuid("GPU", NODE, 0)])["policy"]["read_only_rootfs"] is True


# --- the team's API ---------------------------------------------------------------------------


def test_the_team_api_shows_the_policy_read_only(world: World, alice_api: APIClient) -> None:
    set_team(world.vision, job_network="vision-jobs", allowed_image_prefixes=PREFIXES)
    body = alice_api.get("/api/v1/teams/vision/").json()
    assert (body["allowed_image_prefixes"], body["job_network"], body["read_only_rootfs"]) == (
        PREFIXES,
        "vision-jobs",
        False,
    )

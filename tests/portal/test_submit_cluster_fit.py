"""A request no node of the cluster could ever hold is refused at submit, in the API and the
form alike, with the largest request that would fit; GPU models are matched as people type
them; an empty cluster refuses nothing; the documented examples fit the demo inventory."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from portal_client.cli import build_parser, submit_request
from rest_framework.test import APIClient

from portal.cluster.models import Gpu, InventoryVersion, Node
from portal.cluster.services import inventory_version, sync_inventory
from portal.jobs.arrays import validate_array_request
from portal.jobs.cluster_fit import UNCHECKED_NOTE, match_gpu_model
from portal.jobs.models import Job, JobEvent, JobState
from portal.jobs.testing import World, make_node
from portal.jobs.validation import JobRequestError, validate_job_request
from portal.tenants.models import Team
from portal.tenants.tokens import token_issue
from portal.web.forms import JOB_FORM_DEFAULTS
from workers.inventory import DEFAULT_DESCRIPTION, DEFAULT_MODEL, described_inventory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
A100 = "NVIDIA A100-SXM4-80GB"
A100_PCIE = "NVIDIA A100 80GB PCIe"
H100 = "NVIDIA H100 80GB HBM3"
T4 = "Tesla T4"
MODEL_HELP = "(a case-insensitive start of the name or of one of its words, e.g. a100)"
BODY = {
    "name": "hello",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python3", "-c", "print('hi')"],
}


@pytest.fixture
def world() -> World:
    world = World()
    # No team limit, so only the cluster decides what fits.
    Team.objects.filter(pk=world.vision.pk).update(limit_units=None)
    return world


@pytest.fixture
def cluster() -> None:
    """node-a: 8 whole A100s; node-b: 4 whole A100s, a MIG GPU, an MPS GPU of 4 shares."""
    make_node("node-a", gpus=[{"mode": "whole", "model": A100}] * 8)
    make_node(
        "node-b",
        gpus=[
            *[{"mode": "whole", "model": A100}] * 4,
            {
                "mode": "mig",
                "model": A100,
                "profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
            {"mode": "mps", "model": A100, "shares": 4},
        ],
    )


def api_post(world: World, gpu: dict[str, Any]) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=world.alice)}")
    return client.post("/api/v1/jobs/", {**BODY, "gpu": gpu}, format="json")


def form_post(world: World, **gpu: str) -> Any:
    client = Client()
    client.force_login(world.alice)
    form = {
        **JOB_FORM_DEFAULTS,
        "name": "hello",
        "team": "vision",
        "command": "python3 -c 'print(1)'",
        **gpu,
    }
    return client.post(reverse("web:job_submit"), form)


# --- what no node could ever hold, through the API ---------------------------------------------

NEVER_FITS = [
    pytest.param(
        {"kind": "whole", "count": 9},
        {
            "gpu.count": "at most 8 whole GPUs fit on one node of this cluster (nodes have 8 "
            "and 4); ask for 8 or fewer, or allow multi-node"
        },
        id="more-whole-gpus-than-any-node",
    ),
    pytest.param(
        {"kind": "whole", "count": 13},
        {
            "gpu.count": "at most 8 whole GPUs fit on one node of this cluster (nodes have 8 "
            "and 4); ask for 8 or fewer"
        },
        id="more-whole-gpus-than-the-cluster-so-no-multi-node-hint",
    ),
    pytest.param(
        {"kind": "whole", "count": 13, "multi_node": True},
        {
            "gpu.count": "at most 12 whole GPUs exist in this cluster, on all its nodes "
            "together; ask for 12 or fewer"
        },
        id="multi-node-gang-larger-than-the-cluster",
    ),
    pytest.param(
        {"kind": "whole", "count": 10, "min_count": 9},
        {
            "gpu.min_count": "at most 8 whole GPUs fit on one node of this cluster (nodes have "
            "8 and 4); ask for 8 or fewer, or allow multi-node"
        },
        id="elastic-gang-minimum",
    ),
    pytest.param(
        {"kind": "whole", "count": 9, "model": "a100"},
        {
            "gpu.count": f"at most 8 whole {A100} GPUs fit on one node of this cluster (nodes "
            "have 8 and 4); ask for 8 or fewer, or allow multi-node"
        },
        id="more-gpus-of-a-model",
    ),
    pytest.param(
        {"kind": "whole", "model": "h100"},
        {
            "gpu.model": f"no whole GPU of model 'h100' in this cluster; allowed: {A100} {MODEL_HELP}"
        },
        id="unknown-model",
    ),
    pytest.param(
        {"kind": "mig", "profile": "7g.80gb"},
        {
            "gpu.profile": "no GPU of this cluster offers MIG 7g.80gb; allowed: 1g.10gb, "
            "2g.20gb, 3g.40gb"
        },
        id="mig-profile-no-gpu-offers",
    ),
    pytest.param(
        {"kind": "mig", "profile": "1g.10gb", "count": 3},
        {
            "gpu.count": "at most 2 MIG 1g.10gb instances fit on one node of this cluster "
            "(nodes have 2); ask for 2 or fewer"
        },
        id="more-mig-instances-than-any-node",
    ),
    pytest.param(
        {"kind": "mps", "count": 5},
        {
            "gpu.count": "at most 4 MPS shares fit on one node of this cluster (nodes have 4); "
            "ask for 4 or fewer"
        },
        id="more-mps-shares-than-any-node",
    ),
]


@pytest.mark.parametrize(("gpu", "errors"), NEVER_FITS)
def test_the_api_refuses_what_no_node_could_ever_hold(world, cluster, gpu, errors):
    response = api_post(world, gpu)

    assert response.status_code == 400
    assert response.json() == {"errors": errors}
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "gpu",
    [
        {"kind": "whole", "count": 8},
        {"kind": "whole", "count": 12, "multi_node": True},
        {"kind": "whole", "count": 20, "min_count": 8},
        {"kind": "mig", "profile": "3G.40GB"},
        {"kind": "mig", "profile": "1g.10gb", "count": 2},
        {"kind": "mps", "count": 4},
    ],
)
def test_the_api_accepts_the_largest_requests_that_fit(world, cluster, gpu):
    response = api_post(world, gpu)

    assert response.status_code == 201, response.json()
    assert Job.objects.get().state == JobState.PENDING


def test_mig_and_mps_on_a_cluster_without_them_name_the_kinds_it_has(world):
    make_node("node-a", gpus=[{"mode": "whole", "model": A100}] * 2)

    mig = api_post(world, {"kind": "mig", "profile": "1g.10gb"})
    mps = api_post(world, {"kind": "mps"})

    assert (mig.status_code, mig.json()) == (
        400,
        {
            "errors": {
                "gpu.kind": "this cluster has no MIG instances (no GPU is in MIG mode); "
                "allowed: whole"
            }
        },
    )
    assert mps.json() == {
        "errors": {
            "gpu.kind": "this cluster has no MPS shares (no GPU is in MPS mode); allowed: whole"
        }
    }
    assert Job.objects.count() == 0


def test_whole_gpus_on_a_cluster_of_only_partitioned_gpus_are_refused(world):
    make_node("node-a", gpus=[{"mode": "mig", "profiles": ["3g.40gb"]}, {"mode": "mps"}])

    response = api_post(world, {"kind": "whole"})

    assert response.json() == {
        "errors": {
            "gpu.kind": "this cluster has no whole GPUs (every GPU is split into MIG instances "
            "or MPS shares); allowed: mig, mps"
        }
    }


def test_a_model_whose_gpus_are_all_partitioned_says_so(world):
    make_node("node-a", gpus=[{"mode": "whole", "model": H100}, {"mode": "mig", "model": A100}])

    response = api_post(world, {"kind": "whole", "model": "A100"})

    assert response.json() == {
        "errors": {
            "gpu.model": f"no whole GPU of model 'A100' in this cluster (its {A100} GPUs are "
            "split into MIG instances or MPS shares: ask for kind mig or mps instead); "
            f"allowed: {H100} {MODEL_HELP}"
        }
    }


def test_an_ambiguous_model_is_refused_with_the_models_it_matches(world):
    make_node(
        "node-a", gpus=[{"mode": "whole", "model": A100}, {"mode": "whole", "model": A100_PCIE}]
    )

    response = api_post(world, {"kind": "whole", "model": "nvidia a100"})

    assert response.json() == {
        "errors": {
            "gpu.model": f"'nvidia a100' matches 2 GPU models of this cluster: {A100_PCIE}, "
            f"{A100}; name one of them"
        }
    }
    assert Job.objects.count() == 0


def test_a_gang_without_a_model_counts_gpus_of_one_model_per_node(world):
    # The core places a gang on one pool (kind, profile, model): 2 A100s and 2 T4s on one node
    # hold no 3-GPU gang.
    make_node(
        "node-a", gpus=[{"mode": "whole", "model": A100}] * 2 + [{"mode": "whole", "model": T4}] * 2
    )

    response = api_post(world, {"kind": "whole", "count": 3})

    assert response.json() == {
        "errors": {
            "gpu.count": "at most 2 whole GPUs of one model fit on one node of this cluster "
            "(nodes have 2); ask for 2 or fewer, or allow multi-node"
        }
    }


def test_many_node_sizes_are_cut_short(world):
    for size in range(1, 8):
        make_node(f"node-{size}", gpus=[{"mode": "whole", "model": A100}] * size)

    response = api_post(world, {"kind": "whole", "count": 8})

    assert response.json()["errors"]["gpu.count"] == (
        "at most 7 whole GPUs fit on one node of this cluster (nodes have 7, 6, 5, 4, 3, ...); "
        "ask for 7 or fewer, or allow multi-node"
    )


def test_the_model_is_stored_as_the_inventory_names_it(world, cluster):
    response = api_post(world, {"kind": "whole", "count": 2, "model": "  A100-sxm4 "})

    assert response.status_code == 201, response.json()
    assert response.json()["gpu"]["model"] == A100
    assert Job.objects.get().gpu_model == A100


# --- which nodes count -------------------------------------------------------------------------


def test_drained_and_lost_nodes_count_because_they_may_come_back(world, cluster):
    Node.objects.filter(name="node-a").update(state=Node.State.LOST)
    Node.objects.filter(name="node-b").update(state=Node.State.DRAINED)

    assert api_post(world, {"kind": "whole", "count": 8}).status_code == 201
    refused = api_post(world, {"kind": "whole", "count": 9}).json()["errors"]["gpu.count"]
    assert refused.startswith("at most 8 whole GPUs fit on one node")


def test_gpus_an_agent_stopped_reporting_do_not_count(world, cluster):
    Gpu.objects.filter(node__name="node-a", index__gte=2).update(present=False)

    refused = api_post(world, {"kind": "whole", "count": 5}).json()["errors"]["gpu.count"]

    assert refused == (
        "at most 4 whole GPUs fit on one node of this cluster (nodes have 4 and 2); "
        "ask for 4 or fewer, or allow multi-node"
    )


# --- an empty cluster --------------------------------------------------------------------------


def test_before_any_gpu_is_registered_a_request_is_accepted_and_the_job_says_why(world):
    Node.objects.create(name="registered-no-inventory-yet")

    response = api_post(world, {"kind": "whole", "count": 64, "model": "a100"})

    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert (job.state, job.gpu_count, job.gpu_model) == (JobState.PENDING, 64, "a100")
    assert JobEvent.objects.get(job=job).message == f"submitted by alice; {UNCHECKED_NOTE}"


# --- the form: the same checks, next to their fields -------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "field", "message"),
    [
        (
            {"gpu_count": "9"},
            "gpu_count",
            "at most 8 whole GPUs fit on one node of this cluster (nodes have 8 and 4); "
            "ask for 8 or fewer, or allow multi-node",
        ),
        (
            {"gpu_model": "h100"},
            "gpu_model",
            f"no whole GPU of model &#x27;h100&#x27; in this cluster; allowed: {A100} {MODEL_HELP}",
        ),
        (
            {"gpu_kind": "mig", "gpu_profile": "7g.80gb"},
            "gpu_profile",
            "no GPU of this cluster offers MIG 7g.80gb; allowed: 1g.10gb, 2g.20gb, 3g.40gb",
        ),
        (
            {"gpu_kind": "mps", "gpu_count": "5"},
            "gpu_count",
            "at most 4 MPS shares fit on one node of this cluster (nodes have 4); "
            "ask for 4 or fewer",
        ),
    ],
)
def test_the_form_shows_the_refusal_next_to_its_field_and_stores_nothing(
    world, cluster, gpu, field, message
):
    response = form_post(world, **gpu)

    assert response.status_code == 422
    assert f'<span class="error" id="error-{field}">{message}</span>' in response.content.decode()
    assert Job.objects.count() == 0


def test_the_form_names_a_kind_the_cluster_lacks(world):
    make_node("node-a", gpus=[{"mode": "whole", "model": A100}])

    response = form_post(world, gpu_kind="mps")

    assert (
        '<span class="error" id="error-gpu_kind">this cluster has no MPS shares (no GPU is in '
        "MPS mode); allowed: whole</span>"
    ) in response.content.decode()
    assert Job.objects.count() == 0


def test_the_form_stores_the_canonical_model(world, cluster):
    response = form_post(world, gpu_count="2", gpu_model="a100")

    assert response.status_code == 302
    assert Job.objects.get().gpu_model == A100


# --- matching a model as people type it ---------------------------------------------------------

MODELS = (A100, A100_PCIE, H100, T4, "NVIDIA GeForce RTX 4090", "NVIDIA A100")


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        (A100, (A100,)),
        ("nvidia a100-sxm4-80gb", (A100,)),
        ("a100-sxm4", (A100,)),
        ("  A100-SXM4   ", (A100,)),
        ("NVIDIA A100", ("NVIDIA A100",)),  # an exact name names that model alone
        ("a100", ("NVIDIA A100", A100_PCIE, A100)),  # ambiguous: refused with this list
        ("a100 80gb", (A100_PCIE,)),
        ("nvidia  h100", (H100,)),
        ("h100", (H100,)),
        ("80gb", (A100_PCIE, H100)),  # the start of a word; "-80GB" is not one
        ("t4", (T4,)),
        ("tesla", (T4,)),
        ("rtx 4090", ("NVIDIA GeForce RTX 4090",)),
        ("geforce", ("NVIDIA GeForce RTX 4090",)),
        ("sxm4", ()),
        ("100", ()),
        ("v100", ()),
        ("", ()),
    ],
)
def test_a_model_matches_the_start_of_its_name_or_of_a_word_in_any_case(text, matches):
    assert match_gpu_model(text, MODELS) == matches


def test_a_model_matches_the_demo_inventory_by_its_short_name():
    assert match_gpu_model("a100", [DEFAULT_MODEL]) == (DEFAULT_MODEL,) == (A100,)


# --- the documented examples fit the demo inventory ---------------------------------------------

DOCUMENTS = ("README.md", "docs/api.md", "docs/pages.md", "docs/client.md")


def documented_requests(text: str) -> list[dict[str, Any]]:
    """Every job request an example in ``text`` sends: curl bodies (``-d '{...}'``), JSON
    and YAML request blocks, ``portal.submit(...)`` calls in Python blocks, ``gpu-portal
    submit`` command lines (the body the CLI makes of them), and inline GPU requests
    (`` `{"kind": ...}` ``, checked inside the README's first request)."""
    found: list[dict[str, Any]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("gpu-portal submit "):
                argv = shlex.split(line, comments=True)[1:]
                found.append(submit_request(build_parser().parse_args(argv)))
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL):
        data = yaml.safe_load(block)
        if "gpu" in data:
            found.append(data)
    for body in re.findall(r"-d '(\{.*?\})'", text, flags=re.DOTALL):
        found.append(json.loads(body))
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL):
        data = json.loads(block)
        if "gpu" in data:
            found.append(data)
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL):
        for node in ast.walk(ast.parse(block)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "submit"
            ):
                found.append({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    for gpu in re.findall(r'`(\{"kind": [^`]*\})`', text):
        found.append({**BODY, "gpu": json.loads(gpu)})
    return found


def test_every_documented_example_request_is_accepted_by_the_demo_inventory():
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    node = Node.objects.create(name="local-1")
    sync_inventory(node, described_inventory("local-1", DEFAULT_DESCRIPTION).gpus)
    alice = get_user_model().objects.get(username="alice")

    checked: dict[str, int] = {}
    models: list[str] = []
    for document in DOCUMENTS:
        requests = documented_requests((ROOT / document).read_text())
        checked[document] = len(requests)
        for data in requests:
            try:
                if "array" in data:  # an array submit: the job's fields, then the spec
                    request = validate_array_request(data, user=alice).job
                else:
                    request = validate_job_request(data, user=alice)
            except JobRequestError as error:
                pytest.fail(f"{document}: {json.dumps(data)} is refused: {error.errors}")
            if request.gpu.model:
                models.append(request.gpu.model)

    # README: the command line's submit, the curl body, the notebook call and the inline
    # model example; docs/api.md: the JSON block, the curl body, the what-if's curl body, the
    # array submit and the notebook call; docs/client.md: the Python submit, the command
    # line's and the request file. pages.md has none today.
    assert checked == {"README.md": 4, "docs/api.md": 5, "docs/pages.md": 0, "docs/client.md": 3}
    # The README's and the what-if example's short name, stored as the agent names it.
    assert models == [DEFAULT_MODEL, DEFAULT_MODEL]


# --- the shape kept between submits -------------------------------------------------------------


def test_a_node_that_grew_counts_at_the_next_submit_and_an_unchanged_one_is_not_read_again(
    world, django_assert_num_queries
):
    node = Node.objects.create(name="node-g", hostname="node-g", driver="described")
    two = {"gpus": [{"mode": "whole", "count": 2, "model": A100}]}
    sync_inventory(node, described_inventory("node-g", two).gpus)
    assert api_post(world, {"kind": "whole", "count": 4}).status_code == 400

    eight = {"gpus": [{"mode": "whole", "count": 8, "model": A100}]}
    sync_inventory(node, described_inventory("node-g", eight).gpus)
    assert api_post(world, {"kind": "whole", "count": 4}).status_code == 201

    # The agent's next heartbeats change nothing: the next check reads no slice.
    assert not sync_inventory(node, described_inventory("node-g", eight).gpus)
    request = {**BODY, "gpu": {"kind": "whole", "count": 8}}
    with django_assert_num_queries(
        2
    ):  # the member's teams with their own limit, the inventory's token
        validate_job_request(request, user=world.alice)


def test_the_inventory_version_is_read_again_after_the_recheck_time_or_a_change_made_here(
    world, settings, django_assert_num_queries, django_capture_on_commit_callbacks
):
    settings.INVENTORY_RECHECK_S = 60.0
    node = Node.objects.create(name="node-g", hostname="node-g", driver="described")
    two = {"gpus": [{"mode": "whole", "count": 2, "model": A100}]}
    with django_capture_on_commit_callbacks(execute=True):
        sync_inventory(node, described_inventory("node-g", two).gpus)
    request = {**BODY, "gpu": {"kind": "whole", "count": 2}}
    validate_job_request(request, user=world.alice)
    with django_assert_num_queries(1):  # the member's teams; the token read a moment ago
        validate_job_request(request, user=world.alice)

    # A change this process records is seen by its next submit.
    eight = {"gpus": [{"mode": "whole", "count": 8, "model": A100}]}
    with django_capture_on_commit_callbacks(execute=True):
        sync_inventory(node, described_inventory("node-g", eight).gpus)
    validate_job_request({**BODY, "gpu": {"kind": "whole", "count": 8}}, user=world.alice)

    # One recorded by another process is seen once the recheck time has passed.
    InventoryVersion.objects.filter(pk=1).update(token="changed-elsewhere")
    assert inventory_version() != "changed-elsewhere"
    settings.INVENTORY_RECHECK_S = 0.0
    assert inventory_version() == "changed-elsewhere"

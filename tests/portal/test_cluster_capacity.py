"""The cluster's capacity (``portal.jobs.capacity``) and the Cluster page (``/cluster/``).

Exact numbers on small hand-built clusters: each slice's status and holder, the free totals by
kind and MIG profile, the units by status, and the utilisation of each of the last 24 hours
from allocation intervals worked out by hand. Who sees what: every slice's team for everyone,
a job only for its own teams (site admins: all), never another team's job names or commands.
The selector and the page cost a fixed number of queries, with 1 node or 100 nodes of 8 GPUs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.cluster.models import Gpu, Node, Slice
from portal.jobs.capacity import CAPACITY_QUERIES, cluster_capacity
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.testing import World, make_job, make_node, make_user
from portal.web.cluster import NODES_PER_PAGE, utilisation_chart

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 30, tzinfo=UTC)
SECRET_COMMAND = ["python", "-c", "print('nlp-secret-command')"]


def at(hour: int, minute: int = 0, *, day: int = 10) -> datetime:
    return datetime(2025, 3, day, hour, minute, tzinfo=UTC)


def hold(job: Job, key: str, since: datetime, until: datetime | None = None) -> Allocation:
    return Allocation.objects.create(
        job=job,
        attempt=max(job.attempt, 1),
        slice=Slice.objects.get(key=key),
        created_at=since,
        released_at=until,
    )


def slice_of(capacity: dict[str, Any], key: str) -> dict[str, Any]:
    for node in capacity["nodes"]:
        for gpu in node["gpus"]:
            for slice_ in gpu["slices"]:
                if slice_["key"] == key:
                    return slice_
    raise AssertionError(f"no slice {key}")


def node_of(capacity: dict[str, Any], name: str) -> dict[str, Any]:
    return next(node for node in capacity["nodes"] if node["name"] == name)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def cluster(world: World) -> dict[str, Job]:
    """node-a (ready): 2 whole GPUs, a MIG GPU (3g.40gb, 1g.10gb, 1g.10gb), an MPS GPU of 4
    shares, and a GPU gone from its inventory; node-b (cordoned): 2 whole GPUs; node-c (lost):
    1 whole GPU. Holds: vision on a-gpu0 and b-gpu0; nlp on the 3g.40gb, MPS share 0 and
    c-gpu0."""
    make_node(
        "node-a",
        gpus=[
            {"mode": "whole"},
            {"mode": "whole"},
            {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb", "1g.10gb"]},
            {"mode": "mps", "shares": 4},
            {"mode": "whole"},
        ],
    )
    make_node("node-b", gpus=[{"mode": "whole"}, {"mode": "whole"}])
    make_node("node-c", gpus=[{"mode": "whole"}])
    Gpu.objects.filter(uuid="GPU-node-a-4").update(present=False)
    Slice.objects.filter(key="GPU-node-a-4").update(present=False)
    Node.objects.filter(name="node-a").update(last_heartbeat_at=NOW - timedelta(seconds=3))
    Node.objects.filter(name="node-b").update(
        state=Node.State.DRAINED,
        last_heartbeat_at=NOW - timedelta(seconds=30),
        cordoned_at=at(11),
        cordoned_by="admin",
    )
    Node.objects.filter(name="node-c").update(state=Node.State.LOST, last_heartbeat_at=at(11, 15))
    running = {"state": JobState.RUNNING}
    jobs = {
        "resnet": make_job(team=world.vision, user=world.alice, name="resnet", **running),
        "vit": make_job(team=world.vision, user=world.vera, name="vit", **running),
        "bert": make_job(team=world.nlp, user=world.bob, name="bert", **running),
        "gpt": make_job(team=world.nlp, user=world.nick, name="gpt", **running),
    }
    Job.objects.filter(pk=jobs["bert"].pk).update(command=SECRET_COMMAND)
    hold(jobs["resnet"], "GPU-node-a-0", at(10))
    hold(jobs["vit"], "GPU-node-b-0", at(10, 30))
    hold(jobs["bert"], "MIG-node-a-2-0", at(11, 30))
    hold(jobs["bert"], "GPU-node-a-3/mps/0", at(11, 30))
    hold(jobs["gpt"], "GPU-node-c-0", at(9))
    # An earlier attempt's hold, released: it counts for no one now.
    hold(jobs["gpt"], "GPU-node-a-1", at(8), at(8, 30))
    return jobs


# --- slices, holders and totals --------------------------------------------------------------


def test_each_slice_is_free_held_draining_or_lost(world, cluster):
    capacity = cluster_capacity(user=world.admin, now=NOW)
    statuses = {
        slice_["key"]: slice_["status"]
        for node in capacity["nodes"]
        for gpu in node["gpus"]
        for slice_ in gpu["slices"]
    }
    assert statuses == {
        "GPU-node-a-0": "held",
        "GPU-node-a-1": "free",
        "MIG-node-a-2-0": "held",
        "MIG-node-a-2-1": "free",
        "MIG-node-a-2-2": "free",
        "GPU-node-a-3/mps/0": "held",
        "GPU-node-a-3/mps/1": "free",
        "GPU-node-a-3/mps/2": "free",
        "GPU-node-a-3/mps/3": "free",
        # node-b is cordoned: its held slice stays held, the free one takes no new job.
        "GPU-node-b-0": "held",
        "GPU-node-b-1": "draining",
        # node-c is lost: its slice is lost, held or not.
        "GPU-node-c-0": "lost",
    }
    a, b, c = (node_of(capacity, name) for name in ("node-a", "node-b", "node-c"))
    assert [(n["status"], n["slice_counts"], n["slices_total"]) for n in (a, b, c)] == [
        ("ready", {"free": 6, "held": 3, "draining": 0, "lost": 0}, 9),
        ("cordoned", {"free": 0, "held": 1, "draining": 1, "lost": 0}, 2),
        ("lost", {"free": 0, "held": 0, "draining": 0, "lost": 1}, 1),
    ]
    assert (b["cordoned_at"], b["cordoned_by"]) == (at(11), "admin")
    # The GPU gone from the inventory is listed, with no slice (nothing holds one there).
    assert [(g["index"], g["present"], g["slices"]) for g in a["gpus"]][4] == (4, False, [])


def test_the_last_heartbeat_and_whether_it_is_late(world, cluster, settings):
    settings.AGENT_LEASE_S = 12.0
    capacity = cluster_capacity(user=world.alice, now=NOW)
    beats = [
        (n["name"], n["last_heartbeat_at"], n["heartbeat_age_s"], n["heartbeat_late"])
        for n in capacity["nodes"]
    ]
    assert beats == [
        ("node-a", NOW - timedelta(seconds=3), 3.0, False),
        ("node-b", NOW - timedelta(seconds=30), 30.0, True),
        ("node-c", at(11, 15), 4500.0, True),
    ]
    assert capacity["lease_s"] == 12.0


def test_free_totals_by_kind_and_profile_and_units_by_status(world, cluster):
    capacity = cluster_capacity(user=world.alice, now=NOW)
    rows = [
        (
            t["kind"],
            t["profile"],
            t["units_each"],
            t["free"],
            t["held"],
            t["draining"],
            t["lost"],
            t["total"],
            t["free_units"],
        )
        for t in capacity["free_by_kind"]
    ]
    assert rows == [
        ("whole", "", 1.0, 1, 2, 1, 1, 5, 1.0),
        ("mig", "1g.10gb", 0.142857, 2, 0, 0, 0, 2, 0.285714),
        ("mig", "3g.40gb", 0.428571, 0, 1, 0, 0, 1, 0.0),
        ("mps", "", 0.25, 3, 1, 0, 0, 4, 0.75),
    ]
    # free: 1 + 2/7 + 3/4; held: 1 + 3/7 + 1/4 + 1; draining: node-b's free GPU; lost: node-c's.
    assert capacity["units"] == {
        "free": 2.035714,
        "held": 2.678571,
        "draining": 1.0,
        "lost": 1.0,
        "in_service": 5.714286,
    }


def test_a_member_sees_their_teams_jobs_and_only_the_team_of_the_others(world, cluster):
    capacity = cluster_capacity(user=world.alice, now=NOW)
    assert slice_of(capacity, "GPU-node-a-0")["holder"] == {
        "team": "vision",
        "since": at(10),
        "job": {"id": cluster["resnet"].pk, "name": "resnet", "user": "alice", "state": "RUNNING"},
    }
    assert slice_of(capacity, "GPU-node-b-0")["holder"]["job"]["name"] == "vit"
    for key in ("MIG-node-a-2-0", "GPU-node-a-3/mps/0"):
        assert slice_of(capacity, key)["holder"] == {
            "team": "nlp",
            "since": at(11, 30),
            "job": None,
        }
    assert slice_of(capacity, "GPU-node-c-0")["holder"] == {
        "team": "nlp",
        "since": at(9),
        "job": None,
    }
    assert slice_of(capacity, "GPU-node-a-1")["holder"] is None
    everything = json.dumps(capacity, cls=DjangoJSONEncoder)
    for secret in ("bert", "gpt", "bob", "nick", "nlp-secret-command", str(cluster["bert"].pk)):
        assert f'"{secret}"' not in everything and "nlp-secret" not in everything


def test_someone_in_no_team_sees_only_teams_and_a_site_admin_sees_every_job(world, cluster):
    loner = make_user("loner")
    seen = cluster_capacity(user=loner, now=NOW)
    assert [slice_of(seen, k)["holder"]["team"] for k in ("GPU-node-a-0", "MIG-node-a-2-0")] == [
        "vision",
        "nlp",
    ]
    assert slice_of(seen, "GPU-node-a-0")["holder"]["job"] is None
    admin = cluster_capacity(user=world.admin, now=NOW)
    assert slice_of(admin, "MIG-node-a-2-0")["holder"]["job"] == {
        "id": cluster["bert"].pk,
        "name": "bert",
        "user": "bob",
        "state": "RUNNING",
    }
    assert slice_of(admin, "GPU-node-c-0")["holder"]["job"]["name"] == "gpt"


# --- utilisation -----------------------------------------------------------------------------


def test_utilisation_per_hour_from_allocation_intervals(world):
    """Now is 12:30. node-x: 2 whole GPUs, registered at 09:00 today. node-y: 1 whole GPU,
    registered yesterday 20:00, lost, last heartbeat 11:15.

    Holds: x-gpu0 09:30-11:00; x-gpu1 10:45-now; y-gpu0 11:00-(still held; counted until the
    node's last heartbeat, 11:15); x-gpu0 yesterday 05:00-06:00 (before the window).

    In service per hour: yesterday 13-19 h nothing; 20 h to 08 h: 1 (node-y); 09 h: 3; 10 h:
    3; 11 h: 2 + 0.25; 12:00-12:30: 2 x 0.5 = 1.
    Held: 09 h: 0.5; 10 h: 1 + 0.25; 11 h: 1 + 0.25; 12 h: 0.5.
    """
    make_node("node-x", gpus=[{"mode": "whole"}, {"mode": "whole"}])
    make_node("node-y", gpus=[{"mode": "whole"}])
    Node.objects.filter(name="node-x").update(registered_at=at(9), last_heartbeat_at=NOW)
    Node.objects.filter(name="node-y").update(
        registered_at=at(20, day=9), state=Node.State.LOST, last_heartbeat_at=at(11, 15)
    )
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    hold(job, "GPU-node-x-0", at(9, 30), at(11))
    hold(job, "GPU-node-x-1", at(10, 45))
    hold(job, "GPU-node-y-0", at(11))
    hold(job, "GPU-node-x-0", at(5, day=9), at(6, day=9))

    utilisation = cluster_capacity(user=world.alice, now=NOW)["utilisation"]

    expected = [(at(h, day=9), 0.0, 0.0, None) for h in range(13, 20)]
    expected += [(at(h, day=9), 0.0, 1.0, 0.0) for h in range(20, 24)]
    expected += [(at(h), 0.0, 1.0, 0.0) for h in range(0, 9)]
    expected += [
        (at(9), 0.5, 3.0, 0.1667),
        (at(10), 1.25, 3.0, 0.4167),
        (at(11), 1.25, 2.25, 0.5556),
        (at(12), 0.5, 1.0, 0.5),
    ]
    got = [
        (h["start"], h["held_unit_hours"], h["in_service_unit_hours"], h["ratio"])
        for h in utilisation["series"]
    ]
    assert got == expected
    assert (utilisation["hours"], utilisation["start"], utilisation["end"]) == (
        24,
        at(13, day=9),
        NOW,
    )
    assert [h["end"] for h in utilisation["series"][-2:]] == [at(12), NOW]


def test_holds_older_than_the_window_count_within_each_nodes_time_in_service(world):
    """Now is 12:30; the window begins yesterday 13:00. Every hold began two days ago.

    node-z (2 GPUs, registered three days ago): z-0 still held, z-1 released at 11:00 today.
    node-x (1 GPU, registered at 09:00 today): x-0 still held, counted from 09:00.
    node-y (1 GPU, registered three days ago, lost, last heartbeat 11:15): y-0 still held,
    counted until 11:15.

    Held: up to 08 h: z 2 + y 1 = 3; 09 h, 10 h: 4; 11 h: x 1 + z-0 1 + y 0.25 = 2.25;
    12:00-12:30: (x + z-0) x 0.5 = 1. In service: 3; 4; 4; 3.25; 1.5.
    """
    for name, gpus in (("node-z", 2), ("node-x", 1), ("node-y", 1)):
        make_node(name, gpus=[{"mode": "whole"}] * gpus)
    Node.objects.filter(name="node-z").update(registered_at=at(0, day=7), last_heartbeat_at=NOW)
    Node.objects.filter(name="node-x").update(registered_at=at(9), last_heartbeat_at=NOW)
    Node.objects.filter(name="node-y").update(
        registered_at=at(0, day=7), state=Node.State.LOST, last_heartbeat_at=at(11, 15)
    )
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    long_ago = at(12, day=8)
    hold(job, "GPU-node-z-0", long_ago)
    hold(job, "GPU-node-z-1", long_ago, at(11))
    hold(job, "GPU-node-x-0", long_ago)
    hold(job, "GPU-node-y-0", long_ago)

    series = cluster_capacity(user=world.alice, now=NOW)["utilisation"]["series"]

    expected = [(at(h, day=9), 3.0, 3.0) for h in range(13, 24)]
    expected += [(at(h), 3.0, 3.0) for h in range(0, 9)]
    expected += [(at(9), 4.0, 4.0), (at(10), 4.0, 4.0), (at(11), 2.25, 3.25), (at(12), 1.0, 1.5)]
    got = [(h["start"], h["held_unit_hours"], h["in_service_unit_hours"]) for h in series]
    assert got == expected
    assert [h["ratio"] for h in series[-2:]] == [0.6923, 0.6667]


def test_on_the_hour_the_last_hour_is_whole(world):
    make_node("node-x", gpus=[{"mode": "whole"}])
    Node.objects.filter(name="node-x").update(registered_at=at(0))
    series = cluster_capacity(user=world.alice, now=at(12))["utilisation"]["series"]
    assert (series[0]["start"], series[-1]["start"], series[-1]["end"]) == (
        at(12, day=9),
        at(11),
        at(12),
    )
    assert series[-1]["in_service_unit_hours"] == 1.0


def test_the_chart_draws_a_bar_per_hour_with_its_value_in_words():
    series = [
        {
            "start": at(10),
            "end": at(11),
            "held_unit_hours": 1.5,
            "in_service_unit_hours": 3.0,
            "ratio": 0.5,
        },
        {
            "start": at(11),
            "end": at(12),
            "held_unit_hours": 0.0,
            "in_service_unit_hours": 0.0,
            "ratio": None,
        },
        {
            "start": at(12),
            "end": NOW,
            "held_unit_hours": 0.25,
            "in_service_unit_hours": 1.0,
            "ratio": 0.25,
        },
    ]
    svg = str(utilisation_chart(series))
    assert svg.startswith('<svg id="utilisation-chart"') and svg.count('<g class="bar">') == 3
    assert "<title>10:00–11:00 UTC, 1.5 of 3 GPU-unit-hours held: 50 % held</title>" in svg
    assert "<title>11:00–12:00 UTC, nothing in service: 0 % held</title>" in svg
    assert (
        "<title>12:00–12:30 UTC (so far), 0.25 of 1 GPU-unit-hours held: 25 % held</title>" in svg
    )
    assert svg.count("<rect") == 2  # no bar for the hour with nothing in service
    # The values written above the bars, the hours under them, the axis in per cent.
    for label in (">50<", ">25<", ">10h<", ">11h<", ">now<", ">% held<"):
        assert label in svg


# --- the page --------------------------------------------------------------------------------


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_shows_slices_holders_and_totals_to_a_member(world, cluster):
    response = client_for(world.alice).get("/cluster/")
    assert response.status_code == 200
    page = response.content.decode()
    assert f'href="/jobs/{cluster["resnet"].pk}/">resnet</a>' in page
    assert f'href="/jobs/{cluster["vit"].pk}/">vit</a>' in page
    assert 'by\n                <span class="slice-holder">nlp</span>' in page
    for secret in ("bert", "gpt", "nlp-secret-command", f"/jobs/{cluster['bert'].pk}/"):
        assert secret not in page
    assert '<span class="badge node-status state-PENDING">cordoned</span>' in page
    assert "cordoned 2025-03-10 11:00 UTC by admin" in page
    assert '<svg id="utilisation-chart" class="chart"' in page and 'id="utilisation-table"' in page
    assert 'id="free-mig-1g.10gb"' in page


def test_a_site_admin_sees_every_job_on_the_page(world, cluster):
    page = client_for(world.admin).get("/cluster/").content.decode()
    assert f'href="/jobs/{cluster["bert"].pk}/">bert</a>' in page
    assert "nlp-secret-command" not in page  # commands are not part of the page at all


def test_the_page_needs_a_login_and_htmx_gets_the_live_part_only(world, cluster):
    assert Client().get("/cluster/")["Location"].startswith("/login/")
    fragment = client_for(world.alice).get("/cluster/", HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="cluster-live"') and "<header" not in body


# --- a fixed number of queries -----------------------------------------------------------------


def build_cluster(nodes: int, world: World) -> None:
    """``nodes`` nodes of 8 GPUs (6 whole, 1 MIG in 3 slices, 1 MPS in 4 shares), each node's
    first two whole GPUs held: one by vision, one by nlp, and an earlier hold released."""
    Node.objects.bulk_create(
        Node(name=f"n{i:03d}", hostname=f"n{i:03d}", last_heartbeat_at=NOW) for i in range(nodes)
    )
    node_ids = list(Node.objects.order_by("name").values_list("pk", flat=True))
    modes = ["whole"] * 6 + ["mig", "mps"]
    Gpu.objects.bulk_create(
        Gpu(node_id=node_id, uuid=f"GPU-{node_id}-{i}", index=i, model="NVIDIA A100", mode=mode)
        for node_id in node_ids
        for i, mode in enumerate(modes)
    )
    slices = []
    for gpu_id, uuid, mode in Gpu.objects.values_list("pk", "uuid", "mode"):
        if mode == "whole":
            slices.append(Slice(gpu_id=gpu_id, key=uuid, kind="whole", units=1.0))
        elif mode == "mig":
            for n, profile in enumerate(["3g.40gb", "2g.20gb", "1g.10gb"]):
                units = int(profile[0]) / 7
                slices.append(
                    Slice(
                        gpu_id=gpu_id,
                        key=f"MIG-{uuid}-{n}",
                        kind="mig",
                        profile=profile,
                        mig_uuid=f"MIG-{uuid}-{n}",
                        units=units,
                    )
                )
        else:
            slices += [
                Slice(gpu_id=gpu_id, key=f"{uuid}/mps/{n}", kind="mps", units=0.25)
                for n in range(4)
            ]
    Slice.objects.bulk_create(slices)
    vision = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    nlp = make_job(team=world.nlp, user=world.bob, state=JobState.RUNNING)
    ids = dict(Slice.objects.values_list("key", "pk"))
    allocations = []
    for node_id in node_ids:
        allocations += [
            Allocation(job=vision, attempt=1, slice_id=ids[f"GPU-{node_id}-0"], created_at=at(11)),
            Allocation(job=nlp, attempt=1, slice_id=ids[f"GPU-{node_id}-1"], created_at=at(12)),
            Allocation(
                job=nlp,
                attempt=1,
                slice_id=ids[f"GPU-{node_id}-7/mps/0"],
                created_at=at(1),
                released_at=at(2),
            ),
        ]
    Allocation.objects.bulk_create(allocations)


@pytest.mark.parametrize("nodes", [1, 100])
def test_the_selector_costs_a_fixed_number_of_queries(world, nodes):
    build_cluster(nodes, world)
    with CaptureQueriesContext(connection) as member_queries:
        capacity = cluster_capacity(user=world.alice, now=NOW)
    with CaptureQueriesContext(connection) as admin_queries:
        cluster_capacity(user=world.admin, now=NOW)
    assert len(capacity["nodes"]) == nodes
    assert sum(n["slices_total"] for n in capacity["nodes"]) == nodes * 13
    assert capacity["units"]["held"] == pytest.approx(2.0 * nodes)
    assert len(member_queries) == CAPACITY_QUERIES == 7
    assert len(admin_queries) == CAPACITY_QUERIES - 1


# The page: the selector's queries, and the session and the user of the request.
PAGE_QUERIES = CAPACITY_QUERIES + 2


@pytest.mark.parametrize("nodes", [1, 100])
def test_the_page_costs_a_fixed_number_of_queries(world, nodes):
    build_cluster(nodes, world)
    client = client_for(world.alice)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/cluster/")
    assert response.status_code == 200
    page = response.content.decode()
    assert page.count('class="panel node"') == min(nodes, NODES_PER_PAGE)
    assert len(queries) == PAGE_QUERIES, [q["sql"][:120] for q in queries]
    if nodes > NODES_PER_PAGE:
        assert "Nodes 1–50 of 100" in page and 'href="?page=2"' in page


def test_the_nodes_come_a_page_at_a_time_and_a_bad_page_is_refused(world):
    build_cluster(60, world)
    client = client_for(world.alice)
    second = client.get("/cluster/?page=2").content.decode()
    assert second.count('class="panel node"') == 10
    assert 'id="node-n050"' in second and 'id="node-n049"' not in second
    assert "Nodes 51–60 of 60" in second and 'hx-get="/cluster/?page=2"' in second
    # The totals count every node, whatever the page.
    # 60 nodes of 6 whole GPUs, a MIG GPU of 6/7 and an MPS GPU: 60 x 7 6/7 units.
    assert (
        '<div class="stat" id="units-in-service"><div class="label">In service</div>'
        '<div class="value">471.43 <span class="unit">units' in second
    )
    assert client.get("/cluster/?page=9").content.decode().count('class="panel node"') == 10
    refused = client.get("/cluster/?page=two")
    assert refused.status_code == 400
    assert "Page: &#x27;two&#x27; is not a page number; allowed: a whole number from 1" in (
        refused.content.decode()
    )

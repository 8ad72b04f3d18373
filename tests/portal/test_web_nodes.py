"""The Nodes page (/nodes/): site admins see every node with its state, heartbeat and what it
holds, and cordon, drain and uncordon it with htmx buttons; anyone else gets a 403."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from portal.cluster.models import Node, NodeEvent
from portal.jobs.models import JobState
from portal.jobs.testing import World, allocate, make_job, make_node

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def node() -> Node:
    return make_node("node-1", gpus=[{"mode": "whole"}, {"mode": "whole"}])


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_site_admin_sees_nodes_with_state_slices_jobs_and_buttons(world: World, node: Node):
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])

    response = client_for(world.admin).get(reverse("web:node_list"))

    page = response.content.decode()
    assert response.status_code == 200
    assert '<a href="/nodes/" class="active">Nodes</a>' in page
    assert '<tr id="node-node-1">' in page
    assert '<span class="badge state-SUCCEEDED">ready</span>' in page
    assert "1 / 2" in page  # slices held of offered
    assert f'<a href="/jobs/{job.pk}/">{job.pk}</a>' in page
    assert 'hx-post="/nodes/node-1/cordon/"' in page
    assert 'hx-post="/nodes/node-1/drain/"' in page
    assert "/nodes/node-1/uncordon/" not in page  # not cordoned
    assert 'hx-trigger="every 3s"' not in page  # nothing under way: no polling


def test_a_member_gets_a_403_and_no_nav_link(world: World, node: Node):
    client = client_for(world.alice)

    assert client.get(reverse("web:node_list")).status_code == 403
    drained = client.post(reverse("web:node_drain", args=["node-1"]), {"deadline_s": "0"})
    assert drained.status_code == 403
    assert 'href="/nodes/"' not in client.get(reverse("web:job_list")).content.decode()
    node.refresh_from_db()
    assert node.state == Node.State.READY and not NodeEvent.objects.exists()


def test_drain_through_htmx_answers_the_table_draining_and_polling(world: World, node: Node):
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-1"])

    response = client_for(world.admin).post(
        reverse("web:node_drain", args=["node-1"]), {"deadline_s": "1800"}, **HTMX
    )

    fragment = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in fragment and 'id="nodes"' in fragment
    assert "Node node-1 is being drained." in fragment
    assert '<span class="badge state-PREEMPTED">draining</span>' in fragment
    assert "by admin" in fragment and "deadline " in fragment
    assert 'hx-trigger="every 3s"' in fragment  # watches the drain end
    assert ">Call drain off</button>" in fragment and ">Uncordon</button>" in fragment
    assert list(NodeEvent.objects.values_list("kind", "by")) == [("drain", "admin")]


def test_a_bad_deadline_shows_its_error_and_changes_nothing(world: World, node: Node):
    response = client_for(world.admin).post(
        reverse("web:node_drain", args=["node-1"]), {"deadline_s": "forever"}, **HTMX
    )

    assert response.status_code == 422
    assert "&#x27;forever&#x27; is not allowed; allowed: a whole number of seconds" in (
        response.content.decode()
    )
    node.refresh_from_db()
    assert node.state == Node.State.READY and not NodeEvent.objects.exists()


def test_cordon_and_uncordon_without_javascript_redirect_back_with_a_message(
    world: World, node: Node
):
    client = client_for(world.admin)

    cordoned = client.post(reverse("web:node_cordon", args=["node-1"]), follow=True)

    assert cordoned.redirect_chain == [("/nodes/", 302)]
    page = cordoned.content.decode()
    assert "Node node-1 cordoned: no new jobs; its jobs run on." in page
    assert '<span class="badge state-CANCELLED">drained</span>' in page  # nothing holds it
    node.refresh_from_db()
    assert node.state == Node.State.DRAINED

    back = client.post(reverse("web:node_uncordon", args=["node-1"]), follow=True)

    # A node row made by the test has never had a heartbeat: its agent is silent.
    assert "Node node-1 uncordoned; its agent is silent: lost until a heartbeat arrives." in (
        back.content.decode()
    )
    assert list(NodeEvent.objects.values_list("kind", flat=True)) == ["cordon", "uncordon"]


def test_an_unknown_node_is_a_404_and_get_is_not_allowed(world: World, node: Node):
    client = client_for(world.admin)

    assert client.post(reverse("web:node_cordon", args=["nope"])).status_code == 404
    assert client.get(reverse("web:node_cordon", args=["node-1"])).status_code == 405


def test_the_nodes_are_shown_50_to_a_page_and_an_action_comes_back_to_its_page(world: World):
    for number in range(60):
        make_node(f"node-{number:02d}", gpus=[{"mode": "whole"}])
    client = client_for(world.admin)

    first = client.get(reverse("web:node_list")).content.decode()
    second = client.get(reverse("web:node_list"), {"page": "2"}).content.decode()

    assert 'id="node-node-00"' in first and 'id="node-node-49"' in first
    assert 'id="node-node-50"' not in first
    assert "Nodes 1–50 of 60" in first and 'href="?page=2"' in first
    assert 'id="node-node-50"' in second and 'id="node-node-59"' in second
    assert 'id="node-node-00"' not in second
    # A button on page 2 says which page it is on; the table comes back at that page.
    assert '<input type="hidden" name="page" value="2">' in second
    answer = client.post("/nodes/node-55/cordon/", {"page": "2"}, **HTMX).content.decode()
    assert 'id="node-node-55"' in answer and 'id="node-node-00"' not in answer
    plain = client.post("/nodes/node-56/cordon/", {"page": "2"})
    assert plain.status_code == 302 and plain["Location"] == "/nodes/?page=2"
    assert (
        Node.objects.filter(name__in=["node-55", "node-56"], state=Node.State.DRAINED).count() == 2
    )


def test_a_page_that_is_no_number_is_a_400_that_says_what_is_allowed(world: World, node: Node):
    response = client_for(world.admin).get(reverse("web:node_list"), {"page": "two"})

    assert response.status_code == 400
    assert "Page: &#x27;two&#x27; is not a page number; allowed: a whole number from 1" in (
        response.content.decode()
    )

"""The Nodes page in a real browser: a site admin drains a node with a running job, calls the
drain off and uncordons it, each through its htmx button; the page fits a phone.

Django's live server and rows written straight into the database: no agent needed. The
browser set-up (Chromium, people, log-in, screenshots) is test_browser.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from test_browser import PHONE, chromium, log_in, people, screenshot, sideways_overflow

from portal.cluster.models import Node, NodeEvent
from portal.jobs.models import Job, JobState
from portal.jobs.testing import allocate, make_job, make_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

__all__ = ["chromium", "people"]  # fixtures, used by name


def test_a_site_admin_drains_calls_off_and_uncordons_a_node_from_the_nodes_page(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    node = make_node("gpu-node-with-a-long-name-01", gpus=[{"mode": "whole"}, {"mode": "whole"}])
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now(), agent_version="0.9")
    job = make_job(team=people["vision"], user=people["alice"], state=JobState.RUNNING)
    allocate(job, [f"GPU-{node.name}-0"])
    base = live_server.url
    page = log_in(chromium, base, "admin")
    page.on("dialog", lambda dialog: dialog.accept())  # the drain button's confirmation
    page.click("nav >> text=Nodes")
    page.wait_for_url(f"{base}/nodes/")
    row = f"#node-{node.name}"
    assert page.inner_text(f"{row} td[data-label='Status']").strip() == "ready"

    page.select_option(f"{row} select[name=deadline_s]", "3600")
    page.click(f"{row} button:has-text('Drain')")
    page.wait_for_selector(f"{row} .badge:text('draining')")
    assert "is being drained" in page.inner_text("#nodes [role=status]")
    assert "by admin" in page.inner_text(f"{row} td[data-label='Status']")
    screenshot(page, "nodes.png")

    page.click(f"{row} button:has-text('Call drain off')")
    page.wait_for_selector(f"{row} .badge:text('cordoned')")
    page.click(f"{row} button:has-text('Uncordon')")
    page.wait_for_selector(f"{row} .badge:text('ready')")

    node.refresh_from_db()
    assert (node.state, node.drain_deadline_at) == (Node.State.READY, None)
    assert list(NodeEvent.objects.values_list("kind", "by")) == [
        ("drain", "admin"),
        ("drain_called_off", "admin"),
        ("uncordon", "admin"),
    ]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.stop_requested_at is None
    assert Job.objects.count() == 1

    phone = log_in(chromium, base, "admin", **PHONE)
    phone.goto(f"{base}/nodes/")
    overflow = sideways_overflow(phone)
    assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], overflow
    screenshot(phone, "mobile-node-list.png")

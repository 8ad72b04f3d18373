"""The Fair share page in a real browser, after a real scheduling pass: a member sees every
team's standing and only their own team's members and jobs, follows a pending job to its
page and reads its priority parts; a site admin narrows the page to one team (htmx); the
page fits a phone. Saves docs/screenshots/fairshare.png.

Django's live server, rows written straight into the database and one pass run in process
(its launch messages captured): no agent needed. The browser set-up (Chromium, people,
log-in, screenshots) is test_browser.py's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from test_browser import PHONE, chromium, log_in, people, screenshot, sideways_overflow

from portal.accounting.models import UsageBalance
from portal.agents.testing import capture_sent_messages
from portal.jobs.models import Job, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team
from portal.scheduling.models import JobPriority
from portal.scheduling.service import run_schedule_pass

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

__all__ = ["chromium", "people"]  # fixtures, used by name


def test_a_member_reads_the_fair_share_and_a_pending_jobs_priority_parts(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    vision, nlp, alice, bob = people["vision"], people["nlp"], people["alice"], people["bob"]
    now = timezone.now().replace(microsecond=0)
    idle = make_team("research", description="Idle lately", guaranteed_units=1.0)
    UsageBalance.objects.create(team=idle, unit_seconds=5 * 3600.0, as_of=now)
    make_node("gpu-node-01", gpus=[{"mode": "whole"}] * 4)
    held = make_job(team=nlp, user=bob, name="bert-pretrain", state=JobState.RUNNING)
    Job.objects.filter(pk=held.pk).update(assigned_at=now)
    allocate(held, ["GPU-gpu-node-01-0", "GPU-gpu-node-01-1"])
    make_job(team=vision, user=alice, name="resnet-a", submitted_at=now - timedelta(hours=2))
    make_job(team=vision, user=people["vera"], name="vit-b", submitted_at=now - timedelta(hours=1))
    sweep = make_job(
        team=vision,
        user=alice,
        name="sweep-2gpu",
        gpu_count=2,
        submitted_at=now - timedelta(minutes=30),
    )
    bert = make_job(
        team=nlp, user=bob, name="bert-eval", gpu_count=2, submitted_at=now - timedelta(hours=3)
    )
    with capture_sent_messages():
        assert run_schedule_pass(now=now).status == "ran"
    assert set(JobPriority.objects.values_list("job_id", flat=True)) == {sweep.pk, bert.pk}

    base = live_server.url
    page = log_in(chromium, base, "alice")
    page.click("nav >> text=Fair share")
    page.wait_for_url(f"{base}/fairshare/")
    ranks = {
        team: page.inner_text(f"#fairshare-team-{team} td[data-label='Rank']").strip()
        for team in ("vision", "nlp", "research")
    }
    assert ranks == {"vision": "1", "nlp": "2", "research": "—"}
    # nlp: 2 units held against a fair share of 4/3 of the 4 (weights 2:1): 2 ** -1.5.
    assert page.inner_text("#fairshare-team-nlp td[data-label='Factor']").strip() == "0.3536"
    assert page.is_visible("#fairshare-member-vision-alice")
    assert page.is_visible("#fairshare-member-vision-vera")
    assert page.query_selector("#fairshare-member-nlp-bob") is None  # another team's member
    assert page.query_selector(f"#fairshare-job-{bert.pk}") is None  # another team's job
    row = f"#fairshare-job-{sweep.pk}"
    assert page.inner_text(f"{row} td[data-label='Class']").strip() == "normal"
    screenshot(page, "fairshare.png")

    page.click(f"{row} a")
    page.wait_for_url(f"{base}/jobs/{sweep.pk}/")
    parts = page.inner_text("#job-priority")
    assert "Team factor" in parts and "User factor" in parts and "Age boost" in parts

    # A site admin sees every team's members, and narrows the page to one team.
    admin = log_in(chromium, base, "admin")
    admin.goto(f"{base}/fairshare/")
    assert admin.is_visible("#fairshare-member-nlp-bob")
    admin.select_option("#id_fairshare_team", "nlp")
    admin.wait_for_url(f"{base}/fairshare/?team=nlp")
    admin.wait_for_selector("#fairshare-member-vision-alice", state="detached")
    assert admin.is_visible("#fairshare-member-nlp-bob")
    assert admin.is_visible(f"#fairshare-job-{bert.pk}")

    # At a phone's width the tables are cards and nothing scrolls sideways.
    phone = log_in(chromium, base, "alice", **PHONE)
    phone.goto(f"{base}/fairshare/")
    overflow = sideways_overflow(phone)
    assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], overflow
    assert not phone.is_visible("#fairshare-team-table thead")

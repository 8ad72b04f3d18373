"""The submit form's what-if in a real browser: a person picks a bigger GPU request and sees
the scheduler's answer change beside it (htmx, no reload), submits the job, and after it ran
finds it, with the GPU-unit-hours it was charged, on the Usage page.

Django's live server and rows written straight into the database; the job runs through the
real scheduling pass and the agent's own signed reports (started, finished), without an
agent process. The browser set-up (Chromium, people, log-in, screenshots) is
test_browser.py's.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from test_browser import PHONE, chromium, log_in, people, screenshot, sideways_overflow

from portal.accounting.models import UsageRecord
from portal.agents import testing as agent
from portal.jobs.models import Job, JobState
from portal.jobs.testing import allocate, make_job, make_node
from portal.scheduling import whatif
from portal.scheduling.service import run_schedule_pass
from portal.web.templatetags.portal_web import unit_hours

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

__all__ = ["chromium", "people"]  # fixtures, used by name

A100 = "NVIDIA A100-SXM4-80GB"  # the demo inventory's model


def test_a_user_watches_the_what_if_change_with_a_bigger_request_then_submits(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    whatif.clear_snapshot_cache()
    make_node("gpu-node-1", gpus=[{"mode": "whole", "model": A100}] * 2)
    # bob (nlp) holds one of the two GPUs for at most another 30 minutes, and may not be
    # preempted: one GPU is free now.
    started = timezone.now() - timedelta(minutes=30)
    training = make_job(
        team=people["nlp"],
        user=people["bob"],
        name="bob-train",
        state=JobState.RUNNING,
        assigned_at=started,
        started_at=started,
        time_limit_s=3600,
        preemptible=False,
    )
    allocate(training, ["GPU-gpu-node-1-0"])
    base = live_server.url
    page = log_in(chromium, base, "alice")
    page.click("nav >> text=Submit job")
    page.wait_for_url(f"{base}/jobs/new/")

    # One GPU: it fits now, within the team's guarantee.
    page.wait_for_selector("#whatif-start")
    assert page.inner_text("#whatif-slices") == "2 whole GPUs in the cluster, 1 free now"
    assert page.inner_text("#whatif-start").startswith("now, first in the queue: on gpu-node-1")
    assert page.inner_text("#whatif-borrow") == "no: it stays within the guarantee"

    # Two GPUs of the demo's model, typed as people do: the answer changes by itself.
    page.evaluate("window.__notReloaded = true")
    page.fill("#id_name", "bigger-sweep")
    page.fill("#id_command", "python3 train.py --gpus 2")
    page.fill("#id_gpu_model", "a100")
    page.fill("#id_gpu_count", "2")
    page.dispatch_event("#id_gpu_count", "change")
    page.wait_for_selector("#whatif-start:has-text('position 1 in the queue')")
    assert page.evaluate("window.__notReloaded === true")
    assert page.inner_text("#whatif-slices") == f"2 whole {A100} GPUs in the cluster, 1 free now"
    start = page.inner_text("#whatif-start")
    assert re.search(r"estimated start .* UTC \(in (29|30)\sminutes\)", start), start
    assert page.inner_text("#whatif-reason").startswith("RESERVED")
    assert "draws 2 of its 2 GPU units from team vision's guarantee of 2" in page.inner_text(
        "#whatif-guarantee"
    )
    screenshot(page, "submit-whatif.png")

    # Three GPUs can never fit on a node of two: said before submitting.
    page.fill("#id_gpu_count", "3")
    page.dispatch_event("#id_gpu_count", "change")
    page.wait_for_selector("#whatif-problems")
    assert "at most 2 whole" in page.inner_text("#whatif-problems")

    page.fill("#id_gpu_count", "2")
    page.dispatch_event("#id_gpu_count", "change")
    page.wait_for_selector("#whatif-start:has-text('position 1 in the queue')")
    page.click("button:has-text('Submit job')")
    page.wait_for_url(re.compile(rf"{re.escape(base)}/jobs/\d+/$"))
    job = Job.objects.get(name="bigger-sweep")
    assert (job.state, job.gpu_count, job.gpu_model) == (JobState.PENDING, 2, A100)
    assert Job.objects.count() == 2

    # bob's training ends, the next pass places the sweep on both GPUs, and the agent says
    # it started and, later, that it succeeded: the reports an agent sends, signed.
    node = "gpu-node-1"
    assert agent.deliver(agent.finished(training.pk, 1, node=node)) == "finished"
    with agent.capture_sent_messages():
        assert run_schedule_pass().status == "ran"
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.ASSIGNED, 1), job.pending_message
    assert agent.deliver(agent.started(job.pk, 1, node=node)) == "started"
    page.wait_for_timeout(1000)  # it runs a moment
    assert agent.deliver(agent.finished(job.pk, 1, node=node)) == "finished"
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED

    page.click("nav >> text=Usage")
    page.wait_for_url(f"{base}/usage/")
    row = page.locator(f"#usage-job-{job.pk}")
    assert row.locator("td[data-label=Job]").inner_text() == f"{job.pk} bigger-sweep"
    assert row.locator("td[data-label=State]").inner_text() == "SUCCEEDED"
    # What its attempt was charged (2 GPUs for a few seconds), as the page rounds it.
    charged = UsageRecord.objects.get(job=job, attempt=1)
    assert charged.gpu_units == 2.0 and charged.unit_seconds > 0
    shown = row.locator("td[data-label='Unit-hours']").inner_text()
    assert shown == unit_hours(charged.unit_seconds / 3600) == "< 0.01", shown
    assert row.locator("td[data-label='Last held']").inner_text().endswith(" UTC")
    screenshot(page, "usage-after-run.png")

    phone = log_in(chromium, base, "alice", **PHONE)
    phone.goto(f"{base}/jobs/new/")
    phone.wait_for_selector("#whatif-start")
    overflow = sideways_overflow(phone)
    assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], overflow

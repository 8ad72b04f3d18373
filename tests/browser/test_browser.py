"""A person in a real browser: log in, submit a GPU job through the form, and watch it run.

Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) against the whole
stack from `PortalStack`: gunicorn, the control-plane worker, beat and one agent with the
default described inventory. The job page must follow the job to SUCCEEDED by itself
(htmx polling, no reload), show the MIG device the agent put in CUDA_VISIBLE_DEVICES, and
cancel a running job. Screenshots of the pages go to docs/screenshots/ for the README.

A second test opens every page at a phone's size (390 x 844) against Django's live server and
jobs written straight into the database, so it needs no agent: nothing may scroll sideways.
Another, on the same live server, holds and releases a pending job from the job list and
resubmits a failed one from its page (docs/screenshots/job-actions.png).

Without Chromium the test is skipped, unless PORTAL_REQUIRE_SERVICES=1 (then it fails).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from services import require_service
from stack import PortalStack

from portal.accounting.services import charge_attempt
from portal.cluster.models import Node, Slice
from portal.jobs.models import Allocation, Job, JobArray, JobLogChunk, JobState
from portal.jobs.services import job_submit
from portal.jobs.testing import DEMO_PASSWORD, allocate, make_job, make_node, make_team, make_user
from portal.jobs.validation import validate_job_request
from portal.tenants.models import ApiToken, Membership
from portal.tenants.tokens import token_digest, token_issue
from portal.web import urls as web_urls

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
JOB_TIMEOUT_MS = 120_000
PRINT_DEVICES = "python3 -c \"import os; print(os.environ['CUDA_VISIBLE_DEVICES'])\""


@pytest.fixture
def chromium(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API keeps an asyncio loop on this thread; Django then refuses ORM
    # calls from it, although nothing here runs concurrently with the loop.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not CHROMIUM.exists():
        require_service(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
            # The test's ORM calls ran beside Playwright's event loop, which gives them
            # their own connection; close it here, or the test database cannot be dropped.
            connections.close_all()


@pytest.fixture
def people() -> dict[str, Any]:
    """The demo's teams and people (see seed_demo), with the test password."""
    vision = make_team(
        "vision",
        description="Computer vision",
        weight=2.0,
        guaranteed_units=2.0,
        limit_units=3.0,
        max_priority="high",
    )
    nlp = make_team("nlp", description="Language models", guaranteed_units=1.0, limit_units=3.0)
    return {
        "vision": vision,
        "nlp": nlp,
        "alice": make_user("alice", team=vision),
        "vera": make_user("vera", team=vision, role=Membership.Role.ADMIN),
        "bob": make_user("bob", team=nlp),
        "admin": make_user("admin", site_admin=True),
    }


def log_in(browser: Any, base_url: str, username: str, **page_options: Any) -> Any:
    page = browser.new_page(**{"viewport": VIEWPORT, **page_options})
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", DEMO_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
    return page


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(300)  # let the last htmx swap settle
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def wait_for_badge(page: Any, job_id: int, state: str) -> None:
    """Wait until the job page shows ``state``; on timeout say where the job really is."""
    try:
        page.wait_for_selector(f"#job-state:text('{state}')", timeout=JOB_TIMEOUT_MS)
    except Exception as error:  # Playwright's TimeoutError
        job = Job.objects.get(pk=job_id)
        events = [(e.from_state, e.to_state, e.message) for e in job.events.all()]
        shown = page.inner_text("#job-state") if page.query_selector("#job-state") else "?"
        raise AssertionError(
            f"job {job_id} page shows {shown}, database says {job.state} "
            f"({job.pending_code} {job.pending_message}); events {events}"
        ) from error


def submit_in_background(user: Any, **fields: Any) -> Job:
    """A second job, as from the API: it gives the list and the team page something to show."""
    data = {"team": "vision", "image": "python:3.11-slim", **fields}
    return job_submit(user=user, request=validate_job_request(data, user=user))


def test_a_job_submitted_in_the_browser_runs_to_success_on_its_live_page(
    chromium: Any, people: dict[str, Any], tmp_path: Path
) -> None:
    alice = people["alice"]
    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        base = stack.url.rstrip("/")
        sleeper = submit_in_background(
            alice,
            name="resnet50-train",
            command=["python3", "-c", "import time; print('epoch 1', flush=True); time.sleep(120)"],
            gpu={"kind": "whole", "count": 1},
            time_limit_s=3600,
        )
        page = log_in(chromium, base, "alice")

        # A form sent half-filled comes back with the errors next to their fields.
        page.click("text=Submit job")
        page.wait_for_url(f"{base}/jobs/new/")
        page.fill("#id_name", "")
        page.fill("#id_gpu_count", "0")
        page.click("button:has-text('Submit job')")
        assert page.inner_text("#error-name").startswith("required")
        assert page.inner_text("#error-command").startswith("required, must not be empty")
        assert page.inner_text("#error-gpu_count").startswith("0 is out of range")
        screenshot(page, "submit-errors.png")
        assert Job.objects.filter(name="").count() == 0

        # The submit form, filled in as a person would.
        page.click("nav >> text=Submit job")
        page.wait_for_url(f"{base}/jobs/new/")
        page.fill("#id_name", "hello-mig")
        page.fill("#id_image", "python:3.11-slim")
        page.fill("#id_command", PRINT_DEVICES)
        page.select_option("#id_gpu_kind", "mig")
        page.select_option("#id_gpu_profile", "1g.10gb")
        page.fill("#id_time_limit_s", "600")
        screenshot(page, "submit-form.png")
        page.click("button:has-text('Submit job')")
        page.wait_for_url(re.compile(rf"{re.escape(base)}/jobs/\d+/$"))
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

        # From here on the page must update itself: a reload would drop this marker.
        page.evaluate("window.__notReloaded = true")
        wait_for_badge(page, job_id, "SUCCEEDED")
        assert page.evaluate("window.__notReloaded === true")

        job = Job.objects.get(pk=job_id)
        mig = Allocation.objects.select_related("slice").get(job=job, attempt=job.attempt).slice
        assert (job.state, job.exit_code, mig.kind, mig.profile) == (
            "SUCCEEDED",
            0,
            "mig",
            "1g.10gb",
        )
        assert mig.mig_uuid in page.inner_text(f"#log-{job_id}")
        assert mig.mig_uuid in page.inner_text("#job-slices")
        assert "RUNNING" in page.inner_text("#job-events")
        # Once the job ended, the fragment came back without a poll trigger.
        assert page.get_attribute("#job-live", "hx-trigger") is None
        screenshot(page, "job-finished.png")

        # More work, so the list shows jobs in several states: an MPS job that finishes, and
        # a 2-GPU gang that waits (only one whole GPU is free while the first job runs).
        mps = submit_in_background(
            alice,
            name="mps-check",
            command=[
                "python3",
                "-c",
                "import os; print(os.environ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'])",
            ],
            gpu={"kind": "mps", "count": 1},
        )
        gang = submit_in_background(
            alice,
            name="sweep-2gpu",
            command=["python3", "-c", "print('gang done')"],
            gpu={"kind": "whole", "count": 2},
        )
        stack.wait_for(
            lambda: (
                Job.objects.filter(pk=sleeper.pk, state=JobState.RUNNING).exists()
                and Job.objects.filter(pk=mps.pk, state=JobState.SUCCEEDED).exists()
                and Job.objects.filter(pk=gang.pk, state=JobState.PENDING)
                .exclude(pending_code="")
                .exists()
            ),
            60,
            "a running, an ended and an explained pending job",
        )
        page.goto(f"{base}/")
        page.wait_for_selector(f"#job-table tr:has(a[href='/jobs/{sleeper.pk}/']) .state-RUNNING")
        screenshot(page, "job-list.png")

        # A site admin saves the team's quota through the htmx form, while the job runs.
        admin_page = log_in(chromium, base, "admin")
        admin_page.goto(f"{base}/teams/vision/")
        admin_page.fill("#id_limit_units", "3.5")
        admin_page.click("button:has-text('Save quota')")
        admin_page.wait_for_selector("#team-quota .saved")
        screenshot(admin_page, "team.png")

        # Cancel the running job from its page (the confirm dialog accepted).
        page.goto(f"{base}/jobs/{sleeper.pk}/")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("button:has-text('Cancel job')")
        wait_for_badge(page, sleeper.pk, "CANCELLED")

    assert Job.objects.get(pk=sleeper.pk).state == JobState.CANCELLED
    people["vision"].refresh_from_db()
    assert people["vision"].limit_units == 3.5


# --- at a phone's width ------------------------------------------------------------------

# Every page of portal/web/urls.py that answers a GET, as a path; the others only take POSTs.
WEB_ACTIONS = {
    "logout",
    "job_cancel",
    "job_hold",
    "job_release",
    "job_whatif",  # the submit form's fragment (POST); the submit page shows it
    "team_quota",
    "team_member_add",
    "team_member_role",
    "team_member_limit",
    "token_revoke",
    "node_cordon",
    "node_uncordon",
    "node_drain",
    "array_cancel",
    "array_resubmit_failed",
}


def sideways_overflow(page: Any) -> dict[str, Any]:
    """How far the page scrolls sideways, and every box whose content is wider than itself
    (a table scrolling inside its wrapper would hide from the page's own scroll width)."""
    return page.evaluate(
        """() => ({
            scrollWidth: document.documentElement.scrollWidth,
            wide: Array.from(document.querySelectorAll("header, main, .panel, .table-wrap, table, pre"))
                .filter((box) => box.scrollWidth > box.clientWidth + 1)
                .map((box) => `${box.tagName.toLowerCase()}#${box.id}.${box.className}`),
        })"""
    )


def test_every_page_fits_a_phone_without_sideways_scrolling(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    vision, admin, alice = people["vision"], people["admin"], people["alice"]
    Membership.objects.create(team=vision, user=admin)  # a site admin who may also submit
    node = make_node(
        "gpu-node-with-a-long-name-01",
        gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}],
    )
    # Real MIG UUIDs are long; they must wrap, not widen the page.
    for number, slice_ in enumerate(Slice.objects.filter(kind="mig")):
        Slice.objects.filter(pk=slice_.pk).update(
            mig_uuid=f"MIG-8a3f9c2e-4b1d-5e6f-9a0b-1c2d3e4f5a6{number}"
        )
    running = make_job(
        team=vision, user=alice, state=JobState.RUNNING, name="resnet50-imagenet-train-long-run"
    )
    allocate(running, [s.key for s in Slice.objects.filter(gpu__node=node, kind="mig")[:1]])
    JobLogChunk.objects.create(
        job=running, attempt=1, seq=0, data="epoch 1 " + "x" * 300 + "\nloss=0.42\n"
    )
    pending = make_job(
        team=vision,
        user=admin,
        name="sweep-2gpu",
        gpu_count=2,
        pending_code="QUOTA_LIMIT",
        pending_message="team vision uses 2.0 of 3.0 units, job needs 2.0",
        queue_position=1,
    )
    make_job(
        team=vision,
        user=alice,
        state=JobState.FAILED,
        name="broken-eval",
        exit_code=1,
        reason="exited with code 1: ModuleNotFoundError: No module named 'torchvision'",
    )
    token_issue(user=admin, name="laptop notebook")  # a row on the Tokens page
    sweep = JobArray.objects.create(
        team=vision, user=admin, name="lr-sweep", size=1, max_running=1, created_at=timezone.now()
    )
    Job.objects.filter(pk=pending.pk).update(array=sweep, array_index=0)
    base = live_server.url.rstrip("/")
    pages = {
        "login": "/login/",
        "job_list": "/",
        "job_submit": "/jobs/new/",
        "job_detail": f"/jobs/{running.pk}/",
        "team_list": "/teams/",
        "team_detail": f"/teams/{vision.name}/",
        "cluster": "/cluster/",
        "fairshare": "/fairshare/",
        "usage": "/usage/",
        # The team page asking to confirm a member's removal.
        "team_member_remove": f"/teams/{vision.name}/members/alice/remove/",
        "token_list": "/tokens/",
        "node_list": "/nodes/",
        "notifications": "/settings/notifications/",
        "array_detail": f"/arrays/{sweep.pk}/",
    }
    web_pages = {pattern.name for pattern in web_urls.urlpatterns} - WEB_ACTIONS
    assert web_pages <= set(pages), f"add {web_pages - set(pages)} to this test"
    shots = {name: path for name, path in pages.items() if name in web_pages}
    shots |= {"job_pending": f"/jobs/{pending.pk}/", "404": "/jobs/999999/"}

    anonymous = chromium.new_page(**PHONE)
    page = log_in(chromium, base, "admin", **PHONE)
    for name, path in shots.items():
        visitor = anonymous if name == "login" else page
        response = visitor.goto(f"{base}{path}")
        assert response.status == (404 if name == "404" else 200), path
        screenshot(visitor, f"mobile-{name.replace('_', '-')}.png")
        overflow = sideways_overflow(visitor)
        assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], (path, overflow)
        if name != "login":
            # The header wrapped instead of running off the screen: every link is on it.
            for link in visitor.query_selector_all("header a, header button"):
                box = link.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 391

    # The job list is one card per job, and a card shows the state and the reason.
    page.goto(f"{base}/")
    assert not page.is_visible("#job-table thead")
    card = page.locator(f"#job-table tr:has(a[href='/jobs/{pending.pk}/'])")
    assert card.locator("td[data-label='State'] .badge").inner_text() == "PENDING"
    assert "QUOTA_LIMIT" in card.locator("td[data-label='Where / why']").inner_text()
    failed = page.locator("#job-table tr:has-text('broken-eval') td[data-label='Where / why']")
    assert "No module named" in failed.inner_text()

    # A form sent with errors lists every problem at the top, and still fits.
    page.goto(f"{base}/jobs/new/")
    page.fill("#id_name", "")
    page.fill("#id_command", "")
    page.fill("#id_depends_on", "abc")
    page.click("button:has-text('Submit job')")
    problems = page.inner_text("#form-problems")
    assert "Name: required" in problems and "Depends on: dependency 1:" in problems
    screenshot(page, "mobile-submit-errors.png")
    assert sideways_overflow(page)["scrollWidth"] <= 391


# --- job actions ---------------------------------------------------------------------------


def test_a_job_is_held_and_released_from_the_list_and_resubmitted_from_its_page(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    """No agent needed: the pages of one web server (pytest-django's) and jobs written
    straight into the database."""
    vision, alice = people["vision"], people["alice"]
    now = timezone.now()
    waiting = make_job(
        team=vision,
        user=alice,
        name="sweep-2gpu",
        gpu_count=2,
        pending_code="QUOTA_LIMIT",
        pending_message="team vision uses 2.0 of 3.0 units, job needs 2.0",
        queue_position=1,
        estimated_start_at=now + timedelta(minutes=40),
    )
    failed = make_job(
        team=vision,
        user=alice,
        state=JobState.FAILED,
        name="resnet-train",
        gpu_kind="mig",
        gpu_profile="3g.40gb",
        exit_code=1,
        reason="exited with code 1",
        started_at=now - timedelta(minutes=12),
        finished_at=now - timedelta(minutes=4),
    )
    make_job(
        team=vision,
        user=alice,
        state=JobState.RUNNING,
        name="bert-finetune",
        started_at=now - timedelta(minutes=25),
    )
    make_job(team=vision, user=people["vera"], name="vera-eval")
    base = live_server.url.rstrip("/")
    page = log_in(chromium, base, "alice")
    row = f"#job-row-{waiting.pk}"

    # Hold the pending job from its row: the row turns HELD in place, with a Release button.
    page.evaluate("window.__notReloaded = true")
    page.click(f"{row} button:has-text('Hold')")
    page.wait_for_selector(f"{row} .state-HELD")
    assert Job.objects.get(pk=waiting.pk).state == JobState.HELD
    assert page.inner_text(f"{row} td[data-label='Est. start']").strip() == "held"
    screenshot(page, "job-actions.png")

    # Release it: back to PENDING (at the end of the queue), still without a reload.
    page.click(f"{row} button:has-text('Release')")
    page.wait_for_selector(f"{row} .state-PENDING")
    assert Job.objects.get(pk=waiting.pk).state == JobState.PENDING
    assert page.evaluate("window.__notReloaded === true")

    # The scheduler starts it before the page's next poll; Hold now says why, and stays said.
    page.evaluate(
        """document.body.addEventListener("htmx:beforeRequest", (event) => {
            if (event.detail.elt.id === "job-table") event.preventDefault();  // no polls
        })"""
    )
    Job.objects.filter(pk=waiting.pk).update(state=JobState.RUNNING, started_at=timezone.now())
    page.click(f"{row} button:has-text('Hold')")
    refused = page.wait_for_selector("#job-action-message .form-errors")
    assert refused.inner_text() == f"job {waiting.pk} is RUNNING; only a PENDING job can be held"
    assert Job.objects.get(pk=waiting.pk).state == JobState.RUNNING

    # Mine only, and a search by name: the list narrows as one types, and the address keeps it.
    page.check("#id_mine")
    page.wait_for_url(re.compile(r"mine=1"))
    page.fill("#id_q", "RESNET")
    page.wait_for_url(re.compile(r"q=RESNET"))
    page.wait_for_function("document.querySelectorAll('#job-table tbody tr').length === 1")
    assert page.inner_text("#job-table tbody").startswith(str(failed.pk))

    # Resubmit the failed job from its page: the form comes filled in; change the name.
    page.goto(f"{base}/jobs/{failed.pk}/")
    page.click("#resubmit")
    page.wait_for_url(f"{base}/jobs/new/?from={failed.pk}")
    assert page.input_value("#id_name") == "resnet-train"
    assert page.input_value("#id_gpu_kind") == "mig"
    assert page.input_value("#id_gpu_profile") == "3g.40gb"
    page.fill("#id_name", "resnet-train-retry")
    page.click("button:has-text('Submit job')")
    page.wait_for_url(re.compile(rf"{re.escape(base)}/jobs/\d+/$"))
    new_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    new = Job.objects.get(pk=new_id)
    assert (new.name, new.gpu_kind, new.gpu_profile, new.state) == (
        "resnet-train-retry",
        "mig",
        "3g.40gb",
        JobState.PENDING,
    )
    assert f"resubmitted from job {failed.pk}" in page.inner_text("#job-events")


# --- the Tokens page -----------------------------------------------------------------------


def test_a_token_made_on_the_tokens_page_is_shown_once_works_and_is_revoked(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    """No agent needed: the page and the API of one web server (pytest-django's)."""
    base = live_server.url
    page = log_in(chromium, base, "alice")
    page.click("nav >> text=Tokens")
    page.wait_for_url(f"{base}/tokens/")

    # A read-only token for a notebook; its key appears once, in the answer to the create.
    page.fill("#id_token_name", "analysis notebook")
    page.uncheck("#id_scope_submit")
    page.select_option("#id_expires_in_days", "7")
    page.click("button:has-text('Create token')")
    key = page.inner_text("#new-token-key").strip()
    token = ApiToken.objects.get(user=people["alice"])
    assert (token.name, token.scopes, token.digest) == (
        "analysis notebook",
        ["read"],
        token_digest(key),
    )
    row = page.inner_text(f"#token-{token.pk}")
    assert "analysis notebook" in row and key[:8] in row and key not in row
    screenshot(page, "tokens.png")

    # The key works, for reading only; after a reload it is nowhere on the page.
    api = page.context.request
    headers = {"Authorization": f"Token {key}"}
    assert api.get(f"{base}/api/v1/jobs/", headers=headers).status == 200
    assert api.post(f"{base}/api/v1/jobs/", headers=headers, data={}).status == 403
    page.reload()
    assert key not in page.content()
    assert "never" not in page.inner_text(f"#token-{token.pk} td[data-label='Last used']")

    # Revoke (the confirm dialog accepted): the row goes, and the key is refused.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#token-{token.pk} button:has-text('Revoke')")
    page.wait_for_selector("#tokens .saved")
    assert page.query_selector(f"#token-{token.pk}") is None
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert api.get(f"{base}/api/v1/jobs/", headers=headers).status == 401


def test_the_api_docs_render_with_no_internet(chromium: Any, live_server: Any) -> None:
    base = live_server.url.rstrip("/")
    elsewhere: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(f"{base}/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page = chromium.new_page(viewport=VIEWPORT)
    page.route("**/*", only_this_server)
    page.goto(f"{base}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title:has-text('GPU portal API')")
    page.wait_for_selector(".opblock-summary-path:has-text('/api/v1/jobs/')")
    assert elsewhere == []


# --- the Cluster page ----------------------------------------------------------------------


def test_the_cluster_page_shows_free_slices_and_who_holds_the_others(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    """Alice (vision) sees every slice: free, held by her team's jobs (a link to the job),
    held by nlp (the team only), on a cordoned node, on a lost node; the free totals and the
    last 24 hours' utilisation as a chart with its numbers."""
    vision, nlp, alice, bob = people["vision"], people["nlp"], people["alice"], people["bob"]
    now = timezone.now()
    make_node(
        "gpu-host-1",
        gpus=[
            {"mode": "whole", "model": "NVIDIA A100-SXM4-80GB"},
            {"mode": "whole", "model": "NVIDIA A100-SXM4-80GB"},
            {
                "mode": "mig",
                "model": "NVIDIA A100-SXM4-80GB",
                "profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
            {"mode": "mps", "model": "NVIDIA A100-SXM4-80GB", "shares": 4},
        ],
    )
    make_node("gpu-host-2", gpus=[{"mode": "whole"}, {"mode": "whole"}])
    make_node("gpu-host-3", gpus=[{"mode": "whole"}])
    Node.objects.update(registered_at=now - timedelta(days=2), last_heartbeat_at=now)
    Node.objects.filter(name="gpu-host-2").update(
        state=Node.State.DRAINED, cordoned_at=now - timedelta(minutes=20), cordoned_by="admin"
    )
    Node.objects.filter(name="gpu-host-3").update(
        state=Node.State.LOST, last_heartbeat_at=now - timedelta(hours=3)
    )
    running = {"state": JobState.RUNNING}
    resnet = make_job(team=vision, user=alice, name="resnet50-train", **running)
    bert = make_job(team=nlp, user=bob, name="bert-finetune", **running)
    sweep = make_job(team=vision, user=alice, name="sweep-a", **running)
    allocate(resnet, ["GPU-gpu-host-1-0"])
    allocate(bert, ["MIG-gpu-host-1-2-0", "GPU-gpu-host-1-3/mps/0"])
    allocate(sweep, ["GPU-gpu-host-2-0"])
    # Earlier work, so the chart has a day to show: some GPUs held for part of each hour.
    done = make_job(team=nlp, user=bob, name="earlier", state=JobState.SUCCEEDED)
    for hours_ago in range(1, 24):
        for n, key in enumerate(["GPU-gpu-host-1-1", "GPU-gpu-host-2-1", "GPU-gpu-host-3-0"]):
            if (hours_ago + n) % 3:
                start = now - timedelta(hours=hours_ago, minutes=50)
                Allocation.objects.create(
                    job=done,
                    attempt=1,
                    slice=Slice.objects.get(key=key),
                    created_at=start,
                    released_at=start + timedelta(minutes=10 * (1 + (hours_ago * (n + 1)) % 5)),
                )

    base = live_server.url.rstrip("/")
    page = log_in(chromium, base, "alice")
    page.click("nav >> text=Cluster")
    page.wait_for_url(f"{base}/cluster/")
    page.wait_for_selector("#cluster-live svg#utilisation-chart")

    held = page.locator("#node-gpu-host-1 li.slice-held").all_inner_texts()
    assert [" ".join(text.split()) for text in held] == [
        "whole held by vision: resnet50-train (alice)",
        "3g.40gb held by nlp",
        "MPS 0.25 held by nlp",
    ]
    assert "bert-finetune" not in page.content()
    assert page.inner_text("#node-gpu-host-2 .node-status") == "cordoned"
    assert page.inner_text("#node-gpu-host-3 .node-status") == "lost"
    assert " ".join(page.inner_text("#node-gpu-host-2 li.slice-draining").split()) == (
        "whole draining"
    )
    free_1g = page.locator("[id='free-mig-1g.10gb'] td[data-label='Free']").inner_text()
    assert free_1g == "2"
    assert page.locator("#utilisation-table tbody tr").count() == 24
    assert page.locator("svg#utilisation-chart g.bar").count() == 24
    screenshot(page, "cluster.png")

    # Her team's job links to its page.
    page.click("#node-gpu-host-1 a:has-text('resnet50-train')")
    page.wait_for_url(f"{base}/jobs/{resnet.pk}/")


# --- the Usage page --------------------------------------------------------------------------


def test_the_usage_page_shows_hours_per_member_and_holdings_against_the_guarantee(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    """No agent needed: finished attempts charged through the accounting service, running
    ones as allocations, in the web server of pytest-django."""
    vision, alice, vera = people["vision"], people["alice"], people["vera"]
    vision.budget_gpu_hours = 40.0
    vision.save(update_fields=["budget_gpu_hours"])
    model = "NVIDIA A100-SXM4-80GB"
    make_node(
        "gpu-host-1",
        gpus=[
            {"model": model},
            {"model": model},
            {"model": model},
            {"mode": "mig", "model": model, "profiles": ["3g.40gb", "3g.40gb"]},
        ],
    )
    now = timezone.now()

    def ran(user: Any, keys: list[str], hours_ago: float, hours: float) -> None:
        job = make_job(team=vision, user=user, state=JobState.SUCCEEDED, name="train")
        allocate(job, keys, released=True)
        start = now - timedelta(hours=hours_ago)
        end = start + timedelta(hours=hours)
        Allocation.objects.filter(job=job).update(created_at=start, released_at=end)
        charge_attempt(
            job_id=job.pk,
            attempt=1,
            team_id=vision.pk,
            user_id=user.pk,
            units=float(len(keys)),
            held_from=start,
            held_until=end,
            half_life_s=7 * 86400.0,
        )

    def running(user: Any, keys: list[str], hours_ago: float) -> None:
        job = make_job(team=vision, user=user, state=JobState.RUNNING, name="sweep")
        allocate(job, keys)
        Allocation.objects.filter(job=job).update(created_at=now - timedelta(hours=hours_ago))

    for day in range(1, 12, 2):  # some work on every other day
        ran(alice, ["GPU-gpu-host-1-0"], 24 * day + 6, 3 + day % 4)
    ran(vera, ["GPU-gpu-host-1-0", "GPU-gpu-host-1-1"], 30, 4)  # 8 GPU-unit-hours
    ran(vera, ["GPU-gpu-host-1-2"], 75, 10)
    running(alice, ["MIG-gpu-host-1-3-0"], 5)  # 3/7 of a GPU
    running(vera, ["GPU-gpu-host-1-0", "GPU-gpu-host-1-1"], 3)  # above the guarantee of 2

    base = live_server.url.rstrip("/")
    page = log_in(chromium, base, "vera")
    page.click("nav >> text=Usage")
    page.wait_for_url(f"{base}/usage/")
    assert page.inner_text("h1") == "Usage of team vision"
    # vera administers the team: every member, in the table and in the chart's legend.
    assert page.locator("#usage-members tbody tr").count() == 3  # alice, vera, the team
    assert page.inner_text("#usage-daily-legend").split() == ["alice", "vera"]
    assert page.locator("svg#usage-daily g.bar").count() == 30
    assert page.locator("svg#usage-held g.bar").count() >= 7 * 24
    # vera: 8 + 10 finished, and 2 GPUs for 3 hours so far.
    vera_30 = page.inner_text("#usage-member-vera td[data-label='Last 30 days']")
    assert float(vera_30) == pytest.approx(24.0, abs=0.05)
    borrowed = page.inner_text("#usage-borrowed .value")
    assert borrowed.startswith("0.43")  # 2 + 3/7 held, guarantee 2
    # A bar's title is its tooltip: today's bar names both members.
    today = page.locator("svg#usage-daily g.bar").last.locator("title").first.text_content()
    assert today is not None and "alice" in today and "vera" in today
    screenshot(page, "usage.png")

    # A member sees themself and the rest of the team, never another member's name.
    member = log_in(chromium, base, "alice")
    member.goto(f"{base}/usage/")
    assert member.locator("#usage-member-vera").count() == 0
    assert member.inner_text("#usage-daily-legend").split() == [
        "alice",
        "rest",
        "of",
        "the",
        "team",
    ]
    assert not re.search(r"\bvera\b", member.inner_text("#usage"))

    # At a phone's width the tables become cards and nothing scrolls sideways.
    phone = log_in(chromium, base, "vera", **PHONE)
    phone.goto(f"{base}/usage/")
    overflow = sideways_overflow(phone)
    assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], overflow
    assert not phone.is_visible("#usage-daily-table thead")
    screenshot(phone, "mobile-usage.png")

    # A site admin picks the team from the menu; the page swaps in place (htmx).
    admin = log_in(chromium, base, "admin")
    admin.goto(f"{base}/usage/")
    assert admin.inner_text("h1") == "Usage of team nlp"
    admin.evaluate("window.__notReloaded = true")
    admin.select_option("#id_usage_team", "vision")
    admin.wait_for_selector("h1:has-text('Usage of team vision')")
    assert admin.evaluate("window.__notReloaded === true")
    assert admin.url.endswith("/usage/?team=vision")
    assert admin.locator("#usage-member-alice").count() == 1

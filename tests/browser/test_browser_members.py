"""A team admin manages their team in a real browser (issue 9.5): adds a member by username,
sets the member's limit, and removes them after the confirmation, all through htmx on the
team page. The screenshot docs/screenshots/team-members.png is taken here.

Headless Debian Chromium against Django's live server, with the fixtures of
``test_browser.py``; without Chromium the test is skipped (fails under
PORTAL_REQUIRE_SERVICES=1), as there.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_browser

from portal.jobs.testing import make_user
from portal.tenants.models import Membership, Team, TeamAuditEntry

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The shared fixtures, by their names (pytest finds fixtures among a module's attributes).
chromium = test_browser.chromium
people = test_browser.people


def test_a_team_admin_adds_a_member_sets_a_limit_and_removes_them(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    Team.objects.filter(name="vision").update(member_limit_units=2.0)
    make_user("carl")
    base = live_server.url.rstrip("/")
    page = test_browser.log_in(chromium, base, "vera")
    page.goto(f"{base}/teams/vision/")

    # Add carl as a member, with a limit above the team's per-member limit: refused, and
    # the form keeps what was typed.
    page.fill("#id_member_username", "carl")
    page.fill("#id_member_limit_units", "3")
    page.click("#member-add button:has-text('Add member')")
    error = page.wait_for_selector("#error-member-limit_units")
    assert "above the team's per-member limit (2 units)" in error.inner_text()
    assert page.input_value("#id_member_username") == "carl"
    assert not Membership.objects.filter(user__username="carl").exists()

    page.fill("#id_member_limit_units", "1")
    page.click("#member-add button:has-text('Add member')")
    page.wait_for_selector("#member-done:has-text('carl added to vision as member.')")
    assert Membership.objects.get(user__username="carl").limit_units == 1.0

    # Tighten carl's limit in the list.
    row = page.locator("tr[data-username='carl']")
    row.locator("input[name='limit_units']").fill("0.5")
    row.locator("button:has-text('Set limit')").click()
    page.wait_for_selector("#member-done:has-text('The limit of carl in vision is now 0.5')")
    assert "may hold 0.5 units" in page.locator("tr[data-username='carl']").inner_text()
    assert Membership.objects.get(user__username="carl").limit_units == 0.5
    log = page.inner_text("#team-audit")
    assert "carl's limit (GPU units)" in log and "1 → 0.5" in log and "added carl" in log
    page.locator("#members").scroll_into_view_if_needed()
    test_browser.screenshot(page, "team-members.png")

    # Remove carl: a confirmation first, saying the running jobs keep running.
    page.locator("tr[data-username='carl'] a:has-text('Remove')").click()
    confirm = page.wait_for_selector("#confirm-remove")
    assert "running ones keep running" in confirm.inner_text()
    assert Membership.objects.filter(user__username="carl").exists()
    page.click("#confirm-remove-button")
    page.wait_for_selector("#member-done:has-text('carl removed from vision.')")
    assert page.query_selector("tr[data-username='carl']") is None
    assert not Membership.objects.filter(user__username="carl").exists()
    actions = list(
        TeamAuditEntry.objects.filter(team__name="vision")
        .order_by("at", "id")
        .values_list("action", flat=True)
    )
    assert actions == ["member_added", "limit_changed", "limit_changed", "member_removed"]


def test_a_member_sees_no_controls(chromium: Any, people: dict[str, Any], live_server: Any) -> None:
    base = live_server.url.rstrip("/")
    page = test_browser.log_in(chromium, base, "alice")
    page.goto(f"{base}/teams/vision/")
    page.wait_for_selector("tr[data-username='vera']")
    assert page.query_selector("#member-add") is None
    assert page.query_selector("#team-members button") is None


def test_the_members_section_and_the_confirmation_fit_a_phone(
    chromium: Any, people: dict[str, Any], live_server: Any
) -> None:
    base = live_server.url.rstrip("/")
    page = test_browser.log_in(chromium, base, "vera", **test_browser.PHONE)
    page.goto(f"{base}/teams/vision/members/alice/remove/")
    page.wait_for_selector("#confirm-remove")
    overflow = test_browser.sideways_overflow(page)
    assert overflow["scrollWidth"] <= 391 and overflow["wide"] == [], overflow

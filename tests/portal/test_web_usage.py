"""The Usage page (/usage/) and the usage part of the team page: the numbers of
portal.jobs.usage as people see them, charts with a title per bar and a table beside them,
who sees whose hours, and a fixed number of queries however many jobs and members."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from usage_world import NOW, usage_world

import portal.web.team_usage
from portal.jobs.testing import allocate, make_job, make_user
from portal.tenants.models import Membership
from portal.web.charts import Series, axis, top_series

# Session, user, the viewer's teams, and the report's five (four for a site admin: no
# membership lookup to know they administer the team).
USAGE_PAGE_QUERIES = 8
# The team page's own queries, and the report's five.
TEAM_PAGE_QUERIES = 14


@pytest.fixture
def team_world(db, settings, monkeypatch) -> dict[str, Any]:
    people = usage_world(settings)
    monkeypatch.setattr(portal.web.team_usage, "timezone", SimpleNamespace(now=lambda: NOW))
    return people


def page(user: Any, path: str) -> Any:
    client = Client()
    client.force_login(user)
    return client.get(path)


def section(html: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (its nested elements' too), tags removed
    and spaces squeezed."""
    match = re.search(rf'<(\w+)[^>]*id="{element_id}"', html)
    assert match, f"no #{element_id}"
    tag, depth, position = match.group(1), 1, match.end()
    for found in re.compile(rf"<(/?){tag}\b").finditer(html, match.end()):
        depth += -1 if found.group(1) else 1
        position = found.start()
        if depth == 0:
            break
    text = re.sub(r"<[^>]+>", " ", html[match.start() : position])
    return re.sub(r"\s+", " ", text).strip()


def test_a_member_sees_their_hours_and_the_team_total_but_no_other_member(team_world):
    response = page(team_world["alice"], "/usage/")

    assert response.status_code == 200
    html = response.content.decode()
    assert section(html, "usage-member-alice") == "alice (you) member 20.06 20.06"
    # vera's 5 hours: 1 May's hold across midnight (30 days reach back to 11 April) and 3 h
    # running today.
    assert section(html, "usage-member-others") == "rest of the team — 5 5"
    assert section(html, "usage-member-total") == "team vision 25.06 25.06"
    assert section(html, "usage-budget-left") == "Budget left 74.94 GPU-unit-hours"
    assert section(html, "usage-borrowed").startswith("Borrowed now 1 units")
    assert section(html, "usage-day-2024-05-10") == "Fri 10 May 12.06 3 15.06"
    assert not re.search(r"\bvera\b", html)


def test_a_team_admin_sees_every_member_in_the_table_the_chart_and_its_legend(team_world):
    html = page(team_world["vera"], "/usage/?team=vision").content.decode()

    assert section(html, "usage-member-vera") == "vera (you) team admin 5 5"
    assert section(html, "usage-day-2024-05-10") == "Fri 10 May 12.06 3 15.06"
    assert section(html, "usage-daily-legend") == "alice vera"
    daily = html[
        html.index('<svg id="usage-daily"') : html.index(
            "</svg>", html.index('<svg id="usage-daily"')
        )
    ]
    # One bar per day, each with its title; each member's part of a bar with its own.
    assert daily.count('<g class="bar"><title>') == 30
    assert "<title>Fri 10 May 2024: 15.06 GPU-unit-hours (alice 12.06, vera 3)</title>" in daily
    assert "<title>vera, Fri 10 May 2024: 3 GPU-unit-hours</title>" in daily
    # vera's part is drawn in a pattern, not only in another colour.
    assert 'fill="url(#usage-daily-p1)"' in daily and '<pattern id="usage-daily-p1"' in daily


def test_the_holdings_chart_shows_the_guarantee_and_what_is_borrowed(team_world):
    html = page(team_world["vera"], "/usage/").content.decode()

    held = html[
        html.index('<svg id="usage-held"') : html.index(
            "</svg>", html.index('<svg id="usage-held"')
        )
    ]
    assert held.count('<g class="bar"><title>') == 7 * 24
    assert (
        "<title>Fri 10 May 01:00 UTC: 1.06 GPU units held on average (peak 1.25), "
        "0.06 above the guarantee</title>"
    ) in held
    assert ">guarantee 1</text>" in held and ">limit 4</text>" in held
    assert section(html, "held-day-2024-05-10") == "Fri 10 May (6 h) 1.51 2 3.06 unit-h"


def test_another_teams_usage_page_is_a_404_and_a_person_without_a_team_is_told_so(team_world):
    assert page(team_world["bob"], "/usage/?team=vision").status_code == 404
    assert "Usage of team nlp" in page(team_world["bob"], "/usage/").content.decode()
    loner = make_user("loner")
    assert "You are not in any team yet" in page(loner, "/usage/").content.decode()


def test_the_team_page_shows_the_usage_of_the_period(team_world):
    html = page(team_world["alice"], "/teams/vision/").content.decode()

    assert section(html, "usage-period") == "Used this period 25.06 GPU-unit-hours"
    assert section(html, "usage-budget") == "Monthly budget 100 GPU-unit-hours"
    assert section(html, "usage-held") == "Held now 2 units guarantee 1 · limit 4"
    assert 'id="usage-page-link"' in html
    assert not re.search(r"\bvera\b", section(html, "team-usage"))


def more_of_everything(people: dict[str, Any]) -> None:
    vision = people["vision"]
    for number in range(5):
        member = make_user(f"member{number}", team=vision, role=Membership.Role.MEMBER)
        job = make_job(team=vision, user=member, state="SUCCEEDED", name=f"job{number}")
        allocate(job, ["GPU-node-a-3"], released=True)


@pytest.mark.parametrize("viewer", ["alice", "vera", "admin"])
def test_the_usage_page_costs_the_same_queries_however_many_jobs_and_members(
    team_world, viewer, django_assert_num_queries
):
    client = Client()
    client.force_login(team_world[viewer])
    expected = USAGE_PAGE_QUERIES - (1 if viewer == "admin" else 0)
    with django_assert_num_queries(expected):
        assert client.get("/usage/?team=vision").status_code == 200
    more_of_everything(team_world)
    with django_assert_num_queries(expected):
        assert client.get("/usage/?team=vision").status_code == 200


def test_the_team_page_costs_the_same_queries_however_many_jobs_and_members(
    team_world, django_assert_num_queries
):
    client = Client()
    client.force_login(team_world["vera"])
    with django_assert_num_queries(TEAM_PAGE_QUERIES):
        assert client.get("/teams/vision/").status_code == 200
    more_of_everything(team_world)
    with django_assert_num_queries(TEAM_PAGE_QUERIES):
        assert client.get("/teams/vision/").status_code == 200


def test_a_chart_axis_steps_in_round_numbers_and_many_members_fold_into_one_series():
    assert [axis(value) for value in (0.0, 2.43, 3.0, 13.98, 24.0)] == [
        (1.0, 0.25),
        (2.5, 0.5),
        (3.0, 1.0),
        (15.0, 5.0),
        (25.0, 5.0),
    ]
    series = [Series(f"user{n}", [float(n), 1.0]) for n in range(10)]

    drawn = top_series(series, others="everyone else")

    # The seven largest keep their names (in their order); the three smallest add up.
    assert [s.name for s in drawn] == [f"user{n}" for n in range(3, 10)] + ["everyone else"]
    assert list(drawn[-1].values) == [0.0 + 1.0 + 2.0, 3.0]


def test_the_jobs_table_lists_each_job_with_its_hours_and_a_member_only_their_own(team_world):
    from portal.jobs.models import Job

    a, b, c, d, e = Job.objects.filter(team=team_world["vision"]).order_by("pk")
    admin = page(team_world["vera"], "/usage/?team=vision").content.decode()
    member = page(team_world["alice"], "/usage/").content.decode()

    assert section(admin, f"usage-job-{e.pk}") == f"{e.pk} job vera RUNNING 3 now (running)"
    assert section(admin, f"usage-job-{b.pk}") == f"{b.pk} job alice RUNNING 14 now (running)"
    assert (
        section(admin, f"usage-job-{c.pk}")
        == f"{c.pk} job alice SUCCEEDED 0.06 Fri 10 May 01:45 UTC"
    )
    assert (
        section(admin, f"usage-job-{a.pk}") == f"{a.pk} job alice SUCCEEDED 6 Thu 9 May 01:00 UTC"
    )
    # vera's hold across the night into May is within the page's 30 days.
    assert section(admin, f"usage-job-{d.pk}") == f"{d.pk} job vera SUCCEEDED 2 Wed 1 May 01:00 UTC"
    assert (
        admin.index(f"usage-job-{e.pk}")
        < admin.index(f"usage-job-{b.pk}")
        < admin.index(f"usage-job-{c.pk}")
    )
    assert f'href="/jobs/{b.pk}/"' in member and f"usage-job-{e.pk}" not in member
    assert section(member, f"usage-job-{b.pk}") == f"{b.pk} job RUNNING 14 now (running)"
    assert f"usage-job-{d.pk}" not in member


def test_a_charge_too_small_for_two_decimals_is_not_written_as_nothing():
    from portal.web.templatetags.portal_web import unit_hours

    assert [unit_hours(v) for v in (0.0, 0.0008, 0.005, 2.345, None)] == [
        "0",
        "< 0.01",
        "0.01",
        "2.35",
        "—",
    ]

"""GET /api/v1/teams/<name>/usage/: the series of the Usage page, for the people who may see
them (another team's usage is a 404), over a bounded range of days (bad dates are a 400
naming the field), with a token that has the read scope."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from rest_framework.test import APIClient
from usage_world import NOW, usage_world

import portal.api.usage
from portal.jobs.testing import token_client
from portal.tenants.tokens import token_create

URL = "/api/v1/teams/vision/usage/"
THREE_DAYS = {"from": "2024-05-08", "to": "2024-05-10"}


@pytest.fixture
def team_world(db, settings, monkeypatch) -> dict[str, Any]:
    people = usage_world(settings)
    # The view's clock, not Django's: tokens and sessions keep the real time.
    monkeypatch.setattr(portal.api.usage, "timezone", SimpleNamespace(now=lambda: NOW))
    return people


def get(user: Any, params: dict[str, str] | None = None, url: str = URL) -> Any:
    return token_client(user).get(url, params or {})


def test_a_team_admin_gets_every_members_hours_per_day(team_world):
    response = get(team_world["vera"], THREE_DAYS)

    assert response.status_code == 200, response.json()
    data = response.json()
    assert (data["team"], data["every_member"]) == ("vision", True)
    assert data["days"] == [
        {"date": "2024-05-08", "gpu_unit_hours": 4.0, "members": {"alice": 4.0, "vera": 0.0}, "others": 0.0},
        {"date": "2024-05-09", "gpu_unit_hours": 4.0, "members": {"alice": 4.0, "vera": 0.0}, "others": 0.0},
        {"date": "2024-05-10", "gpu_unit_hours": 15.0625, "members": {"alice": 12.0625, "vera": 3.0}, "others": 0.0},
    ]  # fmt: skip
    assert data["members"] == [
        {"username": "alice", "role": "member", "gpu_unit_hours": 20.0625, "period_gpu_unit_hours": 20.0625},
        {"username": "vera", "role": "admin", "gpu_unit_hours": 3.0, "period_gpu_unit_hours": 5.0},
    ]  # fmt: skip
    assert data["period"] == {
        "start": "2024-05-01T00:00:00Z",
        "gpu_unit_hours": 25.0625,
        "others_gpu_unit_hours": 0.0,
        "budget_gpu_unit_hours": 100.0,
        "budget_left_gpu_unit_hours": 74.9375,
    }
    assert data["quota"] == {
        "guaranteed_units": 1.0,
        "limit_units": 4.0,
        "held_units": 2.0,
        "borrowed_units": 1.0,
    }
    # Hour by hour from 8 May 00:00 up to now (10 May 06:00): 54 hours.
    assert len(data["holdings"]) == 54
    assert data["holdings"][49] == {
        "start": "2024-05-10T01:00:00Z",
        "mean_units": 1.0625,
        "peak_units": 1.25,
        "borrowed_unit_hours": 0.0625,
    }


def test_a_member_gets_their_own_hours_and_the_rest_of_the_team_without_names(team_world):
    response = get(team_world["alice"], THREE_DAYS)

    assert response.status_code == 200
    data = response.json()
    assert data["every_member"] is False
    assert [m["username"] for m in data["members"]] == ["alice"]
    assert [day["members"] for day in data["days"]] == [
        {"alice": 4.0},
        {"alice": 4.0},
        {"alice": 12.0625},
    ]
    assert [day["others"] for day in data["days"]] == [0.0, 0.0, 3.0]
    assert data["period"]["others_gpu_unit_hours"] == 5.0
    assert "vera" not in response.content.decode()


def test_a_site_admin_outside_the_team_gets_every_member(team_world):
    data = get(team_world["admin"], THREE_DAYS).json()

    assert data["every_member"] is True
    assert [m["username"] for m in data["members"]] == ["alice", "vera"]


def test_another_teams_usage_is_a_404_like_a_team_that_does_not_exist(team_world):
    foreign = get(team_world["bob"], THREE_DAYS)
    missing = get(team_world["bob"], THREE_DAYS, url="/api/v1/teams/nosuchteam/usage/")

    assert (foreign.status_code, missing.status_code) == (404, 404)
    assert foreign.json() == {"errors": {"detail": "no team 'vision' among your teams"}}
    assert missing.json()["errors"]["detail"] == "no team 'nosuchteam' among your teams"


def test_without_dates_it_covers_the_last_30_days_up_to_today(team_world):
    data = get(team_world["vera"]).json()

    dates = [day["date"] for day in data["days"]]
    assert (len(dates), dates[0], dates[-1]) == (30, "2024-04-11", "2024-05-10")
    assert data["days"][-1]["gpu_unit_hours"] == 15.0625


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        (
            {"from": "2024-13-01"},
            "from",
            "'2024-13-01' is not a date; allowed: a date as YYYY-MM-DD",
        ),
        ({"to": "yesterday"}, "to", "'yesterday' is not a date; allowed: a date as YYYY-MM-DD"),
        ({"from": "2024-5-1"}, "from", "is not a date"),
        ({"from": "2024-02-30"}, "from", "is not a date"),
        ({"to": "2024-05-11"}, "to", "2024-05-11 is after today; allowed: 2024-05-10 or earlier"),
        ({"from": "2024-05-09", "to": "2024-05-08"}, "from", "is after to (2024-05-08)"),
        (
            {"from": "2023-05-10", "to": "2024-05-10"},  # 2024 is a leap year
            "from",
            "is 367 days; allowed: at most 366 days, so from 2023-05-11 or later",
        ),
    ],
)
def test_bad_dates_are_a_400_naming_the_field(team_world, params, field, says):
    response = get(team_world["vera"], params)

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field] and says in errors[field]


def test_the_longest_range_is_366_days(team_world):
    response = get(team_world["vera"], {"from": "2023-05-11", "to": "2024-05-10"})

    assert response.status_code == 200
    assert len(response.json()["days"]) == 366


def test_a_read_token_may_read_usage_and_a_token_without_read_may_not(team_world):
    _, read_key = token_create(user=team_world["alice"], name="read", scopes=["read"])
    _, submit_key = token_create(user=team_world["alice"], name="submit", scopes=["submit"])
    reader, submitter, anonymous = APIClient(), APIClient(), APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Token {read_key}")
    submitter.credentials(HTTP_AUTHORIZATION=f"Token {submit_key}")

    assert reader.get(URL, THREE_DAYS).status_code == 200
    refused = submitter.get(URL, THREE_DAYS)
    assert refused.status_code == 403
    assert "lacks the 'read' scope" in refused.json()["errors"]["scope"]
    assert anonymous.get(URL, THREE_DAYS).status_code == 401


def test_the_jobs_that_used_the_days_come_with_their_hours_for_whoever_may_see_them(team_world):
    admin = get(team_world["vera"], THREE_DAYS).json()["jobs"]
    member = get(team_world["alice"], THREE_DAYS).json()["jobs"]

    assert [(j["username"], j["state"], j["gpu_unit_hours"], j["running"]) for j in admin] == [
        ("vera", "RUNNING", 3.0, True),
        ("alice", "RUNNING", 14.0, True),
        ("alice", "SUCCEEDED", 0.0625, False),
        ("alice", "SUCCEEDED", 6.0, False),
    ]
    assert admin[3]["last_held_at"] == "2024-05-09T01:00:00Z"
    assert member == admin[1:]

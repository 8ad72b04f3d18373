"""Team admins manage their team (issue 9.5): the services, the API and the team page.

Members are added by username, removed (the last team admin never), made team admins or
members, and given a limit in GPU units that can only tighten the team's per-member limit;
every change is in the team's audit log; a removed member loses the team's jobs at once
while their running jobs keep running; a member cannot manage anything, a team admin no
other team and no quota.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.jobs.models import Allocation, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, make_user, token_client
from portal.jobs.validation import JobRequestError, validate_job_request
from portal.scheduling.snapshot import load_snapshot
from portal.tenants.members import (
    MemberError,
    member_add,
    member_list,
    member_remove,
    member_set_limit,
    member_set_role,
)
from portal.tenants.models import ApiToken, Membership, Team, TeamAuditEntry
from portal.tenants.services import quota_update
from portal.tenants.tokens import token_issue
from scheduler.config import SchedulerConfig

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def audit(team: Team) -> list[tuple[str, str, str, str, str, str]]:
    """The team's log, oldest first: (who, action, member, field, old, new)."""
    return [
        (e.actor_name, e.action, e.subject, e.field, e.old_value, e.new_value)
        for e in TeamAuditEntry.objects.filter(team=team).order_by("at", "id")
    ]


def roles(team: Team) -> dict[str, tuple[str, float | None]]:
    return {
        m.user.username: (m.role, m.limit_units)
        for m in Membership.objects.filter(team=team).select_related("user")
    }


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- services ---------------------------------------------------------------------------------


def test_a_team_admin_adds_a_member_with_a_limit_and_the_log_says_so(world: World) -> None:
    carl = make_user("carl")
    Team.objects.filter(pk=world.vision.pk).update(member_limit_units=2.0)
    world.vision.refresh_from_db()

    member_add(team=world.vision, by=world.vera, username=" carl ", limit_units="1.5")

    assert roles(world.vision)["carl"] == ("member", 1.5)
    assert audit(world.vision) == [
        ("vera", "member_added", "carl", "role", "", "member"),
        ("vera", "limit_changed", "carl", "limit_units", "", "1.5"),
    ]
    rows = member_list(team=world.vision)
    assert [
        (r["username"], r["role"], r["limit_units"], r["effective_limit_units"]) for r in rows
    ] == [
        ("alice", "member", None, 2.0),
        ("carl", "member", 1.5, 1.5),
        ("vera", "admin", None, 2.0),
    ]
    assert Membership.objects.get(user=carl).team == world.vision


def test_a_role_and_a_limit_change_record_before_and_after(world: World) -> None:
    member_set_role(team=world.vision, by=world.vera, username="alice", role="admin")
    member_set_limit(team=world.vision, by=world.vera, username="alice", limit_units=0.5)
    member_set_limit(team=world.vision, by=world.alice, username="alice", limit_units=None)
    member_set_role(team=world.vision, by=world.alice, username="vera", role="member")
    # The same value again changes nothing and writes nothing.
    member_set_role(team=world.vision, by=world.alice, username="vera", role="member")

    assert roles(world.vision) == {"alice": ("admin", None), "vera": ("member", None)}
    assert audit(world.vision) == [
        ("vera", "role_changed", "alice", "role", "member", "admin"),
        ("vera", "limit_changed", "alice", "limit_units", "", "0.5"),
        ("alice", "limit_changed", "alice", "limit_units", "0.5", ""),
        ("alice", "role_changed", "vera", "role", "admin", "member"),
    ]


def test_a_removal_is_logged_with_the_role_it_ended(world: World) -> None:
    member_remove(team=world.vision, by=world.vera, username="alice")

    assert roles(world.vision) == {"vera": ("admin", None)}
    assert audit(world.vision) == [("vera", "member_removed", "alice", "role", "member", "")]


def test_a_site_admin_manages_any_team(world: World) -> None:
    member_add(team=world.nlp, by=world.admin, username="alice", role="admin", limit_units=2)

    assert roles(world.nlp)["alice"] == ("admin", 2.0)
    assert audit(world.nlp)[0] == ("admin", "member_added", "alice", "role", "", "admin")


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"username": "nobody"},
            "username",
            "no active account 'nobody'; allowed: the username of an existing account "
            "(site admins create accounts)",
        ),
        ({"username": ""}, "username", "required; allowed: the username of an existing account"),
        (
            {"username": "bob", "role": "owner"},
            "role",
            "unknown role 'owner'; allowed: member, admin",
        ),
        (
            {"username": "bob", "limit_units": -1},
            "limit_units",
            "-1 is out of range; allowed: a number from 0 to 1000000, or null for the team's "
            "per-member limit",
        ),
        (
            {"username": "bob", "limit_units": 10**9},
            "limit_units",
            "1000000000 is out of range; allowed: a number from 0 to 1000000, or null for the "
            "team's per-member limit",
        ),
        (
            {"username": "bob", "limit_units": "lots"},
            "limit_units",
            "'lots' is not a number; allowed: a number from 0 to 1000000, or null for the "
            "team's per-member limit",
        ),
        (
            {"username": "bob", "limit_units": math.nan},
            "limit_units",
            "nan is out of range; allowed: a number from 0 to 1000000, or null for the "
            "team's per-member limit",
        ),
        (
            {"username": "bob", "limit_units": True},
            "limit_units",
            "True is not a number; allowed: a number from 0 to 1000000, or null for the "
            "team's per-member limit",
        ),
        (
            {"username": "alice"},
            "username",
            "alice is already a member of vision; change their role or limit in the list of "
            "members instead",
        ),
    ],
)
def test_bad_input_names_the_field_and_what_it_allows_and_stores_nothing(
    world: World, fields: dict[str, Any], field: str, message: str
) -> None:
    before = roles(world.vision)
    with pytest.raises(MemberError) as raised:
        member_add(team=world.vision, by=world.vera, **fields)

    assert raised.value.errors == {field: message}
    assert roles(world.vision) == before
    assert audit(world.vision) == []


def test_every_bad_field_is_named_at_once(world: World) -> None:
    with pytest.raises(MemberError) as raised:
        member_add(team=world.vision, by=world.vera, username="x", role="boss", limit_units=-2)
    assert sorted(raised.value.errors) == ["limit_units", "role", "username"]


def test_a_member_limit_may_not_exceed_the_teams_per_member_limit(world: World) -> None:
    quota_update(team=world.vision, by=world.admin, member_limit_units=2.0)

    with pytest.raises(MemberError) as raised:
        member_set_limit(team=world.vision, by=world.vera, username="alice", limit_units=3)

    assert raised.value.errors == {
        "limit_units": "3 is above the team's per-member limit (2 units), which only a site "
        "admin may raise; allowed: a number from 0 to 2, or null for the team's per-member "
        "limit (2)"
    }
    assert roles(world.vision)["alice"] == ("member", None)
    member_set_limit(team=world.vision, by=world.vera, username="alice", limit_units=2)
    assert roles(world.vision)["alice"] == ("member", 2.0)


def test_the_last_team_admin_is_neither_removed_nor_made_a_member(world: World) -> None:
    with pytest.raises(MemberError) as removed:
        member_remove(team=world.vision, by=world.vera, username="vera")
    with pytest.raises(MemberError) as demoted:
        member_set_role(team=world.vision, by=world.admin, username="vera", role="member")

    assert removed.value.errors == {
        "username": "vera is the last team admin of vision; make another member a team admin "
        "first (a team keeps at least one)"
    }
    assert demoted.value.errors == {
        "role": "vera is the last team admin of vision; allowed: admin, until another member "
        "is a team admin (a team keeps at least one)"
    }
    assert roles(world.vision)["vera"] == ("admin", None)
    # With a second admin, the first may go.
    member_set_role(team=world.vision, by=world.vera, username="alice", role="admin")
    member_remove(team=world.vision, by=world.alice, username="vera")
    assert roles(world.vision) == {"alice": ("admin", None)}


def test_a_member_manages_nothing_and_a_team_admin_no_other_team(world: World) -> None:
    attempts = [
        (world.vision, world.alice),  # a member of vision
        (world.nlp, world.vera),  # vision's admin, in nlp
    ]
    for team, who in attempts:
        calls = [
            partial(member_add, username="carl"),
            partial(member_remove, username="bob"),
            partial(member_set_role, username="bob", role="admin"),
            partial(member_set_limit, username="bob", limit_units=1),
        ]
        for call in calls:
            with pytest.raises(PermissionDenied):
                call(team=team, by=who)
    assert audit(world.vision) == audit(world.nlp) == []


def test_a_team_admin_may_not_change_the_quota(world: World) -> None:
    for field, value in (
        ("guaranteed_units", 9),
        ("limit_units", 9),
        ("weight", 9),
        ("budget_gpu_hours", 9),
        ("max_priority", "high"),
        ("member_limit_units", 9),
    ):
        with pytest.raises(PermissionDenied):
            quota_update(team=world.vision, by=world.vera, **{field: value})
    world.vision.refresh_from_db()
    assert (world.vision.guaranteed_units, world.vision.limit_units, world.vision.weight) == (
        2.0,
        4.0,
        1.0,
    )


def test_a_site_admins_quota_change_is_logged_field_by_field(world: World) -> None:
    quota_update(
        team=world.vision,
        by=world.admin,
        guaranteed_units=3,
        limit_units=4,  # unchanged: not logged
        member_limit_units=2,
        budget_gpu_hours=100,
    )

    assert audit(world.vision) == [
        ("admin", "quota_changed", "", "guaranteed_units", "2", "3"),
        ("admin", "quota_changed", "", "member_limit_units", "", "2"),
        ("admin", "quota_changed", "", "budget_gpu_hours", "", "100"),
    ]


def test_the_scheduler_and_the_submit_check_apply_a_members_own_limit(world: World) -> None:
    member_set_limit(team=world.vision, by=world.vera, username="alice", limit_units=1)

    snapshot = load_snapshot(now=world.vision.created_at, config=SchedulerConfig()).snapshot
    vision = snapshot.teams["vision"]
    assert dict(vision.member_limits) == {"alice": 1.0}
    assert (vision.limit_of("alice"), vision.limit_of("vera")) == (1.0, None)
    request = {
        "name": "big",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": ["true"],
        "gpu": {"kind": "whole", "count": 2},
    }
    with pytest.raises(JobRequestError) as raised:
        validate_job_request(request, user=world.alice)
    assert raised.value.errors == {
        "gpu.count": "over-limit count: 2 x whole GPU = 2 GPU units, above your own limit in "
        "team vision of 1 units; allowed: at most 1"
    }
    assert validate_job_request(request, user=world.vera).gpu.count == 2


# --- a removed member ----------------------------------------------------------------------


def test_a_removed_member_loses_the_teams_jobs_at_once_and_their_job_keeps_running(
    world: World,
) -> None:
    make_node(gpus=[{"mode": "whole"}])
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])
    api = token_client(world.alice)
    page = client_for(world.alice)
    assert api.get(f"/api/v1/jobs/{job.pk}/").status_code == 200

    response = token_client(world.vera).delete("/api/v1/teams/vision/members/alice/")

    assert response.status_code == 204
    assert api.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert api.get("/api/v1/jobs/").json()["results"] == []
    assert api.get("/api/v1/teams/vision/").status_code == 404
    assert page.get(reverse("web:job_detail", args=[job.pk])).status_code == 404
    assert page.get(reverse("web:team_detail", args=["vision"])).status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1


# --- API ------------------------------------------------------------------------------------


def test_a_member_lists_the_members_with_their_limits(world: World, alice_api: Any) -> None:
    Team.objects.filter(pk=world.vision.pk).update(member_limit_units=3.0)
    Membership.objects.filter(user=world.vera).update(limit_units=1.0)

    body = alice_api.get("/api/v1/teams/vision/members/").json()

    assert [
        (m["username"], m["role"], m["limit_units"], m["effective_limit_units"]) for m in body
    ] == [("alice", "member", None, 3.0), ("vera", "admin", 1.0, 1.0)]
    assert set(body[0]) == {
        "username",
        "role",
        "limit_units",
        "effective_limit_units",
        "joined_at",
    }


def test_a_team_admin_adds_changes_and_removes_through_the_api(world: World) -> None:
    make_user("carl")
    vera = token_client(world.vera)

    added = vera.post(
        "/api/v1/teams/vision/members/",
        {"username": "carl", "role": "member", "limit_units": 2},
        format="json",
    )
    changed = vera.patch(
        "/api/v1/teams/vision/members/carl/",
        {"role": "admin", "limit_units": 0.5},
        format="json",
    )
    one = vera.get("/api/v1/teams/vision/members/carl/")
    removed = vera.delete("/api/v1/teams/vision/members/carl/")

    assert added.status_code == 201
    assert added["Location"] == "/api/v1/teams/vision/members/carl/"
    assert (added.json()["role"], added.json()["limit_units"]) == ("member", 2.0)
    assert changed.status_code == 200
    assert (changed.json()["role"], changed.json()["limit_units"]) == ("admin", 0.5)
    assert one.json()["effective_limit_units"] == 0.5
    assert removed.status_code == 204
    assert "carl" not in roles(world.vision)
    log = vera.get("/api/v1/teams/vision/audit/").json()
    assert [(e["actor"], e["action"], e["member"], e["old"], e["new"]) for e in log] == [
        ("vera", "member_removed", "carl", "admin", ""),
        ("vera", "limit_changed", "carl", "2", "0.5"),
        ("vera", "role_changed", "carl", "member", "admin"),
        ("vera", "limit_changed", "carl", "", "2"),
        ("vera", "member_added", "carl", "", "member"),
    ]
    assert vera.get("/api/v1/teams/vision/audit/?limit=2").json() == log[:2]


def test_a_member_gets_403_and_nothing_changes(world: World, alice_api: Any) -> None:
    make_user("carl")
    calls = [
        alice_api.post("/api/v1/teams/vision/members/", {"username": "carl"}, format="json"),
        alice_api.patch("/api/v1/teams/vision/members/vera/", {"limit_units": 1}, format="json"),
        alice_api.patch("/api/v1/teams/vision/members/alice/", {"role": "admin"}, format="json"),
        alice_api.delete("/api/v1/teams/vision/members/vera/"),
    ]

    assert [c.status_code for c in calls] == [403, 403, 403, 403]
    assert calls[0].json() == {
        "errors": {"detail": "only a team admin of vision or a site admin may manage its members"}
    }
    assert roles(world.vision) == {"alice": ("member", None), "vera": ("admin", None)}


def test_a_team_admin_gets_404_for_another_team(world: World) -> None:
    vera = token_client(world.vera)
    calls = [
        vera.get("/api/v1/teams/nlp/members/"),
        vera.post("/api/v1/teams/nlp/members/", {"username": "alice"}, format="json"),
        vera.patch("/api/v1/teams/nlp/members/bob/", {"limit_units": 1}, format="json"),
        vera.delete("/api/v1/teams/nlp/members/bob/"),
    ]
    assert [c.status_code for c in calls] == [404, 404, 404, 404]
    assert calls[3].json() == {"errors": {"detail": "no member 'bob' in a team 'nlp' of yours"}}
    assert roles(world.nlp) == {"bob": ("member", None), "nick": ("admin", None)}


def test_member_management_needs_a_token_with_the_admin_scope(world: World) -> None:
    make_user("carl")
    client = token_client(world.vera)
    key = token_issue(user=world.vera, name="notebook")
    ApiToken.objects.filter(name="notebook").update(scopes=["read", "submit"])
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")

    listed = client.get("/api/v1/teams/vision/members/")
    added = client.post("/api/v1/teams/vision/members/", {"username": "carl"}, format="json")

    assert listed.status_code == 200
    assert added.status_code == 403
    assert "lacks the 'admin' scope" in added.json()["errors"]["scope"]
    assert "carl" not in roles(world.vision)


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (
            {"username": "nobody"},
            {
                "username": "no active account 'nobody'; allowed: the username of an existing "
                "account (site admins create accounts)"
            },
        ),
        (
            {"username": "carl", "role": "owner"},
            {"role": "unknown role 'owner'; allowed: member, admin"},
        ),
        (
            {"username": "carl", "limit_units": -0.5},
            {
                "limit_units": "-0.5 is out of range; allowed: a number from 0 to 1000000, or "
                "null for the team's per-member limit"
            },
        ),
        (
            {"username": "carl", "limit_units": 1e300},
            {
                "limit_units": "1e+300 is out of range; allowed: a number from 0 to 1000000, or "
                "null for the team's per-member limit"
            },
        ),
        (
            {"username": "carl", "limit_units": "four"},
            {
                "limit_units": "'four' is not a number; allowed: a number from 0 to 1000000, or "
                "null for the team's per-member limit"
            },
        ),
        (
            {"username": "carl", "team": "nlp"},
            {"team": "unknown field; allowed: username, role, limit_units"},
        ),
        (["carl"], {"detail": "send a JSON object: username, role, limit_units"}),
    ],
)
def test_bad_input_to_the_api_is_a_400_that_stores_nothing(
    world: World, body: Any, errors: dict[str, str]
) -> None:
    make_user("carl")
    response = token_client(world.vera).post("/api/v1/teams/vision/members/", body, format="json")

    assert response.status_code == 400
    assert response.json() == {"errors": errors}
    assert roles(world.vision) == {"alice": ("member", None), "vera": ("admin", None)}
    assert audit(world.vision) == []


def test_a_patch_with_one_bad_field_stores_neither(world: World) -> None:
    response = token_client(world.vera).patch(
        "/api/v1/teams/vision/members/alice/", {"role": "admin", "limit_units": -1}, format="json"
    )

    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["limit_units"]
    assert roles(world.vision)["alice"] == ("member", None)
    assert audit(world.vision) == []


def test_the_api_refuses_to_remove_or_demote_the_last_admin(world: World) -> None:
    vera = token_client(world.vera)
    removed = vera.delete("/api/v1/teams/vision/members/vera/")
    demoted = vera.patch("/api/v1/teams/vision/members/vera/", {"role": "member"}, format="json")

    assert (removed.status_code, demoted.status_code) == (400, 400)
    assert removed.json()["errors"]["username"].startswith("vera is the last team admin of vision")
    assert demoted.json()["errors"]["role"].startswith("vera is the last team admin of vision")
    assert roles(world.vision)["vera"] == ("admin", None)


def test_an_unknown_member_and_a_bad_audit_limit(world: World) -> None:
    vera = token_client(world.vera)
    missing = vera.patch("/api/v1/teams/vision/members/bob/", {"role": "admin"}, format="json")
    empty = vera.patch("/api/v1/teams/vision/members/alice/", {}, format="json")
    bad_limit = vera.get("/api/v1/teams/vision/audit/?limit=0")

    assert missing.status_code == 404
    assert missing.json() == {"errors": {"detail": "no member 'bob' in a team 'vision' of yours"}}
    assert empty.status_code == 400
    assert empty.json() == {
        "errors": {"detail": "nothing to change; send role, limit_units or both"}
    }
    assert bad_limit.status_code == 400
    assert bad_limit.json() == {
        "errors": {"limit": "'0' is out of range; allowed: a whole number from 1 to 500"}
    }


def test_the_member_list_costs_the_same_queries_for_3_or_30_members(world: World) -> None:
    vera = token_client(world.vera)
    vera.get("/api/v1/teams/vision/members/")  # a token's first use records last_used_at
    make_user("m0", team=world.vision)

    with CaptureQueriesContext(connection) as few:
        assert len(vera.get("/api/v1/teams/vision/members/").json()) == 3
    for number in range(1, 28):
        make_user(f"m{number}", team=world.vision)
    with CaptureQueriesContext(connection) as many:
        assert len(vera.get("/api/v1/teams/vision/members/").json()) == 30

    # token, the user's and the token's rate-limit counters (one statement; on PostgreSQL
    # the token's own), the team, its members
    expected = 3 if connection.vendor == "postgresql" else 4
    assert len(few) == len(many) == expected, [q["sql"] for q in many.captured_queries]


# --- the team page --------------------------------------------------------------------------


def test_a_member_sees_the_members_and_the_log_but_no_controls(world: World) -> None:
    member_set_limit(team=world.vision, by=world.vera, username="alice", limit_units=1)

    page = client_for(world.alice).get(reverse("web:team_detail", args=["vision"])).content.decode()

    assert '<tr data-username="alice">' in page and '<tr data-username="vera">' in page
    assert "may hold 1 units" in page
    assert "Add a member" not in page and "Set limit" not in page and ">Remove<" not in page
    assert "Make team admin" not in page
    assert "alice&#x27;s limit (GPU units)" in page  # the log, visible to members


def test_a_member_posting_to_the_member_forms_gets_403(world: World) -> None:
    make_user("carl")
    client = client_for(world.alice)
    responses = [
        client.post(reverse("web:team_member_add", args=["vision"]), {"username": "carl"}),
        client.post(
            reverse("web:team_member_limit", args=["vision", "vera"]), {"limit_units": "1"}
        ),
        client.post(reverse("web:team_member_role", args=["vision", "alice"]), {"role": "admin"}),
        client.post(reverse("web:team_member_remove", args=["vision", "vera"])),
    ]
    assert [r.status_code for r in responses] == [403, 403, 403, 403]
    assert roles(world.vision) == {"alice": ("member", None), "vera": ("admin", None)}


def test_a_team_admin_adds_a_member_and_sets_a_limit_on_the_page(world: World) -> None:
    make_user("carl")
    client = client_for(world.vera)

    added = client.post(
        reverse("web:team_member_add", args=["vision"]),
        {"username": "carl", "role": "member", "limit_units": ""},
        **HTMX,
    )
    limited = client.post(
        reverse("web:team_member_limit", args=["vision", "carl"]), {"limit_units": "1.5"}, **HTMX
    )

    assert added.status_code == limited.status_code == 200
    fragment = limited.content.decode()
    assert "<html" not in fragment and 'id="team-members-section"' in fragment
    assert "The limit of carl in vision is now 1.5 GPU units." in fragment
    assert 'value="1.5"' in fragment and "may hold 1.5 units" in fragment
    assert "carl&#x27;s limit (GPU units)" in fragment and "added carl" in fragment
    assert roles(world.vision)["carl"] == ("member", 1.5)


def test_a_bad_value_on_the_page_is_shown_next_to_its_input_and_stores_nothing(
    world: World,
) -> None:
    client = client_for(world.vera)

    added = client.post(
        reverse("web:team_member_add", args=["vision"]),
        {"username": "ghost", "role": "member", "limit_units": "-3"},
        **HTMX,
    )
    limited = client.post(
        reverse("web:team_member_limit", args=["vision", "alice"]), {"limit_units": "x"}, **HTMX
    )
    plain = client.post(reverse("web:team_member_add", args=["vision"]), {"username": "ghost"})

    assert added.status_code == limited.status_code == plain.status_code == 422
    page = added.content.decode()
    assert (
        '<span class="error" id="error-member-username">no active account &#x27;ghost&#x27;' in page
    )
    assert (
        '<span class="error" id="error-member-limit_units">&#x27;-3&#x27; is out of range' in page
    )
    assert 'name="username" value="ghost"' in page  # what was typed stays
    assert "&#x27;x&#x27; is not a number; allowed: a number from 0 to 1000000" in (
        limited.content.decode()
    )
    assert "<html" in plain.content.decode()  # without htmx: the whole page again
    assert roles(world.vision) == {"alice": ("member", None), "vera": ("admin", None)}


def test_a_removal_asks_for_confirmation_first(world: World) -> None:
    client = client_for(world.vera)
    url = reverse("web:team_member_remove", args=["vision", "alice"])

    asked = client.get(url, **HTMX).content.decode()
    assert roles(world.vision)["alice"] == ("member", None)  # asking removes nothing
    assert "Remove alice from vision?" in asked
    assert "running ones keep running and pending ones keep waiting" in asked
    assert f'hx-post="{url}"' in asked
    whole = client.get(url)
    assert whole.status_code == 200 and "Remove alice from vision?" in whole.content.decode()

    done = client.post(url, **HTMX).content.decode()
    assert "alice removed from vision." in done
    assert "alice" not in roles(world.vision)


def test_the_last_admin_removing_themself_is_told_why_not(world: World) -> None:
    response = client_for(world.vera).post(
        reverse("web:team_member_remove", args=["vision", "vera"]), **HTMX
    )
    assert response.status_code == 422
    assert "Not saved for vera: vera is the last team admin of vision" in response.content.decode()


def test_a_team_admin_gets_404_on_another_teams_member_forms(world: World) -> None:
    client = client_for(world.vera)
    assert client.post(reverse("web:team_member_add", args=["nlp"]), {}).status_code == 404
    assert client.get(reverse("web:team_member_remove", args=["nlp", "bob"])).status_code == 404


def test_the_team_page_costs_the_same_queries_for_3_or_30_members(world: World) -> None:
    client = client_for(world.vera)
    page_url = reverse("web:team_detail", args=["vision"])
    section_url = reverse("web:team_member_remove", args=["vision", "alice"])  # the section
    client.get(page_url)
    make_user("m0", team=world.vision)
    member_set_limit(team=world.vision, by=world.vera, username="m0", limit_units=1)

    with CaptureQueriesContext(connection) as few:
        client.get(page_url)
    with CaptureQueriesContext(connection) as section_few:
        client.get(section_url, **HTMX)
    for number in range(1, 28):
        make_user(f"m{number}", team=world.vision)
        member_set_limit(team=world.vision, by=world.vera, username=f"m{number}", limit_units=1)
    with CaptureQueriesContext(connection) as many:
        page = client.get(page_url).content.decode()
    with CaptureQueriesContext(connection) as section_many:
        section = client.get(section_url, **HTMX).content.decode()

    assert page.count("<tr data-username=") == section.count("<tr data-username=") == 30
    assert len(few) == len(many), [q["sql"] for q in many.captured_queries]
    # The Members section: session, user, the team, its members, the admin check, the log.
    assert len(section_few) == len(section_many) == 6, [
        q["sql"] for q in section_many.captured_queries
    ]


# --- the site admin's quota form ------------------------------------------------------------


def test_a_site_admin_sets_every_quota_field_and_is_warned_of_an_overcommit(
    world: World,
) -> None:
    make_node(gpus=[{"mode": "whole"}, {"mode": "whole"}])  # 2 units; nlp guarantees 1
    response = client_for(world.admin).post(
        reverse("web:team_quota", args=["vision"]),
        {
            "weight": "2",
            "guaranteed_units": "3",
            "limit_units": "4",
            "max_priority": "high",
            "member_limit_units": "1.5",
            "budget_gpu_hours": "120",
        },
        **HTMX,
    )

    world.vision.refresh_from_db()
    fragment = response.content.decode()
    assert response.status_code == 200 and "Saved." in fragment
    assert (world.vision.member_limit_units, world.vision.budget_gpu_hours) == (1.5, 120.0)
    assert world.vision.guaranteed_units == 3.0  # saved despite the warning
    assert (
        "The guarantees of all teams add up to 4 GPU units, more than the 2 units the "
        "cluster&#x27;s ready nodes hold now" in fragment
    )
    assert "The quota is saved all the same." in fragment
    assert 'name="member_limit_units" value="1.5"' in fragment
    assert 'name="budget_gpu_hours" value="120"' in fragment


def test_no_overcommit_warning_when_the_cluster_holds_the_guarantees(world: World) -> None:
    make_node(gpus=[{"mode": "whole"}] * 4)  # 4 units; guarantees 2 + 1
    page = client_for(world.admin).get(reverse("web:team_detail", args=["vision"]))
    assert "overcommit-warning" not in page.content.decode()

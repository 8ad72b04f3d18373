"""Fair share in the open: a real pass stores the numbers the core used (per team, member and
pending job), and the Fair share page, its API and the job page show them to whom they may.

The fixture (``standing``): 4 whole GPUs; nlp (weight 1, guarantee 1) holds 2 of them and
waits with b1 (2 GPUs, queued 3 h); vision (weight 3, guarantee 2) holds nothing and waits
with a1 (alice, 2 h), a2 (vera, 1 h), a3 (alice, 2 GPUs, 30 min) and d1 (alice, after a3).
The pass: fair shares of the 4 units are 3 (vision) and 1 (nlp); vision, under its
guarantee, places a1 and a2 in its first round; a3 would then borrow and goes to the second
round, where it gets the reservation at vision's factor 2 ** (-2/3), and b1 waits behind it.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounting.models import UsageBalance
from portal.jobs.models import Job, JobDependency, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, make_team, make_user
from portal.policy import scheduler_config
from portal.scheduling.fairshare import store_standing
from portal.scheduling.models import FairShareMember, FairSharePass, FairShareTeam, JobPriority
from portal.scheduling.selectors import FAIRSHARE_QUERIES, fairshare_report
from portal.scheduling.service import run_schedule_pass
from portal.scheduling.snapshot import load_snapshot
from portal.tenants.models import Membership, Team
from portal.tenants.tokens import token_issue
from scheduler import Policy, schedule

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def standing(world: World) -> dict:
    """The fixture of the module docstring, before its pass; ``now`` is the pass's time."""
    now = timezone.now().replace(microsecond=0)
    Team.objects.filter(pk=world.vision.pk).update(weight=3.0)
    idle = make_team("idle", guaranteed_units=0.0)
    # Only history: 2 GPU-unit-hours, decayed as of now.
    UsageBalance.objects.create(team=idle, unit_seconds=7200.0, as_of=now)
    make_node("node-1", gpus=[{"mode": "whole"}] * 4)
    held = make_job(team=world.nlp, user=world.bob, name="b0", state=JobState.RUNNING)
    Job.objects.filter(pk=held.pk).update(assigned_at=now, started_at=now)
    allocate(held, ["GPU-node-1-0", "GPU-node-1-1"])
    jobs = {
        "b1": make_job(
            team=world.nlp, user=world.bob, name="b1", gpu_count=2, submitted_at=now - 3 * HOUR
        ),
        "a1": make_job(team=world.vision, user=world.alice, name="a1", submitted_at=now - 2 * HOUR),
        "a2": make_job(team=world.vision, user=world.vera, name="a2", submitted_at=now - HOUR),
        "a3": make_job(
            team=world.vision,
            user=world.alice,
            name="a3",
            gpu_count=2,
            submitted_at=now - HOUR / 2,
        ),
    }
    jobs["d1"] = make_job(team=world.vision, user=world.alice, name="d1", submitted_at=now)
    JobDependency.objects.create(job=jobs["d1"], depends_on=jobs["a3"])
    return {"now": now, "jobs": jobs, "world": world}


def _pass(standing: dict) -> None:
    assert run_schedule_pass(now=standing["now"]).status == "ran"


def _core_decisions(standing: dict):
    """What ``scheduler.schedule`` decides on the snapshot the pass is about to load, and
    that snapshot."""
    config = scheduler_config()
    with transaction.atomic():
        loaded = load_snapshot(now=standing["now"], config=config)
    return schedule(loaded.snapshot, now=standing["now"].timestamp(), config=config), loaded


def client_with(user, *scopes: str) -> APIClient:
    client = APIClient()
    key = token_issue(user=user, scopes=scopes or ("read",))
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


# --- what a pass stores -------------------------------------------------------------------


def test_a_pass_stores_exactly_the_numbers_the_core_computed(standing):
    expected, _ = _core_decisions(standing)
    assert expected.standing is not None
    _pass(standing)

    jobs = standing["jobs"]
    states = {name: Job.objects.get(pk=job.pk).state for name, job in jobs.items()}
    assert states == {
        "b1": JobState.PENDING,
        "a1": JobState.ASSIGNED,
        "a2": JobState.ASSIGNED,
        "a3": JobState.PENDING,
        "d1": JobState.PENDING,
    }
    stored_teams = {
        row.pop("team__name"): row
        for row in FairShareTeam.objects.values(
            "team__name",
            "weight",
            "guaranteed_units",
            "usage_unit_seconds",
            "held_units",
            "effective_units",
            "effective_end_units",
            "fair_units",
            "factor",
            "factor_end",
            "rank",
        )
    }
    assert stored_teams == {
        t.team: {
            "weight": t.weight,
            "guaranteed_units": t.guaranteed,
            "usage_unit_seconds": t.usage,
            "held_units": t.held,
            "effective_units": t.effective,
            "effective_end_units": t.effective_end,
            "fair_units": t.fair,
            "factor": t.factor,
            "factor_end": t.factor_end,
            "rank": t.rank,
        }
        for t in expected.standing.teams
    }
    stored_members = {
        (row.pop("team__name"), row.pop("user__username")): row
        for row in FairShareMember.objects.values(
            "team__name",
            "user__username",
            "usage_unit_seconds",
            "held_units",
            "effective_units",
            "effective_end_units",
            "fair_units",
            "factor",
            "factor_end",
            "rank",
        )
    }
    assert stored_members == {
        (u.team, u.user): {
            "usage_unit_seconds": u.usage,
            "held_units": u.held,
            "effective_units": u.effective,
            "effective_end_units": u.effective_end,
            "fair_units": u.fair,
            "factor": u.factor,
            "factor_end": u.factor_end,
            "rank": u.rank,
        }
        for u in expected.standing.users
    }
    parts = expected.standing.priorities()
    still_pending = {p.job_id for p in expected.pending}
    stored_jobs = {
        str(row.pop("job_id")): row
        for row in JobPriority.objects.values(
            "job_id",
            "priority",
            "class_rank",
            "within_guarantee",
            "team_factor",
            "user_factor",
            "age_boost",
        )
    }
    assert stored_jobs == {
        job_id: {
            "priority": p.priority,
            "class_rank": p.class_rank,
            "within_guarantee": p.within_guarantee,
            "team_factor": p.team_factor,
            "user_factor": p.user_factor,
            "age_boost": p.age_boost,
        }
        for job_id, p in parts.items()
        if job_id in still_pending
    }
    stored = FairSharePass.objects.get()
    assert (stored.as_of, stored.capacity_units, stored.scale_units) == (
        standing["now"],
        4.0,
        4.0,
    )
    assert stored.aging_per_hour == expected.standing.aging_per_hour


def test_the_stored_numbers_are_the_fixtures_by_hand(standing):
    _pass(standing)
    jobs = standing["jobs"]
    teams = {row.team.name: row for row in FairShareTeam.objects.select_related("team")}
    # vision: E 0 -> 2 (a1 and a2) of a fair share of 3; nlp: E 2 (its held job) of 1.
    assert (teams["vision"].fair_units, teams["vision"].factor) == (3.0, 1.0)
    assert teams["vision"].factor_end == pytest.approx(2 ** (-2 / 3), rel=1e-12)
    assert (teams["nlp"].fair_units, teams["nlp"].factor, teams["nlp"].factor_end) == (
        1.0,
        0.25,
        0.25,
    )
    assert (teams["vision"].rank, teams["nlp"].rank, teams["idle"].rank) == (1, 2, None)
    assert (teams["nlp"].held_units, teams["vision"].held_units) == (2.0, 0.0)
    # The idle team has only history: 2 unit-hours, no share, no factor, no rank.
    assert (teams["idle"].usage_unit_seconds, teams["idle"].fair_units) == (7200.0, None)

    members = {
        (row.team.name, row.user.username): row
        for row in FairShareMember.objects.select_related("team", "user")
    }
    # Inside vision its share 3 is split between alice and vera: 1.5 each.
    assert members[("vision", "alice")].fair_units == 1.5
    assert members[("vision", "alice")].factor_end == pytest.approx(2 ** (-1 / 1.5), rel=1e-12)
    assert (members[("nlp", "bob")].fair_units, members[("nlp", "bob")].factor) == (2.0, 0.5)

    a3 = JobPriority.objects.get(job=jobs["a3"])
    # Ordered in the second round (it would borrow), at vision's and alice's factors after a1
    # and a2 landed, 30 minutes old.
    assert (a3.priority, a3.class_rank, a3.within_guarantee) == ("normal", 1, False)
    assert a3.team_factor == pytest.approx(2 ** (-2 / 3), rel=1e-12)
    assert a3.user_factor == pytest.approx(2 ** (-1 / 1.5), rel=1e-12)
    assert a3.age_boost == pytest.approx(0.002 * 0.5, rel=1e-9)
    b1 = JobPriority.objects.get(job=jobs["b1"])
    assert (b1.team_factor, b1.user_factor) == (0.25, 0.5)
    assert b1.age_boost == pytest.approx(0.002 * 3, rel=1e-9)
    assert not JobPriority.objects.filter(job=jobs["d1"]).exists()  # parked: not ordered


def test_each_pass_replaces_the_numbers(standing, settings):
    _pass(standing)
    jobs = standing["jobs"]
    Job.objects.filter(pk=jobs["b1"].pk).update(state=JobState.CANCELLED)
    later = standing["now"] + timedelta(minutes=1)
    run_schedule_pass(now=later)
    assert FairSharePass.objects.get().as_of == later
    assert set(JobPriority.objects.values_list("job_id", flat=True)) == {jobs["a3"].pk}
    assert FairShareTeam.objects.get(team__name="nlp").rank is None  # no pending work now

    # A FIFO pass keeps no standing: the numbers go, rather than grow stale.
    settings.SCHEDULER = {**settings.SCHEDULER, "policy": Policy.FIFO}
    run_schedule_pass(now=later + timedelta(minutes=1))
    assert not FairSharePass.objects.exists()
    assert not FairShareTeam.objects.exists() and not JobPriority.objects.exists()


def test_a_pass_within_the_store_window_leaves_the_stored_numbers(standing, settings):
    settings.FAIRSHARE_STORE_S = 2.0
    world, now = standing["world"], standing["now"]
    _pass(standing)
    stored = set(JobPriority.objects.values_list("job_id", flat=True))
    newer = make_job(team=world.vision, user=world.alice, name="newer")

    # 1.5 s later: the numbers of the pass before stay, the new job has none yet.
    assert run_schedule_pass(now=now + timedelta(seconds=1.5)).status == "ran"
    assert FairSharePass.objects.get().as_of == now
    assert set(JobPriority.objects.values_list("job_id", flat=True)) == stored

    # 2 s after the stored ones: replaced, the new job's included.
    assert run_schedule_pass(now=now + timedelta(seconds=2)).status == "ran"
    assert FairSharePass.objects.get().as_of == now + timedelta(seconds=2)
    assert newer.pk in set(JobPriority.objects.values_list("job_id", flat=True))

    # Numbers dated after the pass (a clock that went back) are replaced too.
    assert run_schedule_pass(now=now + timedelta(seconds=1)).status == "ran"
    assert FairSharePass.objects.get().as_of == now + timedelta(seconds=1)


def test_storing_a_pass_costs_the_same_statements_however_long_the_queue(
    standing, django_assert_num_queries
):
    """Four DELETEs, the pass row, the ids of the teams and users, one INSERT per table."""
    decisions, loaded = _core_decisions(standing)
    with django_assert_num_queries(10):
        written = store_standing(decisions.standing, decisions.pending, loaded=loaded)
    assert written == 2  # a3 and b1 (d1 is parked: not ordered)
    world = standing["world"]
    for i in range(200):
        make_job(team=world.vision, user=world.alice, name=f"more-{i}")
    decisions, loaded = _core_decisions(standing)
    with django_assert_num_queries(10):
        written = store_standing(decisions.standing, decisions.pending, loaded=loaded)
    assert JobPriority.objects.count() == written == 202


# --- who sees what ----------------------------------------------------------------------------


def _members(body: dict) -> list[tuple[str, str]]:
    return [(m["team"], m["username"]) for m in body["members"]]


def test_a_member_sees_every_team_but_only_their_teams_members_and_jobs(standing):
    _pass(standing)
    world, jobs = standing["world"], standing["jobs"]
    body = client_with(world.alice).get("/api/v1/fairshare/").json()
    assert [(t["name"], t["rank"], t["members_shown"]) for t in body["teams"]] == [
        ("vision", 1, True),
        ("nlp", 2, False),
        ("idle", None, False),
    ]
    nlp = body["teams"][1]
    assert (nlp["factor"], nlp["fair_units"], nlp["held_units"]) == (0.25, 1.0, 2.0)
    assert body["teams"][2]["usage_unit_hours"] == 2.0
    assert _members(body) == [("vision", "alice"), ("vision", "vera")]
    assert [j["id"] for j in body["jobs"]] == [jobs["a3"].pk]
    assert body["jobs_total"] == 1
    job = body["jobs"][0]
    assert (job["name"], job["team"], job["user"], job["within_guarantee"]) == (
        "a3",
        "vision",
        "alice",
        False,
    )
    assert job["team_key"] == pytest.approx(job["team_factor"] + job["age_boost"])
    assert "bob" not in json.dumps(body["members"]) + json.dumps(body["jobs"])
    assert body["visible_teams"] == ["vision"]

    bob = client_with(world.bob).get("/api/v1/fairshare/").json()
    assert _members(bob) == [("nlp", "bob")]
    assert [j["id"] for j in bob["jobs"]] == [jobs["b1"].pk]


def test_a_site_admin_sees_every_member_and_job_in_queue_order(standing):
    _pass(standing)
    world, jobs = standing["world"], standing["jobs"]
    body = client_with(world.admin).get("/api/v1/fairshare/").json()
    assert _members(body) == [
        ("nlp", "bob"),
        ("vision", "alice"),
        ("vision", "vera"),
    ]
    assert [j["id"] for j in body["jobs"]] == [jobs["a3"].pk, jobs["b1"].pk]
    assert [j["queue_position"] for j in body["jobs"]] == [1, 2]
    narrowed = client_with(world.admin).get("/api/v1/fairshare/", {"team": "nlp"}).json()
    assert _members(narrowed) == [("nlp", "bob")]
    assert [j["id"] for j in narrowed["jobs"]] == [jobs["b1"].pk]
    one = client_with(world.admin).get("/api/v1/fairshare/", {"job": jobs["a3"].pk}).json()
    assert [j["id"] for j in one["jobs"]] == [jobs["a3"].pk]


def test_someone_in_no_team_sees_the_teams_only(standing):
    _pass(standing)
    body = client_with(make_user("loner")).get("/api/v1/fairshare/").json()
    assert len(body["teams"]) == 3
    assert (body["members"], body["jobs"], body["visible_teams"]) == ([], [], [])


def test_bad_parameters_are_refused_naming_the_field_and_what_it_allows(standing):
    _pass(standing)
    world, jobs = standing["world"], standing["jobs"]
    client = client_with(world.alice)
    response = client.get("/api/v1/fairshare/", {"team": "nlp"})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == ["team"]
    assert "'nlp' is not one of your teams; allowed: vision" in errors["team"]
    response = client.get("/api/v1/fairshare/", {"job": "a3"})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == ["job"]
    assert "'a3' is not a job id; allowed: a whole number" in errors["job"]
    # Another team's job is simply not among yours.
    other = client.get("/api/v1/fairshare/", {"job": jobs["b1"].pk}).json()
    assert (other["jobs"], other["jobs_total"]) == ([], 0)


def test_a_token_without_the_read_scope_is_refused(standing):
    response = client_with(standing["world"].alice, "submit").get("/api/v1/fairshare/")
    assert response.status_code == 403
    assert "read" in response.content.decode()


# --- the pages ----------------------------------------------------------------------------------


def _page(client, user, path: str, **params):
    client.force_login(user)
    return client.get(path, params)


def test_the_page_shows_every_team_and_the_members_of_mine(client, standing):
    _pass(standing)
    world, jobs = standing["world"], standing["jobs"]
    response = _page(client, world.alice, reverse("web:fairshare"))
    assert response.status_code == 200
    page = response.content.decode()
    for row in ("fairshare-team-vision", "fairshare-team-nlp", "fairshare-team-idle"):
        assert f'id="{row}"' in page
    assert 'id="fairshare-member-vision-alice"' in page
    assert 'id="fairshare-member-vision-vera"' in page
    assert "fairshare-member-nlp-bob" not in page
    assert f'id="fairshare-job-{jobs["a3"].pk}"' in page
    assert f'id="fairshare-job-{jobs["b1"].pk}"' not in page
    assert "0.6300" in page  # vision's factor after the pass, 2 ** (-2/3)
    # The htmx refresh sends the live part only.
    fragment = client.get(reverse("web:fairshare"), **HTMX).content.decode()
    assert fragment.lstrip().startswith('<div id="fairshare-live"')


def test_the_page_refuses_a_team_that_is_not_mine_and_shows_mine(client, standing):
    _pass(standing)
    response = _page(client, standing["world"].alice, reverse("web:fairshare"), team="nlp")
    assert response.status_code == 400
    page = response.content.decode()
    assert "Team: &#x27;nlp&#x27; is not one of your teams; allowed: vision" in page
    assert 'id="fairshare-member-vision-alice"' in page


def test_the_page_before_any_pass_says_so(client, standing):
    page = _page(client, standing["world"].alice, reverse("web:fairshare")).content.decode()
    assert "No fair-share numbers yet" in page


def test_a_pending_jobs_page_shows_its_priority_parts(client, standing):
    _pass(standing)
    world, jobs = standing["world"], standing["jobs"]
    page = _page(client, world.alice, reverse("web:job_detail", args=[jobs["a3"].pk]))
    html = page.content.decode()
    assert 'id="job-priority"' in html
    assert "<dt>Team factor</dt><dd>0.6300</dd>" in html
    assert "<dt>Age boost</dt><dd>0.0010</dd>" in html
    # A placed job shows none; a parked one (waiting for a3) has none.
    for name in ("a1", "d1"):
        other = client.get(reverse("web:job_detail", args=[jobs[name].pk])).content.decode()
        assert 'id="job-priority"' not in other


# --- cost -----------------------------------------------------------------------------------------


def test_the_report_costs_a_fixed_number_of_queries(standing, django_assert_num_queries):
    _pass(standing)
    world = standing["world"]
    with django_assert_num_queries(FAIRSHARE_QUERIES):
        small = fairshare_report(user=world.admin)
    # Many more teams, members and ordered jobs: the same queries.
    for t in range(12):
        team = make_team(f"team-{t:02d}", guaranteed_units=0.0)
        for u in range(3):
            user = make_user(f"user-{t:02d}-{u}", team=team)
            make_job(team=team, user=user, name=f"j-{t}-{u}", gpu_count=4)  # waits
    Membership.objects.create(team=Team.objects.get(name="team-00"), user=world.alice)
    run_schedule_pass(now=standing["now"] + timedelta(minutes=1))
    with django_assert_num_queries(FAIRSHARE_QUERIES):
        big = fairshare_report(user=world.admin)
    assert len(big["teams"]) == len(small["teams"]) + 12
    assert len(big["members"]) == len(small["members"]) + 36
    assert big["jobs_total"] == small["jobs_total"] + 36
    # The page: the report's queries, plus the session and the user.
    for user in (world.alice, world.admin):
        client = Client()
        client.force_login(user)
        with django_assert_num_queries(FAIRSHARE_QUERIES + 2):
            assert client.get(reverse("web:fairshare")).status_code == 200

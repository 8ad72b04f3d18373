"""Team isolation: a user sees and touches only their own teams' jobs, in selectors and the API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.jobs.models import Job, JobState
from portal.jobs.selectors import job_get_for_user, job_list_for_user
from portal.jobs.testing import World, make_job
from portal.tenants.selectors import can_admin_team, teams_for_user
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def vision_job(world) -> Job:
    return make_job(team=world.vision, user=world.alice, name="vision-secret")


def api_as(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=user)}")
    return client


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("get", ""), ("get", "log/?format=json"), ("post", "cancel/")],
)
def test_a_member_of_nlp_gets_404_for_a_vision_job(world, vision_job, method, suffix):
    response = getattr(api_as(world.bob), method)(f"/api/v1/jobs/{vision_job.pk}/{suffix}")

    assert response.status_code == 404
    assert response.json() == {
        "errors": {"detail": f"no job {vision_job.pk} among the jobs of your teams"}
    }
    vision_job.refresh_from_db()
    assert vision_job.state == JobState.PENDING


def test_a_foreign_job_reads_exactly_like_a_missing_one(world, vision_job):
    bob = api_as(world.bob)
    foreign = bob.get(f"/api/v1/jobs/{vision_job.pk}/")
    missing = bob.get("/api/v1/jobs/999999/")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["errors"]["detail"].replace(str(vision_job.pk), "N") == missing.json()[
        "errors"
    ]["detail"].replace("999999", "N")


def test_the_nlp_job_list_leaves_out_vision_jobs(world, vision_job):
    own = make_job(team=world.nlp, user=world.bob)
    body = api_as(world.nick).get("/api/v1/jobs/")  # nlp's team admin
    assert [job["id"] for job in body.json()["results"]] == [own.pk]


def test_filtering_by_a_foreign_team_is_refused_naming_my_teams(world, vision_job):
    response = api_as(world.bob).get("/api/v1/jobs/?team=vision")
    assert response.status_code == 400
    assert response.json() == {
        "errors": {"team": "'vision' is not one of your teams; allowed: nlp"}
    }


def test_a_foreign_team_page_is_404(world):
    response = api_as(world.bob).get("/api/v1/teams/vision/")
    assert response.status_code == 404
    assert response.json() == {"errors": {"detail": "no team 'vision' among your teams"}}
    assert (
        api_as(world.nick).patch("/api/v1/teams/vision/", {"weight": 9}, format="json").status_code
        == 404
    )


def test_a_dependency_on_a_foreign_job_is_refused_and_nothing_is_stored(world, vision_job):
    before = Job.objects.count()
    response = api_as(world.bob).post(
        "/api/v1/jobs/",
        {
            "name": "sneaky",
            "team": "nlp",
            "image": "python:3.11-slim",
            "command": ["true"],
            "gpu": {"kind": "whole"},
            "depends_on": [vision_job.pk],
        },
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "depends_on": f"unknown job {vision_job.pk}; allowed: ids of jobs of your teams"
    }
    assert Job.objects.count() == before


# --- the selectors the pages use -------------------------------------------------------


def test_job_selectors_keep_teams_apart(world, vision_job):
    nlp_job = make_job(team=world.nlp, user=world.bob)

    assert list(job_list_for_user(user=world.bob)) == [nlp_job]
    assert list(job_list_for_user(user=world.alice)) == [vision_job]
    assert set(job_list_for_user(user=world.admin)) == {vision_job, nlp_job}
    assert job_get_for_user(user=world.alice, job_id=vision_job.pk) == vision_job
    with pytest.raises(Job.DoesNotExist):
        job_get_for_user(user=world.bob, job_id=vision_job.pk)
    with pytest.raises(Job.DoesNotExist):
        job_get_for_user(user=world.nick, job_id=vision_job.pk)
    assert list(job_list_for_user(user=world.admin, team="nlp")) == [nlp_job]
    assert list(job_list_for_user(user=world.alice, team=world.nlp)) == []


def test_team_selectors_know_who_sees_and_who_administers(world):
    assert list(teams_for_user(user=world.alice)) == [world.vision]
    assert list(teams_for_user(user=world.nick)) == [world.nlp]
    assert list(teams_for_user(user=world.admin)) == [world.nlp, world.vision]
    assert can_admin_team(user=world.vera, team=world.vision)
    assert not can_admin_team(user=world.alice, team=world.vision)
    assert not can_admin_team(user=world.nick, team=world.vision)
    assert can_admin_team(user=world.admin, team=world.vision)


def test_an_anonymous_user_sees_nothing(world, vision_job):
    from django.contrib.auth.models import AnonymousUser

    assert list(teams_for_user(user=AnonymousUser())) == []
    assert list(job_list_for_user(user=AnonymousUser())) == []

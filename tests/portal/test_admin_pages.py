"""The Django admin: every model registered, lists load, state fields are read-only."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from portal.jobs.models import Job, JobState
from portal.jobs.testing import World, allocate, make_job, make_node

pytestmark = pytest.mark.django_db

PORTAL_APPS = ("tenants", "cluster", "jobs", "accounting")


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def admin_client_(client, world):
    client.force_login(world.admin)
    return client


def portal_models():
    return [model for label in PORTAL_APPS for model in apps.get_app_config(label).get_models()]


def test_every_portal_model_is_registered():
    missing = [model.__name__ for model in portal_models() if not admin.site.is_registered(model)]
    assert missing == []


def test_every_changelist_loads_with_data(admin_client_, world):
    make_node(gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["1g.10gb"]}])
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])
    for model in portal_models():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = admin_client_.get(url)
        assert response.status_code == 200, url


def test_job_state_fields_are_read_only_and_jobs_are_not_added_by_hand(admin_client_, world):
    job = make_job(team=world.vision, user=world.alice)
    url = reverse("admin:jobs_job_change", args=[job.pk])
    page = admin_client_.get(url)
    assert page.status_code == 200
    form_fields = page.context["adminform"].form.fields
    for name in ("state", "attempt", "exit_code", "node", "stop_requested_at", "pending_code"):
        assert name not in form_fields
    assert admin_client_.get(reverse("admin:jobs_job_add")).status_code == 403


def test_a_jobs_request_is_editable_while_pending_and_read_only_once_placed(admin_client_, world):
    pending = make_job(team=world.vision, user=world.alice)
    running = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)

    def editable(job):
        page = admin_client_.get(reverse("admin:jobs_job_change", args=[job.pk]))
        assert page.status_code == 200
        return set(page.context["adminform"].form.fields)

    request_fields = {"image", "command", "env", "gpu_kind", "gpu_count", "priority", "team"}
    assert request_fields <= editable(pending)
    assert request_fields & editable(running) == set()
    assert {"state", "exit_code"} & editable(pending) == set()


def test_admin_model_names_are_spelled_right(admin_client_):
    page = admin_client_.get(reverse("admin:index")).content.decode()

    for right in ("Job metrics", "Dispatches", "GPUs", "Job dependencies"):
        assert f">{right}</a>" in page, right
    for wrong in ("Job metricss", "Dispatchs", "Gpus", "Job dependencys"):
        assert wrong not in page


def test_no_admin_model_has_a_naive_plural():
    # Django's default plural adds an "s": wrong after s, x, ch, sh and a consonant + y.
    for model in admin.site._registry:
        plural = str(model._meta.verbose_name_plural)
        assert not re.search(r"(ss|xs|chs|shs|[^aeiou]ys)$", plural), model.__name__


def test_the_cancel_action_goes_through_the_service(admin_client_, world):
    job = make_job(team=world.vision, user=world.alice)
    finished = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)
    response = admin_client_.post(
        reverse("admin:jobs_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [job.pk, finished.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert Job.objects.get(pk=job.pk).events.filter(to_state="CANCELLED").exists()
    assert Job.objects.get(pk=finished.pk).state == JobState.SUCCEEDED
    messages = [str(m) for m in response.context["messages"]]
    assert f"job {finished.pk} already ended (SUCCEEDED); nothing to cancel" in messages


def test_usage_and_allocations_cannot_be_edited(admin_client_):
    for name in ("accounting_usagerecord", "accounting_usagebalance", "jobs_allocation"):
        assert admin_client_.get(reverse(f"admin:{name}_add")).status_code == 403


def test_a_team_admin_is_not_a_site_admin(client, world):
    client.force_login(world.vera)
    response = client.get(reverse("admin:jobs_job_changelist"))
    assert response.status_code == 302  # to the admin login: the admin is for site admins

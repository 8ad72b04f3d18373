"""The job page links the whole log for download; the link serves it to the logged-in user."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from portal.jobs.models import JobLogChunk, JobState
from portal.jobs.testing import World, make_job

pytestmark = pytest.mark.django_db


def test_the_job_page_links_the_whole_log_and_the_link_serves_it() -> None:
    world = World()
    job = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, data="x" * 30_000 + "\n")
    JobLogChunk.objects.create(job=job, attempt=1, seq=1, data="the end\n")
    browser = Client()
    browser.force_login(world.alice)

    page = browser.get(reverse("web:job_detail", args=[job.pk])).content.decode()
    link = re.search(r'<a [^>]*id="log-download"[^>]*>', page)
    assert link is not None, page
    href = re.search(r'href="([^"]+)"', link.group(0)).group(1)
    download = browser.get(href, HTTP_ACCEPT="text/html,*/*;q=0.8")  # what a browser sends

    assert f'download="job-{job.pk}-attempt-1.log"' in link.group(0)
    assert download.status_code == 200
    assert download["Content-Type"].startswith("text/plain")
    assert download.content.decode() == "x" * 30_000 + "\nthe end\n"

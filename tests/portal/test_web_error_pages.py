"""Error pages as a person meets them (DEBUG off, as in production): the site's own 404, 403
and 500 pages with its header and a way back; under /api/ the answers stay JSON. And the API
docs page, which must work on a cluster without internet access.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client, RequestFactory
from django.urls import reverse
from django.views.defaults import server_error

from portal.jobs.testing import make_job, make_team, make_user
from portal.tenants.models import Team

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def production_errors(settings: Any) -> None:
    # pytest-django runs with DEBUG off already; pinned here because these pages exist only then.
    settings.DEBUG = False


@pytest.fixture
def vision() -> Team:
    return make_team("vision")


@pytest.fixture
def alice(vision: Team) -> Any:
    return make_user("alice", team=vision)


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def html(response: Any) -> str:
    return response.content.decode()


def test_a_missing_page_is_the_sites_404_with_its_navigation(alice: Any) -> None:
    response = client_for(alice).get("/jobs/999/")
    page = html(response)

    assert response.status_code == 404
    assert "404.html" in [t.name for t in response.templates]
    assert "<h1>Page not found</h1>" in page
    assert "<code>/jobs/999/</code>, or it belongs to a team you are not in" in page
    assert '<nav class="nav">' in page and 'href="/teams/"' in page  # the site's header
    assert '<a class="button" href="/">Your jobs</a>' in page
    assert "/static/css/portal.css" in page


def test_another_teams_job_gets_the_same_404_page(alice: Any) -> None:
    nlp = make_team("nlp")
    foreign = make_job(team=nlp, user=make_user("bob", team=nlp))

    response = client_for(alice).get(reverse("web:job_detail", args=[foreign.pk]))

    assert response.status_code == 404
    assert "<h1>Page not found</h1>" in html(response)


def test_an_anonymous_visitor_of_an_unknown_address_is_offered_the_login(db: Any) -> None:
    response = Client().get("/no-such-page/")
    page = html(response)

    assert response.status_code == 404
    assert "<h1>Page not found</h1>" in page
    assert '<nav class="nav">' not in page
    assert '<a class="button" href="/login/">Log in</a>' in page
    assert "a team you are not in" not in page  # nothing to hint at for a stranger


def test_a_forbidden_action_is_the_sites_403_saying_why(alice: Any, vision: Team) -> None:
    response = client_for(alice).post(
        reverse("web:team_quota", args=["vision"]),
        {"weight": "9", "guaranteed_units": "1", "limit_units": "4", "max_priority": "normal"},
    )
    page = html(response)

    vision.refresh_from_db()
    assert response.status_code == 403
    assert "403.html" in [t.name for t in response.templates]
    assert "<h1>Not allowed</h1>" in page
    assert "Only site admins may change a team&#x27;s quota. Nothing was changed." in page
    assert '<nav class="nav">' in page
    assert vision.weight == 1.0


def test_a_form_sent_without_its_csrf_token_gets_a_page_that_says_what_to_do(
    alice: Any,
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    response = client.post(reverse("web:job_submit"), {"name": "x"})
    page = html(response)

    assert response.status_code == 403
    assert "<h1>The form expired</h1>" in page
    assert "reload the page and send it again" in page
    assert "/static/css/portal.css" in page


def test_a_server_error_is_the_sites_500_page_without_the_request_context(db: Any) -> None:
    # Django renders 500.html with no context at all; it must still render, styled.
    response = server_error(RequestFactory().get("/"))
    page = html(response)

    assert response.status_code == 500
    assert "<h1>Something went wrong</h1>" in page
    assert "/static/css/portal.css" in page
    assert '<nav class="nav">' not in page


def test_api_errors_stay_json(alice: Any) -> None:
    client = client_for(alice)

    unknown = client.get("/api/v1/no-such-endpoint/")
    missing_job = client.get("/api/v1/jobs/999/")

    assert unknown.status_code == 404 and unknown["Content-Type"] == "application/json"
    assert unknown.json() == {
        "errors": {
            "detail": "no API endpoint /api/v1/no-such-endpoint/; the endpoints are listed at "
            "/api/docs/"
        }
    }
    assert missing_job.status_code == 404
    assert missing_job["Content-Type"] == "application/json"
    assert "errors" in missing_job.json()


# --- the API docs ------------------------------------------------------------------------


def test_the_api_docs_load_swagger_ui_from_this_server_only(db: Any) -> None:
    client = Client()
    response = client.get("/api/docs/")
    page = html(response)
    assets = re.findall(r'(?:src|href)="([^"]*)"', page)

    assert response.status_code == 200
    assert len(assets) >= 3  # Swagger UI's script, preset and stylesheet at least
    assert "http://" not in page and "https://" not in page and '="//' not in page
    for url in assets:
        assert url.startswith("/static/drf_spectacular_sidecar/"), url
        assert finders.find(url.removeprefix("/static/")) is not None, url
        served = client.get(url)
        assert served.status_code == 200, url
        served.close()
    assert '"validatorUrl": null' in page  # no badge fetched from swagger.io either

"""The Tokens page: create a token (its key shown in that answer only), list, revoke."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from portal.jobs.testing import make_team, make_user
from portal.tenants.models import ApiToken
from portal.tenants.tokens import token_create, token_digest

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def alice() -> Any:
    return make_user("alice", team=make_team("vision"))


@pytest.fixture
def alice_browser(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def test_the_page_needs_a_login_and_is_linked_from_the_header(alice_browser: Client) -> None:
    assert Client().get("/tokens/").status_code == 302
    page = alice_browser.get("/").content.decode()
    assert '<a href="/tokens/"' in page


def test_a_token_created_on_the_page_shows_its_key_once(alice: Any, alice_browser: Client) -> None:
    created = alice_browser.post(
        "/tokens/",
        {"name": "laptop", "scopes": ["read", "submit"], "expires_in_days": "30"},
        **HTMX,
    )

    assert created.status_code == 201
    assert "no-store" in created["Cache-Control"]
    token = ApiToken.objects.get(user=alice)
    html = created.content.decode()
    key = html.split('<pre class="key" id="new-token-key">', 1)[1].split("</pre>", 1)[0]
    assert token.digest == token_digest(key)
    assert (token.name, token.scopes) == ("laptop", ["read", "submit"])
    assert token.expires_at is not None
    assert "<html" not in html  # the fragment only

    again = alice_browser.get("/tokens/").content.decode()
    assert key not in again
    assert f"<code>{key[:8]}…</code>" in again and "laptop" in again


def test_bad_input_is_shown_next_to_its_field_and_nothing_is_stored(
    alice_browser: Client,
) -> None:
    response = alice_browser.post("/tokens/", {"name": "", "expires_in_days": "1000"}, **HTMX)

    assert response.status_code == 422
    html = response.content.decode()
    assert 'id="error-name">required; allowed: 1 to 64 characters' in html
    assert 'id="error-expires_at">unknown choice; allowed: never, 7 days, 30 days' in html
    assert not ApiToken.objects.exists()

    no_scope = alice_browser.post("/tokens/", {"name": "nb", "expires_in_days": ""}, **HTMX)
    assert 'id="error-scopes">at least one scope is required; allowed: read, submit, admin' in (
        no_scope.content.decode()
    )
    assert not ApiToken.objects.exists()


def test_revoke_removes_the_token_and_someone_elses_is_a_404(
    alice: Any, alice_browser: Client
) -> None:
    mine, _ = token_create(user=alice, name="old notebook", scopes=["read"])
    bob = make_user("bob")
    bobs, _ = token_create(user=bob, name="bobs", scopes=["read"])

    refused = alice_browser.post(f"/tokens/{bobs.pk}/revoke/", **HTMX)
    revoked = alice_browser.post(f"/tokens/{mine.pk}/revoke/", **HTMX)

    assert refused.status_code == 404
    assert ApiToken.objects.filter(pk=bobs.pk).exists()
    assert revoked.status_code == 200
    assert "Token revoked" in revoked.content.decode()
    assert "old notebook" not in revoked.content.decode()
    assert not ApiToken.objects.filter(pk=mine.pk).exists()

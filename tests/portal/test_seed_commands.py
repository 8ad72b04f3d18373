"""The management commands a newcomer runs: seed_demo and issue_token."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from portal.tenants.models import ApiToken, Membership, Team
from portal.tenants.tokens import token_digest

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def memberships() -> set[tuple[str, str, str]]:
    return set(Membership.objects.values_list("team__name", "user__username", "role"))


def test_seed_demo_creates_the_teams_and_people_of_the_readme(monkeypatch):
    monkeypatch.delenv("PORTAL_DEMO_PASSWORD", raising=False)
    output = run("seed_demo")

    assert list(Team.objects.values_list("name", "weight", "guaranteed_units", "limit_units")) == [
        ("nlp", 1.0, 1.0, 3.0),
        ("vision", 2.0, 2.0, 3.0),
    ]
    assert memberships() == {
        ("vision", "alice", "member"),
        ("vision", "vera", "admin"),
        ("nlp", "bob", "member"),
        ("nlp", "nick", "admin"),
    }
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser
    assert admin.check_password("demo-password-change-me")
    for line in (
        "alice  member of vision",
        "vera   team admin of vision",
        "nick   team admin of nlp",
        "admin  site admin",
    ):
        assert line in output
    assert "password demo-password-change-me" in output


def test_seed_demo_is_idempotent_and_keeps_changes(monkeypatch):
    monkeypatch.setenv("PORTAL_DEMO_PASSWORD", "first-secret")
    run("seed_demo")
    Team.objects.filter(name="vision").update(limit_units=8.0)
    alice = get_user_model().objects.get(username="alice")
    alice.set_password("alices-own")
    alice.save()

    monkeypatch.setenv("PORTAL_DEMO_PASSWORD", "second-secret")
    output = run("seed_demo")

    assert get_user_model().objects.count() == 5
    assert Team.objects.count() == 2
    assert len(memberships()) == 4
    assert Team.objects.get(name="vision").limit_units == 8.0
    alice.refresh_from_db()
    assert alice.check_password("alices-own")
    assert "existing user, password unchanged" in output


def authenticates(key: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/v1/jobs/").status_code == 200


def test_issue_token_prints_a_token_that_authenticates_and_stores_only_its_digest(db):
    run("seed_demo")
    key = run("issue_token", "alice").strip()

    token = ApiToken.objects.get(user__username="alice")
    assert token.digest == token_digest(key) != key
    assert token.prefix == key[:8]
    stored = [str(value) for value in ApiToken.objects.values_list(flat=False).get()]
    assert key not in stored
    assert authenticates(key)


def test_issue_token_again_issues_a_second_token_and_both_work(db):
    run("seed_demo")
    first = run("issue_token", "alice").strip()
    second = run("issue_token", "alice").strip()

    assert first != second
    assert ApiToken.objects.filter(user__username="alice").count() == 2
    assert authenticates(first) and authenticates(second)


def test_issue_token_rotate_revokes_the_old_token(db):
    run("seed_demo")
    old = run("issue_token", "bob").strip()
    new = run("issue_token", "bob", "--rotate").strip()
    assert new != old
    assert not ApiToken.objects.filter(digest=token_digest(old)).exists()
    assert not authenticates(old)
    assert authenticates(new)


def test_issue_token_for_an_unknown_user_fails_with_exit_status_1(db):
    run("seed_demo")
    with pytest.raises(CommandError) as caught:
        call_command("issue_token", "mallory")
    assert caught.value.returncode == 1
    assert str(caught.value) == (
        "unknown user 'mallory'; known users: admin, alice, bob, nick, vera"
    )
    assert not ApiToken.objects.exists()

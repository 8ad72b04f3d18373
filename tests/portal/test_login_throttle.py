"""Failed logins lock further attempts for a while, per username and per client address."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.jobs.testing import DEMO_PASSWORD, World
from portal.tenants.models import AccessCounter

pytestmark = pytest.mark.django_db

LOCKED = "Too many failed logins for this account or from this address; try again in 5 minutes."


@pytest.fixture
def world(settings) -> World:
    settings.LOGIN_MAX_FAILURES = 3
    settings.LOGIN_MAX_FAILURES_PER_ADDRESS = 5
    settings.LOGIN_LOCKOUT_S = 300
    return World()


def login(username: str, password: str, address: str = "10.0.0.1") -> object:
    return Client(REMOTE_ADDR=address).post(
        reverse("web:login"), {"username": username, "password": password}
    )


def test_it_locks_a_username_after_the_failures_and_refuses_even_the_right_password(world):
    assert login("alice", "wrong").status_code == 200
    assert login("alice", "wrong").status_code == 200
    third = login("alice", "wrong")  # the failure that reaches the limit says so at once
    assert third.status_code == 429
    assert LOCKED in third.content.decode()

    refused = login("alice", DEMO_PASSWORD)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) in range(295, 301)
    assert LOCKED in refused.content.decode()
    assert "_auth_user_id" not in refused.wsgi_request.session
    # From another address too: the lock is on the account.
    assert login("alice", DEMO_PASSWORD, address="10.9.9.9").status_code == 429
    # Another account is not locked.
    assert login("bob", DEMO_PASSWORD).status_code == 302


def test_the_lock_ends_after_the_lockout_time(world):
    for _ in range(3):
        login("alice", "wrong")
    assert login("alice", DEMO_PASSWORD).status_code == 429

    # Five minutes later (moved back in the database: the clock is the database row's).
    past = timezone.now() - timedelta(seconds=301)
    AccessCounter.objects.update(window_started_at=past, locked_until=past)

    assert login("alice", DEMO_PASSWORD).status_code == 302


def test_a_success_clears_the_usernames_failures(world):
    login("alice", "wrong")
    login("alice", "wrong")
    assert login("alice", DEMO_PASSWORD).status_code == 302
    # Two more failures do not reach the limit of three: the count started again.
    assert login("alice", "wrong").status_code == 200
    assert login("alice", "wrong").status_code == 200


def test_it_locks_an_address_that_guesses_across_many_usernames(world):
    for name in ("u1", "u2", "u3", "u4", "u5"):
        login(name, "guess", address="10.6.6.6")

    locked = login("alice", DEMO_PASSWORD, address="10.6.6.6")
    assert locked.status_code == 429
    # The same account from another address is fine.
    assert login("alice", DEMO_PASSWORD, address="10.0.0.2").status_code == 302


def test_the_admin_login_is_behind_the_same_lock(world):
    for _ in range(3):
        login("admin", "wrong")
    response = Client(REMOTE_ADDR="10.0.0.1").post(
        "/admin/login/?next=/admin/", {"username": "admin", "password": DEMO_PASSWORD}
    )
    assert response.status_code == 200  # the admin form shows its own error
    assert "_auth_user_id" not in response.wsgi_request.session


def test_counters_are_shared_through_the_database_not_process_memory(world):
    login("alice", "wrong")
    row = AccessCounter.objects.get(scope="login-user", key="alice")
    assert row.count == 1 and row.locked_until is None
    login("Alice", "wrong")  # the same target, whatever the case
    assert AccessCounter.objects.get(scope="login-user", key="alice").count == 2

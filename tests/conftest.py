"""Shared test set-up: which real services this run has, and what to do when one is missing.

PostgreSQL is used when DATABASE_URL points at it, Redis when REDIS_URL is set. A test that
needs one of them skips without it, unless PORTAL_REQUIRE_SERVICES=1 (CI), where a missing
service fails the run instead.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings as hypothesis_settings
from services import require_service

# Property tests are deterministic by default (`make test`, CI): the same examples every run,
# so a failure is reproducible and no run passes by luck. `make test-deep` hunts with random
# seeds and ten times the examples (HYPOTHESIS_PROFILE=deep).
hypothesis_settings.register_profile("ci", derandomize=True, max_examples=400, deadline=None)
hypothesis_settings.register_profile("deep", derandomize=False, max_examples=4000, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _schedule_requests_sent_at_once(settings) -> None:  # noqa: ANN001 - pytest-django's
    """In-process tests see each 'schedule now' request sent when its transaction commits:
    a request coalesced into a timer's send would reach a later test (portal/passes.py;
    tests/portal/test_schedule_requests.py tests the coalescing itself). The real processes
    the stack tests start keep the default."""
    settings.SCHEDULE_REQUEST_COALESCE_S = 0.0
    # A submit reads the inventory version every time: a test that adds GPUs and submits at
    # once must not see the version an earlier test left (portal/cluster/services.py).
    settings.INVENTORY_RECHECK_S = 0.0
    # Each pass stores its fair-share numbers, for the tests that read them after it
    # (tests/portal/test_fairshare.py tests the window itself).
    settings.FAIRSHARE_STORE_S = 0.0


@pytest.fixture
def postgres_db(settings) -> None:  # noqa: ANN001 - pytest-django's settings fixture
    """For tests that only make sense on PostgreSQL (races, advisory locks)."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        require_service("PostgreSQL (set DATABASE_URL=postgres://...)")


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get("REDIS_URL", "").strip()
    if not url:
        require_service("Redis (set REDIS_URL=redis://...)")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        require_service(f"Redis at {url} ({error})")
    return url

"""What to do when a test needs a real service this run does not have.

Importable from any test as ``from services import require_service`` (tests/ is on the path).
"""

from __future__ import annotations

import os

import pytest


def require_service(what: str) -> None:
    """Skip (or, when services are required, fail) a test that needs a missing service."""
    if os.environ.get("PORTAL_REQUIRE_SERVICES", "").strip().lower() in {"1", "true", "yes", "on"}:
        pytest.fail(f"{what} is required (PORTAL_REQUIRE_SERVICES=1) but not available")
    pytest.skip(f"{what} not available")

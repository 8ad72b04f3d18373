"""Fixtures for the agent tests (the doubles live in agent_doubles.py)."""

from __future__ import annotations

import pytest
from agent_doubles import RecordingSender


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()

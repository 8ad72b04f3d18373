"""Fixtures for the agent tests (the doubles live in agent_doubles.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_doubles import RecordingSender
from job_processes import scratch_dir_others_may_enter


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A scratch directory job uids may pass through (pytest's tmp_path is 0700): an agent's
    work directory when its jobs run as uids of their own."""
    with scratch_dir_others_may_enter() as path:
        yield path

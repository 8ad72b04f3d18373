"""Fixtures most API tests share: the demo-shaped world and alice's API client."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.jobs.testing import World, token_client


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def alice_api(world: World) -> APIClient:
    return token_client(world.alice)

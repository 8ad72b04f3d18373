"""PortalStack's children must open the very database this test process uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from stack import database_url_for_children

from portal.env import database_from_url


@pytest.mark.django_db
def test_the_childrens_database_url_names_the_test_database() -> None:
    mine = connection.settings_dict
    theirs = database_from_url(database_url_for_children(), base_dir=Path("/nowhere"))
    assert theirs["ENGINE"] == mine["ENGINE"]
    assert theirs["NAME"] == str(mine["NAME"])
    assert str(mine["NAME"]).startswith("test_") or Path(str(mine["NAME"])).name.startswith("test_")
    if mine["ENGINE"] == "django.db.backends.postgresql":
        for key in ("USER", "PASSWORD", "PORT"):
            assert theirs[key] == str(mine[key] or ""), key
        assert theirs["HOST"] == (mine["HOST"] or "127.0.0.1")

"""The API's JSON renderer (portal/api/renderers.py) writes the bytes DRF's ``JSONRenderer``
writes, for everything a response may hold (a float perhaps in another notation of the same
number), and hands DRF's renderer what it does not write itself."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer

from portal.api.renderers import FastJSONRenderer
from portal.jobs.testing import World, token_client

DRF = JSONRenderer()
FAST = FastJSONRenderer()


@dataclasses.dataclass
class _Point:
    x: int


CASES = {
    "page": {
        "next": "http://testserver/api/v1/jobs/?cursor=abc",
        "previous": None,
        "results": [
            {"id": 1, "name": "train", "gpu": {"count": 2, "multi_node": False}, "eta": 1.5}
        ],
    },
    "unicode": {"name": "résumé 训练 🚀", "quote": 'a "b" \\ c\n\t'},
    "line separators": {"text": "one\u2028two\u2029three"},
    "times": {
        "utc": datetime(2026, 12, 7, 15, 2, 11, 525_123, tzinfo=UTC),
        "whole second": datetime(2026, 12, 7, 15, 2, 11, tzinfo=UTC),
        "offset": datetime(2026, 12, 7, 15, 2, 11, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        "naive": datetime(2026, 12, 7, 15, 2, 11, 5),
        "day": date(2026, 12, 7),
        "clock": time(15, 2, 11, 400),
        "span": timedelta(hours=1, seconds=3),
    },
    "other types": {
        "decimal": Decimal("1.10"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "lazy": gettext_lazy("Not found."),
        "tuple": (1, 2),
        "set_like": frozenset(),
        "bytes": b"abc",
    },
    "keys that are not text": {1: "one", 2.5: "two and a half", False: "no", None: "none"},
    "numbers": {"big": 2**63 - 1, "negative": -(2**63), "float": 0.1 + 0.2, "e": 1e300},
    "wider than 64 bits": {"n": 2**70},
    "a dataclass": {"point": _Point(1)},
    "top-level list": [1, "two", None, True, {"k": []}],
    "empty": {},
}


@pytest.mark.parametrize("data", CASES.values(), ids=list(CASES))
def test_same_bytes_as_drf(data: object) -> None:
    try:
        expected = DRF.render(data)
    except (TypeError, ValueError) as error:
        with pytest.raises(type(error)):
            FAST.render(data)
        return
    assert FAST.render(data) == expected


def test_indented_json_when_asked() -> None:
    data = {"a": [1, 2]}
    media = "application/json; indent=4"
    assert (
        FAST.render(data, media, {})
        == DRF.render(data, media, {})
        == b'{\n    "a": [\n        1,\n        2\n    ]\n}'
    )


def test_nothing_for_no_data() -> None:
    assert FAST.render(None) == DRF.render(None) == b""


def _json(leaves: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=30,
    )


@given(_json(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()))
def test_same_bytes_as_drf_for_any_json_without_floats(data: object) -> None:
    assert FAST.render(data) == DRF.render(data)


@given(_json(st.floats(allow_nan=False, allow_infinity=False) | st.integers() | st.text()))
def test_same_values_as_drf_with_floats(data: object) -> None:
    """A float may be written in another notation (0.00001 for 1e-05): the same number."""
    assert json.loads(FAST.render(data)) == json.loads(DRF.render(data))


def test_a_float_that_is_no_number_is_null() -> None:
    """Where DRF's strict JSON raises (a server error), the value is written as null."""
    with pytest.raises(ValueError):
        DRF.render({"x": math.inf})
    assert FAST.render({"x": math.inf, "y": math.nan}) == b'{"x":null,"y":null}'


@pytest.mark.django_db
def test_the_api_answers_with_it(world: World) -> None:
    client = token_client(world.alice)
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 200
    assert isinstance(response.accepted_renderer, FastJSONRenderer)
    assert response.content == DRF.render(response.data)

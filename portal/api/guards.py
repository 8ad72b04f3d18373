"""Input the database or the services must never see, refused at the door with a 400 that
names the field: NUL characters and lone surrogates in any string (PostgreSQL cannot store
the first, UTF-8 cannot encode the second), JSON nested deeper than any request needs, and
pagination numbers beyond what a query can take.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser

# The largest value a bigint column holds: an offset beyond it cannot reach a row.
BIGINT_MAX = 2**63 - 1


def string_problem(text: str) -> str | None:
    """Why `text` may not be stored, or None."""
    if "\x00" in text:
        return "must not contain a NUL character"
    for char in text:
        if "\ud800" <= char <= "\udfff":
            return f"must not contain a lone surrogate (U+{ord(char):04X}); send valid UTF-8 text"
    return None


def check_tree(value: Any, *, path: str = "", depth: int = 1, max_depth: int) -> None:
    """Walk a parsed JSON body: every string and key clean, nesting at most `max_depth`."""
    field = path or "detail"
    if isinstance(value, dict | list) and depth > max_depth:
        raise ValidationError(
            {field: f"nested too deeply; allowed: at most {max_depth} levels of objects and lists"}
        )
    if isinstance(value, str):
        if problem := string_problem(value):
            raise ValidationError({field: problem})
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else str(key)
            if problem := string_problem(key):
                raise ValidationError({_printable(name): f"this key {problem}"})
            check_tree(item, path=name, depth=depth + 1, max_depth=max_depth)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            name = f"{path}.{index}" if path else str(index)
            check_tree(item, path=name, depth=depth + 1, max_depth=max_depth)


def check_query_params(params: Mapping[str, Any]) -> None:
    """Query parameters (a QueryDict) or the URL's captured values (a dict)."""
    for name in params:
        if problem := string_problem(name):
            raise ValidationError({_printable(name): f"this parameter name {problem}"})
        values = params.getlist(name) if hasattr(params, "getlist") else [params[name]]
        for value in values:
            if isinstance(value, str) and (problem := string_problem(value)):
                raise ValidationError({name: problem})


def _printable(name: str) -> str:
    # The field name itself holds the bad character: show it escaped, so the JSON answer
    # is valid UTF-8.
    return name.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


class PortalJSONParser(JSONParser):
    """DRF's JSON parser, plus the checks above; a body too deep for Python's own parser
    is a 400 too, never a RecursionError."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
            data = json.loads(text)
        except RecursionError:
            raise ValidationError(
                {
                    "detail": f"nested too deeply; allowed: at most {settings.API_MAX_JSON_DEPTH} "
                    "levels of objects and lists"
                }
            ) from None
        except ValueError as error:
            raise ParseError(f"JSON parse error - {error}") from None
        check_tree(data, max_depth=settings.API_MAX_JSON_DEPTH)
        return data


class PortalPagination(LimitOffsetPagination):
    """`limit` and `offset` checked and named when wrong, instead of quietly replaced by the
    default (DRF's way) or passed to the database as a number it cannot hold."""

    def get_limit(self, request: Any) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None or raw.strip() == "":
            return int(self.default_limit or settings.API_MAX_LIMIT)
        allowed = f"a whole number from 1 to {settings.API_MAX_LIMIT}"
        return whole_number(raw, name="limit", low=1, high=settings.API_MAX_LIMIT, allowed=allowed)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        # The bounds get_limit and get_offset check, in the schema too.
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": settings.API_MAX_LIMIT},
            self.offset_query_param: {"minimum": 0, "maximum": BIGINT_MAX},
        }
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters

    def get_offset(self, request: Any) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None or raw.strip() == "":
            return 0
        allowed = f"a whole number from 0 to {BIGINT_MAX}"
        return whole_number(raw, name="offset", low=0, high=BIGINT_MAX, allowed=allowed)


def whole_number(raw: str, *, name: str, low: int, high: int, allowed: str) -> int:
    """A query parameter as a whole number from ``low`` to ``high``; a 400 naming ``name``
    and ``allowed`` otherwise."""
    text = raw.strip()
    shown = repr(text if len(text) <= 40 else text[:37] + "...")
    # Digits only, and not more than a bigint's: int() of a huge string costs time.
    if not text.isdigit() or not text.isascii():
        raise ValidationError({name: f"{shown} is not a whole number; allowed: {allowed}"})
    if len(text) > 19 or not low <= int(text) <= high:
        raise ValidationError({name: f"{shown} is out of range; allowed: {allowed}"})
    return int(text)

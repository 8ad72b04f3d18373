"""Input the database or the services must never see, refused at the door with a 400 that
names the field: NUL characters and lone surrogates in any string (PostgreSQL cannot store
the first, UTF-8 cannot encode the second), JSON nested deeper than any request needs, and
pagination numbers and cursors beyond what a query can take; and the cursor pagination of
the job list.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib import parse

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from portal.compiled_queries import compiled_rows

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


class NewestFirstPagination(BasePagination):
    """Pages of a list newest first by (``submitted_at``, ``id``), walked with a cursor: each
    page is one indexed query that reads ``limit`` + 1 rows wherever it is in the list, and no
    page counts the whole list (a COUNT over every row the user may see, on every request,
    was what a list cost most). ``{"next", "previous", "results"}``: ``next`` and
    ``previous`` are links holding the cursor (null at either end). A row added meanwhile
    never shifts a page by one, as an offset would.

    ``limit`` is checked and named when wrong (1 to API_MAX_LIMIT, default PAGE_SIZE); so is
    a ``cursor`` this API did not give.
    """

    ordering: Sequence[str] = ("submitted_at", "id")  # both descending
    cursor_query_param = "cursor"
    limit_query_param = "limit"
    offset_query_param = "offset"
    allowed_cursor = "the cursor of a page's next or previous link"

    def paginate_queryset(self, queryset: QuerySet[Any], request: Any, view: Any = None) -> Any:
        after = self._read_request(request)
        return self._keep(list(self._page_query(queryset, after)), after=after)

    def paginate_compiled(
        self,
        *,
        key: Hashable,
        build: Callable[[Sequence[Any]], QuerySet[Any]],
        values: Sequence[Any],
        request: Any,
    ) -> list[dict[str, Any]]:
        """``paginate_queryset(build(values))`` for a ``values()`` queryset, with its SQL
        compiled once per ``key``, walking direction and page size
        (``portal.compiled_queries``); the cursor's time and id are values of the shape."""
        after = self._read_request(request)
        count = len(values)

        def page(all_values: Sequence[Any]) -> QuerySet[Any]:
            at = None if after is None else (after[0], all_values[count], all_values[count + 1])
            return self._page_query(build(all_values[:count]), at)

        rows = compiled_rows(
            key=(key, None if after is None else after[0], self.limit),
            build=page,
            values=[*values, *(() if after is None else after[1:])],
        )
        return self._keep(rows, after=after)

    def _read_request(self, request: Any) -> tuple[bool, datetime, int] | None:
        self.request = request
        if self.offset_query_param in request.query_params:
            # An old client paging by offset would get the first page again and again.
            raise ValidationError(
                {
                    self.offset_query_param: "this list is paged by cursor, not by offset; "
                    f"allowed: none (follow the next link, or send {self.allowed_cursor})"
                }
            )
        self.limit = self.get_limit(request)
        return self.decode_cursor(request)

    def _page_query(
        self, queryset: QuerySet[Any], after: tuple[bool, datetime, int] | None
    ) -> QuerySet[Any]:
        """The page's rows and one more (there is a next page when it comes back)."""
        time_field, id_field = self.ordering
        newest_first = (f"-{time_field}", f"-{id_field}")
        if after is None:
            rows = queryset.order_by(*newest_first)
        else:
            backwards, at, pk = after
            if backwards:  # the page before: the rows just newer than the cursor, oldest first
                newer = Q(**{f"{time_field}__gt": at}) | Q(
                    **{time_field: at, f"{id_field}__gt": pk}
                )
                rows = queryset.filter(newer).order_by(time_field, id_field)
            else:
                older = Q(**{f"{time_field}__lt": at}) | Q(
                    **{time_field: at, f"{id_field}__lt": pk}
                )
                rows = queryset.filter(older).order_by(*newest_first)
        return rows[: self.limit + 1]

    def _keep(self, page: list[Any], *, after: tuple[bool, datetime, int] | None) -> list[Any]:
        backwards = after is not None and after[0]
        more = len(page) > self.limit
        page = page[: self.limit]
        if backwards:
            page.reverse()
        self.page = page
        # Further in the direction walked: `more`; back where we came from: there is a cursor.
        self.has_next = (more if not backwards else True) and bool(page)
        self.has_previous = (more if backwards else after is not None) and bool(page)
        return page

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data}
        )

    def get_next_link(self) -> str | None:
        return self._link(self.page[-1], backwards=False) if self.has_next else None

    def get_previous_link(self) -> str | None:
        return self._link(self.page[0], backwards=True) if self.has_previous else None

    def _link(self, row: Any, *, backwards: bool) -> str:
        time_field, id_field = self.ordering
        # A page holds model instances, or plain rows (``values()``).
        at: datetime = row[time_field] if isinstance(row, Mapping) else getattr(row, time_field)
        pk = row[id_field] if isinstance(row, Mapping) else getattr(row, id_field)
        position = {"d": "prev" if backwards else "next", "t": at.isoformat(), "i": pk}
        cursor = base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")
        # What DRF's replace_query_param (twice) and remove_query_param would make of the
        # request's URL, with the URL taken apart once instead of three times.
        scheme, netloc, path, query, fragment = parse.urlsplit(self.request.build_absolute_uri())
        params = parse.parse_qs(query, keep_blank_values=True)
        params[self.cursor_query_param] = [cursor]
        params[self.limit_query_param] = [str(self.limit)]
        params.pop(self.offset_query_param, None)
        query = parse.urlencode(sorted(params.items()), doseq=True)
        return parse.urlunsplit((scheme, netloc, path, query, fragment))

    def get_limit(self, request: Any) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None or raw.strip() == "":
            return int(settings.REST_FRAMEWORK.get("PAGE_SIZE") or settings.API_MAX_LIMIT)
        allowed = f"a whole number from 1 to {settings.API_MAX_LIMIT}"
        return whole_number(raw, name="limit", low=1, high=settings.API_MAX_LIMIT, allowed=allowed)

    def decode_cursor(self, request: Any) -> tuple[bool, datetime, int] | None:
        """(backwards, time, id) of the cursor in the request, or None for the first page."""
        raw = request.query_params.get(self.cursor_query_param, "").strip()
        if not raw:
            return None
        try:
            position = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            direction, at, pk = position["d"], parse_datetime(position["t"]), position["i"]
        except (binascii.Error, ValueError, TypeError, KeyError, RecursionError):
            position = direction = at = pk = None
        valid = (
            direction in ("next", "prev")
            and isinstance(at, datetime)
            and at.tzinfo is not None
            and isinstance(pk, int)
            and not isinstance(pk, bool)
            and 0 <= pk <= BIGINT_MAX
        )
        if not valid:
            shown = repr(raw if len(raw) <= 40 else raw[:37] + "...")
            raise ValidationError(
                {
                    self.cursor_query_param: f"{shown} is not a cursor; allowed: {self.allowed_cursor}"
                }
            )
        assert isinstance(at, datetime) and isinstance(pk, int)
        return direction == "prev", at, pk

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "where the page starts: the cursor of the next or previous link "
                "of the page before (omit it for the newest jobs)",
                "schema": {"type": "string"},
            },
            {
                "name": self.limit_query_param,
                "required": False,
                "in": "query",
                "description": "jobs per page",
                "schema": {"type": "integer", "minimum": 1, "maximum": settings.API_MAX_LIMIT},
            },
        ]

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }


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

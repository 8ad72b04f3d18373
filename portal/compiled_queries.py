"""A queryset's SQL compiled once per shape, then run again with new values.

Django builds and compiles a queryset on every request: for the API's job list that was
about half of what a ``?limit=1`` page cost the web process (cloning querysets, resolving
``team__name`` into joins, quoting every column). The SQL of one *shape* of request (which
filters are on, how many states, which way a cursor walks, how many rows a page holds) is
the same each time; only the values in its parameters change. ``compiled_rows`` compiles a
shape once per process and afterwards only substitutes the new values.

The SQL comes from the caller's own queryset, never from a second copy of its logic: the
caller hands over ``build(values) -> QuerySet`` (the very function that answers the request)
and the ``values`` that may change between requests of one shape. On the first request of a
shape the queryset is built twice, with two different sets of stand-in values, and compiled;
the two must give the same SQL text, and every parameter must either be one of the stand-ins
(in both, at the same place: it is filled with that value from then on) or a constant (equal
in both). A queryset that puts a value in its SQL text, or transforms it on the way (a
``LIKE`` pattern built from it), fails that check: that shape is not cached and every
request of it is answered by the ORM as before. A queryset that the ORM knows to be empty
(no team to see) is not cached either.

What ``build`` decides from anything other than ``values`` (whether the user is a site
admin, whether a filter is on) must be part of ``key``: two requests of one key must build
the same SQL from different values. Only ``values()`` querysets are taken: their rows are
plain dicts, converted as the ORM converts them (the backend's and the fields' converters).

On PostgreSQL the compiled SQL is also a prepared statement (``prepared_cursor``): the
server parses and plans it once per connection instead of on every request. Planning was
most of what the job list cost the database server (0.75 ms of its CPU for a ``?limit=1``
page whose execution takes 0.05 ms).
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection, connections
from django.db.models import QuerySet
from django.db.models.query import ValuesIterable

# Shapes kept per process at most (each is a few kilobytes); beyond it the cache starts over.
SHAPES_KEPT = 256

# A stand-in's base values: far from any id, name or time a real request carries, so that a
# constant of the query is never mistaken for one.
_INT_BASE = 1_987_650_000
_TIME_BASE = datetime(1901, 2, 3, 4, 5, 6, 789_012, tzinfo=UTC)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # One entry per parameter: (index into the values, how the ORM adapted it) or, for a
    # constant of the query, (None, the constant).
    slots: tuple[tuple[int | None, Any], ...]
    names: tuple[str, ...]  # the row's keys, in column order
    converters: tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]

    def rows(self, values: Sequence[Any]) -> list[dict[str, Any]]:
        params = [
            slot if index is None else (values[index] if slot is None else slot(values[index]))
            for index, slot in self.slots
        ]
        with prepared_cursor() as cursor:
            cursor.execute(self.sql, params)
            fetched = cursor.fetchall()
        names, width = self.names, len(self.names)
        rows = []
        for record in fetched:
            row = list(record[:width])
            for position, convert_all, expression in self.converters:
                value = row[position]
                for convert in convert_all:
                    value = convert(value, expression, connection)
                row[position] = value
            rows.append(dict(zip(names, row, strict=True)))
        return rows


_shapes: dict[Hashable, _Compiled | None] = {}  # None: a shape the ORM answers every time
_lock = threading.Lock()


def compiled_rows(
    *, key: Hashable, build: Callable[[Sequence[Any]], QuerySet[Any]], values: Sequence[Any]
) -> list[dict[str, Any]]:
    """The rows of ``build(values)`` (a ``values()`` queryset), from SQL compiled once per
    ``key`` and database backend (see the module's docstring for what ``key`` must hold)."""
    shape_key = (connection.vendor, key)
    try:
        compiled = _shapes[shape_key]
    except KeyError:
        compiled = _compile(build, values)
        with _lock:
            if len(_shapes) >= SHAPES_KEPT:
                _shapes.clear()
            _shapes[shape_key] = compiled
    if compiled is None:
        return list(build(values))
    return compiled.rows(values)


def prepared_cursor() -> Any:
    """A cursor of the default connection for statements whose SQL text is fixed per process
    (compiled shapes, the token lookup, the rate-limit counters): on PostgreSQL each is a
    prepared statement of the connection, parsed and planned once and then only executed
    (after five executions PostgreSQL keeps a generic plan when it costs no more than the
    custom ones). Elsewhere, the usual cursor.

    It is Django's own cursor wrapper (query logging and ``CaptureQueriesContext`` see its
    statements) around a server-side-binding psycopg cursor: parameters travel apart from
    the SQL, as prepared statements need. Every other cursor of the connection stays
    client-side binding and unprepared, as Django makes them. Prepared statements belong to
    a server session: behind PgBouncer, transaction pooling needs PgBouncer 1.21 or later
    with ``max_prepared_statements`` set.
    """
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    raw = connection.connection
    # Django opens connections with preparing off (prepare_threshold None). The psycopg
    # cursors Django makes bind on the client side and never prepare whatever the threshold
    # (psycopg only counts their statements, in a table of at most 100), so turning it on
    # prepares nothing but what _PreparingCursor runs.
    if raw.prepare_threshold is None:
        raw.prepare_threshold = PREPARE_THRESHOLD
    cursor = _preparing_cursor_class()(raw)
    cursor.database = connections[connection.alias]
    with connection.wrap_database_errors:
        return connection._prepare_cursor(cursor)


# psycopg's own default: what a statement that does not ask to be prepared needs (none here).
PREPARE_THRESHOLD = 5


@functools.cache
def _preparing_cursor_class() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor

    class _PreparingCursor(ServerBindingCursor):  # type: ignore[misc,valid-type]
        """Asks psycopg to prepare every statement it executes (Django's cursor wrapper
        passes no ``prepare`` argument)."""

        database: Any  # Django's wrapper of the connection (prepared_cursor sets it)

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs["prepare"] = True
            result = super().execute(query, params, **kwargs)
            # A statement that just came back is all CONN_HEALTH_CHECKS' ``SELECT 1`` would
            # tell: mark this request's check done, so the next ORM query of the request does
            # not pay that hidden round trip. Each request's start (``request_started``)
            # clears the mark again, so the next request still checks its connection.
            self.database.health_check_done = True
            return result

        def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> None:
            # psycopg leaves the cursor's last query unset when it runs a prepared statement;
            # Django's query log reads it (the SQL, with $1-style placeholders).
            self._query = pgq
            super()._send_query_prepared(name, pgq, **kwargs)

    return _PreparingCursor


def with_pk(instance: Any, pk: Any) -> Any:
    """A copy of ``instance`` (a model instance, such as the requesting user) with ``pk`` for
    its primary key: what ``build`` filters by when the instance's id is a value of the
    shape."""
    copied = copy.copy(instance)
    copied.pk = pk
    return copied


def forget_compiled() -> None:
    """Drop every compiled shape (tests that change what a shape compiles to)."""
    with _lock:
        _shapes.clear()


def _compile(
    build: Callable[[Sequence[Any]], QuerySet[Any]], values: Sequence[Any]
) -> _Compiled | None:
    stand_ins = [_stand_ins(values, variant) for variant in (0, 1)]
    if any(row is None for row in stand_ins):
        return None
    first, second = (build(row) for row in stand_ins)  # type: ignore[arg-type]
    if first._iterable_class is not ValuesIterable:
        return None
    try:
        compiler = first.query.get_compiler(using=first.db)
        sql, params = compiler.as_sql()
        other_sql, other_params = second.query.get_compiler(using=second.db).as_sql()
    except EmptyResultSet:
        return None
    if not sql or sql != other_sql or len(params) != len(other_params):
        return None
    slots: list[tuple[int | None, Any]] = []
    for param, other in zip(params, other_params, strict=True):
        slot = _slot(param, other, stand_ins)  # type: ignore[arg-type]
        if slot is False:
            return None
        slots.append(slot)
    query = first.query
    if query.selected:
        names = tuple(query.selected)
    else:
        names = (*query.extra_select, *query.values_select, *query.annotation_select)
    fields = [column[0] for column in compiler.select[: compiler.col_count]]
    converters = tuple(
        (position, tuple(convert_all), expression)
        for position, (convert_all, expression) in compiler.get_converters(fields).items()
    )
    if len(fields) != len(names):
        return None
    return _Compiled(sql=sql, slots=tuple(slots), names=names, converters=converters)


def _stand_ins(values: Sequence[Any], variant: int) -> list[Any] | None:
    """Values of the same types as ``values``, each different from the others and from those
    of the other variant; None when a value's type has no stand-in (a bool: it has too few
    values to tell apart, and belongs in the key)."""
    stand_ins: list[Any] = []
    for index, value in enumerate(values):
        number = variant * 1_000 + index
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            stand_ins.append(_INT_BASE + number)
        elif isinstance(value, str):
            stand_ins.append(f"standin{number}x")
        elif isinstance(value, datetime) and value.tzinfo is not None:
            stand_ins.append(_TIME_BASE + timedelta(seconds=number))
        else:
            return None
    return stand_ins


def _slot(
    param: Any, other: Any, stand_ins: Sequence[Sequence[Any]]
) -> tuple[int | None, Any] | bool:
    """Where the parameter of the first compilation (``param``) and of the second (``other``)
    comes from: a value (its index, and the ORM's adaptation of it, None when it is passed as
    it is), a constant (None, the constant), or False when neither explains it."""
    first, second = stand_ins
    for index, (one, two) in enumerate(zip(first, second, strict=True)):
        for adapt in _adaptations(one):
            if _same(param, one if adapt is None else adapt(one)) and _same(
                other, two if adapt is None else adapt(two)
            ):
                return index, adapt
    if _same(param, other) and not any(_same(param, value) for value in first):
        return None, param
    return False


def _adaptations(value: Any) -> tuple[Callable[[Any], Any] | None, ...]:
    # A time goes to PostgreSQL as it is, to SQLite as text (the backend's own adaptation).
    if isinstance(value, datetime):
        return (None, connection.ops.adapt_datetimefield_value)
    return (None,)


def _same(one: Any, two: Any) -> bool:
    return type(one) is type(two) and one == two

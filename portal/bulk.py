"""Update many rows with different values in one statement per few thousand rows.

Django's ``bulk_update`` writes ``CASE WHEN id = ... THEN ...`` per column, and a VALUES list
with one placeholder per value makes the driver parse a statement with tens of thousands of
placeholders; both are slow for the thousands of pending jobs one pass explains. Here the
rows travel as ONE JSON parameter that the database unpacks itself:

- PostgreSQL: ``UPDATE t SET a = v.a FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, a text)
  WHERE t.id = v.id``
- SQLite: ``UPDATE t SET a = json_extract(v.value, '$[1]') FROM json_each(%s) AS v
  WHERE t.id = json_extract(v.value, '$[0]')``

An optional guard on the row's current state means an update never overwrites a job that
moved on since the snapshot; ``match`` columns guard each row by values of its own (the
attempt a report is about), and ``updated_pks`` says which rows the guards let through.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import orjson
from django.db import connection, models

_ROWS_PER_STATEMENT = 5_000


def update_rows(
    model: type[models.Model],
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    where_state: str | None = None,
    only_changed: bool = False,
) -> int:
    """``rows`` are ``(pk, value of columns[0], value of columns[1], ...)``. Returns rows updated.

    ``where_state`` only touches rows whose ``state`` column still has that value;
    ``only_changed`` skips rows whose columns already hold these values (and does not count
    them), so a pass that explains the same queue again writes nothing.
    """
    count, _ = _update(
        model, columns, rows, where_state=where_state, only_changed=only_changed, match=()
    )
    return count


def updated_pks(
    model: type[models.Model],
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    where_state: str,
    match: Sequence[str],
) -> list[int]:
    """``update_rows`` guarded per row as well: ``rows`` are ``(pk, values of columns...,
    values of match...)``, and a row changes only while its ``match`` columns hold its values
    (and its state is ``where_state``). Returns the pks of the rows that changed."""
    _, pks = _update(model, columns, rows, where_state=where_state, only_changed=False, match=match)
    return pks


def _update(
    model: type[models.Model],
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    where_state: str | None,
    only_changed: bool,
    match: Sequence[str],
) -> tuple[int, list[int]]:
    if not rows:
        return 0, []
    fields = [model._meta.get_field(name) for name in columns]
    matched = [model._meta.get_field(name) for name in match]
    pk_column = model._meta.pk.column  # type: ignore[union-attr]
    key = ("update", connection.vendor, model, tuple(columns), tuple(match))
    key += (where_state is not None, only_changed)
    sql = _statements.get(key)
    if sql is None:
        build = _postgres_sql if connection.vendor == "postgresql" else _sqlite_sql
        sql = build(
            model, fields, guarded=where_state is not None, only_changed=only_changed, match=matched
        )
        _statements[key] = sql
    returning = bool(matched)
    updated = 0
    pks: list[int] = []
    encode = _row_encoder(pk_column, fields, matched)
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[start : start + _ROWS_PER_STATEMENT]
            payload = encode(chunk)
            params: list[Any] = [payload] if where_state is None else [payload, where_state]
            cursor.execute(sql, params)
            if returning:
                changed = [int(row[0]) for row in cursor.fetchall()]
                pks += changed
                updated += len(changed)
            else:
                updated += _rows_changed(cursor)
    return updated, pks


# Fields whose values ``_sqlite_value`` turns into what SQLite stores (JSON text, time text).
_CONVERTED_ON_SQLITE = (models.JSONField, models.DateTimeField, models.DateField, models.TimeField)


def insert_rows(
    model: type[models.Model],
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    on_conflict: tuple[Sequence[str], Sequence[str], Sequence[str]] | None = None,
) -> None:
    """``INSERT`` one row per tuple of ``columns`` values (a pk not among them is assigned
    by the database).

    A constraint violation raises ``IntegrityError`` as ``bulk_create`` would, for the
    caller's savepoint to roll back. PostgreSQL unpacks the rows from one JSON parameter;
    SQLite runs one short prepared statement per row (``executemany``), several times
    faster there than unpacking JSON with a ``json_extract`` per value.

    ``on_conflict=(unique fields, replaced fields, counted fields)`` makes it an upsert: a row
    whose unique fields match an existing row updates that row instead: its replaced fields
    take the new row's values, its counted fields go up by one, the others stay.
    """
    if not rows:
        return
    fields = [model._meta.get_field(name) for name in columns]
    key = ("insert", connection.vendor, model, tuple(columns), _conflict_key(on_conflict))
    sql = _statements.get(key)
    if sql is None:
        sql = _insert_sql(model, fields, on_conflict)
        _statements[key] = sql
    if connection.vendor != "postgresql":
        # Numbers, text, booleans and NULL go as they are; JSON and times as SQLite stores them.
        params: Sequence[Sequence[Any]] = rows
        if any(isinstance(f, _CONVERTED_ON_SQLITE) for f in fields):
            params = [
                [_sqlite_value(f, v) for f, v in zip(fields, row, strict=True)] for row in rows
            ]
        with connection.cursor() as cursor:
            cursor.executemany(sql, params)
        return
    names = [f.column for f in fields]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[start : start + _ROWS_PER_STATEMENT]
            cursor.execute(sql, [_pg_payload(names, chunk)])


# The SQL of each shape of statement (model, columns, guards), built once per process:
# quoting names and asking each field for its database type on every call was a fifth of the
# CPU of a report batch's two statements (its guarded UPDATE and its events' INSERT: 0.68 ms,
# 0.55 ms with the SQL kept; bench.admissions_cpu's world).
_statements: dict[tuple[Any, ...], str] = {}


def _conflict_key(
    on_conflict: tuple[Sequence[str], Sequence[str], Sequence[str]] | None,
) -> tuple[tuple[str, ...], ...] | None:
    return None if on_conflict is None else tuple(tuple(names) for names in on_conflict)


def _insert_sql(
    model: type[models.Model],
    fields: list[Any],
    on_conflict: tuple[Sequence[str], Sequence[str], Sequence[str]] | None,
) -> str:
    suffix = "" if on_conflict is None else _upsert_sql(model, *on_conflict)
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    names = [quote(f.column) for f in fields]
    if connection.vendor != "postgresql":
        placeholders = ", ".join(["%s"] * len(fields))
        return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({placeholders}){suffix}"
    types = ", ".join(f"{n} {f.db_type(connection)}" for n, f in zip(names, fields, strict=True))
    source = f"SELECT {', '.join(names)} FROM jsonb_to_recordset(%s::jsonb) AS v({types})"
    return f"INSERT INTO {table} ({', '.join(names)}) {source}{suffix}"


def _upsert_sql(
    model: type[models.Model],
    unique: Sequence[str],
    replaced: Sequence[str],
    counted: Sequence[str],
) -> str:
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    column = {
        name: quote(model._meta.get_field(name).column) for name in (*unique, *replaced, *counted)
    }  # type: ignore[union-attr]
    updates = [f"{column[name]} = excluded.{column[name]}" for name in replaced]
    updates += [f"{column[name]} = {table}.{column[name]} + 1" for name in counted]
    keys = ", ".join(column[name] for name in unique)
    return f" ON CONFLICT ({keys}) DO UPDATE SET {', '.join(updates)}"


def _pg_payload(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> str:
    """The JSON parameter ``jsonb_to_recordset`` unpacks: one object per row, keyed by column
    name. orjson writes times as ISO 8601 text (as ``isoformat``, which PostgreSQL reads), JSON
    values as they are, and a pass's ten thousand rows about ten times faster than the
    ``json`` module with a conversion per value."""
    return orjson.dumps([dict(zip(names, row, strict=True)) for row in rows]).decode()


def _postgres_sql(
    model: type[models.Model],
    fields: list[Any],
    *,
    guarded: bool,
    only_changed: bool,
    match: list[Any],
) -> str:
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk = quote(model._meta.pk.column)  # type: ignore[union-attr]
    names = [quote(f.column) for f in fields]
    # A column both set and matched is read from the row twice: its match value is aliased.
    matched = [(quote(f.column), quote(f"match_{f.column}"), f) for f in match]
    types = [f"{name} {f.db_type(connection)}" for name, f in zip(names, fields, strict=True)]
    types += [f"{alias} {f.db_type(connection)}" for _, alias, f in matched]
    assignments = ", ".join(f"{name} = v.{name}" for name in names)
    guard = f" AND {table}.{quote('state')} = %s" if guarded else ""
    guard += "".join(f" AND {table}.{name} = v.{alias}" for name, alias, _ in matched)
    if only_changed:
        changed = " OR ".join(f"{table}.{name} IS DISTINCT FROM v.{name}" for name in names)
        guard += f" AND ({changed})"
    returning = f" RETURNING {table}.{pk}" if match else ""
    return (
        f"UPDATE {table} SET {assignments} "
        f"FROM jsonb_to_recordset(%s::jsonb) AS v({pk} bigint, {', '.join(types)}) "
        f"WHERE {table}.{pk} = v.{pk}{guard}{returning}"
    )


def _sqlite_sql(
    model: type[models.Model],
    fields: list[Any],
    *,
    guarded: bool,
    only_changed: bool,
    match: list[Any],
) -> str:
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk = quote(model._meta.pk.column)  # type: ignore[union-attr]
    values = [
        (quote(f.column), f"json_extract(v.value, '$[{i}]')") for i, f in enumerate(fields, 1)
    ]
    assignments = ", ".join(f"{name} = {value}" for name, value in values)
    # The unary + keeps SQLite from driving the join from the state index, which would scan
    # the whole JSON list once per matching job (minutes for a queue of thousands).
    guard = f" AND +{table}.{quote('state')} = %s" if guarded else ""
    guard += "".join(
        f" AND {table}.{quote(f.column)} = json_extract(v.value, '$[{i}]')"
        for i, f in enumerate(match, len(fields) + 1)
    )
    if only_changed:
        changed = " OR ".join(f"{table}.{name} IS NOT {value}" for name, value in values)
        guard += f" AND ({changed})"
    returning = f" RETURNING {table}.{pk}" if match else ""
    return (
        f"UPDATE {table} SET {assignments} FROM json_each(%s) AS v "
        f"WHERE {table}.{pk} = json_extract(v.value, '$[0]'){guard}{returning}"
    )


def _row_encoder(
    pk_column: str, fields: list[Any], matched: list[Any]
) -> Callable[[Sequence[tuple[Any, ...]]], str]:
    """The JSON parameter of ``_update`` for some of its rows (a pass sends thousands)."""
    if connection.vendor == "postgresql":
        # jsonb_to_recordset reads objects keyed by column name (match columns as match_*).
        names = [pk_column, *(f.column for f in fields)]
        names += [f"match_{f.column}" for f in matched]
        return lambda rows: _pg_payload(names, rows)
    every = [*fields, *matched]

    def sqlite_rows(rows: Sequence[tuple[Any, ...]]) -> str:
        return json.dumps(
            [
                [row[0], *(_sqlite_value(f, v) for f, v in zip(every, row[1:], strict=True))]
                for row in rows
            ]
        )

    return sqlite_rows


def _sqlite_value(field: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(field, models.JSONField):
        return json.dumps(value)  # stored as JSON text; a bare string would lose its quotes
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def _rows_changed(cursor: Any) -> int:
    if connection.vendor == "sqlite":
        # Python's sqlite3 does not always know how many rows an UPDATE ... FROM changed.
        cursor.execute("SELECT changes()")
        return int(cursor.fetchone()[0])
    return int(cursor.rowcount)

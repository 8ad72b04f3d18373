"""Fixed-window counters in the database, shared by every web process.

One row per (scope, key): the start of its current window and the hits in it. A hit is one
statement (INSERT ... ON CONFLICT DO UPDATE ... RETURNING, on PostgreSQL and SQLite alike):
it counts in the current window, or starts a new one when the window has expired, so two
processes counting the same key at once never lose a hit and a request pays one query, for
all the counters it counts in (``counter_hits``: the API's per-user and per-token limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils.dateparse import parse_datetime

from portal.compiled_queries import prepared_cursor
from portal.tenants.models import AccessCounter

# Rows whose window ended this long ago (and that hold no lock) are deleted by
# `counter_forget_stale`, so addresses and usernames seen once do not pile up.
FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class Window:
    count: int
    started_at: datetime
    locked_until: datetime | None


def counter_hit(*, scope: str, key: str, now: datetime, window_s: float) -> Window:
    """Count one hit for `key` in `scope` and return its window after the hit."""
    return counter_hits([Hit(scope=scope, key=key, window_s=window_s)], now=now)[0]


@dataclass(frozen=True)
class Hit:
    scope: str
    key: str
    window_s: float


def counter_hits(hits: Sequence[Hit], *, now: datetime) -> list[Window]:
    """Count one hit for each of ``hits`` (each of its own scope) in one statement, and
    return their windows after the hits, in the order of ``hits``."""
    scopes = [hit.scope for hit in hits]
    if len(set(scopes)) != len(scopes):
        raise ValueError(f"counter_hits: one hit per scope; got {scopes}")
    start = connection.ops.adapt_datetimefield_value(now)
    values = ", ".join("(%s, %s, %s, 1, NULL)" for _ in hits)
    sql = counter_upsert_sql(f"VALUES {values}", len(hits))
    params: list[Any] = [value for hit in hits for value in (hit.scope, hit.key, start)]
    # One SQL text per number of hits: a prepared statement on PostgreSQL.
    with prepared_cursor() as cursor:
        scoped = [(hit.scope, hit.window_s) for hit in hits]
        cursor.execute(sql, [*params, *counter_upsert_params(scoped, now=now)])
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    return [window_of(*rows[hit.scope]) for hit in hits]


def counter_upsert_sql(source: str, hits: int) -> str:
    """The statement that counts a hit for each row of ``source`` (SQL giving rows of scope,
    key, now, 1, NULL; ``hits`` rows at most, each of its own scope): it counts in the
    row's current window or starts a new one when that has expired, and returns each row's
    scope, count, window start and lock. Its parameters: those of ``source``, then
    ``counter_upsert_params``. ``counter_hits`` runs it over a VALUES list; the API's token
    statement (``portal.tenants.tokens.token_use``) over its own token's ids."""
    quote = connection.ops.quote_name
    table = quote(AccessCounter._meta.db_table)
    scope_, key_, started_, count_, locked_ = (
        quote(name) for name in ("scope", "key", "window_started_at", "count", "locked_until")
    )
    # A row's window is current when it started after its own scope's expiry time.
    current = " OR ".join(
        f"({table}.{scope_} = %s AND {table}.{started_} > %s)" for _ in range(hits)
    )
    return f"""
        INSERT INTO {table} ({scope_}, {key_}, {started_}, {count_}, {locked_})
        {source}
        ON CONFLICT ({scope_}, {key_}) DO UPDATE SET
            {count_} = CASE WHEN {current} THEN {table}.{count_} + 1 ELSE 1 END,
            {started_} = CASE WHEN {current}
                              THEN {table}.{started_} ELSE excluded.{started_} END
        RETURNING {scope_}, {count_}, {started_}, {locked_}
    """  # noqa: S608 - the table name is ours; every value is a parameter


def counter_upsert_params(scoped: Sequence[tuple[str, float]], *, now: datetime) -> list[Any]:
    """The parameters ``counter_upsert_sql`` adds after its source's, from each hit's scope
    and window in seconds: the scope and the time before which its window has expired,
    twice."""
    expiries: list[Any] = []
    for scope, window_s in scoped:
        expired = now - timedelta(seconds=window_s)
        expiries += [scope, connection.ops.adapt_datetimefield_value(expired)]
    return [*expiries, *expiries]


def window_of(
    count: int, started_at: datetime | str, locked_until: datetime | str | None
) -> Window:
    """A window from the columns ``counter_upsert_sql`` returns (after the scope)."""
    return Window(int(count), _as_datetime(started_at), _as_datetime_or_none(locked_until))


def counter_get(*, scope: str, key: str) -> Window | None:
    row = (
        AccessCounter.objects.filter(scope=scope, key=key)
        .values_list("count", "window_started_at", "locked_until")
        .first()
    )
    return Window(*row) if row else None


def counter_lock(*, scope: str, key: str, until: datetime) -> None:
    AccessCounter.objects.filter(scope=scope, key=key).update(locked_until=until)


def counter_clear(*, scope: str, key: str) -> None:
    AccessCounter.objects.filter(scope=scope, key=key).delete()


def counter_forget_stale(*, scopes: tuple[str, ...], now: datetime) -> None:
    AccessCounter.objects.filter(
        scope__in=scopes, window_started_at__lt=now - FORGET_AFTER
    ).exclude(locked_until__gt=now).delete()


def _as_datetime(value: datetime | str) -> datetime:
    # SQLite hands RETURNING values back as text, in the UTC form Django wrote.
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _as_datetime_or_none(value: datetime | str | None) -> datetime | None:
    return None if value is None else _as_datetime(value)

"""API tokens: issued once in plaintext, stored as a SHA-256 digest, looked up by digest.

Each token has a name, scopes (a subset of TOKEN_SCOPES), an optional expiry and the time it
was last used. Its user creates, lists and revokes it (the Tokens page, /api/v1/tokens/);
revoking deletes it. The API checks expiry and scopes on every request (portal/api/auth.py).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Field, Q, QuerySet
from django.db.models.expressions import Col
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.compiled_queries import prepared_cursor
from portal.tenants.counters import Window, counter_upsert_params, counter_upsert_sql, window_of
from portal.tenants.models import TOKEN_NAME_MAX_CHARS, TOKEN_SCOPES, ApiToken

# 20 random bytes as 40 hex characters: the shape DRF's tokens had, so old keys still fit.
KEY_BYTES = 20
PREFIX_CHARS = 8
# A user's tokens at most: enough for every notebook and machine, not a table a script fills.
TOKENS_PER_USER_MAX = 100
# last_used_at is written when it is older than this, so a busy token costs one UPDATE a
# minute instead of one per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)

ALLOWED_SCOPES = ", ".join(TOKEN_SCOPES)
ALLOWED_NAME = f"1 to {TOKEN_NAME_MAX_CHARS} characters, no control characters"
ALLOWED_EXPIRY = (
    "a date and time after now in ISO 8601 (2027-01-31T18:00:00Z; UTC when no offset is "
    "given), or null for no expiry"
)


class TokenError(ValueError):
    """A token request with bad values; ``errors`` maps each field to what it accepts."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


def token_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def token_create(
    *,
    user: Any,
    name: Any,
    scopes: Any,
    expires_at: Any = None,
    now: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for ``user`` and return it with its key: the only time the key exists
    in clear. The values are checked first (``TokenError`` names each bad one; nothing is
    stored then): ``name`` text, ``scopes`` a non-empty list of TOKEN_SCOPES, ``expires_at``
    None, an aware datetime or ISO 8601 text, after ``now``."""
    now = now or timezone.now()
    errors: dict[str, str] = {}
    clean_name = _name(name, errors)
    clean_scopes = _scopes(scopes, errors)
    clean_expiry = _expiry(expires_at, now, errors)
    if not errors and ApiToken.objects.filter(user=user).count() >= TOKENS_PER_USER_MAX:
        errors["detail"] = (
            f"you hold {TOKENS_PER_USER_MAX} tokens, the most a user may; revoke one first"
        )
    if errors:
        raise TokenError(errors)
    key = secrets.token_hex(KEY_BYTES)
    token = ApiToken.objects.create(
        user=user,
        digest=token_digest(key),
        prefix=key[:PREFIX_CHARS],
        name=clean_name,
        scopes=clean_scopes,
        expires_at=clean_expiry,
    )
    return token, key


@transaction.atomic
def token_issue(
    *,
    user: Any,
    revoke_others: bool = False,
    name: str = "issue_token",
    scopes: Sequence[str] = TOKEN_SCOPES,
    expires_at: datetime | None = None,
) -> str:
    """Create a token for `user` and return its key (every scope and no expiry unless told).

    A user may hold several tokens (one per notebook or machine); `revoke_others` deletes
    the ones they had, for a rotation.
    """
    if revoke_others:
        ApiToken.objects.filter(user=user).delete()
    _, key = token_create(user=user, name=name, scopes=list(scopes), expires_at=expires_at)
    return key


def token_revoke(*, user: Any, token_id: int) -> None:
    """Delete ``user``'s token ``token_id``; ``ApiToken.DoesNotExist`` when they hold no such
    token (another user's token looks exactly like a missing one)."""
    deleted, _ = ApiToken.objects.filter(user=user, pk=token_id).delete()
    if not deleted:
        raise ApiToken.DoesNotExist(f"no token {token_id} among your tokens")


def token_list_for_user(*, user: Any) -> QuerySet[ApiToken]:
    """``user``'s tokens, newest first."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")


def token_get_for_user(*, user: Any, token_id: int) -> ApiToken:
    return ApiToken.objects.get(user=user, pk=token_id)


def token_find(*, key: str) -> ApiToken | None:
    """The token whose key this is (its user joined), or None.

    Every API request asks this, so it is one indexed query whose SQL is written once per
    process (``_TokenLookup``): compiling the same join through the ORM again on every
    request was most of what the lookup cost (0.9 ms of CPU against 0.1 ms). On PostgreSQL it
    is a prepared statement too (``prepared_cursor``), planned once per connection.
    """
    lookup = _token_lookup(connection.vendor)
    with prepared_cursor() as cursor:
        cursor.execute(lookup.sql, [token_digest(key)])
        row = cursor.fetchone()
    return None if row is None else lookup.token(row)


@dataclass(frozen=True)
class _TokenLookup:
    """``ApiToken.objects.select_related("user").get(digest=...)``, its SQL and its column
    conversions (the database backend's and the fields' own, as the ORM applies them) made
    once."""

    sql: str
    select: str  # the token's and its user's columns
    source: str  # FROM the tokens JOIN their users, WHERE the digest is the parameter
    token_fields: tuple[Field[Any, Any], ...]
    user_fields: tuple[Field[Any, Any], ...]
    converters: tuple[tuple[Col, tuple[Any, ...]], ...]

    def token(self, row: Sequence[Any]) -> ApiToken:
        values = []
        for value, (column, converters) in zip(row, self.converters, strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            values.append(value)
        split = len(self.token_fields)
        token = ApiToken.from_db(
            connection.alias, [field.attname for field in self.token_fields], values[:split]
        )
        token.user = get_user_model().from_db(
            connection.alias, [field.attname for field in self.user_fields], values[split:]
        )
        return token


@functools.cache
def _token_lookup(vendor: str) -> _TokenLookup:
    # `vendor` keys the cache: the conversions depend on the database backend.
    user_model = get_user_model()
    tokens, users = ApiToken._meta, user_model._meta
    token_fields, user_fields = tuple(tokens.concrete_fields), tuple(users.concrete_fields)
    quote = connection.ops.quote_name
    columns = [
        *(f"{quote(tokens.db_table)}.{quote(field.column)}" for field in token_fields),
        *(f"{quote(users.db_table)}.{quote(field.column)}" for field in user_fields),
    ]
    user_id = tokens.get_field("user").column
    source = (
        f"FROM {quote(tokens.db_table)} "
        f"INNER JOIN {quote(users.db_table)} "
        f"ON {quote(tokens.db_table)}.{quote(user_id)} = {quote(users.db_table)}.{quote(users.pk.column)} "
        f"WHERE {quote(tokens.db_table)}.{quote(tokens.get_field('digest').column)} = %s"
    )
    select = ", ".join(columns)
    converters = []
    for model, fields in ((ApiToken, token_fields), (user_model, user_fields)):
        for field in fields:
            column = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            converters.append((column, tuple(found)))
    return _TokenLookup(
        sql=f"SELECT {select} {source}",  # noqa: S608 - names are ours
        select=select,
        source=source,
        token_fields=token_fields,
        user_fields=user_fields,
        converters=tuple(converters),
    )


@dataclass(frozen=True)
class TokenHit:
    """A rate-limit counter a request counts in (``portal.tenants.counters``), keyed by the
    token's id or by its user's."""

    scope: str
    window_s: float
    per_token: bool  # keyed by the token's id; False: by its user's


@dataclass(frozen=True)
class TokenUse:
    token: ApiToken  # its user joined
    windows: list[Window]  # after this request's hits, one per hit; empty when none counted


def token_use(
    *, key: str, now: datetime, hits: Sequence[TokenHit], scope: str | None
) -> TokenUse | None:
    """``token_find``, ``token_touch`` and ``counter_hits`` in ONE statement (PostgreSQL only;
    a prepared one): the token whose key this is, its last use written when it is usable
    (as ``token_touch`` writes it), and one hit counted in each of ``hits`` when it is usable
    and holds ``scope`` (None: any token). None for an unknown key.

    A data-modifying ``WITH``: the lookup, the conditional UPDATE of last_used_at and the
    counters' upsert read one snapshot, so the token's row comes back as it was before the
    UPDATE (its last use is set here when the statement wrote it)."""
    sql, width = _token_use_sql(tuple(hit.per_token for hit in hits))
    stamp = connection.ops.adapt_datetimefield_value(now)
    stale = connection.ops.adapt_datetimefield_value(now - LAST_USED_RESOLUTION)
    params: list[Any] = [stamp, token_digest(key), stamp, stale]  # found; touched
    if hits:
        params += [stamp, *(hit.scope for hit in hits), scope, scope]  # the counters' rows
        params += counter_upsert_params([(hit.scope, hit.window_s) for hit in hits], now=now)
        params += [hit.scope for hit in hits for _ in range(3)]  # which counter is which
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    token = _token_lookup(connection.vendor).token(row[:width])
    # After the token's and user's columns: the four found_ columns, then whether
    # last_used_at was written, then the counters.
    touched, counted = row[width + 4], row[width + 5 :]
    if touched:
        token.last_used_at = now
    windows = [
        window_of(*counted[index : index + 3])
        for index in range(0, len(counted), 3)
        if counted[index] is not None
    ]
    return TokenUse(token=token, windows=windows)


@functools.cache
def _token_use_sql(per_token: tuple[bool, ...]) -> tuple[str, int]:
    """``token_use``'s statement, for hits keyed by the token's id (True) or its user's, and
    how many token and user columns its row starts with (``_TokenLookup``); then come
    the four found_ columns (whether the token is usable first), whether last_used_at was
    written, and each hit's count, window start and lock (NULL when none was counted)."""
    lookup = _token_lookup(connection.vendor)
    quote = connection.ops.quote_name
    tokens, users = ApiToken._meta, get_user_model()._meta
    token_table, user_table = quote(tokens.db_table), quote(users.db_table)
    token_id = quote(tokens.pk.column)  # type: ignore[union-attr]
    token_user = quote(tokens.get_field("user").column)
    expires, last_used, scopes = (
        quote(tokens.get_field(name).column) for name in ("expires_at", "last_used_at", "scopes")
    )
    # The user's is_active and ApiToken.expired, as PortalTokenAuthentication checks them.
    usable = (
        f"{user_table}.{quote(users.get_field('is_active').column)} "
        f"AND ({token_table}.{expires} IS NULL OR {token_table}.{expires} > %s)"
    )
    width = len(lookup.token_fields) + len(lookup.user_fields)
    sql = (
        f"WITH found AS (SELECT {lookup.select}, {usable} AS found_usable, "  # noqa: S608
        f"{token_table}.{token_id} AS found_token_id, {token_table}.{token_user} AS "
        f"found_user_id, {token_table}.{scopes} AS found_scopes {lookup.source}), "
        # token_touch's conditional UPDATE: at most one write a minute per token.
        f"touched AS (UPDATE {token_table} SET {last_used} = %s "
        f"WHERE {token_id} = (SELECT found_token_id FROM found WHERE found_usable) "
        f"AND ({last_used} IS NULL OR {last_used} <= %s) RETURNING {token_id})"
    )
    returned = ["found.*", "EXISTS (SELECT 1 FROM touched)"]
    if per_token:
        keys = ", ".join(
            f"(%s, found.{'found_token_id' if by_token else 'found_user_id'}::text)"
            for by_token in per_token
        )
        # ApiThrottle counts only requests that passed authentication and TokenScopes.
        rows = (
            f"SELECT v.scope, v.key, %s::timestamptz, 1, NULL FROM found "
            f"CROSS JOIN LATERAL (VALUES {keys}) AS v(scope, key) WHERE found.found_usable "
            "AND (%s::text IS NULL OR found.found_scopes @> jsonb_build_array(%s::text))"
        )
        sql += f", counted AS ({counter_upsert_sql(rows, len(per_token))})"
        returned += [
            f"(SELECT {column} FROM counted WHERE {quote('scope')} = %s)"
            for _ in per_token
            for column in (quote("count"), quote("window_started_at"), quote("locked_until"))
        ]
    return f"{sql} SELECT {', '.join(returned)} FROM found", width


def token_touch(*, token: ApiToken, now: datetime) -> None:
    """Record that ``token`` was used ``now``, unless that was recorded less than a minute
    ago. The UPDATE is conditional too, so processes racing on one token write it once."""
    last = token.last_used_at
    if last is not None and now - last < LAST_USED_RESOLUTION:
        return
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
    ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


# --- checks of a token request ---------------------------------------------------------


def token_problems(*, name: Any, scopes: Any, expires_at: Any, now: datetime) -> dict[str, str]:
    """What ``token_create`` would refuse in these values (field -> message), without storing
    anything: for a form that has a problem of its own to show beside them."""
    errors: dict[str, str] = {}
    _name(name, errors)
    _scopes(scopes, errors)
    _expiry(expires_at, now, errors)
    return errors


def _name(value: Any, errors: dict[str, str]) -> str:
    if not isinstance(value, str):
        errors["name"] = f"must be text; allowed: {ALLOWED_NAME}"
        return ""
    name = value.strip()
    if not name:
        errors["name"] = f"required; allowed: {ALLOWED_NAME}"
    elif len(name) > TOKEN_NAME_MAX_CHARS:
        errors["name"] = f"{len(name)} characters is too long; allowed: {ALLOWED_NAME}"
    elif any(unicodedata.category(char) in ("Cc", "Cs") for char in name):
        errors["name"] = f"must not contain control characters; allowed: {ALLOWED_NAME}"
    return name


def _scopes(value: Any, errors: dict[str, str]) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        errors["scopes"] = f'must be a list of scopes such as ["read"]; allowed: {ALLOWED_SCOPES}'
        return []
    unknown = [scope for scope in value if scope not in TOKEN_SCOPES]
    if unknown:
        shown = ", ".join(repr(scope[:40]) for scope in unknown[:5])
        errors["scopes"] = f"unknown scope {shown}; allowed: {ALLOWED_SCOPES}"
        return []
    if not value:
        errors["scopes"] = f"at least one scope is required; allowed: {ALLOWED_SCOPES}"
    # Stored in one order, each once, so lists and comparisons read the same everywhere.
    return [scope for scope in TOKEN_SCOPES if scope in value]


def _expiry(value: Any, now: datetime, errors: dict[str, str]) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        when: datetime | None = value
    elif isinstance(value, str):
        try:
            when = parse_datetime(value.strip())
        except ValueError:  # well formed, but no such day or hour (2027-02-30)
            when = None
    else:
        when = None
    if when is None:
        shown = repr(value[:40]) if isinstance(value, str) else f"a {type(value).__name__}"
        errors["expires_at"] = f"{shown} is not a date and time; allowed: {ALLOWED_EXPIRY}"
        return None
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    if when <= now:
        at_now = now.astimezone(UTC).replace(microsecond=0).isoformat()
        errors["expires_at"] = (
            f"{when.isoformat()} is not in the future (now: {at_now}); allowed: {ALLOWED_EXPIRY}"
        )
        return None
    return when

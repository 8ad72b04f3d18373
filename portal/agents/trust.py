"""The broker carries messages, not authority: verify what agents send, sign what we send.

`open_report(raw)` checks an agent's envelope before anything is applied: the node has a key,
the HMAC matches it, the timestamp is within PORTAL_MESSAGE_MAX_SKEW_S, the message is one an
agent may send and names the node that signed it. The nonce is claimed by `claim_nonce`
inside the transaction that applies the message, so a message whose handling failed (the
database went away) can be delivered again, while a replay of one that was applied is
refused. Every refusal leaves a `RefusedMessage` row and a log line.

`seal_for(node, message)` signs a launch, stop, query or ack with the node's key.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from portal.agents.keys import key_problem, node_keys
from portal.agents.models import RefusedMessage, SeenNonce
from portal.compiled_queries import prepared_cursor
from workers.protocol import TO_PORTAL_TYPES, Message
from workers.signing import (
    Envelope,
    SignatureError,
    check_fresh,
    message_of,
    open_envelope,
    seal,
    verify_signature,
)

log = logging.getLogger("portal.agents")


@dataclass(frozen=True, slots=True)
class Received:
    envelope: Envelope
    message: Message
    key: bytes  # the node's key, to sign the acknowledgement with


def open_report(raw: Any, *, now: datetime) -> Received:
    """Verify an agent's envelope and return its message; raises SignatureError."""
    envelope = open_envelope(raw)
    key = node_keys([envelope.node]).get(envelope.node)
    if key is None:
        raise SignatureError(
            "unknown_node", key_problem(name=envelope.node) or "no key", node=envelope.node
        )
    verify_signature(envelope, key)
    check_fresh(envelope, now=now.timestamp(), max_skew_s=settings.MESSAGE_MAX_SKEW_S)
    message = message_of(envelope, allowed_types=TO_PORTAL_TYPES)
    return Received(envelope=envelope, message=message, key=key)


def claim_nonce(envelope: Envelope, *, now: datetime) -> None:
    """Record the envelope's nonce in the current transaction; SignatureError('replay') when
    it was applied before.

    One statement, ``INSERT ... ON CONFLICT DO NOTHING RETURNING``: a nonce already there
    inserts nothing and returns no row, with no savepoint to set and release around it (an
    IntegrityError would need one, and every message from every agent passes here). Its SQL
    is fixed, so on PostgreSQL it is a prepared statement of the connection (parsed and
    planned once)."""
    with prepared_cursor() as cursor:
        cursor.execute(
            _claim_nonce_sql(connection.vendor),
            [envelope.node, envelope.nonce, connection.ops.adapt_datetimefield_value(now)],
        )
        claimed = cursor.fetchone() is not None
    if not claimed:
        raise SignatureError(
            "replay", f"nonce {envelope.nonce} was applied already", node=envelope.node
        )


@functools.cache
def _claim_nonce_sql(vendor: str) -> str:
    """``claim_nonce``'s SQL, built once per backend (its quoting is the backend's)."""
    quote = connection.ops.quote_name
    meta = SeenNonce._meta
    table = quote(meta.db_table)
    node, nonce, seen_at, pk = (
        quote(meta.get_field(name).column) for name in ("node", "nonce", "seen_at", "id")
    )
    return (
        f"INSERT INTO {table} ({node}, {nonce}, {seen_at}) VALUES (%s, %s, %s) "
        f"ON CONFLICT ({node}, {nonce}) DO NOTHING RETURNING {pk}"
    )


def forget_old_nonces(*, now: datetime) -> int:
    """Nonces older than twice the allowed skew can go: such messages are refused as stale."""
    cutoff = now - timedelta(seconds=2 * settings.MESSAGE_MAX_SKEW_S)
    deleted, _ = SeenNonce.objects.filter(seen_at__lt=cutoff).delete()
    return deleted


def forget_old_refusals(*, now: datetime) -> int:
    """Refusal records are kept PORTAL_REFUSED_KEEP_DAYS, then go."""
    cutoff = now - timedelta(days=settings.REFUSED_KEEP_DAYS)
    deleted, _ = RefusedMessage.objects.filter(at__lt=cutoff).delete()
    return deleted


def record_refusal(error: SignatureError, raw: Any, *, now: datetime | None = None) -> None:
    """Leave a trace of a refused message: a row an operator sees in the admin, and a log
    line. Never raises: a refusal must not turn into a retry loop."""
    kind = ""
    if isinstance(raw, dict) and isinstance(raw.get("signed"), str):
        # Only for the record: the text was not trusted.
        kind = _claimed_type(raw["signed"])
    elif isinstance(raw, dict):
        kind = str(raw.get("type", ""))[:32]
    log.warning("refused a %s message from %s: %s", kind or "malformed", error.node or "?", error)
    try:
        RefusedMessage.objects.create(
            at=now or timezone.now(),
            node=error.node[:128],
            kind=kind[:32],
            reason=error.reason,
            detail=error.detail[:2000],
        )
    except DatabaseError:
        log.exception("could not record the refusal")


def _claimed_type(text: str) -> str:
    try:
        body = json.loads(text)
        return str(body["msg"]["type"])[:32]
    except (ValueError, KeyError, TypeError):
        return ""


def seal_for(node: str, message: Message, *, keys: dict[str, bytes] | None = None) -> dict | None:
    """The signed envelope of `message` for `node`, or None when the node has no key (it
    cannot have an agent the portal trusts, so there is nothing to send)."""
    key = (keys if keys is not None else node_keys([node])).get(node)
    if key is None:
        log.error("not sending %s to %s: %s", message.TYPE, node, key_problem(name=node))
        return None
    return seal(message, node=node, key=key, now=timezone.now().timestamp())

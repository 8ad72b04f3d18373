"""Signed envelopes: the broker carries messages, not authority.

Every message between the portal and an agent travels as

    {"signed": "<JSON text of {node, ts, nonce, msg}>", "sig": "<hex HMAC-SHA256 of that text>"}

keyed with the node's own key. The signature covers the exact text that was sent, so no
canonical re-encoding is needed and nothing can change in between. The receiver:

1. opens the envelope (untrusted: only to learn which node's key to use),
2. verifies the HMAC with that node's key (constant-time),
3. refuses a timestamp further than the allowed skew from its own clock,
4. refuses a nonce it has seen within that window (a replay),
5. validates the message (``workers.protocol.parse``) and refuses one whose own `node` is not
   the envelope's node, or that travels in the wrong direction (an agent cannot send a
   launch; the portal does not send heartbeats).

Reports waiting in an agent's outbox are re-signed at every send, so a report resent after a
long outage carries a fresh timestamp; a message that waited in the broker for longer than
the window is refused and its sender's resend takes its place.

Node keys: the portal derives each node's key from its own secret, the node's name and a
random salt made by `manage.py node_add` (``derive_node_key``). It stores the salt and a
SHA-256 digest of the key, never the key; the key is printed once for the operator to give
to the agent (``PORTAL_AGENT_KEY``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from workers.protocol import Message, ProtocolError, parse

DEFAULT_MAX_SKEW_S = 300.0
KEY_BYTES = 32


class SignatureError(Exception):
    """A message refused for its envelope; `reason` is one of REASONS."""

    REASONS = (
        "malformed",
        "unknown_node",
        "bad_signature",
        "stale",
        "replay",
        "wrong_node",
        "wrong_direction",
        "invalid",
    )

    def __init__(self, reason: str, detail: str, *, node: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.node = node


@dataclass(frozen=True, slots=True)
class Envelope:
    """An opened envelope, NOT yet verified: use `node` only to pick the key."""

    node: str
    ts: float
    nonce: str
    body: dict[str, Any]
    text: str
    sig: str


def sign_text(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def seal(message: Message, *, node: str, key: bytes, now: float, nonce: str = "") -> dict[str, str]:
    """The envelope of `message` for (or from) `node`, signed with that node's key."""
    text = json.dumps(
        {
            "node": node,
            "ts": now,
            "nonce": nonce or secrets.token_hex(16),
            "msg": message.to_dict(),
        },
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return {"signed": text, "sig": sign_text(key, text)}


def open_envelope(raw: Any) -> Envelope:
    """Read an envelope's parts; raises SignatureError('malformed') for anything else."""
    if not isinstance(raw, dict) or set(raw) != {"signed", "sig"}:
        raise SignatureError("malformed", "expected an object with exactly 'signed' and 'sig'")
    text, sig = raw["signed"], raw["sig"]
    if not isinstance(text, str) or not isinstance(sig, str):
        raise SignatureError("malformed", "'signed' and 'sig' must be strings")
    # seal() writes ASCII only; anything else would fail the HMAC's encoding or the
    # constant-time comparison with an exception instead of a refusal.
    if not text.isascii() or not sig.isascii():
        raise SignatureError("malformed", "'signed' and 'sig' must be ASCII text")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        raise SignatureError("malformed", "'signed' is not JSON") from None
    if not isinstance(body, dict) or set(body) != {"node", "ts", "nonce", "msg"}:
        raise SignatureError("malformed", "'signed' must hold exactly node, ts, nonce and msg")
    node, ts, nonce = body["node"], body["ts"], body["nonce"]
    if not isinstance(node, str) or not node:
        raise SignatureError("malformed", "node must be a non-empty string")
    # The range also refuses NaN, which no skew comparison would ever call stale.
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts <= 1e11:
        raise SignatureError("malformed", "ts must be a number of epoch seconds", node=node)
    if not isinstance(nonce, str) or not 8 <= len(nonce) <= 128:
        raise SignatureError(
            "malformed", "nonce must be a string of 8 to 128 characters", node=node
        )
    return Envelope(node=node, ts=float(ts), nonce=nonce, body=body, text=text, sig=sig)


def verify_signature(envelope: Envelope, key: bytes) -> None:
    expected = sign_text(key, envelope.text)
    if not hmac.compare_digest(expected, envelope.sig.lower()):
        raise SignatureError(
            "bad_signature", f"signature does not match {envelope.node}'s key", node=envelope.node
        )


def check_fresh(envelope: Envelope, *, now: float, max_skew_s: float) -> None:
    if abs(now - envelope.ts) > max_skew_s:
        raise SignatureError(
            "stale",
            f"sent at {envelope.ts:.3f}, {envelope.ts - now:+.1f} s from now; "
            f"at most {max_skew_s:.0f} s allowed",
            node=envelope.node,
        )


def message_of(envelope: Envelope, *, allowed_types: Collection[str]) -> Message:
    """The validated message of a verified envelope, checked against the envelope's node."""
    raw = envelope.body["msg"]
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in allowed_types:
        raise SignatureError(
            "wrong_direction", f"a {kind!r} message is not accepted here", node=envelope.node
        )
    try:
        message = parse(raw)
    except ProtocolError as error:
        raise SignatureError("invalid", str(error), node=envelope.node) from None
    claimed = getattr(message, "node", envelope.node)
    if claimed != envelope.node:
        raise SignatureError(
            "wrong_node",
            f"the message names node {claimed!r} but is signed for {envelope.node!r}",
            node=envelope.node,
        )
    return message


class ReplayGuard:
    """Nonces seen within the freshness window (in memory: an agent's side of replay checks).

    An older message is refused as stale anyway, so a nonce need only be remembered for
    twice the allowed skew; at most `capacity` are kept.
    """

    def __init__(self, *, window_s: float = 2 * DEFAULT_MAX_SKEW_S, capacity: int = 200_000):
        self._window_s = window_s
        self._capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, nonce: str, *, now: float) -> bool:
        """Record the nonce; False when it was seen already (a replay)."""
        with self._lock:
            while self._seen:
                oldest, at = next(iter(self._seen.items()))
                if now - at <= self._window_s and len(self._seen) < self._capacity:
                    break
                del self._seen[oldest]
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


# --- node keys --------------------------------------------------------------------------------


def new_salt() -> str:
    return secrets.token_hex(16)


def derive_node_key(secret: bytes, *, node: str, salt: str) -> bytes:
    """The node's key: HMAC(portal secret, node + salt). A new salt rotates it."""
    return hmac.new(secret, f"portal-node-key\0{node}\0{salt}".encode(), hashlib.sha256).digest()


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def key_to_text(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")


def key_from_text(text: str) -> bytes:
    """Decode PORTAL_AGENT_KEY; raises ValueError naming what is wrong."""
    cleaned = text.strip()
    try:
        # validate: refuse stray characters instead of silently skipping them.
        key = base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "not a node key (expected the text `manage.py node_add` printed)"
        ) from None
    if len(key) != KEY_BYTES:
        raise ValueError(
            f"not a node key: decodes to {len(key)} bytes, expected {KEY_BYTES} "
            "(the text `manage.py node_add` printed)"
        )
    return key

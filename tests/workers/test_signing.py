"""Signed envelopes between the portal and the agents: signatures, freshness, replays, keys."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from workers.protocol import (
    TO_AGENT_TYPES,
    TO_PORTAL_TYPES,
    Device,
    Heartbeat,
    Inventory,
    Launch,
    Message,
    Query,
    Stop,
)
from workers.signing import (
    DEFAULT_MAX_SKEW_S,
    KEY_BYTES,
    Envelope,
    ReplayGuard,
    SignatureError,
    check_fresh,
    derive_node_key,
    key_digest,
    key_from_text,
    key_to_text,
    message_of,
    new_salt,
    open_envelope,
    seal,
    sign_text,
    verify_signature,
)

NODE = "gpu-host-1"
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOW = 1_700_000_000.0
STOP = Stop(node=NODE, job_id=42, attempt=1, reason="cancel", grace_s=5.0)
HEARTBEAT = Heartbeat(
    node=NODE,
    boot="b-1",
    agent_version="0.2.0",
    sent_at=NOW,
    inventory=Inventory(hostname=NODE, driver="described", gpus=()),
)


def received(
    raw: Any, *, key: bytes = KEY, now: float = NOW, allowed: frozenset[str] = TO_AGENT_TYPES
) -> Message:
    """What a receiver does with a raw envelope, in order."""
    envelope = open_envelope(raw)
    verify_signature(envelope, key)
    check_fresh(envelope, now=now, max_skew_s=DEFAULT_MAX_SKEW_S)
    return message_of(envelope, allowed_types=allowed)


def refusal(raw: Any, **kwargs: Any) -> SignatureError:
    with pytest.raises(SignatureError) as caught:
        received(raw, **kwargs)
    assert caught.value.reason in SignatureError.REASONS
    return caught.value


def resigned(body: dict[str, Any], *, key: bytes = KEY) -> dict[str, str]:
    """An envelope around `body`, correctly signed: only its content is wrong."""
    text = json.dumps(body, separators=(",", ":"))
    return {"signed": text, "sig": sign_text(key, text)}


def body_of(envelope: dict[str, str]) -> dict[str, Any]:
    return json.loads(envelope["signed"])  # type: ignore[no-any-return]


# --- round trip -----------------------------------------------------------------------------


def test_a_sealed_message_opens_verifies_and_comes_back_equal() -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW, nonce="nonce-0001")
    assert set(raw) == {"signed", "sig"}
    envelope = open_envelope(json.loads(json.dumps(raw)))  # as the broker delivers it
    assert (envelope.node, envelope.ts, envelope.nonce) == (NODE, NOW, "nonce-0001")
    assert envelope.body["msg"] == json.loads(json.dumps(STOP.to_dict()))
    verify_signature(envelope, KEY)
    check_fresh(envelope, now=NOW, max_skew_s=DEFAULT_MAX_SKEW_S)
    assert message_of(envelope, allowed_types=TO_AGENT_TYPES) == STOP


def test_an_agent_report_travels_the_other_way_with_the_same_key() -> None:
    raw = seal(HEARTBEAT, node=NODE, key=KEY, now=NOW)
    assert received(raw, allowed=TO_PORTAL_TYPES) == HEARTBEAT


def test_the_signature_is_hmac_sha256_of_the_exact_text() -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW, nonce="nonce-0001")
    assert raw["sig"] == sign_text(KEY, raw["signed"])
    assert len(raw["sig"]) == 64
    assert raw["signed"].isascii()


def test_every_seal_gets_a_fresh_random_nonce() -> None:
    nonces = {open_envelope(seal(STOP, node=NODE, key=KEY, now=NOW)).nonce for _ in range(50)}
    assert len(nonces) == 50
    assert all(len(nonce) == 32 for nonce in nonces)


def test_an_uppercase_hex_signature_is_the_same_signature() -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    assert received({**raw, "sig": raw["sig"].upper()}) == STOP


def test_sealing_refuses_a_nan_instead_of_sending_invalid_json() -> None:
    nan_stop = Stop(node=NODE, job_id=1, attempt=0, reason="cancel", grace_s=float("nan"))
    with pytest.raises(ValueError, match="Out of range float values"):
        seal(nan_stop, node=NODE, key=KEY, now=NOW)


# --- signatures -----------------------------------------------------------------------------


def flip(text: str, index: int) -> str:
    """`text` with the character at `index` changed to another of the same kind."""
    old = text[index]
    new = {"0": "1", "1": "2", "2": "3"}.get(old, "0" if old in "0123456789abcdef" else "x")
    return text[:index] + new + text[index + 1 :]


def test_a_changed_byte_in_the_signed_text_is_a_bad_signature() -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    # job 42 -> job 43: still valid JSON, still a valid message, no longer what was signed.
    changed = raw["signed"].replace('"job_id":42', '"job_id":43')
    assert changed != raw["signed"]
    error = refusal({**raw, "signed": changed})
    assert (error.reason, error.node) == ("bad_signature", NODE)
    assert error.detail == f"signature does not match {NODE}'s key"


@pytest.mark.parametrize("index", [0, 31, 63])
def test_a_changed_byte_in_the_signature_is_a_bad_signature(index: int) -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    assert refusal({**raw, "sig": flip(raw["sig"], index)}).reason == "bad_signature"


def test_a_truncated_or_empty_signature_is_a_bad_signature() -> None:
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    assert refusal({**raw, "sig": raw["sig"][:-1]}).reason == "bad_signature"
    assert refusal({**raw, "sig": ""}).reason == "bad_signature"


def test_another_nodes_key_is_a_bad_signature() -> None:
    raw = seal(STOP, node=NODE, key=OTHER_KEY, now=NOW)
    assert refusal(raw).reason == "bad_signature"


def test_a_message_resigned_for_another_node_fails_with_that_nodes_key() -> None:
    # An envelope re-addressed to gpu-host-2 must verify with gpu-host-2's key, not ours.
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    moved = raw["signed"].replace(f'"node":"{NODE}"', '"node":"gpu-host-2"', 1)
    error = refusal({**raw, "signed": moved}, key=OTHER_KEY)
    assert (error.reason, error.node) == ("bad_signature", "gpu-host-2")


# --- malformed envelopes --------------------------------------------------------------------

GOOD = seal(STOP, node=NODE, key=KEY, now=NOW, nonce="nonce-0001")

MALFORMED = [
    ("not-an-object", ["signed", "sig"], "expected an object with exactly 'signed' and 'sig'"),
    ("bare-message", STOP.to_dict(), "expected an object with exactly 'signed' and 'sig'"),
    ("no-sig", {"signed": GOOD["signed"]}, "expected an object with exactly 'signed' and 'sig'"),
    ("extra-key", {**GOOD, "by": "me"}, "expected an object with exactly 'signed' and 'sig'"),
    ("sig-not-str", {**GOOD, "sig": 1}, "'signed' and 'sig' must be strings"),
    ("signed-object", {**GOOD, "signed": body_of(GOOD)}, "'signed' and 'sig' must be strings"),
    ("signed-not-json", {**GOOD, "signed": "{oops"}, "'signed' is not JSON"),
    ("signed-deep", {**GOOD, "signed": "[" * 100_000}, "'signed' is not JSON"),
    ("sig-not-ascii", {**GOOD, "sig": "é" * 64}, "'signed' and 'sig' must be ASCII text"),
    (
        "signed-not-ascii",
        {**GOOD, "signed": GOOD["signed"].replace("nonce-0001", "nonce-000\ud800")},
        "'signed' and 'sig' must be ASCII text",
    ),
    (
        "body-list",
        resigned([1, 2]),  # type: ignore[arg-type]
        "'signed' must hold exactly node, ts, nonce and msg",
    ),
    (
        "body-extra",
        resigned({**body_of(GOOD), "key_id": 1}),
        "'signed' must hold exactly node, ts, nonce and msg",
    ),
    (
        "body-no-nonce",
        resigned({k: v for k, v in body_of(GOOD).items() if k != "nonce"}),
        "'signed' must hold exactly node, ts, nonce and msg",
    ),
    ("node-empty", resigned({**body_of(GOOD), "node": ""}), "node must be a non-empty string"),
    ("node-int", resigned({**body_of(GOOD), "node": 7}), "node must be a non-empty string"),
    ("ts-str", resigned({**body_of(GOOD), "ts": "now"}), "ts must be a number of epoch seconds"),
    ("ts-bool", resigned({**body_of(GOOD), "ts": True}), "ts must be a number of epoch seconds"),
    ("ts-neg", resigned({**body_of(GOOD), "ts": -1}), "ts must be a number of epoch seconds"),
    (
        "ts-nan",
        {**GOOD, "signed": GOOD["signed"].replace(f'"ts":{NOW}', '"ts":NaN')},
        "ts must be a number of epoch seconds",
    ),
    (
        "ts-infinity",
        {**GOOD, "signed": GOOD["signed"].replace(f'"ts":{NOW}', '"ts":Infinity')},
        "ts must be a number of epoch seconds",
    ),
    (
        "ts-huge-int",
        resigned({**body_of(GOOD), "ts": 10**400}),
        "ts must be a number of epoch seconds",
    ),
    (
        "nonce-short",
        resigned({**body_of(GOOD), "nonce": "1234567"}),
        "nonce must be a string of 8 to 128 characters",
    ),
    (
        "nonce-long",
        resigned({**body_of(GOOD), "nonce": "n" * 129}),
        "nonce must be a string of 8 to 128 characters",
    ),
    (
        "nonce-int",
        resigned({**body_of(GOOD), "nonce": 12345678}),
        "nonce must be a string of 8 to 128 characters",
    ),
]


@pytest.mark.parametrize(
    ("raw", "detail"),
    [pytest.param(raw, detail, id=name) for name, raw, detail in MALFORMED],
)
def test_a_malformed_envelope_is_refused_before_any_key_is_used(raw: Any, detail: str) -> None:
    with pytest.raises(SignatureError) as caught:
        open_envelope(raw)
    assert (caught.value.reason, caught.value.detail) == ("malformed", detail)


def test_a_nan_timestamp_cannot_make_a_message_fresh_forever() -> None:
    # NaN compares false with everything, so no skew check alone would call it stale.
    text = GOOD["signed"].replace(f'"ts":{NOW}', '"ts":NaN')
    with pytest.raises(SignatureError) as caught:
        open_envelope({"signed": text, "sig": sign_text(KEY, text)})
    assert caught.value.reason == "malformed"


def test_nonces_of_8_and_128_characters_are_accepted() -> None:
    for nonce in ("n" * 8, "n" * 128):
        assert received(seal(STOP, node=NODE, key=KEY, now=NOW, nonce=nonce)) == STOP


# --- freshness ------------------------------------------------------------------------------


def envelope_sent_at(ts: float) -> Envelope:
    return open_envelope(seal(STOP, node=NODE, key=KEY, now=ts))


@pytest.mark.parametrize("offset", [-DEFAULT_MAX_SKEW_S, 0.0, DEFAULT_MAX_SKEW_S])
def test_a_message_within_the_skew_is_fresh(offset: float) -> None:
    check_fresh(envelope_sent_at(NOW + offset), now=NOW, max_skew_s=DEFAULT_MAX_SKEW_S)


def test_an_old_message_is_stale() -> None:
    with pytest.raises(SignatureError) as caught:
        check_fresh(envelope_sent_at(NOW - 301), now=NOW, max_skew_s=DEFAULT_MAX_SKEW_S)
    assert (caught.value.reason, caught.value.node) == ("stale", NODE)
    assert caught.value.detail == (
        f"sent at {NOW - 301:.3f}, -301.0 s from now; at most 300 s allowed"
    )


def test_a_message_from_the_future_is_stale() -> None:
    with pytest.raises(SignatureError) as caught:
        check_fresh(envelope_sent_at(NOW + 301), now=NOW, max_skew_s=DEFAULT_MAX_SKEW_S)
    assert caught.value.reason == "stale"
    assert caught.value.detail == (
        f"sent at {NOW + 301:.3f}, +301.0 s from now; at most 300 s allowed"
    )


def test_the_allowed_skew_is_the_receivers_choice() -> None:
    envelope = envelope_sent_at(NOW - 20)
    check_fresh(envelope, now=NOW, max_skew_s=30)
    with pytest.raises(SignatureError, match="at most 10 s allowed"):
        check_fresh(envelope, now=NOW, max_skew_s=10)


def test_a_resent_report_is_fresh_because_it_is_sealed_again() -> None:
    late = NOW + 3600
    assert refusal(seal(STOP, node=NODE, key=KEY, now=NOW), now=late).reason == "stale"
    assert received(seal(STOP, node=NODE, key=KEY, now=late), now=late) == STOP


# --- replays --------------------------------------------------------------------------------


def test_the_replay_guard_refuses_a_nonce_it_has_seen() -> None:
    guard = ReplayGuard(window_s=600)
    assert guard.first_time("nonce-a", now=NOW)
    assert not guard.first_time("nonce-a", now=NOW + 1)
    assert not guard.first_time("nonce-a", now=NOW + 600)
    assert guard.first_time("nonce-b", now=NOW + 1)


def test_the_replay_guard_forgets_a_nonce_after_its_window() -> None:
    guard = ReplayGuard(window_s=600)
    assert guard.first_time("nonce-a", now=NOW)
    assert guard.first_time("nonce-b", now=NOW + 500)
    # By now nonce-a's message would be refused as stale; the guard need not hold it.
    assert guard.first_time("nonce-a", now=NOW + 600.5)
    assert not guard.first_time("nonce-b", now=NOW + 600.5)


def test_the_default_window_covers_both_directions_of_the_skew() -> None:
    guard = ReplayGuard()
    assert guard.first_time("nonce-a", now=NOW)
    assert not guard.first_time("nonce-a", now=NOW + 2 * DEFAULT_MAX_SKEW_S)
    assert guard.first_time("nonce-a", now=NOW + 2 * DEFAULT_MAX_SKEW_S + 1)


def test_the_replay_guard_holds_at_most_its_capacity() -> None:
    guard = ReplayGuard(window_s=600, capacity=2)
    for nonce in ("nonce-a", "nonce-b", "nonce-c"):
        assert guard.first_time(nonce, now=NOW)
    # The oldest made room; the two newest are still refused.
    assert guard.first_time("nonce-a", now=NOW)
    assert not guard.first_time("nonce-a", now=NOW)


def test_a_replayed_envelope_is_caught_by_its_nonce() -> None:
    guard = ReplayGuard()
    raw = seal(STOP, node=NODE, key=KEY, now=NOW)
    accepted = [guard.first_time(open_envelope(raw).nonce, now=NOW + s) for s in (0, 1, 299)]
    assert accepted == [True, False, False]


# --- the message inside ---------------------------------------------------------------------


def test_a_message_in_the_wrong_direction_is_refused() -> None:
    to_portal = refusal(seal(STOP, node=NODE, key=KEY, now=NOW), allowed=TO_PORTAL_TYPES)
    assert (to_portal.reason, to_portal.detail) == (
        "wrong_direction",
        "a 'stop' message is not accepted here",
    )
    to_agent = refusal(seal(HEARTBEAT, node=NODE, key=KEY, now=NOW))
    assert (to_agent.reason, to_agent.detail) == (
        "wrong_direction",
        "a 'heartbeat' message is not accepted here",
    )


def test_a_message_without_a_type_is_in_no_direction() -> None:
    raw = resigned({**body_of(GOOD), "msg": [1]})
    error = refusal(raw)
    assert (error.reason, error.detail) == (
        "wrong_direction",
        "a None message is not accepted here",
    )


def test_a_message_naming_another_node_than_its_envelope_is_refused() -> None:
    # Signed with this node's key, but the query inside is for gpu-host-2.
    other = Query(node="gpu-host-2", job_id=1, attempt=0)
    error = refusal(seal(other, node=NODE, key=KEY, now=NOW))
    assert (error.reason, error.node) == ("wrong_node", NODE)
    assert error.detail == (f"the message names node 'gpu-host-2' but is signed for {NODE!r}")


def test_an_invalid_message_in_a_valid_envelope_is_refused_with_the_protocol_error() -> None:
    raw = resigned({**body_of(GOOD), "msg": {**STOP.to_dict(), "job_id": 0}})
    error = refusal(raw)
    assert (error.reason, error.node) == ("invalid", NODE)
    assert error.detail == "stop.job_id: Expected `int` >= 1"


def test_a_message_of_an_older_protocol_version_is_invalid() -> None:
    raw = resigned({**body_of(GOOD), "msg": {**STOP.to_dict(), "v": 1}})
    error = refusal(raw)
    assert (error.reason, error.detail) == (
        "invalid",
        "v: unsupported protocol version 1; this side speaks 2",
    )


def test_a_launch_is_opened_with_its_devices() -> None:
    launch = Launch(
        node=NODE,
        job_id=7,
        attempt=0,
        name="n",
        team="t",
        user="u",
        image="img",
        command=("python", "-V"),
        env={"A": "1"},
        devices=(Device(slice_id="s", kind="whole", gpu_uuid="GPU-a", gpu_index=0),),
    )
    opened = received(seal(launch, node=NODE, key=KEY, now=NOW))
    assert isinstance(opened, Launch)
    assert opened.devices[0].gpu_uuid == "GPU-a"


# --- node keys ------------------------------------------------------------------------------


def test_a_key_survives_its_text_form() -> None:
    for _ in range(20):
        key = secrets.token_bytes(KEY_BYTES)
        text = key_to_text(key)
        assert len(text) == 43 and "=" not in text
        assert key_from_text(text) == key
        assert key_from_text(f"  {text}\n") == key  # as pasted from a terminal


def test_a_padded_key_text_is_accepted() -> None:
    assert key_from_text(key_to_text(KEY) + "=") == KEY


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("not a key!!", id="garbage"),
        pytest.param(f'"{key_to_text(KEY)}"', id="quoted"),
        pytest.param(key_to_text(KEY)[:20] + "!" + key_to_text(KEY)[20:], id="stray-character"),
        pytest.param("é" * 43, id="not-ascii"),
        pytest.param("abcde", id="bad-padding"),
    ],
)
def test_garbage_is_not_a_key(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        key_from_text(text)
    assert str(caught.value) == "not a node key (expected the text `manage.py node_add` printed)"


@pytest.mark.parametrize(
    ("size", "text"), [(16, key_to_text(bytes(16))), (0, ""), (33, key_to_text(bytes(33)))]
)
def test_a_key_of_the_wrong_length_is_refused_with_its_length(size: int, text: str) -> None:
    with pytest.raises(ValueError) as caught:
        key_from_text(text)
    assert str(caught.value) == (
        f"not a node key: decodes to {size} bytes, expected 32 "
        "(the text `manage.py node_add` printed)"
    )


def test_a_node_key_is_stable() -> None:
    first = derive_node_key(b"portal-secret", node=NODE, salt="salt-1")
    assert derive_node_key(b"portal-secret", node=NODE, salt="salt-1") == first
    assert len(first) == KEY_BYTES


def test_a_node_key_differs_per_node_per_salt_and_per_secret() -> None:
    keys = {
        derive_node_key(b"portal-secret", node=NODE, salt="salt-1"),
        derive_node_key(b"portal-secret", node="gpu-host-2", salt="salt-1"),
        derive_node_key(b"portal-secret", node=NODE, salt="salt-2"),
        derive_node_key(b"other-secret", node=NODE, salt="salt-1"),
        # The separator keeps the name and the salt apart: "ab" + "c" is not "a" + "bc".
        derive_node_key(b"portal-secret", node="ab", salt="c"),
        derive_node_key(b"portal-secret", node="a", salt="bc"),
    }
    assert len(keys) == 6


def test_a_derived_key_signs_and_verifies_through_its_text_form() -> None:
    key = derive_node_key(b"portal-secret", node=NODE, salt=new_salt())
    agent_key = key_from_text(key_to_text(key))
    assert received(seal(STOP, node=NODE, key=key, now=NOW), key=agent_key) == STOP


def test_salts_are_random_and_the_digest_hides_the_key() -> None:
    assert len({new_salt() for _ in range(20)}) == 20
    digest = key_digest(KEY)
    assert len(digest) == 64 and digest != KEY.hex()
    assert key_digest(KEY) == digest
    assert key_digest(OTHER_KEY) != digest

"""``koord_formats.signature``: the allocation signature annotation, its canonical message and the
public-key list, happy paths next to hostile values (issue 37 item 1)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, keys
from koord_formats.signature import (
    MAX_PUBLIC_KEYS,
    MAX_PUBLIC_KEYS_CHARS,
    MAX_SIGNATURE_CHARS,
    AllocationSignature,
    format_allocation_signature,
    format_public_key,
    key_id_of,
    merge_public_keys,
    parse_allocation_signature,
    parse_public_keys,
    signed_message,
)
from tests.formats.hostile import call_total, fragments

SIG = bytes(range(64))
KEY = bytes(range(32))
GOOD = format_allocation_signature("0123456789abcdef", 4000, SIG)


def test_a_signature_round_trips() -> None:
    assert GOOD.startswith("v1.0123456789abcdef.4000.") and len(GOOD) <= MAX_SIGNATURE_CHARS
    assert parse_allocation_signature(GOOD) == AllocationSignature("0123456789abcdef", 4000, SIG)


def test_the_annotation_is_ours_not_koordinator_s() -> None:
    assert keys.ANNOTATION_ALLOCATION_SIGNATURE.startswith("scheduler-ext.runtime-hook-proxy.io/")


def test_the_message_covers_every_part_and_is_deterministic() -> None:
    ann = {keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"0-1"}', "other": "not covered"}
    base = {"key_id": "0123456789abcdef", "uid": "u", "namespace": "ns", "name": "p", "node": "n",
            "cpu_milli": 2000, "annotations": ann}  # fmt: skip
    msg = signed_message(**base)  # type: ignore[arg-type]
    assert msg == signed_message(**base)  # type: ignore[arg-type]
    for part, other in [("uid", "v"), ("namespace", "n2"), ("name", "q"), ("node", "m"), ("cpu_milli", 3000),
                        ("key_id", "fedcba9876543210")]:  # fmt: skip
        assert signed_message(**{**base, part: other}) != msg, part  # type: ignore[arg-type]
    changed = {**ann, keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"0-2"}'}
    assert signed_message(**{**base, "annotations": changed}) != msg  # type: ignore[arg-type]
    added = {**ann, keys.ANNOTATION_DEVICE_ALLOCATED: "{}"}
    assert signed_message(**{**base, "annotations": added}) != msg  # type: ignore[arg-type]
    assert signed_message(**{**base, "annotations": {**ann, "other": "x"}}) == msg  # type: ignore[arg-type]
    # no ambiguity between fields: a separator inside a value cannot shift another
    assert signed_message(**{**base, "namespace": 'a","b', "name": ""}) != signed_message(  # type: ignore[arg-type]
        **{**base, "namespace": "a", "name": 'b'})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("v1", id="version alone"),
        pytest.param("v2.0123456789abcdef.4000." + GOOD.rsplit(".", 1)[1], id="another version"),
        pytest.param(GOOD.replace("0123456789abcdef", "0123456789ABCDEF"), id="upper-case key id"),
        pytest.param(GOOD.replace("0123456789abcdef", "0123456789abcde"), id="short key id"),
        pytest.param(GOOD.replace(".4000.", ".04000."), id="leading zero"),
        pytest.param(GOOD.replace(".4000.", ".-1."), id="negative request"),
        pytest.param(GOOD.replace(".4000.", ".99999999999."), id="11-digit request"),
        pytest.param(GOOD.replace(".4000.", ".\u0664\u0660\u0660\u0660."), id="non-ASCII digits"),
        pytest.param(GOOD[:-1], id="85 signature characters"),
        pytest.param(GOOD + "A", id="87 signature characters"),
        pytest.param(GOOD[:-1] + "B", id="non-canonical last character"),
        pytest.param(GOOD[:-2] + "=", id="padding"),
        pytest.param(GOOD[:-1] + "+", id="standard alphabet"),
        pytest.param(GOOD + ".x", id="five parts"),
        pytest.param("v1." + "A" * (MAX_SIGNATURE_CHARS * 1000), id="huge"),
        pytest.param("v1.\x00\uffff.1.", id="control characters"),
        pytest.param(42, id="not a string"),
        pytest.param(None, id="None"),
    ],
)
def test_a_hostile_signature_is_a_format_error(text: object) -> None:
    with pytest.raises(FormatError):
        parse_allocation_signature(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(fragments, st.text(alphabet="v1.0123456789abcdefABCDEF_-=+/", max_size=200)))
def test_the_signature_parser_is_total(text: str) -> None:
    call_total(parse_allocation_signature, text)


def test_a_public_key_list_round_trips() -> None:
    other = bytes(range(1, 33))
    text = "# published by scheduler-ext\n\n" + format_public_key(KEY, "key one") + "\n" + format_public_key(other)
    assert parse_public_keys(text) == (KEY, other)
    assert parse_public_keys(text + "\n" + format_public_key(KEY)) == (KEY, other)  # repeats kept once
    assert key_id_of(KEY) == key_id_of(KEY) != key_id_of(other) and len(key_id_of(KEY)) == 16
    merged = merge_public_keys(text, [other, bytes(32)], "new")
    assert parse_public_keys(merged) == (KEY, other, bytes(32)) and merged.startswith(text)
    assert parse_public_keys(merge_public_keys("", [KEY])) == (KEY,)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("rsa " + base64.b64encode(KEY).decode(), id="another algorithm"),
        pytest.param("ed25519", id="no key"),
        pytest.param("ed25519 " + base64.b64encode(KEY[:31]).decode(), id="31 bytes"),
        pytest.param("ed25519 " + base64.b64encode(KEY + b"x").decode(), id="33 bytes"),
        pytest.param("ed25519 " + base64.b64encode(KEY).decode()[:-2] + "B=", id="non-canonical"),
        pytest.param("ed25519 " + base64.urlsafe_b64encode(b"\xff" * 32).decode(), id="URL-safe alphabet"),
        pytest.param("\n".join(format_public_key(i.to_bytes(32, "big")) for i in range(MAX_PUBLIC_KEYS + 1)),
                     id="too many keys"),
        pytest.param("#" * (MAX_PUBLIC_KEYS_CHARS + 1), id="too long"),
        pytest.param(b"ed25519 x", id="bytes"),
    ],
)
def test_a_hostile_public_key_list_is_a_format_error(text: object) -> None:
    with pytest.raises(FormatError):
        parse_public_keys(text)


@settings(max_examples=200, deadline=None)
@given(fragments)
def test_the_public_key_parser_is_total(text: str) -> None:
    call_total(parse_public_keys, "ed25519 " + text)
    call_total(parse_public_keys, text)

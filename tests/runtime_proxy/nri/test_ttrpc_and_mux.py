"""The NRI multiplexer and ttrpc framing as pure byte functions."""

from __future__ import annotations

import struct

import pytest

from runtime_proxy.nri import mux, ttrpc


def _frames(data: bytes) -> list[tuple[int, int]]:
    out = []
    offset = 0
    while offset < len(data):
        conn_id, length = struct.unpack_from(">II", data, offset)
        out.append((conn_id, length))
        offset += 8 + length
    return out


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        pytest.param(0, [(2, 0)], id="an empty payload is one empty frame"),
        pytest.param(10, [(2, 10)], id="a small payload is one frame"),
        pytest.param(4096, [(2, 4096)], id="a payload of exactly 4096 bytes is one frame"),
        pytest.param(4097, [(2, 4096), (2, 1)], id="one byte over 4096 makes a second frame"),
        pytest.param(10_000, [(2, 4096), (2, 4096), (2, 1808)], id="a large payload is cut into 4096-byte frames"),
    ],
)
def test_encode_keeps_frames_within_the_go_readers_buffer(size: int, expected: list[tuple[int, int]]) -> None:
    data = mux.encode(2, bytes(size))
    assert _frames(data) == expected


def test_decoder_joins_a_stream_fed_one_byte_at_a_time() -> None:
    stream = mux.encode(1, b"hello") + mux.encode(2, b"world" * 1000)
    decoder = mux.FrameDecoder()
    got: list[tuple[int, bytes]] = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i : i + 1]))
    joined: dict[int, bytes] = {}
    for conn_id, payload in got:
        joined[conn_id] = joined.get(conn_id, b"") + payload
    assert joined == {1: b"hello", 2: b"world" * 1000}
    assert decoder.buffered == 0


def test_decoder_keeps_interleaved_connections_apart() -> None:
    first = ttrpc.encode_message(1, ttrpc.TYPE_REQUEST, b"a" * 5000)
    second = ttrpc.encode_message(1, ttrpc.TYPE_RESPONSE, b"b" * 5000)
    one, two = mux.encode(1, first), mux.encode(2, second)
    # Frames of connection 1 and 2 alternate on the wire.
    frames_one = [one[i : i + 8 + 4096] for i in range(0, len(one), 8 + 4096)]
    frames_two = [two[i : i + 8 + 4096] for i in range(0, len(two), 8 + 4096)]
    wire = b"".join(a + b for a, b in zip(frames_one, frames_two, strict=True))
    decoder = mux.FrameDecoder()
    per_conn = {1: ttrpc.MessageDecoder(), 2: ttrpc.MessageDecoder()}
    messages = {1: [], 2: []}  # type: dict[int, list[ttrpc.Message]]
    for conn_id, payload in decoder.feed(wire):
        messages[conn_id].extend(per_conn[conn_id].feed(payload))
    assert [m.payload for m in messages[1]] == [b"a" * 5000]
    assert [m.payload for m in messages[2]] == [b"b" * 5000]


def test_decoder_refuses_an_oversized_frame_from_its_header_alone() -> None:
    decoder = mux.FrameDecoder(max_payload=1024)
    with pytest.raises(mux.FrameTooLarge):
        decoder.feed(struct.pack(">II", 1, 1025))


def test_message_decoder_refuses_an_oversized_message_from_its_header_alone() -> None:
    decoder = ttrpc.MessageDecoder(max_message=100)
    with pytest.raises(ttrpc.MessageTooLarge):
        decoder.feed(ttrpc.HEADER.pack(101, 1, ttrpc.TYPE_REQUEST, 0))


def test_message_decoder_reassembles_split_messages() -> None:
    wire = ttrpc.encode_message(3, ttrpc.TYPE_REQUEST, b"x" * 300) + ttrpc.encode_message(5, ttrpc.TYPE_REQUEST, b"")
    decoder = ttrpc.MessageDecoder()
    got = decoder.feed(wire[:7]) + decoder.feed(wire[7:200]) + decoder.feed(wire[200:])
    assert [(m.stream_id, m.type, len(m.payload)) for m in got] == [(3, 1, 300), (5, 1, 0)]


def test_header_layout_is_length_stream_type_flags() -> None:
    assert ttrpc.encode_message(7, ttrpc.TYPE_RESPONSE, b"ab", flags=0) == b"\x00\x00\x00\x02\x00\x00\x00\x07\x02\x00ab"

"""The relay's frame parser, fed byte chunks: the fuzz part of the transport suite.

These tests drive one relay ``Session`` directly, with fake transports on both sides, so they
are relay-only (the grpcio transport has no frame parser of its own). A recorded exchange is
split at every byte offset (and fed one byte at a time); whatever the chunking, what each side
receives must be the same as the reference, and mean the same. "The same" is ``_canonical``: the
relay writes what a hook sends together with the frames of the read that completed the request,
so where an injected request lands among other streams' frames, and how the connection window
it owes the client is cut into WINDOW_UPDATEs, depend on the chunking; nothing else may.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hpack import Decoder, Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transport_backend import RecordingInterceptor, expected

from runtime_proxy.cri.relay import _session as session_mod
from runtime_proxy.cri.relay import _wire as w


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _session(interceptor: RecordingInterceptor) -> tuple[session_mod.Session, FakeTransport, FakeTransport]:
    s = session_mod.Session(interceptor, "/nonexistent", 1.0, lambda _s: None)
    down, up = FakeTransport(), FakeTransport()
    s.down, s.up = down, up
    s.state = session_mod._RELAY
    return s, down, up


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        lt, flags, sid = w.FRAME_HEADER.unpack_from(data, pos)
        length = lt >> 8
        out.append((lt & 0xFF, flags, sid & 0x7FFFFFFF, bytes(data[pos + 9 : pos + 9 + length])))
        pos += 9 + length
    assert pos == len(data)
    return out


REQ_HOOKED = b"grow:300:" + bytes(range(256)) * 8  # 2 KiB in several DATA frames
REQ_PLAIN = b"plain" * 100


def _request_headers(enc: Encoder, path: str) -> bytes:
    return enc.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-custom", "v" * 40),
        ]
    )


def client_stream() -> bytes:
    """Preface, SETTINGS, a pass-through call split over HEADERS+CONTINUATION with padded DATA,
    an intercepted call in several DATA frames, WINDOW_UPDATE, PING, PRIORITY and a reset stream."""
    enc = Encoder()
    out = [w.PREFACE, w.settings([(w.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20)])]
    block = _request_headers(enc, "/test.Echo/Unary")
    out.append(w.frame(w.HEADERS, 0, 1, block[:10]))
    out.append(w.frame(w.CONTINUATION, w.FLAG_END_HEADERS, 1, block[10:]))
    msg = w.grpc_frame(REQ_PLAIN)
    out.append(w.frame(w.DATA, w.FLAG_PADDED, 1, bytes([7]) + msg[:200] + b"\x00" * 7))
    out.append(w.frame(w.DATA, w.FLAG_END_STREAM, 1, msg[200:]))
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 3, _request_headers(enc, "/test.Hooked/Unary")))
    hooked = w.grpc_frame(REQ_HOOKED)
    for i in range(0, len(hooked), 700):
        last = i + 700 >= len(hooked)
        out.append(w.frame(w.DATA, w.FLAG_END_STREAM if last else 0, 3, hooked[i : i + 700]))
    out.append(w.window_update(0, 100000))
    out.append(w.frame(w.PING, 0, 0, b"12345678"))
    out.append(w.frame(w.PRIORITY, 0, 5, b"\x00\x00\x00\x00\x10"))
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 5, _request_headers(enc, "/test.Echo/Slow")))
    out.append(w.rst_stream(5, w.CANCEL))
    out.append(w.frame(w.SETTINGS, w.FLAG_ACK, 0))
    return b"".join(out)


def server_stream() -> bytes:
    enc = Encoder()
    out = [w.settings([(w.SETTINGS_MAX_FRAME_SIZE, 16384)]), w.frame(w.SETTINGS, w.FLAG_ACK, 0)]
    resp_headers = [(":status", "200"), ("content-type", "application/grpc")]
    trailers = [("grpc-status", "0"), ("grpc-message", "")]
    plain = w.grpc_frame(REQ_PLAIN)
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, enc.encode(resp_headers)))
    out.append(w.frame(w.DATA, 0, 1, plain))
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 1, enc.encode(trailers)))
    grown = w.grpc_frame(expected(REQ_HOOKED))
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS, 3, enc.encode(resp_headers)))
    out.append(w.frame(w.DATA, 0, 3, grown[:500]))
    out.append(w.window_update(0, 40000))
    out.append(w.frame(w.DATA, 0, 3, grown[500:]))
    out.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, 3, enc.encode(trailers)))
    out.append(w.frame(w.PING, w.FLAG_ACK, 0, b"12345678"))
    return b"".join(out)


CLIENT = client_stream()
SERVER = server_stream()


async def _settle(session: session_mod.Session) -> None:
    for _ in range(50):
        await asyncio.sleep(0)
        if not session._tasks:
            return
    raise AssertionError("hook tasks did not finish")


async def _run(client_chunks: list[bytes], server_chunks: list[bytes]) -> tuple[bytes, bytes, RecordingInterceptor]:
    interceptor = RecordingInterceptor()
    s, down, up = _session(interceptor)
    for chunk in client_chunks:
        s.data_received(chunk)
    await _settle(s)
    for chunk in server_chunks:
        s.server_data(chunk)
    await _settle(s)
    assert not down.closed and not up.closed
    return bytes(up.data), bytes(down.data), interceptor


def _canonical(data: bytes, preface: bool) -> tuple[object, ...]:
    """Every stream's frames in order; header blocks (HPACK state, stream-id order) and the
    other connection frames each in their global order; connection WINDOW_UPDATEs as a total."""
    if preface:
        assert data.startswith(w.PREFACE)
        data = data[len(w.PREFACE) :]
    streams: dict[int, list[tuple[int, int, bytes]]] = {}
    blocks: list[tuple[int, int, bytes]] = []
    conn: list[tuple[int, int, bytes]] = []
    window = 0
    for ftype, flags, sid, payload in _frames(data):
        if ftype == w.WINDOW_UPDATE and sid == 0:
            window += w.u32(payload)
        elif sid == 0:
            conn.append((ftype, flags, payload))
        else:
            streams.setdefault(sid, []).append((ftype, flags, payload))
            if ftype in (w.HEADERS, w.CONTINUATION):
                blocks.append((sid, ftype, payload))
    return streams, blocks, conn, window


def _same(got: tuple[bytes, bytes], reference: tuple[bytes, bytes]) -> bool:
    return _canonical(got[0], True) == _canonical(reference[0], True) and _canonical(got[1], False) == _canonical(
        reference[1], False
    )


def _split(data: bytes, k: int) -> list[bytes]:
    return [data[:k], data[k:]]


@pytest.fixture(scope="module")
def reference() -> tuple[bytes, bytes]:
    up, down, interceptor = asyncio.run(_run([CLIENT], [SERVER]))
    _check_meaning(up, down)
    assert interceptor.after_calls == [("/test.Hooked/Unary", expected(REQ_HOOKED), expected(REQ_HOOKED))]
    return up, down


def _check_meaning(up: bytes, down: bytes) -> None:
    """What the server and the client receive, decoded with fresh HPACK decoders."""
    assert up.startswith(w.PREFACE)
    frames = _frames(up[len(w.PREFACE) :])
    dec = Decoder()
    paths = {}
    data: dict[int, bytearray] = {}
    block = b""
    for ftype, flags, sid, payload in frames:
        if ftype in (w.HEADERS, w.CONTINUATION):
            block += payload
            if flags & w.FLAG_END_HEADERS:
                paths[sid] = dict(dec.decode(block, raw=True))[b":path"]
                block = b""
        elif ftype == w.DATA:
            body = payload[1 : len(payload) - payload[0]] if flags & w.FLAG_PADDED else payload
            data.setdefault(sid, bytearray()).extend(body)
    assert paths == {1: b"/test.Echo/Unary", 3: b"/test.Hooked/Unary", 5: b"/test.Echo/Slow"}
    assert bytes(data[1]) == w.grpc_frame(REQ_PLAIN)
    assert bytes(data[3]) == w.grpc_frame(expected(REQ_HOOKED))  # rebuilt by the hook
    sizes = [len(p) for t, _, sid, p in frames if t == w.DATA and sid == 3]
    assert max(sizes) <= 16384
    types = [t for t, *_ in frames]
    assert types.count(w.RST_STREAM) == 1 and types.count(w.PING) == 1 and types.count(w.PRIORITY) == 1

    frames = _frames(down)
    dec = Decoder()
    heads: dict[int, list[dict[bytes, bytes]]] = {}
    got: dict[int, bytearray] = {}
    window_back = 0
    for ftype, flags, sid, payload in frames:
        if ftype == w.HEADERS:
            assert flags & w.FLAG_END_HEADERS
            heads.setdefault(sid, []).append(dict(dec.decode(payload, raw=True)))
        elif ftype == w.DATA:
            got.setdefault(sid, bytearray()).extend(payload)
        elif ftype == w.WINDOW_UPDATE and sid == 0:
            window_back += w.u32(payload)
    for sid in (1, 3):
        assert heads[sid][0][b":status"] == b"200"
        assert heads[sid][-1][b"grpc-status"] == b"0"
    assert bytes(got[1]) == w.grpc_frame(REQ_PLAIN)
    assert bytes(got[3]) == w.grpc_frame(expected(REQ_HOOKED))
    # Connection window: the relay returned the intercepted request bytes to the client, and
    # kept back from the server's WINDOW_UPDATE what it had injected beyond them.
    swallowed = len(w.grpc_frame(REQ_HOOKED))
    injected = len(w.grpc_frame(expected(REQ_HOOKED)))
    assert window_back == swallowed + 40000 - injected


async def test_split_at_every_byte_offset_of_the_client_stream(reference: tuple[bytes, bytes]) -> None:
    for k in range(len(CLIENT) + 1):
        up, down, _ = await _run(_split(CLIENT, k), [SERVER])
        assert _same((up, down), reference), f"client stream split at {k}"


async def test_split_at_every_byte_offset_of_the_server_stream(reference: tuple[bytes, bytes]) -> None:
    for k in range(len(SERVER) + 1):
        up, down, _ = await _run([CLIENT], _split(SERVER, k))
        assert _same((up, down), reference), f"server stream split at {k}"


async def test_one_byte_at_a_time(reference: tuple[bytes, bytes]) -> None:
    up, down, _ = await _run([bytes([b]) for b in CLIENT], [bytes([b]) for b in SERVER])
    assert _same((up, down), reference)


async def test_random_chunkings(reference: tuple[bytes, bytes]) -> None:
    rng = random.Random(1)
    for _ in range(100):
        cuts_c = sorted(rng.sample(range(1, len(CLIENT)), 20))
        cuts_s = sorted(rng.sample(range(1, len(SERVER)), 20))
        cc = [CLIENT[a:b] for a, b in zip([0, *cuts_c], [*cuts_c, len(CLIENT)], strict=True)]
        sc = [SERVER[a:b] for a, b in zip([0, *cuts_s], [*cuts_s, len(SERVER)], strict=True)]
        up, down, _ = await _run(cc, sc)
        assert _same((up, down), reference)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=300), side=st.sampled_from(["client", "server"]))
def test_garbage_never_escapes_the_parser(garbage: bytes, side: str) -> None:
    async def run() -> None:
        s, down, _up = _session(RecordingInterceptor())
        s.data_received(CLIENT[:200])
        if side == "client":
            s.data_received(garbage)
        else:
            s.server_data(garbage)
        await asyncio.sleep(0)
        if down.closed:
            assert w.GOAWAY in [t for t, *_ in _frames_lenient(bytes(down.data))]
        for task in list(s._tasks):
            task.cancel()

    asyncio.run(run())


def _frames_lenient(data: bytes) -> list[tuple[int, int, int]]:
    out = []
    pos = 0
    while len(data) - pos >= 9:
        lt, flags, sid = w.FRAME_HEADER.unpack_from(data, pos)
        out.append((lt & 0xFF, flags, sid))
        pos += 9 + (lt >> 8)
    return out

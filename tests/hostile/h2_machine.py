"""A hypothesis state machine that speaks structured, often wrong, HTTP/2 to a relay process.

Used by ``test_h2_fuzz.py`` (a short run) and ``scripts/h2_fuzz_long.py`` (a long one). Each
example opens one raw connection to a ``RelayProcess`` (a relay in front of the transport
suite's real grpcio backend) and sends a sequence of frames: HEADERS with valid, broken or
unfinished blocks on new, old, even or zero stream ids; CONTINUATION runs; DATA within and past
the windows; SETTINGS, RST_STREAM, GOAWAY, PRIORITY, PING and WINDOW_UPDATE with right and wrong
lengths; raw garbage; and reads now and then. After every step the relay process must be
alive; at the end of each example a call over another connection must succeed and the relay's
memory must stay under ``rss_limit_mib``.
"""

from __future__ import annotations

import socket
import struct
from typing import ClassVar

from hpack import Encoder
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from relay_attacks import PREFACE, RelayProcess, frame, healthy_call

PATHS = ["/test.Echo/Unary", "/test.Echo/Bidi", "/test.Hooked/Unary", "/test.Hooked/Bidi", "/nope.X/Y"]
SID = st.sampled_from(["new", "last", "even", "zero", "old"])
SIZES = st.sampled_from([0, 1, 5, 100, 4096, 16384, 16385, 70000])


class RelayH2Machine(RuleBasedStateMachine):
    """Set ``relay`` (a started ``RelayProcess``) and ``baseline_kib`` before running."""

    relay: ClassVar[RelayProcess]
    baseline_kib: ClassVar[int] = 0
    rss_limit_mib: ClassVar[float] = 64.0
    examples: ClassVar[int] = 0
    max_rss_kib: ClassVar[int] = 0
    progress_every: ClassVar[int] = 0  # print the relay's stats every this many sessions (0: never)

    def __init__(self) -> None:
        super().__init__()
        self.sock: socket.socket | None = None
        self.enc = Encoder()
        self.last = 0
        self.open = True

    @initialize(preface=st.booleans())
    def connect(self, preface: bool) -> None:
        type(self).examples += 1
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.relay.path)
        self.sock.settimeout(0.5)
        self._send((PREFACE if preface else b"PRI * HTTP/1.1\r\n") + frame(0x4, 0, 0))

    def _send(self, data: bytes) -> None:
        if not self.open or self.sock is None:
            return
        try:
            self.sock.sendall(data)
        except OSError:  # closed by the relay, or it stopped reading: this connection is done
            self.open = False

    def _sid(self, kind: str) -> int:
        if kind == "new":
            self.last += 2 if self.last else 1
            return self.last
        if kind == "last":
            return max(self.last, 1)
        if kind == "even":
            return self.last + 2 if self.last % 2 else self.last + 1
        if kind == "zero":
            return 0
        return 1

    @rule(
        sid=SID,
        path=st.sampled_from(PATHS),
        end_stream=st.booleans(),
        end_headers=st.booleans(),
        padded=st.booleans(),
        priority=st.booleans(),
        garbage=st.sampled_from([None, b"", b"\xff\xff\xff\xff", b"\x3f\xe1\x1f", b"\x40\x7f"]),
    )
    def headers(
        self,
        sid: str,
        path: str,
        end_stream: bool,
        end_headers: bool,
        padded: bool,
        priority: bool,
        garbage: bytes | None,
    ) -> None:
        block = (
            garbage
            if garbage is not None
            else bytes(
                self.enc.encode(
                    [
                        (":method", "POST"),
                        (":scheme", "http"),
                        (":path", path),
                        (":authority", "x"),
                        ("content-type", "application/grpc"),
                        ("te", "trailers"),
                    ]
                )
            )
        )
        flags = (0x1 if end_stream else 0) | (0x4 if end_headers else 0)
        payload = block
        if priority:
            flags |= 0x20
            payload = b"\x00\x00\x00\x00\x10" + payload
        if padded:
            flags |= 0x8
            payload = b"\x03" + payload + b"\x00\x00\x00"
        self._send(frame(0x1, flags, self._sid(sid), payload))

    @rule(sid=SID, end_headers=st.booleans(), size=st.sampled_from([0, 3, 1000, 16384]), count=st.integers(1, 40))
    def continuation(self, sid: str, end_headers: bool, size: int, count: int) -> None:
        n = self._sid(sid)
        run = [frame(0x9, 0, n, b"\x82" * size) for _ in range(count - 1)]
        run.append(frame(0x9, 0x4 if end_headers else 0, n, b"\x82" * size))
        self._send(b"".join(run))

    @rule(
        sid=SID,
        size=SIZES,
        end_stream=st.booleans(),
        padded=st.booleans(),
        count=st.integers(1, 20),
        grpc_prefix=st.booleans(),
    )
    def data(self, sid: str, size: int, end_stream: bool, padded: bool, count: int, grpc_prefix: bool) -> None:
        n = self._sid(sid)
        body = bytes(size)
        if grpc_prefix and size >= 5:
            body = b"\x00" + struct.pack(">I", size * count - 5) + body[5:]
        if padded:
            body = b"\x02" + body + b"\x00\x00"
        flags = 0x8 if padded else 0
        frames = [frame(0x0, flags, n, body) for _ in range(count - 1)]
        frames.append(frame(0x0, flags | (0x1 if end_stream else 0), n, body))
        self._send(b"".join(frames))

    @rule(
        pairs=st.lists(
            st.tuples(st.integers(0, 8), st.sampled_from([0, 1, 100, 16383, 16384, 65535, 2**24, 2**31])), max_size=4
        ),
        ack=st.booleans(),
        bad_length=st.booleans(),
    )
    def settings(self, pairs: list[tuple[int, int]], ack: bool, bad_length: bool) -> None:
        payload = b"".join(struct.pack(">HI", k, v & 0xFFFFFFFF) for k, v in pairs)
        if bad_length:
            payload += b"\x00"
        self._send(frame(0x4, 0x1 if ack else 0, 0, payload))

    @rule(sid=SID, code=st.sampled_from([0, 1, 2, 3, 8, 0xB, 0xFFFF]), bad_length=st.booleans())
    def rst_stream(self, sid: str, code: int, bad_length: bool) -> None:
        self._send(frame(0x3, 0, self._sid(sid), struct.pack(">I", code) + (b"\x00" if bad_length else b"")))

    @rule(last=st.integers(0, 2**31 - 1), code=st.sampled_from([0, 1, 2, 0xB]), debug=st.binary(max_size=20))
    def goaway(self, last: int, code: int, debug: bytes) -> None:
        self._send(frame(0x7, 0, 0, struct.pack(">II", last, code) + debug))

    @rule(sid=SID, dep=st.integers(0, 2**31 - 1), length=st.sampled_from([5, 4, 6]))
    def priority(self, sid: str, dep: int, length: int) -> None:
        self._send(frame(0x2, 0, self._sid(sid), (struct.pack(">I", dep) + b"\x10\x00")[:length]))

    @rule(ack=st.booleans(), length=st.sampled_from([8, 7, 9]), sid=st.sampled_from(["zero", "last"]))
    def ping(self, ack: bool, length: int, sid: str) -> None:
        self._send(frame(0x6, 0x1 if ack else 0, self._sid(sid), b"p" * length))

    @rule(sid=SID, inc=st.sampled_from([0, 1, 65535, 2**31 - 1]), length=st.sampled_from([4, 3]))
    def window_update(self, sid: str, inc: int, length: int) -> None:
        self._send(frame(0x8, 0, self._sid(sid), struct.pack(">I", inc)[:length]))

    @rule(
        ftype=st.integers(0, 255),
        flags=st.integers(0, 255),
        sid=st.integers(0, 2**32 - 1),
        payload=st.binary(max_size=64),
    )
    def any_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        self._send(struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload)

    @rule(data=st.binary(min_size=1, max_size=64))
    def garbage(self, data: bytes) -> None:
        self._send(data)

    @rule()
    def read(self) -> None:
        if not self.open or self.sock is None:  # no precondition: it would depend on the relay
            return
        try:
            self.sock.settimeout(0.01)
            if not self.sock.recv(1 << 20):
                self.open = False
        except (TimeoutError, BlockingIOError):
            pass
        except OSError:
            self.open = False
        finally:
            self.sock.settimeout(0.5)

    @invariant()
    def relay_lives(self) -> None:
        assert self.relay.alive(), "the relay process died"

    def teardown(self) -> None:
        if self.sock is not None:
            self.sock.close()
        assert self.relay.alive(), "the relay process died"
        assert healthy_call(self.relay.path) == b"ping"
        row = self.relay.stats()
        rss = int(row["rss_kib"])
        cls = type(self)
        if cls.progress_every and cls.examples % cls.progress_every == 0:
            print(
                f"{cls.examples:8} sessions: RSS {rss / 1024:.1f} MiB, open connections {row['connections']}",
                flush=True,
            )
        cls.max_rss_kib = max(cls.max_rss_kib, rss)
        assert (rss - self.baseline_kib) / 1024 < self.rss_limit_mib, f"relay RSS grew to {rss / 1024:.1f} MiB"

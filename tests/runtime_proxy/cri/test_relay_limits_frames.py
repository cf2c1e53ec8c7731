"""The relay's limits at frame level: one ``Session`` driven with fake transports, as in
``test_relay_frames``. The attacks on a relay process are in ``tests/hostile/test_relay_limits.py``.
"""

from __future__ import annotations

import pytest
from hpack import Encoder
from test_relay_frames import _frames, _request_headers, _session
from transport_backend import RecordingInterceptor

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._limits import RelayLimits


def _open(enc: Encoder, sid: int, path: str) -> bytes:
    return w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, _request_headers(enc, path))


async def test_intercepted_stream_past_its_window_is_reset_with_flow_control_error() -> None:
    s, down, up = _session(RecordingInterceptor())
    # The server's initial stream window is 1000, and the client has acknowledged it.
    s.server_data(w.settings([(w.SETTINGS_INITIAL_WINDOW_SIZE, 1000)]))
    enc = Encoder()
    s.data_received(w.PREFACE + w.settings() + w.SETTINGS_ACK + _open(enc, 1, "/test.Hooked/Unary"))
    s.data_received(w.frame(w.DATA, 0, 1, bytes(1001)))
    resets = [(sid, w.u32(p)) for t, _f, sid, p in _frames(bytes(down.data)) if t == w.RST_STREAM]
    assert resets == [(1, w.FLOW_CONTROL_ERROR)]
    assert s.buffered == 0 and not down.closed
    # The same connection goes on: a pass-through call.
    s.data_received(_open(enc, 3, "/test.Echo/Unary"))
    assert not up.closed and s.live == {3: 0}
    s.close()


@pytest.mark.parametrize(
    ("debt", "violation"),
    [
        pytest.param(0, True, id="DATA past the window with no debt is a flow-control error"),
        pytest.param(70000, False, id="DATA within the client's view of the window waits for the server"),
    ],
)
async def test_pass_through_data_past_the_window(debt: int, violation: bool) -> None:
    s, down, _up = _session(RecordingInterceptor())
    enc = Encoder()
    s.data_received(w.PREFACE + w.settings() + _open(enc, 1, "/test.Echo/Bidi"))
    s._debt = debt  # as after a hook grew messages by that much
    for _ in range(5):
        s.data_received(w.frame(w.DATA, 0, 1, bytes(16000)))
    goaways = [w.u32(p, 4) for t, _f, _sid, p in _frames(bytes(down.data)) if t == w.GOAWAY]
    if violation:
        assert goaways == [w.FLOW_CONTROL_ERROR] and down.closed
    else:
        assert goaways == [] and s._gated and not down.closed
        s.server_data(w.window_update(0, 100000))
        assert not s._gated
        s.close()


async def test_header_block_past_the_limit_ends_the_connection_with_enhance_your_calm() -> None:
    s, down, _up = _session(RecordingInterceptor())
    s._limits = RelayLimits(header_block=4096)
    s._block_limit = 4096
    s.data_received(w.PREFACE + w.settings() + w.frame(w.HEADERS, 0, 1, b"\x82" * 100))
    for _ in range(3):
        s.data_received(w.frame(w.CONTINUATION, 0, 1, b"\x82" * 2000))
    goaways = [w.u32(p, 4) for t, _f, _sid, p in _frames(bytes(down.data)) if t == w.GOAWAY]
    assert goaways == [w.ENHANCE_YOUR_CALM] and down.closed

"""Flow control and resource limits of one relayed connection: the peers' SETTINGS as they take
effect, the accounting of request bytes held for intercepted calls against ``RelayLimits``
(``_limits``), and the errors for a peer that crosses a limit or a window.

The windows themselves are counted where frames are parsed (``_client``, ``_server``) and where
rebuilt requests are sent (``_intercept``); ``docs/transports.md`` explains the debt.
"""

from __future__ import annotations

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._frames import FrameError
from runtime_proxy.cri.relay._limits import hit
from runtime_proxy.cri.relay._state import SessionState
from runtime_proxy.cri.relay._streams import (
    Intercepted,
)


class FlowControl(SessionState):
    """SETTINGS bookkeeping and resource limits (a ``Session`` unit)."""

    # SETTINGS bind the side that receives them from the moment it acknowledges them: the relay
    # applies the client's settings (to what it sends the client) when the server's ACK passes,
    # and the server's when the client's ACK passes. Limits used only to check incoming frames
    # or header blocks are widened at once, as the sender may use them before the ACK arrives.
    def _client_settings_early(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._down_frame_limit = max(self._down_frame_limit, value)
            elif key == w.SETTINGS_HEADER_TABLE_SIZE:
                self._s_dec.dec.max_allowed_table_size = max(self._s_dec.dec.max_allowed_table_size, value)

    def _client_settings(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._down_max_frame = value

    def _server_settings_early(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._up_frame_limit = max(self._up_frame_limit, value)
            elif key == w.SETTINGS_HEADER_TABLE_SIZE:
                self._c_dec.dec.max_allowed_table_size = max(self._c_dec.dec.max_allowed_table_size, value)

    def _server_settings(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._up_init_window
                self._up_init_window = value
                for st in self._icpt.values():
                    st.window += delta
                    st.cwin += delta
                self._resume = True
            elif key == w.SETTINGS_MAX_FRAME_SIZE:
                self._up_max_frame = value
                self._resume = True

    def _flow_control_violation(self) -> None:
        hit("flow_control")
        raise FrameError(w.FLOW_CONTROL_ERROR, "client DATA beyond the connection window")

    def _block_too_large(self, side: str) -> None:
        hit("header_block")
        raise FrameError(w.ENHANCE_YOUR_CALM, f"{side} header block over {self._block_limit} bytes")

    def _over_budget(self, stream_total: int, more: int) -> str:
        """Which buffer limit holding ``more`` request bytes crosses, counted (``_intercept`` checks
        all three inline first, and calls this only when one is crossed)."""
        if stream_total > self._limits.stream_buffer:
            hit("stream_buffer")
            return "request too large for an intercepted method"
        if self.buffered + more > self._limits.connection_buffer:
            hit("connection_buffer")
            return "too many request bytes held for intercepted calls on this connection"
        hit("total_buffer")
        return "too many request bytes held for intercepted calls"

    def _release(self, st: Intercepted) -> None:
        """Forget the request bytes ``st`` holds and give them back to the budgets."""
        size = len(st.req) + len(st.out)
        if size:
            st.req = bytearray()
            st.out = b""
            self.buffered -= size
            self._budget.held -= size

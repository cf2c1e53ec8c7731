"""Resource limits of the relay: how much a peer may make it hold, and what happens past that.

Used by ``_session`` (one ``Session`` per connection) and ``RelayTransport``, which takes a
``RelayLimits`` to override the defaults. Every limit that is hit is counted in
``rhp_relay_limit_hits_total{limit}`` (``runtime_proxy.metrics``) and ends only what crossed it:

* ``header_block``: a header block (HEADERS plus its CONTINUATION frames) larger than this ends
  its connection with GOAWAY(ENHANCE_YOUR_CALM). A header block cannot be dropped alone: the
  HPACK tables on both sides would diverge, so the connection goes.
* ``stream_buffer``: request bytes one intercepted call may make the relay hold (the hook needs
  the whole message). Past it the call is answered RESOURCE_EXHAUSTED and reset; the connection
  goes on.
* ``connection_buffer``: request bytes all intercepted calls of one connection may make the relay
  hold together. The call whose bytes would cross it is answered RESOURCE_EXHAUSTED.
* ``total_buffer``: the same across all connections of one ``RelayTransport``.
* ``intercepted_streams``: intercepted calls open at once on one connection; the next one is
  answered RESOURCE_EXHAUSTED.
* ``flow_control`` (not a size): a client that sends DATA past the window the relay advertised
  gets FLOW_CONTROL_ERROR, as RFC 9113 section 6.9 says: GOAWAY for the connection window,
  RST_STREAM for an intercepted stream's window.
* ``early_input``: bytes a client may send before the backend connection is up; past it the
  relay stops reading that client until the connection is up (not an error, so not counted).

Besides these limits the relay stops reading a peer while the other side's write buffer is full
(asyncio's ``pause_writing``), and stops reading the client while a DATA frame waits for the
server's window, so a peer that never reads cannot make the relay hold more than one read.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime_proxy import metrics

# A compressed header block of 256 KiB is far above any gRPC metadata (grpc-go and grpc C-core
# refuse header lists above 16 KiB unless configured) and decodes well within 50 ms.
MAX_HEADER_BLOCK = 256 * 1024
# kubelet's CRI client and containerd both cap a message at 16 MiB; plus the 5-byte gRPC prefix.
MAX_STREAM_BUFFER = 16 * 1024 * 1024 + 5
MAX_CONNECTION_BUFFER = 32 * 1024 * 1024
MAX_TOTAL_BUFFER = 64 * 1024 * 1024
# kubelet starts pods a few at a time; each intercepted call holds a hook task.
MAX_INTERCEPTED_STREAMS = 128
MAX_EARLY_INPUT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """The limits one ``RelayTransport`` enforces; the module docstring says what each does."""

    header_block: int = MAX_HEADER_BLOCK
    stream_buffer: int = MAX_STREAM_BUFFER
    connection_buffer: int = MAX_CONNECTION_BUFFER
    total_buffer: int = MAX_TOTAL_BUFFER
    intercepted_streams: int = MAX_INTERCEPTED_STREAMS
    early_input: int = MAX_EARLY_INPUT


class Budget:
    """Bytes held for intercepted calls across the sessions of one transport."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0


def hit(limit: str) -> None:
    """Count one hit of ``limit`` (the names are RelayLimits' fields and ``flow_control``)."""
    metrics.RELAY_LIMIT_HITS.labels(limit).inc()

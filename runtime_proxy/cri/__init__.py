"""Where a CRI call enters: the transport seam, the method table and the two transports
(``relay``, the HTTP/2 frame relay, and ``grpc_transport``, the grpc.aio fallback)."""

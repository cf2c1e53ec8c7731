"""The seam between a transport (how bytes move between kubelet and the runtime) and the hook
machinery (what happens to an intercepted call).

Both transports, the HTTP/2 frame relay (``runtime_proxy.cri.relay``) and the grpcio fallback
(``runtime_proxy.cri.grpc_transport``), take a ``CallInterceptor``. For a method the interceptor
``intercepts``, the transport buffers the single request message, awaits ``before`` and sends
the bytes it returns; when the runtime answered OK it awaits ``after`` with the response
message before it hands the response to the caller (so the store knows a new sandbox or
container before kubelet can name it). Every other call passes as raw bytes.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CallInterceptor", "HookRejected", "PassThrough"]


class HookRejected(Exception):
    """Raised by ``before`` (or ``undecodable``) to fail the call without calling the runtime.

    ``code`` is a gRPC status code number (e.g. 9 FAILED_PRECONDITION, 13 INTERNAL,
    14 UNAVAILABLE); ``message`` becomes the grpc-message the caller sees.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallInterceptor(Protocol):
    """What a transport needs from the hook side."""

    def intercepts(self, method: str) -> bool:
        """True when ``method`` (the full ``:path``, e.g.
        ``/runtime.v1.RuntimeService/CreateContainer``) must go through ``before``/``after``."""
        ...

    async def before(self, method: str, request: bytes) -> bytes:
        """Run the pre hooks on one uncompressed request message; return the message to send.

        Raises ``HookRejected`` to fail the call; the runtime is then never called."""
        ...

    async def after(self, method: str, request: bytes, response: bytes) -> None:
        """Run the post hooks and record state after the runtime answered with status OK.
        ``request`` is the message that was sent. Never raises."""
        ...

    async def undecodable(self, method: str, reason: str) -> None:
        """An intercepted call whose request cannot be decoded (compressed, several messages,
        malformed). Return to forward it unhooked; raise ``HookRejected`` to refuse it (what the
        ``Fail`` policy asks for)."""
        ...


class PassThrough:
    """An interceptor that intercepts nothing: a transparent proxy."""

    def intercepts(self, method: str) -> bool:
        return False

    async def before(self, method: str, request: bytes) -> bytes:
        return request

    async def after(self, method: str, request: bytes, response: bytes) -> None:
        return None

    async def undecodable(self, method: str, reason: str) -> None:
        return None

"""The seam between a transport (how bytes move between kubelet and the runtime) and the hook
machinery (what happens to an intercepted call).

Both transports, the HTTP/2 frame relay (``runtime_proxy.cri.relay``) and the grpcio fallback
(``runtime_proxy.cri.grpc_transport``), take a ``CallInterceptor``. For a method the interceptor
``intercepts``, the transport buffers the single request message and awaits ``before``, which
returns the call's own ``InterceptedCall``: the transport sends its ``request`` bytes and keeps
the object for that call alone; when the runtime answered OK it awaits the object's ``after``
with the response message before it hands the response to the caller (so the store knows a new
sandbox or container before kubelet can name it). Every other call passes as raw bytes.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CallInterceptor", "HookRejected", "InterceptedCall"]


class HookRejected(Exception):
    """Raised by ``before`` (or ``undecodable``) to fail the call without calling the runtime.

    ``code`` is a gRPC status code number (e.g. 9 FAILED_PRECONDITION, 13 INTERNAL,
    14 UNAVAILABLE); ``message`` becomes the grpc-message the caller sees.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InterceptedCall(Protocol):
    """One intercepted call as ``before`` left it: what to send, and what to do after."""

    @property
    def request(self) -> bytes:
        """The uncompressed request message to send to the runtime."""
        ...

    async def after(self, response: bytes) -> None:
        """Run the post hooks and record state after the runtime answered this call with
        status OK (``response`` is its one response message). Never raises."""
        ...


class CallInterceptor(Protocol):
    """What a transport needs from the hook side."""

    def intercepts(self, method: str) -> bool:
        """True when ``method`` (the full ``:path``, e.g.
        ``/runtime.v1.RuntimeService/CreateContainer``) must go through ``before``."""
        ...

    async def before(self, method: str, request: bytes) -> InterceptedCall:
        """Run the pre hooks on one uncompressed request message (decoded here, once); return
        the call, whose ``request`` is the message to send and whose ``after`` the transport
        awaits once the runtime answered OK.

        Raises ``HookRejected`` to fail the call; the runtime is then never called."""
        ...

    async def undecodable(self, method: str, reason: str) -> None:
        """An intercepted call whose request cannot be decoded (compressed, several messages,
        malformed). Return to forward it unhooked; raise ``HookRejected`` to refuse it (what the
        ``Fail`` policy asks for)."""
        ...

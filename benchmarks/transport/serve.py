"""Run one transport for the benchmark: ``python serve.py relay|grpc LISTEN BACKEND``.

The interceptor intercepts ``/bench.Echo/Hooked`` and, like the real hook pipeline's cheapest
case, decodes the request as a CRI ``CreateContainerRequest`` and encodes it again; every other
method passes through. Prints ``ready`` once listening; runs until killed.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from cri_protos import api_pb2
from runtime_proxy.cri.relay import RelayTransport, new_event_loop

if TYPE_CHECKING:
    from runtime_proxy.cri.grpc_transport import GrpcTransport

HOOKED = "/bench.Echo/Hooked"


class Encoded:
    """The call ``DecodeEncode.before`` returns: the encoded request, nothing after."""

    __slots__ = ("request",)

    def __init__(self, request: bytes) -> None:
        self.request = request

    async def after(self, response: bytes) -> None:
        return None


class DecodeEncode:
    def intercepts(self, method: str) -> bool:
        return method == HOOKED

    async def before(self, method: str, request: bytes) -> Encoded:
        msg = api_pb2.CreateContainerRequest.FromString(request)
        return Encoded(msg.SerializeToString())

    async def undecodable(self, method: str, reason: str) -> None:
        return None


async def main(kind: str, listen: str, backend: str) -> None:
    transport: RelayTransport | GrpcTransport
    if kind == "relay":
        transport = RelayTransport(listen, backend, DecodeEncode())
    else:
        from runtime_proxy.cri.grpc_transport import GrpcTransport

        transport = GrpcTransport(listen, backend, DecodeEncode())
    await transport.start()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await transport.stop(1.0)


if __name__ == "__main__":
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main(sys.argv[1], sys.argv[2], sys.argv[3]))

"""Python (grpcio) ends for the transport benchmark, used when Go is not installed.

``python py_ends.py server PATH`` echoes every message of every method (like ``go/echoserver``);
``python py_ends.py client PATH MODE METHOD PAYLOAD_HEX N SECONDS REPS`` prints the same JSON as
``go/client``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


class _Echo(grpc.GenericRpcHandler):  # type: ignore[misc]
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for r in requests:
                yield r

        return grpc.stream_stream_rpc_method_handler(echo)


async def server(path: str) -> None:
    srv = grpc.aio.server(options=OPTIONS)
    srv.add_generic_rpc_handlers([_Echo()])
    srv.add_insecure_port(f"unix:{path}")
    await srv.start()
    print("ready", flush=True)
    await srv.wait_for_termination()


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[int(p * (len(values) - 1))]


def client(path: str, mode: str, method: str, payload: bytes, n: int, seconds: float, reps: int) -> dict[str, Any]:
    channel = grpc.insecure_channel(f"unix:{path}", options=OPTIONS)
    unary = channel.unary_unary(method)
    for _ in range(200):
        unary(payload)
    result: dict[str, Any] = {"mode": mode}
    if mode == "unary":
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            unary(payload)
            lat.append((time.perf_counter() - t) * 1e6)
        result.update(p50_us=_pct(lat, 0.5), p99_us=_pct(lat, 0.99))
    elif mode == "conc":
        count = [0]
        lock = threading.Lock()
        deadline = time.perf_counter() + seconds

        def worker() -> None:
            while time.perf_counter() < deadline:
                unary(payload)
                with lock:
                    count[0] += 1

        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            for _ in range(16):
                pool.submit(worker)
        result["calls_per_s"] = count[0] / (time.perf_counter() - start)
    else:
        stream = channel.stream_stream(method)
        lat = []
        for _ in range(reps):
            t = time.perf_counter()

            def gen() -> Iterator[bytes]:
                for _ in range(1000):
                    yield payload

            got = sum(1 for _ in stream(gen()))
            assert got == 1000
            lat.append((time.perf_counter() - t) * 1e3)
        result.update(p50_ms=_pct(lat, 0.5), p99_ms=_pct(lat, 0.99))
    channel.close()
    return result


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(server(sys.argv[2]))
    else:
        _, _, p, m, meth, hexpayload, n, s, r = sys.argv
        print(json.dumps(client(p, m, meth, bytes.fromhex(hexpayload), int(n), float(s), int(r))))

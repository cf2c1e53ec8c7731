"""New connections on a busy uvloop event loop: every new connection must get the
server's SETTINGS and work, on both transports.

What went wrong: a real ``runtime-proxy serve`` runs on uvloop, and the reconciler, the hooks
and the store keep its loop busy. containerd (grpc-go) and grpcio send their SETTINGS as soon as
they accept a connection. The relay switched a connection to relaying only when its connect
coroutine resumed, but uvloop runs I/O callbacks before the ready queue, so when the loop was
busy the server's first bytes arrived (and were dropped) before that; the client then failed
with "timed out before receiving SETTINGS". The suite's other tests run on asyncio's default
loop, whose order hides the race, so these tests run the transport on uvloop themselves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from conftest import BACKEND_SCRIPT, Transport, make_transport
from test_relay_frames import FakeTransport
from transport_backend import OPTIONS, RecordingInterceptor

from runtime_proxy.cri.relay import _session as session_mod
from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay import new_event_loop

CONNECTIONS = 40
BUSY_SLICE = 0.003  # seconds the loop is kept busy per turn: a synchronous piece of work


class LoopThread:
    """A uvloop event loop in a daemon thread, kept busy by a callback that blocks for
    ``BUSY_SLICE`` on every turn (what a round of hooks, a store rebuild or a reconciler round
    does to the proxy's loop)."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="uvloop")
        self.busy = False

    def call(self, coro: Any, timeout: float = 20.0) -> Any:
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def start_busy(self) -> None:
        def turn() -> None:
            if self.busy:
                time.sleep(BUSY_SLICE)
                self.loop.call_soon(turn)

        self.busy = True
        self.loop.call_soon_threadsafe(turn)

    def stop_busy(self) -> None:
        self.busy = False

    def __enter__(self) -> LoopThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.busy = False
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def backend_process(sock_dir: str) -> Iterator[str]:
    """The test backend (grpcio, which sends SETTINGS on accept, as containerd does) in its own
    process, so that its timing does not depend on the loop under test."""
    path = os.path.join(sock_dir, "backend.sock")
    proc = subprocess.Popen(
        [sys.executable, BACKEND_SCRIPT, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        yield path
    finally:
        proc.kill()
        proc.wait(10)


def _gets_server_settings(path: str, timeout: float = 3.0) -> bool:
    """Open a raw connection and send the client preface; True once the server's own SETTINGS
    frame (not an ACK) arrives, False when it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(w.PREFACE + w.settings())
        data = b""
        while True:
            pos = 0
            while len(data) - pos >= 9:
                length = int.from_bytes(data[pos : pos + 3], "big")
                if data[pos + 3] == w.SETTINGS and not data[pos + 4] & w.FLAG_ACK:
                    return True
                pos += 9 + length
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return False
            if not chunk:
                return False
            data += chunk


def test_every_new_connection_gets_settings_on_a_busy_uvloop(
    transport_kind: str, sock_dir: str, backend_process: str
) -> None:
    listen = os.path.join(sock_dir, "proxy.sock")
    with LoopThread() as lt:
        transport: Transport = lt.call(_start(transport_kind, listen, backend_process))
        try:
            lt.start_busy()
            missing = sum(not _gets_server_settings(listen) for _ in range(CONNECTIONS))
            assert missing == 0, f"{missing} of {CONNECTIONS} new connections never got SETTINGS"
            # And real calls, each on a new connection, work end to end (pass-through and hooked).
            for i in range(10):
                with grpc.insecure_channel(f"unix:{listen}", options=OPTIONS) as channel:
                    for method in ("/test.Echo/Unary", "/test.Hooked/Unary"):
                        body = b"grow:3:%d" % i
                        want = body + bytes((j * 7 + 3) & 0xFF for j in range(3)) if "Hooked" in method else body
                        assert channel.unary_unary(method)(body, timeout=5) == want
        finally:
            lt.stop_busy()
            lt.call(transport.stop(0.5))


async def _start(kind: str, listen: str, backend: str) -> Transport:
    transport = make_transport(kind, listen, backend, RecordingInterceptor())
    await transport.start()
    return transport


async def test_relay_passes_server_bytes_that_arrive_before_the_connect_coroutine_resumes() -> None:
    """The order uvloop produces, made deterministic: upstream ``connection_made`` and then its
    ``data_received`` run before the relay's connect coroutine gets another turn."""
    session = session_mod.Session(RecordingInterceptor(), "/nonexistent", 1.0, lambda _s: None)
    down = FakeTransport()
    session.down = down  # as connection_made does, without starting the real connect
    session.data_received(w.PREFACE + w.settings())  # the client's first bytes, while connecting
    up = FakeTransport()
    upstream = session_mod._Upstream(session)
    upstream.connection_made(up)
    server_settings = w.settings([(w.SETTINGS_MAX_CONCURRENT_STREAMS, 100)])
    upstream.data_received(server_settings)
    assert bytes(down.data) == server_settings
    assert bytes(up.data) == w.PREFACE + w.settings()
    session.close()


def test_a_failing_relay_task_is_logged_and_ends_its_connection() -> None:
    """A bug in a connection's task must not vanish silently with the task."""

    async def scenario() -> tuple[bool, bool]:
        closed: list[session_mod.Session] = []
        session = session_mod.Session(RecordingInterceptor(), "/nonexistent", 1.0, closed.append)
        down = FakeTransport()
        session.down = down

        async def boom() -> None:
            raise RuntimeError("relay bug")

        task = session._spawn(boom())
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        return down.closed, closed == [session]

    assert asyncio.run(scenario()) == (True, True)

"""Attacks on the relay's memory, shared by ``test_relay_limits.py`` and ``h2_fuzz_long.py``.

``RelayProcess`` starts the transport suite's backend (``transport_backend.py``) and a relay
(``relay_child.py``) in processes of their own, from any source tree, so a test or a script can
read the relay's own memory. The attacks speak raw HTTP/2 over the relay's unix socket.

Run as a script (``python relay_attacks.py [--root TREE]``) it runs every attack once against the
relay of TREE (default: this checkout) and prints the relay's memory after each one.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from hpack import Encoder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = struct.Struct(">IBI")
MiB = 1024 * 1024
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.max_send_message_length", 64 * MiB)]


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return FRAME.pack((len(payload) << 8) | ftype, flags, sid) + payload


def request_block(enc: Encoder, path: str) -> bytes:
    return bytes(
        enc.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
    )


class RelayProcess:
    """A backend process and a relay process in front of it, in a fresh directory."""

    def __init__(self, root: str = ROOT, limits: dict[str, int] | None = None, *, backend: bool = True) -> None:
        self.root = root
        self.dir = tempfile.mkdtemp(prefix="rhp-h-", dir="/tmp")
        self.backend_path = os.path.join(self.dir, "backend.sock")
        self.path = os.path.join(self.dir, "relay.sock")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "devenv")])}
        script = os.path.join(root, "tests", "runtime_proxy", "cri", "transport_backend.py")
        # Without a backend the relay answers every call UNAVAILABLE (its refuse mode).
        argv = [sys.executable, script, self.backend_path] if backend else [sys.executable, "-c", "print('ready')"]
        self.backend = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._ready(self.backend)
        argv = [sys.executable, os.path.join(HERE, "relay_child.py"), self.path, self.backend_path]
        if limits:
            argv.append(json.dumps(limits))
        self.relay = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self._ready(self.relay)

    @staticmethod
    def _ready(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            raise RuntimeError(f"child did not start: {line!r}")

    def alive(self) -> bool:
        return self.relay.poll() is None

    def stats(self) -> dict[str, Any]:
        assert self.relay.stdin is not None and self.relay.stdout is not None
        self.relay.stdin.write(b"stats\n")
        self.relay.stdin.flush()
        row: dict[str, Any] = json.loads(self.relay.stdout.readline())
        return row

    def rss_mib(self) -> float:
        return float(self.stats()["rss_kib"]) / 1024

    def settle(self, connections: int = 0, timeout: float = 5.0) -> dict[str, Any]:
        """Stats once at most ``connections`` are open (the attacked one was read to its end)."""
        deadline = time.monotonic() + timeout
        row = self.stats()
        while row["connections"] > connections and time.monotonic() < deadline:
            time.sleep(0.05)
            row = self.stats()
        return row

    def close(self) -> None:
        for proc in (self.relay, self.backend):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def healthy_call(path: str, timeout: float = 10.0) -> bytes:
    """One pass-through and one intercepted call on a new connection; returns the echo."""
    with grpc.insecure_channel(f"unix:{path}", options=GRPC_OPTIONS) as channel:
        plain = channel.unary_unary("/test.Echo/Unary")(b"ping", timeout=timeout)
        hooked = channel.unary_unary("/test.Hooked/Unary")(b"hooked", timeout=timeout)
        assert hooked == b"hooked", hooked
        out: bytes = plain
        return out


class RawClient:
    """A raw HTTP/2 client that writes what it is told and reads only when asked."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(2.0)
        self.enc = Encoder()
        self.sent = 0
        self.sock.sendall(PREFACE + frame(0x4, 0, 0))

    def send(self, data: bytes) -> bool:
        """Write ``data``; False once the relay stops reading (2 s) or closes the connection."""
        try:
            self.sock.sendall(data)
        except (TimeoutError, OSError):
            return False
        self.sent += len(data)
        return True

    def goaway_code(self, timeout: float = 2.0) -> int | None:
        """Read until the connection ends; the error code of the GOAWAY seen, if any."""
        self.sock.settimeout(timeout)
        buf = bytearray()
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
        except (TimeoutError, OSError):
            pass
        pos = 0
        code = None
        while len(buf) - pos >= 9:
            lt, _flags, _sid = FRAME.unpack_from(buf, pos)
            end = pos + 9 + (lt >> 8)
            if end > len(buf):
                break
            if lt & 0xFF == 0x7:
                code = struct.unpack_from(">I", buf, pos + 13)[0]
            pos = end
        return code

    def close(self) -> None:
        self.sock.close()


def continuation_flood(path: str, total: int) -> RawClient:
    """HEADERS without END_HEADERS, then CONTINUATION frames of 16 KiB, up to ``total`` bytes."""
    c = RawClient(path)
    c.send(frame(0x1, 0, 1, request_block(c.enc, "/test.Echo/Unary")[:3]))
    chunk = frame(0x9, 0, 1, b"\x82" * 16384) * 16
    while c.sent < total and c.send(chunk):
        pass
    return c


def window_flood(path: str, total: int, method: str) -> RawClient:
    """One stream of ``method``, then DATA frames of 16 KiB that ignore every window; never reads."""
    c = RawClient(path)
    # The relay must keep reading until it has seen the window broken; a 2 s stall on a loaded
    # machine is not the end of the attack here.
    c.sock.settimeout(15.0)
    c.send(frame(0x1, 0x4, 1, request_block(c.enc, method)))
    body = b"\x00" + struct.pack(">I", 64 * MiB) + bytes(16384 - 5)
    c.send(frame(0x0, 0, 1, body))
    chunk = frame(0x0, 0, 1, bytes(16384)) * 16
    while c.sent < total and c.send(chunk):
        pass
    return c


def big_intercepted_calls(path: str, streams: int, size: int) -> list[str]:
    """``streams`` intercepted calls of ``size`` bytes at once on one connection; their codes."""
    with grpc.insecure_channel(f"unix:{path}", options=GRPC_OPTIONS) as channel:
        call = channel.unary_unary("/test.Hooked/Unary")
        payload = bytes(size)
        futures = [call.future(payload, timeout=120) for _ in range(streams)]
        codes = []
        for f in futures:
            try:
                f.result()
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(err.code().name)
        return codes


def while_healthy(path: str, attack: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``attack`` in a thread while healthy calls go on; (its result, healthy calls made)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(attack()), daemon=True)
    thread.start()
    calls = 0
    while thread.is_alive() or calls == 0:
        assert healthy_call(path) == b"ping"
        calls += 1
    thread.join()
    return (result[0] if result else None), calls


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=ROOT, help="source tree whose relay is attacked")
    args = parser.parse_args()
    attacks: list[tuple[str, bool, Callable[[str], Any]]] = [
        ("CONTINUATION without END_HEADERS, 400 MiB", True, lambda p: continuation_flood(p, 400 * MiB).close()),
        ("the same with the backend down", False, lambda p: continuation_flood(p, 400 * MiB).close()),
        ("8 intercepted calls of 40 MiB", True, lambda p: big_intercepted_calls(p, 8, 40 * MiB)),
        (
            "DATA past the window on a pass-through stream, never reading, 200 MiB",
            True,
            lambda p: window_flood(p, 200 * MiB, "/test.Echo/Bidi").close(),
        ),
        (
            "DATA on an intercepted stream, never reading, 200 MiB",
            True,
            lambda p: window_flood(p, 200 * MiB, "/test.Hooked/Unary").close(),
        ),
    ]
    print(f"relay of {args.root}")
    for name, backend, attack in attacks:
        relay = RelayProcess(args.root, backend=backend)
        try:
            if backend:
                healthy_call(relay.path)
            before = relay.stats()
            t0 = time.monotonic()
            attack(relay.path)
            after = relay.settle()
            if backend:
                healthy_call(relay.path)
            hits = {k: v for k, v in after.get("hits", {}).items() if v}
            print(
                f"{name:72} RSS {before['rss_kib'] / 1024:6.1f} -> peak {after['hwm_kib'] / 1024:6.1f} MiB"
                f" ({time.monotonic() - t0:5.1f} s), alive={relay.alive()}, hits={hits}"
            )
        finally:
            relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

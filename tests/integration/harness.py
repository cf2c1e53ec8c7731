"""Run a proxy for a test: in-process on its own event-loop thread (``ProxyThread``), or as a
real ``runtime-proxy serve`` process (``ProxyProcess``) for kill -9 and signal tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from runtime_proxy.commands.serve import Proxy, ProxyOptions

REPO = Path(__file__).resolve().parents[2]


def required_versions() -> set[str]:
    """containerd versions whose tests must fail, not skip, when the binaries are missing
    (``RHP_REQUIRE_CONTAINERD``, comma-separated; ``scripts/test.sh`` sets 1.6)."""
    return {v.strip() for v in os.environ.get("RHP_REQUIRE_CONTAINERD", "").split(",") if v.strip()}


def wait_for_socket(path: str, timeout: float = 60.0, *, exited: Callable[[], str] | None = None) -> None:
    """Wait until a CRI Version call through the socket succeeds (generous: on the shared 2 cores
    at a load of 15, the proxy's imports alone took 11 s); *exited* says why the server is gone
    ("" while it runs), so a server that died fails at once rather than at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited is not None and (why := exited()):
            raise RuntimeError(f"the server of {path} exited before it was ready: {why}")
        if os.path.exists(path):
            try:
                with grpc.insecure_channel(f"unix://{path}") as ch:
                    ch.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=1)
                return
            except grpc.RpcError:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"proxy socket {path} not ready")


def proxy_options(containerd: Any, tmp_path: Path, transport: str, **kw: Any) -> ProxyOptions:
    """Options for a test proxy in front of ``containerd``: no entry points, no built-ins, no hook
    servers and no reconciler unless ``kw`` asks for them."""
    defaults: dict[str, Any] = {
        "listen": str(tmp_path / "proxy.sock"),
        "backend": str(containerd.socket),
        "transport": transport,
        "entry_points": False,
        "builtins": (),
        "hook_servers": False,
        "reconcile": False,
        "grace": 2.0,
    }
    defaults.update(kw)
    return ProxyOptions(**defaults)


class ProxyThread:
    """A ``Proxy`` running on a private event loop in a daemon thread."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="proxy-loop")
        self.proxy: Proxy | None = None

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def __enter__(self) -> ProxyThread:
        self.thread.start()

        async def start() -> Proxy:
            proxy = Proxy(self.opts)
            await proxy.start()
            await asyncio.wait_for(proxy.ready.wait(), 20)
            return proxy

        self.proxy = self.call(start())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proxy is not None:
            self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class ProxyProcess:
    """``runtime-proxy serve`` as a child process."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, log: Path | None = None,
                 wrapper: list[str] | None = None) -> None:
        """*wrapper*: a command prefix for the child, e.g. ``PrivateNetns.command([])`` to run it in a
        network namespace."""
        self.args = args
        self.wrapper = wrapper or []
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, listen: str, *, timeout: float = 60.0) -> ProxyProcess:
        """Start it and wait (at most *timeout* seconds) until its socket answers."""
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*self.wrapper, sys.executable, "-m", "runtime_proxy.cli", "--log-format", "json", "--log-level",
             os.environ.get("RHP_LOG_LEVEL", "info"), "serve", "--listen", listen, *self.args],
            env=self.env,
            stdout=out,
            stderr=out,
        )
        try:
            wait_for_socket(listen, timeout, exited=self._exited)
        except BaseException:
            self.terminate(5.0)  # never leave a proxy that did not come up running
            raise
        return self

    def _exited(self) -> str:
        """"" while the child runs, else its exit status and the end of its log."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        tail = self.log.read_text(errors="replace")[-2000:] if self.log and self.log.exists() else ""
        return f"exit status {self.proc.returncode}\n{tail}"

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(5)
        return self.proc.returncode

"""Fixtures for the scheduler extender tests: a fake API server, the official client bound to
it, and an extender served by uvicorn on loopback."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # ``tests.fakeapi`` and ``tests.scheduler_ext.builders``

import kubernetes  # noqa: E402
import uvicorn  # noqa: E402

from rhp_kube.http import KubeHTTP  # noqa: E402
from rhp_kube.watch import Informer, WatchOptions  # noqa: E402
from scheduler_ext.extender import Binder, ExtenderConfig  # noqa: E402
from scheduler_ext.kube import BindClient, watch_cluster  # noqa: E402
from scheduler_ext.ledger import LeaseLedger  # noqa: E402
from scheduler_ext.requeue import Requeuer  # noqa: E402
from scheduler_ext.server import create_app  # noqa: E402
from scheduler_ext.state import ClusterState  # noqa: E402
from scheduler_ext.trust import Signer, Trust  # noqa: E402
from tests.fakeapi import FakeAPIServer  # noqa: E402

# the signing key every test extender shares, as the replicas of one deployment do
SIGNER = Signer.generate()
TRUST = Trust.of(SIGNER, ["koord-scheduler"])


def signing_key_file(directory: Path) -> Path:
    """``SIGNER``'s key as PEM in a file under ``directory`` (for ``scheduler-ext serve
    --signing-key-file``)."""
    path = directory / "signing.key"
    path.write_bytes(SIGNER.pem())
    return path


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()


def api_client(url: str) -> kubernetes.client.ApiClient:
    conf = kubernetes.client.Configuration()
    conf.host = url
    conf.connection_pool_maxsize = 32
    return kubernetes.client.ApiClient(conf)


def bind_client(url: str) -> BindClient:
    return BindClient(api_client(url), timeout=10)


@pytest.fixture
def official(api: FakeAPIServer) -> kubernetes.client.ApiClient:
    conf = kubernetes.client.Configuration()
    conf.host = api.url
    return kubernetes.client.ApiClient(conf)


@dataclass
class Extender:
    """An extender served over loopback HTTP, wired as ``scheduler-ext serve`` wires it."""

    url: str
    state: ClusterState
    binder: Binder
    watcher: Informer
    server: uvicorn.Server
    thread: threading.Thread

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.state.ready:
            if time.monotonic() > deadline:
                raise TimeoutError("extender cache did not sync")
            time.sleep(0.01)

    def stop(self) -> None:
        self.watcher.close()
        self.server.should_exit = True
        self.thread.join(5)


def start_extender(
    api_url: str,
    *,
    ledger: bool = False,
    identity: str = "test",
    cfg: ExtenderConfig | None = None,
    trust: Trust = TRUST,
    watch_timeout: int = 30,
    idle_timeout: float | None = None,
    stale_after: float | None = None,
    ledger_ttl: float = 120.0,
    wait: bool = True,
    requeue_rate: float = 0.0,
    dead_after: float = 300.0,
) -> Extender:
    client = api_client(api_url)
    bind_api = BindClient(client, timeout=10)
    state = ClusterState(trust)
    state.stale_after = stale_after
    options = WatchOptions(watch_timeout=watch_timeout, read_deadline=idle_timeout or watch_timeout + 30.0,
                           backoff_initial=0.05, backoff_max=1.0, dead_after=dead_after)
    watcher = watch_cluster(state, KubeHTTP(client, timeout=None), options)
    lease = (
        LeaseLedger(bind_api, "kube-system", identity=identity, ttl=ledger_ttl,
                    is_deleted=state.recently_deleted, settled=state.settled)
        if ledger
        else None
    )
    binder = Binder(state, bind_api, cfg or ExtenderConfig(), lease)
    requeuer = (Requeuer(bind_api, state.with_topology, rate=requeue_rate, interval=0.05,
                         fresh=lambda: not state.stale_kinds()) if requeue_rate else None)  # fmt: skip
    app = create_app(state, binder, cfg or ExtenderConfig(), requeuer=requeuer, liveness=watcher.liveness)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="httptools")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError("uvicorn did not start")
        time.sleep(0.01)
    ext = Extender(f"http://127.0.0.1:{port}", state, binder, watcher, server, thread)
    if wait:
        ext.wait_ready()
    return ext


@pytest.fixture
def extender(api: FakeAPIServer) -> Iterator[Extender]:
    ext = start_extender(api.url)
    try:
        yield ext
    finally:
        ext.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``cond`` every 10 ms until it holds; ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.01)


@pytest.fixture
def serve(api: FakeAPIServer) -> Iterator[Callable[..., Extender]]:
    """Start extenders against ``api`` (after creating ``objects`` there); all stopped at the end."""
    started: list[Extender] = []

    def _serve(objects: list[dict[str, Any]] = (), **kwargs: Any) -> Extender:  # type: ignore[assignment]
        for obj in objects:
            api.create(obj)
        ext = start_extender(api.url, **kwargs)
        started.append(ext)
        return ext

    yield _serve
    for ext in started:
        ext.stop()

"""The metrics endpoint's probes (``runtime_proxy.metrics.serve``): ``/healthz`` while the
process serves, ``/readyz`` from the command's readiness check, ``/metrics`` with
``rhp_build_info``, 404 elsewhere; and the proxy's readiness (``Proxy.readiness``): store rebuilt
and the runtime's socket accepting connections."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rhp_devenv.kube import free_port as _free_port

from rhp_ops import build
from runtime_proxy import metrics
from runtime_proxy.commands.serve import Proxy, ProxyOptions
from runtime_proxy.metrics import socket_accepts


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def state() -> dict[str, object]:
    return {"ready": False, "reason": "store not rebuilt"}


@pytest.fixture
def port(state: dict[str, object]) -> Iterator[int]:
    def readiness() -> tuple[bool, str]:
        if state.get("raise"):
            raise RuntimeError("boom")
        return bool(state["ready"]), str(state["reason"])

    server = metrics.serve(f"127.0.0.1:{_free_port()}", readiness)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("path", "method", "code", "body"),
    [
        pytest.param("/healthz", "GET", 200, "ok", id="healthz answers 200 while the process serves"),
        pytest.param("/readyz", "GET", 503, "store not rebuilt", id="readyz is 503 with the reason when not ready"),
        pytest.param("/metrics", "GET", 200, "rhp_build_info{", id="metrics carry the build info"),
        pytest.param("/", "GET", 404, "not found", id="the root is not found"),
        pytest.param("/anything/else", "GET", 404, "not found", id="another path is not found"),
        pytest.param("/readyz", "POST", 405, "not allowed", id="a POST is refused"),
    ],
)
def test_paths(port: int, path: str, method: str, code: int, body: str) -> None:
    got_code, got_body = _get(port, path, method)
    assert got_code == code and body in got_body


def test_readyz_follows_the_check(port: int, state: dict[str, object]) -> None:
    assert _get(port, "/readyz")[0] == 503
    state.update(ready=True, reason="ok")
    assert _get(port, "/readyz") == (200, "ok\n")
    state["raise"] = True
    code, body = _get(port, "/readyz")
    assert code == 503 and "readiness check failed: RuntimeError" in body


def test_build_info_names_version_python_and_commit(port: int) -> None:
    text = _get(port, "/metrics")[1]
    line = next(line for line in text.splitlines() if line.startswith("rhp_build_info{"))
    info = build.build_info()
    assert f'version="{info["version"]}"' in line and f'python="{info["python"]}"' in line
    assert f'commit="{info["commit"]}"' in line and 'component="runtime-proxy"' in line


@pytest.fixture
def short() -> Iterator[Path]:
    path = Path(f"/tmp/rhp-probe-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir()
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


async def test_proxy_is_ready_only_with_the_store_rebuilt_and_the_runtime_listening(short: Path) -> None:
    backend = short / "containerd.sock"
    proxy = Proxy(ProxyOptions(listen=str(short / "proxy.sock"), backend=str(backend), entry_points=False,
                               builtins=(), hook_servers=False, reconcile=False))
    assert proxy.readiness() == (False, "store not rebuilt from the runtime yet")
    proxy.ready.set()
    ready, reason = proxy.readiness()
    assert not ready and reason.startswith(f"runtime not reachable at {backend}: ")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(backend))
        listener.listen(8)
        assert proxy.readiness() == (True, "ok")
    ready, reason = proxy.readiness()  # the socket file is still there, nobody accepts
    assert not ready and "Connection refused" in reason


def test_socket_accepts_reports_why_not(short: Path) -> None:
    assert socket_accepts(str(short / "absent.sock")) == (False, "No such file or directory")
    (short / "file").write_text("")
    ok, why = socket_accepts(str(short / "file"))
    assert not ok and why

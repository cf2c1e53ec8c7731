"""``scheduler-ext serve`` over real TLS on loopback: kube-scheduler's request shapes with and
without a valid client certificate, and the rule that a reachable listener needs mutual TLS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from rhp_devenv.kube import free_port

from scheduler_ext import cli
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import cluster, pod
from tests.scheduler_ext.conftest import signing_key_file
from tests.scheduler_ext.tlscerts import PKI, client_context, make_pki

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class TLSExtender:
    proc: subprocess.Popen[bytes]
    url: str  # https://127.0.0.1:PORT
    health: str  # http://127.0.0.1:PORT of --health-listen


def spawn_tls(api_url: str, pki: PKI, *extra: str) -> TLSExtender:
    port, health_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_ext.cli", "serve", "--api-server", api_url, "--no-ha-ledger",
         "--signing-key-file", str(signing_key_file(pki.ca.parent)),
         "--listen", f"127.0.0.1:{port}", "--health-listen", f"127.0.0.1:{health_port}",
         "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
         "--tls-client-ca", str(pki.ca), "--log-level", "warning", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ext = TLSExtender(proc, f"https://127.0.0.1:{port}", f"http://127.0.0.1:{health_port}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{ext.health}/readyz", timeout=1).status_code == 200:
                return ext
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(ext)
    raise TimeoutError("extender did not become ready")


def stop(ext: TLSExtender) -> None:
    if ext.proc.poll() is None:
        os.kill(ext.proc.pid, signal.SIGTERM)
        try:
            ext.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(ext.proc.pid, signal.SIGKILL)
            ext.proc.wait()


@pytest.fixture
def tls_extender(api: FakeAPIServer, pki: PKI) -> Iterator[tuple[TLSExtender, dict[str, Any]]]:
    p = pod("web", cpu="2")
    for obj in [*cluster(["n1"]), p]:
        api.create(obj)
    ext = spawn_tls(api.url, pki)
    try:
        yield ext, p
    finally:
        stop(ext)


def scheduler_client(pki: PKI, cert: Path | None, key: Path | None) -> httpx.Client:
    """An HTTPS client as kube-scheduler configures it: caFile, and certFile/keyFile if given."""
    return httpx.Client(verify=client_context(pki, cert, key), timeout=10)


def test_a_client_with_a_certificate_from_the_trusted_ca_is_served(
    tls_extender: tuple[TLSExtender, dict[str, Any]], api: FakeAPIServer, pki: PKI
) -> None:
    ext, p = tls_extender
    with scheduler_client(pki, pki.client_cert, pki.client_key) as client:
        reply = client.post(f"{ext.url}/filter", json={"Pod": p, "Nodes": None, "NodeNames": ["n1"]})
        assert reply.status_code == 200 and reply.json()["NodeNames"] == ["n1"]
        scores = client.post(f"{ext.url}/prioritize", json={"Pod": p, "NodeNames": ["n1"]}).json()
        assert [s["Host"] for s in scores] == ["n1"]
        deadline = time.monotonic() + 10
        while True:  # the pod must be in the cache before bind can plan it
            bound = client.post(f"{ext.url}/bind", json={
                "PodName": "web", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"}).json()
            if bound["Error"] == "" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert bound == {"Error": ""}
    got = api.get("pods", "web", "default")
    assert got is not None and got["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    "who",
    [
        pytest.param("anonymous", id="a TLS client without a client certificate is refused in the handshake"),
        pytest.param("stranger", id="a client certificate from another CA is refused in the handshake"),
    ],
)
def test_clients_without_a_trusted_certificate_never_reach_a_verb(
    tls_extender: tuple[TLSExtender, dict[str, Any]], api: FakeAPIServer, pki: PKI, who: str
) -> None:
    ext, p = tls_extender
    cert, key = (None, None) if who == "anonymous" else (pki.other_cert, pki.other_key)
    with scheduler_client(pki, cert, key) as client, pytest.raises(httpx.TransportError):
        client.post(f"{ext.url}/bind", json={
            "PodName": "web", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"})
    got = api.get("pods", "web", "default")
    assert got is not None and "nodeName" not in got["spec"]


def test_plain_http_to_the_tls_port_is_refused(
    tls_extender: tuple[TLSExtender, dict[str, Any]], api: FakeAPIServer
) -> None:
    ext, p = tls_extender
    with pytest.raises(httpx.TransportError):
        httpx.post(ext.url.replace("https:", "http:") + "/bind", timeout=10, json={
            "PodName": "web", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"})
    got = api.get("pods", "web", "default")
    assert got is not None and "nodeName" not in got["spec"]


def test_the_health_listener_serves_probes_but_no_verbs(
    tls_extender: tuple[TLSExtender, dict[str, Any]]
) -> None:
    ext, _ = tls_extender
    assert httpx.get(f"{ext.health}/healthz").text == "ok"
    assert "scheduler_ext_ready 1.0" in httpx.get(f"{ext.health}/metrics").text
    reply = httpx.post(f"{ext.health}/bind", json={"PodName": "web", "PodNamespace": "default", "Node": "n1"})
    assert reply.status_code in (404, 405)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler_ext.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(["--listen", "0.0.0.0:8888"], "without --tls-cert, --tls-key and --tls-client-ca",
                     id="all interfaces in plain HTTP are refused"),
        pytest.param(["--listen", "[::]:8888"], "without --tls-cert, --tls-key and --tls-client-ca",
                     id="all IPv6 interfaces in plain HTTP are refused"),
        pytest.param(["--listen", "10.1.2.3:8888", "--tls-cert", "{cert}", "--tls-key", "{key}"],
                     "--tls-client-ca", id="server TLS without client certificates is refused off loopback"),
        pytest.param(["--listen", "127.0.0.1:8888", "--tls-key", "{key}"], "go together",
                     id="a key without a certificate is refused"),
        pytest.param(["--listen", "127.0.0.1:8888", "--tls-cert", "{cert}", "--tls-key", "/nonexistent/key"],
                     "cannot load --tls-cert/--tls-key", id="an unreadable key is a message"),
        pytest.param(["--listen", "nonsense"], "HOST:PORT", id="a listen address without a port is refused"),
    ],
)
def test_serve_refuses_unsafe_or_broken_listeners(pki: PKI, flags: list[str], message: str) -> None:
    args = [f.format(cert=pki.server_cert, key=pki.server_key) for f in flags]
    done = run_cli("serve", "--api-server", "http://127.0.0.1:9", *args)
    assert done.returncode == cli.EXIT_USAGE
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


# Runs ``cli.main`` in a child process whose serving coroutine is replaced by a recorder, so
# the test never listens beyond loopback and the child's logging setup stays out of pytest.
_RECORDING_SERVE = """
import sys
from scheduler_ext import cli

async def record(main_server, health):
    print("serving", main_server.config.host, main_server.config.ssl_certfile, flush=True)
    main_server.started = True

cli._serve_all = record
raise SystemExit(cli.main(sys.argv[1:]))
"""


def test_insecure_serves_a_reachable_listener_and_warns(api: FakeAPIServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RECORDING_SERVE, "serve", "--api-server", api.url, "--listen", "0.0.0.0:8888",
         "--insecure", "--no-ha-ledger", "--signing-key-file", str(signing_key_file(tmp_path))],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == cli.EXIT_OK
    assert done.stdout == "serving 0.0.0.0 None\n"
    assert "INSECURE" in done.stderr and "bind pending pods" in done.stderr


def test_serve_without_flags_serves_on_its_default_listen_address(api: FakeAPIServer, tmp_path: Path) -> None:
    """The default --listen is one serve accepts (loopback, plain HTTP), not one it refuses
    (the API server and the signing key are the only things it must be told)."""
    done = subprocess.run([sys.executable, "-c", _RECORDING_SERVE, "serve", "--api-server", api.url, "--no-ha-ledger",
                           "--signing-key-file", str(signing_key_file(tmp_path))],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == cli.EXIT_OK, done.stderr
    assert done.stdout == "serving 127.0.0.1 None\n"
    assert "INSECURE" not in done.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        pytest.param("127.0.0.1", True, id="127.0.0.1 is loopback"),
        pytest.param("127.8.9.10", True, id="all of 127/8 is loopback"),
        pytest.param("::1", True, id="IPv6 ::1 is loopback"),
        pytest.param("localhost", True, id="localhost is loopback"),
        pytest.param("0.0.0.0", False, id="the wildcard address is not loopback"),
        pytest.param("::", False, id="the IPv6 wildcard is not loopback"),
        pytest.param("scheduler-ext.example", False, id="a name counts as reachable"),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert cli.is_loopback(host) is loopback

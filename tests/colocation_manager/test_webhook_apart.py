"""The manager's webhook runs apart from its elector (issue 32 item 5): ``scheduler-ext manager``
as a process against the in-process fake API server, its webhook on loopback.

- Reviews that take long (the review made to sleep, as a huge or costly pod would make it) and a
  flood of idle connections do not stop the Lease from being renewed: the webhook has its own
  thread and event loop. On the old code the webhook shared the elector's loop and the first
  slow review stopped every renewal.
- Beyond ``--webhook-max-inflight`` reviews in flight, a request gets 503 at once.
- A certificate whose files are replaced is the one presented at the next TLS handshake, with no
  restart (the old code loaded the files once).
- With ``--webhook-cert-secret`` (the chart's default without cert-manager) the manager issues
  the certificate into its Secret and the CA into the webhook configuration's caBundle, serves
  it, and a BE pod's review gets the extended-resource-spec the node agent reads.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.kube import free_port as _free_port

from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.tlscerts import make_pki

pytestmark = pytest.mark.timeout(240)

LEASE_NS, LEASE = "default", "rhp-manager"
MAX_INFLIGHT = 2
SLOW_SECONDS = 90
# The manager with every review sleeping SLOW_SECONDS first (a review that costs that long).
WRAPPER = f"""
import sys, time
import colocation_manager.webhook as w
_review = w.review
def slow(*args, **kwargs):
    time.sleep({SLOW_SECONDS})
    return _review(*args, **kwargs)
w.review = slow
from scheduler_ext.entry import main
sys.exit(main(sys.argv[1:]))
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a manager process: SIGTERM, then SIGKILL when it is still there 30 s later."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


_MANAGERS: list[Manager] = []


@dataclass
class Manager:
    api: FakeAPIServer
    proc: subprocess.Popen[bytes]
    port: int
    cert: Path
    key: Path
    pki_dir: Path

    def renew_time(self) -> str:
        lease = self.api.get("Lease", LEASE, LEASE_NS)
        return str((lease or {}).get("spec", {}).get("renewTime", ""))


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    work = tmp_path_factory.mktemp("webhook-apart")
    (work / "pki").mkdir()
    pki = make_pki(work / "pki")
    cert, key = work / "serving.crt", work / "serving.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    port = _free_port()
    with FakeAPIServer() as api:
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: f, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: f, user: u}}]\n")
        log = (work / "manager.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, "manager", f"--kubeconfig={kubeconfig}", f"--lease-namespace={LEASE_NS}",
             f"--lease-name={LEASE}", "--identity=only", f"--webhook-listen=127.0.0.1:{port}",
             f"--webhook-cert={cert}", f"--webhook-key={key}", f"--webhook-max-inflight={MAX_INFLIGHT}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            _MANAGERS.append(Manager(api, proc, port, cert, key, work / "pki"))
            yield _MANAGERS[-1]
        finally:
            _stop(proc)
            log.close()


def _tls_connect(port: int) -> ssl.SSLSocket:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return context.wrap_socket(raw, server_hostname="rhp-manager.kube-system.svc")


def _served_cert(port: int) -> bytes:
    with _tls_connect(port) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def _send_review(port: int) -> ssl.SSLSocket:
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}'
    conn = _tls_connect(port)
    conn.sendall(b"POST /mutate-pod HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    return conn


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_slow_reviews_and_idle_connections_do_not_stop_the_lease_renewals(manager: Manager) -> None:
    _wait("the webhook's first handshake", lambda: _try(lambda: _served_cert(manager.port)), timeout=90)
    first = _wait("the Lease held", manager.renew_time, timeout=90)
    idle = [socket.create_connection(("127.0.0.1", manager.port), timeout=30) for _ in range(100)]
    slow = [_send_review(manager.port) for _ in range(MAX_INFLIGHT)]
    try:
        time.sleep(1)  # the slow reviews are in flight (they sleep SLOW_SECONDS)
        seen = {first}
        # Renewed every 2 s by the elector; at least two new renewals while the reviews hang.

        def renewed_twice() -> bool:
            seen.add(manager.renew_time())
            return len(seen) >= 3

        _wait("two Lease renewals while reviews hang", renewed_twice, timeout=SLOW_SECONDS / 2)
        # One more review: refused at once, not queued behind the slow ones.
        with _send_review(manager.port) as extra:
            extra.settimeout(30)
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    finally:
        for s in idle + slow:
            s.close()
    assert manager.proc.poll() is None


def _try(fn: Callable[[], Any]) -> Any:
    assert _MANAGERS[-1].proc.poll() is None, "the manager exited (see manager.log in the test's directory)"
    try:
        return fn()
    except OSError:
        return None


def test_a_replaced_certificate_is_served_at_the_next_handshake(manager: Manager) -> None:
    old = _wait("the webhook's first handshake", lambda: _try(lambda: _served_cert(manager.port)), timeout=90)
    assert old == _der(manager.cert)
    (manager.pki_dir.parent / "renewed").mkdir()
    renewed = make_pki(manager.pki_dir.parent / "renewed")
    # A Secret volume's update: new files in place of the old (here renamed over them).
    for src, dst in ((renewed.server_key, manager.key), (renewed.server_cert, manager.cert)):
        tmp = dst.with_suffix(".new")
        shutil.copy(src, tmp)
        tmp.replace(dst)
    assert _served_cert(manager.port) == _der(renewed.server_cert) != old
    # A broken replacement keeps the renewed certificate served.
    manager.cert.write_text("not a certificate\n")
    assert _served_cert(manager.port) == _der(renewed.server_cert)


def test_the_manager_issues_its_certificate_and_the_api_server_can_trust_it(tmp_path: Path) -> None:
    import base64
    import json

    port = _free_port()
    with FakeAPIServer() as api:
        api.register("", "v1", "secrets", "Secret", True)
        api.register("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                     "MutatingWebhookConfiguration", False)
        api.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": "hook-cert", "namespace": LEASE_NS}})
        api.create({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                    "metadata": {"name": "hook"}, "webhooks": [
                        {"name": "pods.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                         "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate-pod"}}]})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: f, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: f, user: u}}]\n")
        with (tmp_path / "manager.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler_ext.entry", "manager", f"--kubeconfig={kubeconfig}",
                 f"--lease-namespace={LEASE_NS}", "--identity=only", f"--webhook-listen=127.0.0.1:{port}",
                 "--webhook-cert-secret=hook-cert", f"--webhook-cert-namespace={LEASE_NS}",
                 f"--webhook-cert-dir={tmp_path / 'certs'}", "--webhook-ip=127.0.0.1",
                 "--webhook-configuration=hook"], stdout=log, stderr=subprocess.STDOUT)
            try:
                def ca_bundle() -> str:
                    assert proc.poll() is None, (tmp_path / "manager.log").read_text()[-2000:]
                    hook = api.get("MutatingWebhookConfiguration", "hook") or {}
                    return str(hook["webhooks"][0]["clientConfig"].get("caBundle", ""))

                ca = base64.b64decode(_wait("the caBundle written", ca_bundle, timeout=90)).decode()
                secret = api.get("Secret", "hook-cert", LEASE_NS) or {}
                assert set(secret.get("data", {})) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
                # What the API server does: trust the caBundle and check the address it dials.
                context = ssl.create_default_context(cadata=ca)
                batch = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"}
                review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                    "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "default",
                    "operation": "CREATE", "object": {
                        "metadata": {"name": "be", "labels": {"koordinator.sh/qosClass": "BE"}},
                        "spec": {"containers": [{"name": "app", "resources": {"requests": batch,
                                                                               "limits": batch}}]}}}}).encode()

                def answer() -> bytes | None:
                    try:
                        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
                    except OSError:
                        return None
                    with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                        conn.sendall(b"POST /mutate-pod HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
                                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                     % (len(review), review))
                        data = b""
                        while chunk := conn.recv(65536):
                            data += chunk
                    return data

                reply = _wait("the webhook's answer", answer, timeout=60)
                assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
                response = json.loads(reply.split(b"\r\n\r\n", 1)[1])["response"]
                ops = json.loads(base64.b64decode(response["patch"]))
                annotations = ops[0]["value"]
                assert json.loads(annotations["node.koordinator.sh/extended-resource-spec"]) == {
                    "containers": {"app": {"requests": batch, "limits": batch}}}
            finally:
                _stop(proc)

"""The webhook's certificate without cert-manager (``colocation_manager.certs``): the keeper
issues a CA and a serving certificate into its Secret, writes the pair to files and the CA into
the webhook configuration's caBundle; renews the serving certificate (same CA) and the CA (the
bundle keeps the old CA while it is valid) in the last third of their lifetimes; a lost race
writes nothing; Secret data that is hostile (not base64, too large, not PEM, keys of other
certificates) is replaced, never trusted."""

from __future__ import annotations

import asyncio
import base64
import copy
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from colocation_manager.certs import DAY, Bundle, CertKeeper, issue, parse_secret, renewal_reason, secret_data
from rhp_kube.errors import ConflictError

NS, SECRET, HOOK = "rhp-system", "rhp-webhook-cert", "rhp-webhook"
DNS = ["rhp-manager.rhp-system.svc"]
IPS = ["127.0.0.1"]
T0 = time.time()  # handshakes check validity against the real clock


class FakeCertAPI:
    def __init__(self) -> None:
        self.secret: dict[str, Any] = {"metadata": {"name": SECRET, "namespace": NS, "resourceVersion": "1"},
                                       "type": "Opaque", "data": {}}
        self.hook: dict[str, Any] = {"metadata": {"name": HOOK}, "webhooks": [
            {"name": "pods.rhp", "clientConfig": {"url": "https://127.0.0.1/mutate-pod"}},
            {"name": "more.rhp", "clientConfig": {"url": "https://127.0.0.1/mutate-pod"}}]}
        self.replaces = 0
        self.conflict_next = False

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        assert (namespace, name) == (NS, SECRET)
        return copy.deepcopy(self.secret)

    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.conflict_next or body["metadata"].get("resourceVersion") != self.secret["metadata"]["resourceVersion"]:
            self.conflict_next = False
            raise ConflictError(409, "the object has been modified")
        self.replaces += 1
        self.secret = copy.deepcopy(dict(body))
        self.secret["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.secret)

    async def get_mutating_webhook(self, name: str) -> dict[str, Any]:
        assert name == HOOK
        return copy.deepcopy(self.hook)

    async def patch_mutating_webhook(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        by_name = {h["name"]: h for h in self.hook["webhooks"]}
        for h in patch["webhooks"]:
            by_name[h["name"]]["clientConfig"].update(h["clientConfig"])
        return copy.deepcopy(self.hook)


def _keeper(api: FakeCertAPI, tmp_path: Path, now: list[float]) -> CertKeeper:
    return CertKeeper(api, NS, SECRET, dns_names=DNS, ips=IPS, cert_dir=str(tmp_path / "certs"), webhooks=[HOOK],
                      ca_days=30, cert_days=3, wall=lambda: now[0])


def _ca_bundle(api: FakeCertAPI) -> set[str]:
    return {h["clientConfig"].get("caBundle", "") for h in api.hook["webhooks"]}


def _handshake(keeper: CertKeeper, ca_pem: bytes, hostname: str) -> None:
    """A TLS handshake against the keeper's files, verified with the caBundle and ``hostname``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(keeper.cert_path, keeper.key_path)
    client_ctx = ssl.create_default_context(cadata=ca_pem.decode())
    listener = socket.create_server(("127.0.0.1", 0))
    errors: list[BaseException] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=30) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=hostname) as tls:
            tls.sendall(b"x")
    finally:
        thread.join(30)
        listener.close()


def _verifies(cert_pem: bytes, ca_pem: bytes, at: float, hostname: str = DNS[0]) -> None:
    """What the API server checks, at a chosen time: the chain to the caBundle and the name."""
    import datetime

    verifier = (PolicyBuilder().store(Store(x509.load_pem_x509_certificates(ca_pem)))
                .time(datetime.datetime.fromtimestamp(at, datetime.UTC)).build_server_verifier(x509.DNSName(hostname)))
    verifier.verify(x509.load_pem_x509_certificate(cert_pem), [])


def test_the_first_round_issues_writes_the_files_and_the_ca_bundle(tmp_path: Path) -> None:
    api, now = FakeCertAPI(), [T0]
    keeper = _keeper(api, tmp_path, now)
    assert asyncio.run(keeper.round())
    bundle = parse_secret(api.secret)
    assert bundle is not None and renewal_reason(bundle, DNS, IPS, T0) == ""
    assert keeper.cert_path.read_bytes() == bundle.cert and keeper.key_path.read_bytes() == bundle.key
    assert oct(keeper.key_path.stat().st_mode & 0o777) == "0o600"
    assert _ca_bundle(api) == {base64.b64encode(bundle.ca_cert).decode()}
    # What the API server does: trust the caBundle, check the name it dials.
    _handshake(keeper, bundle.ca_cert, DNS[0])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(keeper, bundle.ca_cert, "someone-else.svc")
    # A second round changes nothing.
    assert asyncio.run(keeper.round()) and api.replaces == 1


def test_renewal_in_the_last_third_keeps_the_ca_then_rotates_it_with_the_old_one_bundled(tmp_path: Path) -> None:
    api, now = FakeCertAPI(), [T0]
    keeper = _keeper(api, tmp_path, now)
    asyncio.run(keeper.round())
    first = parse_secret(api.secret)
    assert first is not None
    now[0] = T0 + 1.9 * DAY  # serving cert (3 days) still has more than a third left
    asyncio.run(keeper.round())
    assert parse_secret(api.secret) == first
    now[0] = T0 + 2.1 * DAY
    asyncio.run(keeper.round())
    second = parse_secret(api.secret)
    assert second is not None and second.cert != first.cert and second.ca_cert == first.ca_cert
    assert keeper.cert_path.read_bytes() == second.cert
    now[0] = T0 + 20.5 * DAY  # the CA (30 days) is in its last third: a new CA, the old one bundled
    asyncio.run(keeper.round())
    third = parse_secret(api.secret)
    assert third is not None and third.ca_key != first.ca_key
    assert third.ca_cert.endswith(first.ca_cert) and third.ca_cert != first.ca_cert
    _verifies(keeper.cert_path.read_bytes(), third.ca_cert, now[0])
    # The old CA stays in the bundle: a certificate it signed (a replica whose files have not
    # caught up yet) is still trusted while it is valid.
    _verifies(second.cert, third.ca_cert, T0 + 3 * DAY)


def test_a_lost_race_writes_nothing_and_the_winner_is_read_next_round(tmp_path: Path) -> None:
    api, now = FakeCertAPI(), [T0]
    keeper = _keeper(api, tmp_path, now)
    api.conflict_next = True
    assert not asyncio.run(keeper.round())
    assert not keeper.cert_path.exists()
    winner = issue(None, DNS, IPS, T0)
    api.secret["data"] = secret_data(winner)
    assert asyncio.run(keeper.round())
    assert keeper.cert_path.read_bytes() == winner.cert and api.replaces == 0


def test_a_missing_name_is_a_reason_to_renew() -> None:
    bundle = issue(None, DNS, [], T0)
    assert renewal_reason(bundle, DNS, [], T0) == ""
    assert "lacks a name" in renewal_reason(bundle, DNS, IPS, T0)


def _mixed() -> Bundle:
    a, b = issue(None, DNS, IPS, T0), issue(None, DNS, IPS, T0)
    return Bundle(a.ca_cert, a.ca_key, a.cert, b.key)


@pytest.mark.parametrize("data", [
    pytest.param({}, id="empty"),
    pytest.param({"tls.crt": "!!!", "tls.key": "x", "ca.crt": "x", "ca.key": "x"}, id="not-base64"),
    pytest.param({k: base64.b64encode(b"A" * (1 << 20)).decode() for k in ("tls.crt", "tls.key", "ca.crt", "ca.key")},
                 id="too-large"),
    pytest.param({k: base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").decode()
                  for k in ("tls.crt", "tls.key", "ca.crt", "ca.key")}, id="not-pem"),
    pytest.param(secret_data(_mixed()), id="key-of-another-certificate"),
    pytest.param({"tls.crt": 7, "tls.key": None, "ca.crt": [], "ca.key": {}}, id="wrong-types"),
])
def test_hostile_secret_data_is_replaced(tmp_path: Path, data: dict[str, Any]) -> None:
    api, now = FakeCertAPI(), [T0]
    api.secret["data"] = data
    keeper = _keeper(api, tmp_path, now)
    assert asyncio.run(keeper.round())
    bundle = parse_secret(api.secret)
    assert bundle is not None and renewal_reason(bundle, DNS, IPS, T0) == "" and api.replaces == 1

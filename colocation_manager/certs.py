"""The pod webhook's serving certificate without cert-manager: a CA and a serving certificate
kept in one Secret, renewed before they expire, written to files the webhook reloads, and the
CA written into the caBundle of the webhook configurations.

Who calls this: ``colocation_manager.cli`` runs ``CertKeeper.run`` beside the elector when
``--webhook-cert-secret`` is given (the chart's default where cert-manager is absent). Every
replica runs it: a write is a replace guarded by the Secret's ``resourceVersion``, so when two
replicas renew at once one wins and the other reads the winner's certificate at its next round;
every replica writes the Secret's certificate to its own files (``--webhook-cert-dir``), which
``colocation_manager.serving.ReloadingCertificate`` serves from the next TLS handshake on.

Rules (``renewal_reason``, pure):

- no certificate, one that does not parse, one whose key is not its own, or one missing a name
  the webhook is reached by: issue a new one;
- a serving certificate with less than a third of its lifetime left: issue a new one from the
  same CA;
- a CA with less than a third of its lifetime left: a new CA, and the caBundle holds the new and
  the old CA until the old one expires, so replicas still serving the old certificate are
  trusted while their files catch up.

The Secret's data (``tls.crt``, ``tls.key``, ``ca.crt``, ``ca.key``) is input like any other: each
value is bounded (``MAX_PEM_BYTES``) before it is decoded, and what does not parse is replaced.
Keys are ECDSA P-256; certificates use SHA-256.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
import ipaddress
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rhp_kube.errors import APIError, ConflictError

__all__ = ["MAX_PEM_BYTES", "Bundle", "CertAPI", "CertKeeper", "issue", "parse_secret", "renewal_reason",
           "secret_data"]

log = structlog.get_logger("colocation_manager.certs")

MAX_PEM_BYTES = 64 << 10
MAX_CA_CERTS = 4
DAY = 86400.0


@dataclass(frozen=True)
class Bundle:
    """A CA (its certificates, the current one first, and its key) and a serving pair, PEM."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


class CertAPI(Protocol):
    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def get_mutating_webhook(self, name: str) -> dict[str, Any]: ...
    async def patch_mutating_webhook(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _names(dns_names: Sequence[str], ips: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    out += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return out


def _new_ca(now: float, days: float) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"runtime-hook-proxy webhook CA {int(now)}")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(now - 300)).not_valid_after(_utc(now + days * DAY))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _serving(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, dns_names: Sequence[str],
             ips: Sequence[str], now: float, days: float) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(dns_names) or list(ips) or ["webhook"])[0])])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(now - 300)).not_valid_after(_utc(min(now + days * DAY,
                                                                          ca.not_valid_after_utc.timestamp())))
            .add_extension(x509.SubjectAlternativeName(_names(dns_names, ips)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _remaining(cert: x509.Certificate, now: float) -> float:
    """The fraction of the certificate's lifetime still ahead at ``now`` (0 when expired)."""
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    return max(0.0, (end - now) / (end - start)) if end > start else 0.0


@dataclass(frozen=True)
class _Parsed:
    cas: list[x509.Certificate]
    ca_key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _parse(bundle: Bundle) -> _Parsed | None:
    try:
        cas = x509.load_pem_x509_certificates(bundle.ca_cert)
        ca_key = serialization.load_pem_private_key(bundle.ca_key, password=None)
        cert = x509.load_pem_x509_certificate(bundle.cert)
        key = serialization.load_pem_private_key(bundle.key, password=None)
    except (ValueError, TypeError):
        return None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if not cas or len(cas) > MAX_CA_CERTS:
        return None
    return _Parsed(cas, ca_key, cert, key)


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(cert.public_key().public_bytes(serialization.Encoding.DER, pub)
                == key.public_key().public_bytes(serialization.Encoding.DER, pub))


def renewal_reason(bundle: Bundle | None, dns_names: Sequence[str], ips: Sequence[str], now: float) -> str:
    """Why a new serving certificate (or CA) is needed; "" when ``bundle`` is good."""
    parsed = _parse(bundle) if bundle is not None else None
    if parsed is None:
        return "no certificate" if bundle is None else "the certificate does not parse"
    if not _same_key(parsed.cas[0], parsed.ca_key) or not _same_key(parsed.cert, parsed.key):
        return "a key is not its certificate's"
    if parsed.cert.issuer != parsed.cas[0].subject:
        return "the serving certificate is not the current CA's"
    try:
        san = parsed.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the serving certificate names nobody"
    if set(_names(dns_names, ips)) - set(san):
        return "the serving certificate lacks a name the webhook is reached by"
    if _remaining(parsed.cas[0], now) < 1 / 3:
        return "the CA is in the last third of its lifetime"
    if _remaining(parsed.cert, now) < 1 / 3:
        return "the serving certificate is in the last third of its lifetime"
    return ""


def issue(old: Bundle | None, dns_names: Sequence[str], ips: Sequence[str], now: float, *,
          ca_days: float = 3650, cert_days: float = 365) -> Bundle:
    """A bundle that ``renewal_reason`` finds good at ``now``: the old CA kept while it has more
    than a third of its lifetime left, else a new CA bundled with the old ones still valid."""
    parsed = _parse(old) if old is not None else None
    keep = [c for c in (parsed.cas if parsed else []) if c.not_valid_after_utc.timestamp() > now]
    if parsed is not None and _same_key(parsed.cas[0], parsed.ca_key) and _remaining(parsed.cas[0], now) >= 1 / 3:
        ca, ca_key, older = parsed.cas[0], parsed.ca_key, keep[1:] if keep and keep[0] == parsed.cas[0] else keep
    else:
        ca, ca_key = _new_ca(now, ca_days)
        older = keep[: MAX_CA_CERTS - 1]
    cert, key = _serving(ca, ca_key, dns_names, ips, now, cert_days)
    pem = serialization.Encoding.PEM
    return Bundle(b"".join(c.public_bytes(pem) for c in [ca, *older]), _key_pem(ca_key), cert.public_bytes(pem),
                  _key_pem(key))


_FIELDS = {"ca.crt": "ca_cert", "ca.key": "ca_key", "tls.crt": "cert", "tls.key": "key"}


def parse_secret(secret: Mapping[str, Any] | None) -> Bundle | None:
    """The bundle in a Secret's data; None when a key is missing, too large or not base64."""
    data = secret.get("data") if isinstance(secret, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    values: dict[str, bytes] = {}
    for key, attr in _FIELDS.items():
        raw = data.get(key)
        if not isinstance(raw, str) or not raw or len(raw) > MAX_PEM_BYTES * 4 // 3 + 4:
            return None
        try:
            values[attr] = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            return None
    return Bundle(**values)


def secret_data(bundle: Bundle) -> dict[str, str]:
    return {key: base64.b64encode(getattr(bundle, attr)).decode() for key, attr in _FIELDS.items()}


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class CertKeeper:
    """Keeps the Secret ``namespace/secret`` holding a good bundle for ``dns_names`` and ``ips``,
    its serving pair in ``cert_dir`` (``tls.crt``, ``tls.key``) and its CA in the caBundle of
    every webhook of the MutatingWebhookConfigurations ``webhooks``."""

    def __init__(self, api: CertAPI, namespace: str, secret: str, *, dns_names: Sequence[str], ips: Sequence[str],
                 cert_dir: str, webhooks: Sequence[str] = (), ca_days: float = 3650, cert_days: float = 365,
                 wall: Callable[[], float] = time.time) -> None:
        self.api, self.namespace, self.secret = api, namespace, secret
        self.dns_names, self.ips, self.webhooks = list(dns_names), list(ips), list(webhooks)
        self.cert_dir = Path(cert_dir)
        self.ca_days, self.cert_days, self.wall = ca_days, cert_days, wall
        self.cert_path, self.key_path = self.cert_dir / "tls.crt", self.cert_dir / "tls.key"
        self.serving: Bundle | None = None  # what the files hold

    async def round(self) -> bool:
        """Read the Secret, renew what is due (a lost race is read next round), write the files
        and the caBundles; True when the files hold a certificate afterwards."""
        secret = await self.api.get_secret(self.namespace, self.secret)
        bundle = parse_secret(secret)
        reason = renewal_reason(bundle, self.dns_names, self.ips, self.wall())
        if reason:
            new = issue(bundle, self.dns_names, self.ips, self.wall(), ca_days=self.ca_days, cert_days=self.cert_days)
            raw_meta = secret.get("metadata")
            meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
            body = {"apiVersion": "v1", "kind": "Secret", "type": secret.get("type") or "Opaque",
                    "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels",
                                                      "annotations") if k in meta},
                    "data": secret_data(new)}
            try:
                await self.api.replace_secret(self.namespace, self.secret, body)
            except ConflictError:
                log.info("webhook certificate renewed by another replica; reading it next round")
                return self.serving is not None
            log.info("webhook certificate issued", secret=f"{self.namespace}/{self.secret}", reason=reason)
            bundle = new
        assert bundle is not None
        if bundle != self.serving:
            self.cert_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.key_path, bundle.key, 0o600)
            _write_atomic(self.cert_path, bundle.cert, 0o644)
            self.serving = bundle
        ca = base64.b64encode(bundle.ca_cert).decode()
        for name in self.webhooks:
            config = await self.api.get_mutating_webhook(name)
            raw_hooks = config.get("webhooks")
            hooks: list[Any] = raw_hooks if isinstance(raw_hooks, list) else []
            stale = [h["name"] for h in hooks if isinstance(h, Mapping) and isinstance(h.get("name"), str)
                     and (h.get("clientConfig") or {}).get("caBundle") != ca]
            if stale:
                await self.api.patch_mutating_webhook(name, {"webhooks": [
                    {"name": n, "clientConfig": {"caBundle": ca}} for n in stale]})
                log.info("webhook caBundle written", configuration=name, webhooks=stale)
        return True

    async def run(self, stop: asyncio.Event, period: float = 60.0, first: asyncio.Event | None = None) -> None:
        """A round every ``period`` seconds (every 2 s until the first succeeds) until ``stop``;
        ``first`` is set once the files hold a certificate."""
        while not stop.is_set():
            ok = False
            try:
                ok = await self.round()
            except APIError as exc:
                log.warning("webhook certificate round failed", secret=f"{self.namespace}/{self.secret}",
                            error=str(exc)[:300])
            except OSError as exc:
                log.warning("webhook certificate files not written", dir=str(self.cert_dir), error=str(exc)[:300])
            if ok and first is not None:
                first.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period if ok else 2.0)

"""Throwaway certificate authorities and certificates for TLS tests, made with the openssl CLI.

``make_pki(directory)`` writes a CA, a server certificate for 127.0.0.1 and a client
certificate signed by that CA, plus a second, unrelated CA with its own client certificate
(a caller the extender must refuse). Keys are P-256 and live one day. The extensions follow
what strict verifiers ask for (CA basic constraints and key usage, key identifiers), so both
Python's default client context and the extender's server context accept the good chain.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PKI", "client_context", "make_pki"]

_CA_EXT = [
    "-addext", "basicConstraints=critical,CA:TRUE",
    "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    "-addext", "subjectKeyIdentifier=hash",
]


@dataclass(frozen=True)
class PKI:
    ca: Path  # CA the extender trusts for client certificates, and that signed its own cert
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by ``ca``: what kube-scheduler presents
    client_key: Path
    other_ca: Path  # an unrelated CA
    other_cert: Path  # a client certificate signed by ``other_ca``
    other_key: Path


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", f"/CN={name}", *_CA_EXT)
    return crt, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    crt, key, csr, extfile = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    extfile.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n" + ext + "\n"
    )
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-out", str(crt), "-days", "1", "-extfile", str(extfile))
    return crt, key


def make_pki(d: Path) -> PKI:
    ca = _ca(d, "ca")
    server = _leaf(d, "server", ca, "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost")
    client = _leaf(d, "kube-scheduler", ca, "extendedKeyUsage=clientAuth")
    other = _ca(d, "other-ca")
    stranger = _leaf(d, "stranger", other, "extendedKeyUsage=clientAuth")
    return PKI(ca[0], server[0], server[1], client[0], client[1], other[0], stranger[0], stranger[1])


def client_context(pki: PKI, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """What an HTTPS client with ``caFile`` = the extender's CA and an optional client cert uses."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx

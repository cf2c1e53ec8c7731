"""Where the extenders' signing key and the public keys come from: files, or a Secret and a
ConfigMap the extender keeps in its namespace.

Who calls this: ``scheduler_ext.cli serve`` at start, before it serves anything
(``keys_from_cluster`` with ``--key-secret`` and ``--public-keys-configmap``, else
``signer_from_file`` with ``--signing-key-file``; ``public_keys_from_files`` for
``--public-key-file``, also in ``simulate``).

The cluster way (what the Helm chart uses; docs/helm.md "Signing keys"):

- the Secret (``SECRET_KEY``: the Ed25519 private key, PKCS#8 PEM) is read; when it does not
  exist, one replica makes a key and creates the Secret. Create is atomic: a replica that meets
  AlreadyExists reads the winner's key, so every replica signs with the same one. The Secret
  carries no owner and no release label: ``helm uninstall`` or a re-render never deletes or
  replaces it, so a reinstall finds the same key;
- the ConfigMap (``CONFIGMAP_KEY``: the public-key list of ``koord_formats.signature``) gets the
  signing key's public key appended when it lacks it; keys already listed stay (so a replaced
  signing key leaves every earlier signature verifiable); a compare-and-swap update, retried on
  a conflict. Node agents mount it (``allocationTrust.publicKeyFiles``) and the extenders verify
  with every key in it. The public keys are no secret; the node side needs nothing else.

Rotation: put a new key in the Secret (or delete it: the next extender start makes one), restart
the extenders; the new public key is appended, the old ones stay until the operator removes
them from the ConfigMap once no running pod carries a signature by them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import structlog

from koord_formats.errors import FormatError
from koord_formats.signature import merge_public_keys, parse_public_keys
from rhp_ops.files import FileRefused, read_regular_file
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.trust import MAX_KEY_FILE_BYTES, Signer

__all__ = [
    "CONFIGMAP_KEY",
    "SECRET_KEY",
    "KeyAPI",
    "KeyStoreError",
    "keys_from_cluster",
    "public_keys_from_files",
    "signer_from_file",
]

log = structlog.get_logger("scheduler_ext.keystore")

SECRET_KEY = "signing.key"
CONFIGMAP_KEY = "public-keys"
_MANAGED_BY = {"app.kubernetes.io/managed-by": "scheduler-ext"}


class KeyStoreError(Exception):
    """The keys could not be had; the message says why."""


class KeyAPI(Protocol):
    """The API calls on the key objects (``KubeKeyAPI``; tests pass a fake). Each raises
    ``NotFoundError`` or ``ConflictError`` (create: AlreadyExists; replace: stale version)."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]: ...

    def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def signer_from_file(path: str) -> Signer:
    """The signing key of a PEM file (``KeyStoreError`` when unreadable or not an Ed25519 key)."""
    try:
        return Signer.from_pem(read_regular_file(path, limit=MAX_KEY_FILE_BYTES), path)
    except FileRefused as exc:
        raise KeyStoreError(f"cannot read {path}: {exc.message}") from None
    except ValueError as exc:
        raise KeyStoreError(str(exc)) from None


def public_keys_from_files(paths: Iterable[str]) -> tuple[bytes, ...]:
    """Every public key of the public-key list files, in order."""
    found: list[bytes] = []
    for path in paths:
        try:
            text = read_regular_file(path, limit=MAX_KEY_FILE_BYTES).decode("utf-8")
            found += parse_public_keys(text, path)
        except FileRefused as exc:
            raise KeyStoreError(f"cannot read {path}: {exc.message}") from None
        except ValueError as exc:  # FormatError, UnicodeDecodeError
            raise KeyStoreError(f"{path}: {exc}") from None
    return tuple(found)


def _secret_signer(obj: Mapping[str, Any], where: str) -> Signer:
    data = obj.get("data") or {}
    raw = data.get(SECRET_KEY) if isinstance(data, dict) else None
    if not isinstance(raw, str):
        raise KeyStoreError(f"{where} has no {SECRET_KEY!r}")
    try:
        pem = base64.b64decode(raw, validate=True)
    except ValueError:
        raise KeyStoreError(f"{where}: {SECRET_KEY!r} is not base64") from None
    try:
        return Signer.from_pem(pem, f"{where} {SECRET_KEY}")
    except ValueError as exc:
        raise KeyStoreError(str(exc)) from None


def _signer(api: KeyAPI, namespace: str, name: str) -> Signer:
    where = f"Secret {namespace}/{name}"
    try:
        return _secret_signer(api.get("secrets", namespace, name), where)
    except NotFoundError:
        pass
    signer = Signer.generate()
    body = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": _MANAGED_BY},
        "data": {SECRET_KEY: base64.b64encode(signer.pem()).decode("ascii")},
    }  # fmt: skip
    try:
        api.create("secrets", namespace, body)
    except ConflictError:  # another replica created it first: use its key
        return _secret_signer(api.get("secrets", namespace, name), where)
    log.info("made a new signing key", secret=f"{namespace}/{name}", key_id=signer.key_id)
    return signer


def _published(api: KeyAPI, namespace: str, name: str, signer: Signer) -> tuple[bytes, ...]:
    where = f"ConfigMap {namespace}/{name}"
    for _ in range(5):
        try:
            obj = api.get("configmaps", namespace, name)
        except NotFoundError:
            obj = None
        data = (obj or {}).get("data") or {}
        text = data.get(CONFIGMAP_KEY, "") if isinstance(data, dict) else ""
        if not isinstance(text, str):
            raise KeyStoreError(f"{where}: {CONFIGMAP_KEY!r} is not text")
        try:
            keys = parse_public_keys(text, f"{where} {CONFIGMAP_KEY}")
        except FormatError as exc:
            raise KeyStoreError(str(exc)) from None
        if signer.public_raw in keys:
            return keys
        merged = merge_public_keys(text, [signer.public_raw], f"key {signer.key_id}")
        try:
            if obj is None:
                api.create("configmaps", namespace, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace, "labels": _MANAGED_BY},
                    "data": {CONFIGMAP_KEY: merged},
                })  # fmt: skip
            else:
                meta = obj.get("metadata") or {}
                api.replace("configmaps", namespace, name, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {**meta, "name": name, "namespace": namespace},
                    "data": {**data, CONFIGMAP_KEY: merged},
                })  # fmt: skip
        except ConflictError:
            continue  # created or changed meanwhile: read it again
        log.info("published the signing key's public key", configmap=f"{namespace}/{name}", key_id=signer.key_id)
        return parse_public_keys(merged)
    raise KeyStoreError(f"{where} kept changing while the public key was added")


def keys_from_cluster(api: KeyAPI, namespace: str, secret: str, configmap: str) -> tuple[Signer, tuple[bytes, ...]]:
    """The signing key from the Secret (made when absent) and every public key of the ConfigMap
    (the signing key's added when missing); ``KeyStoreError`` or an ``APIError`` otherwise."""
    signer = _signer(api, namespace, secret)
    return signer, _published(api, namespace, configmap, signer)

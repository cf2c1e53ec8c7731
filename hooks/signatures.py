"""Verifying a pod's allocation signature: the public keys and the one verification function.

Who uses this: ``hooks.facts`` (the node's trust rules for a resource-status cpuset: a node agent
with public keys honours a cpuset only when ``verify_allocation`` says ``SIGNED``, or, when the
operator accepts unsigned claims, an unsigned one) and ``scheduler_ext.trust`` (the extender
counts a bound pod's allocation by the same verdict). The keys come from the node agent's config
(``allocationTrust``, ``runtime_proxy.state.nodeconfig``) or the extender's key store; this
module only computes, on facts it is given: no I/O, no secret (public keys only).

The signature's format and canonical message are ``koord_formats.signature``'s. Verdicts:

- ``SIGNED``: the signature parses, names a key the verifier holds, and verifies over this pod's
  UID, namespace, name, node and covered annotations; ``Verdict.cpu_milli`` is the request it
  states;
- ``UNSIGNED``: no signature annotation;
- ``MALFORMED``: a signature annotation that does not parse;
- ``UNKNOWN_KEY``: a well-formed signature by a key the verifier does not hold (rotated away, or
  forged: it cannot tell);
- ``BAD``: the named key does not verify it (forged, copied from another pod, or a covered value
  changed after the bind).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from koord_formats import keys as koord_keys
from koord_formats.errors import FormatError
from koord_formats.signature import key_id_of, parse_allocation_signature, signed_message

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "ACCEPT_UNSIGNED",
    "BAD",
    "MALFORMED",
    "SIGNED",
    "UNKNOWN_KEY",
    "UNSIGNED",
    "AllocationKeys",
    "Verdict",
    "verify_allocation",
]

SIGNED = "signed"
UNSIGNED = "unsigned"
MALFORMED = "malformed"
UNKNOWN_KEY = "unknown-key"
BAD = "bad-signature"


@functools.lru_cache(maxsize=256)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    # cryptography is imported on first use: a node without public keys never verifies, and its
    # Rust extension and OpenSSL bindings are 7 MiB of every process's RSS.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class AllocationKeys:
    """What allocations are verified with: raw Ed25519 public keys (every one verifies: rotation
    adds a key and keeps the old ones), and whether a claim without a signature counts
    (``accept_unsigned``: Koordinator's model, where whoever writes resource-status is trusted;
    the default without keys, so a node beside koord-scheduler works as before)."""

    public_keys: tuple[bytes, ...] = ()
    accept_unsigned: bool = True
    _by_id: Mapping[str, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {key_id_of(k): k for k in self.public_keys})

    def key(self, key_id: str) -> bytes | None:
        """The public key with this id, ``None`` when it is not among them."""
        return self._by_id.get(key_id)

    @classmethod
    def of(cls, public_keys: Iterable[bytes], *, accept_unsigned: bool | None = None) -> AllocationKeys:
        """Keys in order without repeats (``ValueError`` for one that is not an Ed25519 public
        key); ``accept_unsigned`` defaults to "no keys given"."""
        found = tuple(dict.fromkeys(public_keys))
        for raw in found:
            _public_key(raw)
        return cls(found, not found if accept_unsigned is None else accept_unsigned)


ACCEPT_UNSIGNED = AllocationKeys()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``verify_allocation`` found: one of the module's verdicts, the CPU request a valid
    signature states (else ``None``) and a short reason for logs."""

    kind: str
    cpu_milli: int | None = None
    reason: str = ""

    @property
    def signed(self) -> bool:
        return self.kind == SIGNED


def verify_allocation(
    allocation_keys: AllocationKeys, *, uid: str, namespace: str, name: str, node: str, annotations: Mapping[str, str]
) -> Verdict:
    """The verdict on the signature annotation of the pod (``uid``, ``namespace``/``name``)
    bound to ``node`` with ``annotations`` (all of them; the covered ones are read from it)."""
    raw = annotations.get(koord_keys.ANNOTATION_ALLOCATION_SIGNATURE)
    if raw is None:
        return Verdict(UNSIGNED, reason="no allocation signature")
    try:
        sig = parse_allocation_signature(raw)
    except FormatError as exc:
        return Verdict(MALFORMED, reason=str(exc)[:200])
    public = allocation_keys.key(sig.key_id)
    if public is None:
        return Verdict(UNKNOWN_KEY, reason=f"signed by key {sig.key_id}, which is not among the public keys")
    message = signed_message(key_id=sig.key_id, uid=uid, namespace=namespace, name=name, node=node,
                             cpu_milli=sig.cpu_milli, annotations=annotations)  # fmt: skip
    from cryptography.exceptions import InvalidSignature

    try:
        _public_key(public).verify(sig.signature, message)
    except InvalidSignature:
        return Verdict(BAD, reason=f"the signature by key {sig.key_id} does not verify for this pod and node")
    return Verdict(SIGNED, sig.cpu_milli)

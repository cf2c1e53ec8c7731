"""Who may write the scheduler-owned pod annotations, and how the extender tells.

Who calls this: ``scheduler_ext.state`` judges every bound pod's allocation annotations here
before it counts them; ``scheduler_ext.binder.Binder`` signs what a bind writes;
``scheduler_ext.cli serve`` builds the ``Trust`` from its signing key (``scheduler_ext.keystore``)
and ``--trusted-scheduler-names``; ``simulate`` builds one from ``--public-key-file``. Pure
functions over values, no I/O.

The annotations a scheduler writes when it binds (``OWNED``: ``resource-status``,
``device-allocated``, ``reservation-allocated``) say which CPUs, NUMA amounts, GPUs and
reservation a pod holds. Anyone who can create or update a pod can write them too, so the
extender counts a bound pod's allocation only when it can tell who wrote it:

- **signed**: the pod carries ``SIGNATURE_ANNOTATION`` (``koord_formats.signature``), an Ed25519
  signature by the extenders' private key over the pod's UID, namespace, name, node, CPU request
  and the exact value (or absence) of every owned annotation, and it verifies with one of the
  public keys (``hooks.signatures.verify_allocation``, the same function the node agents run).
  A bind writes the owned annotations and the signature in the Binding itself, so they land with
  the node choice. The API server assigns the UID, so a signature copied from another pod never
  verifies, and a value changed after the bind breaks it. Every replica signs with the same key
  (``scheduler_ext.keystore``); the public keys of earlier keys stay in the list, so a rotation
  leaves every placed pod verifiable.
- **trusted scheduler**: the pod's ``spec.schedulerName`` is one of ``--trusted-scheduler-names``
  (default ``koord-scheduler``): its annotations are taken as written by that scheduler. This is
  a trust assumption, not a proof: whoever may create pods can also set ``schedulerName`` and
  ``nodeName`` and so forge such a pod; an admission policy that forbids ``spec.nodeName`` at
  create (or that scheduler name) for tenants closes it.
- **unverifiable, still counted**: a well-formed signature by a key the extender does not hold
  (its key was replaced and the old public key dropped, or lost with the ConfigMap), or the HMAC
  seal annotation of earlier releases (``LEGACY_SEAL_ANNOTATION``). The extender can neither prove
  nor disprove it, so it counts the allocation (a placed pod's CPUs are never handed out again
  because a key changed) when its CPUs are no more than the pod's own CPU request; it is never
  evidence for the node, which honours only ``SIGNED``.

Anything else (a pod created with ``spec.nodeName``, bound by another scheduler, or whose
signature does not verify) holds nothing as far as the extender is concerned; ``ClusterState``
keeps the last trusted allocation of a pod whose annotations change on the same node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hooks.signatures import SIGNED, UNKNOWN_KEY, UNSIGNED, AllocationKeys, verify_allocation
from koord_formats import keys
from koord_formats.signature import SIGNED_ANNOTATIONS, format_allocation_signature, key_id_of, signed_message

__all__ = [
    "BY_SCHEDULER",
    "DEFAULT_TRUSTED_SCHEDULERS",
    "EVERYONE",
    "LEGACY_SEAL_ANNOTATION",
    "MAX_KEY_FILE_BYTES",
    "OWNED",
    "SIGNATURE_ANNOTATION",
    "SIGNED",
    "TRUST_ALL",
    "UNVERIFIABLE",
    "Signer",
    "Trust",
]

# every pod annotation a scheduler writes at bind time; a bind writes or removes each of them
OWNED = SIGNED_ANNOTATIONS
SIGNATURE_ANNOTATION = keys.ANNOTATION_ALLOCATION_SIGNATURE
# the HMAC seal of the releases before signatures: unverifiable now, counted (see above) and
# removed by every bind
LEGACY_SEAL_ANNOTATION = "scheduler-ext.runtime-hook-proxy.io/seal"
DEFAULT_TRUSTED_SCHEDULERS = ("koord-scheduler",)
MAX_KEY_FILE_BYTES = 64 * 1024

BY_SCHEDULER = "scheduler"
EVERYONE = "everyone"
UNVERIFIABLE = "unverifiable"


@dataclass(frozen=True)
class Signer:
    """The extenders' Ed25519 private key."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes, what: str = "signing key") -> Signer:
        """A signing key from PKCS#8 PEM (``openssl genpkey -algorithm ed25519``); ``ValueError``
        for anything else."""
        if len(data) > MAX_KEY_FILE_BYTES:
            raise ValueError(f"{what}: more than {MAX_KEY_FILE_BYTES} bytes")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{what}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{what}: not an Ed25519 key")
        return cls(key)

    def pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def public_raw(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> str:
        return key_id_of(self.public_raw)


@dataclass(frozen=True)
class Trust:
    """The signing key (``None``: this process signs nothing), the public keys every signature is
    verified with (the signer's among them) and the scheduler names whose annotations count
    unsigned. ``everyone`` counts every annotation as written (``simulate --trust-all``, which
    judges a what-if document, and unit tests)."""

    signer: Signer | None = None
    verify: AllocationKeys = field(default_factory=lambda: AllocationKeys(accept_unsigned=False))
    schedulers: frozenset[str] = frozenset(DEFAULT_TRUSTED_SCHEDULERS)
    everyone: bool = False

    def sign(self, uid: str, namespace: str, name: str, node: str, cpu_milli: int,
             annotations: Mapping[str, str]) -> str | None:  # fmt: skip
        """The signature annotation of a bind that writes ``annotations`` (the owned ones; absent
        ones are signed as absent) for the pod on ``node``; ``None`` without a signing key."""
        if self.signer is None:
            return None
        kid = self.signer.key_id
        message = signed_message(key_id=kid, uid=uid, namespace=namespace, name=name, node=node,
                                 cpu_milli=cpu_milli, annotations=annotations)  # fmt: skip
        return format_allocation_signature(kid, cpu_milli, self.signer.private.sign(message))

    def judge(self, uid: str, namespace: str, name: str, node: str, scheduler: str,
              annotations: Mapping[str, str]) -> str:  # fmt: skip
        """Why the owned annotations of this bound pod count (``"signed"``, ``"scheduler"``,
        ``"everyone"``, ``"unverifiable"``: see the module docstring), or "" when they do not."""
        if self.everyone:
            return EVERYONE
        verdict = verify_allocation(self.verify, uid=uid, namespace=namespace, name=name, node=node,
                                    annotations=annotations)  # fmt: skip
        if verdict.kind == SIGNED:
            return SIGNED
        if scheduler and scheduler in self.schedulers:
            return BY_SCHEDULER
        if verdict.kind == UNKNOWN_KEY or (verdict.kind == UNSIGNED and LEGACY_SEAL_ANNOTATION in annotations):
            return UNVERIFIABLE
        return ""

    @staticmethod
    def carries_any(annotations: Mapping[str, str]) -> bool:
        """Whether any owned annotation or a signature is present (an untrusted pod without any is
        not worth a log line)."""
        return (any(k in annotations for k in OWNED) or SIGNATURE_ANNOTATION in annotations
                or LEGACY_SEAL_ANNOTATION in annotations)  # fmt: skip

    @classmethod
    def of(cls, signer: Signer | None, schedulers: Iterable[str], public_keys: Iterable[bytes] = ()) -> Trust:
        """Signs with ``signer``; verifies with its public key and ``public_keys``."""
        own = [signer.public_raw] if signer is not None else []
        verify = AllocationKeys.of([*own, *public_keys], accept_unsigned=False)
        return cls(signer, verify, frozenset(s for s in schedulers if s))


TRUST_ALL = Trust(everyone=True)

"""The allocation signature: this project's own pod annotation (not Koordinator's), its canonical
message, its one bounded parser, and the public-key list format node agents read.

Who uses this: ``scheduler_ext.trust`` signs what a bind writes (``signed_message``, then
``format_allocation_signature``); ``hooks.signatures`` verifies it on the node and in the
extender (``parse_allocation_signature``, ``signed_message``); ``parse_public_keys`` reads the
public keys (the extender's ConfigMap, a node agent's ``allocationTrust.publicKeyFiles``).

The annotation ``keys.ANNOTATION_ALLOCATION_SIGNATURE`` holds
``v1.<key id>.<CPU request in millicores>.<signature>``:

- key id: 16 lowercase hex digits, the first 8 bytes of the SHA-256 of the signer's raw 32-byte
  Ed25519 public key (``key_id_of``), so a verifier picks the key without trying each;
- the pod's CPU request as the signer read it (decimal, at most 10 digits): a node never honours
  a cpuset with more CPUs than this;
- the Ed25519 signature (64 bytes) in unpadded URL-safe base64, exactly 86 characters.

The signature covers ``signed_message``: a domain tag and a JSON array of the key id, the pod's
UID, namespace, name, the node it is bound to, the CPU request and the exact value (``null``
when absent) of each of ``SIGNED_ANNOTATIONS``. The API server assigns the UID, so a signature
copied to another pod never verifies, and any change of a covered value breaks it.

Public keys are text, one a line: ``ed25519 <standard base64 of the 32 raw bytes> [comment]``;
blank lines and lines starting with ``#`` are skipped. At most ``MAX_PUBLIC_KEYS`` keys in at
most ``MAX_PUBLIC_KEYS_CHARS`` characters. Pure standard library, like every module here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koord_formats import keys
from koord_formats.bounded import check_text
from koord_formats.errors import FormatError

__all__ = [
    "MAX_PUBLIC_KEYS",
    "MAX_PUBLIC_KEYS_CHARS",
    "MAX_SIGNATURE_CHARS",
    "SIGNED_ANNOTATIONS",
    "AllocationSignature",
    "format_allocation_signature",
    "format_public_key",
    "key_id_of",
    "merge_public_keys",
    "parse_allocation_signature",
    "parse_public_keys",
    "signed_message",
]

# every pod annotation a bind writes whose value the signature covers, in message order
SIGNED_ANNOTATIONS = (
    keys.ANNOTATION_RESOURCE_STATUS,
    keys.ANNOTATION_DEVICE_ALLOCATED,
    keys.ANNOTATION_RESERVATION_ALLOCATED,
)
VERSION = "v1"
MAX_SIGNATURE_CHARS = 128
MAX_CPU_MILLI_DIGITS = 10
KEY_ID_CHARS = 16
SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
MAX_PUBLIC_KEYS = 64
MAX_PUBLIC_KEYS_CHARS = 64 * 1024
_DOMAIN = b"runtime-hook-proxy allocation signature v1\n"
_KEY_ID = re.compile(r"[0-9a-f]{16}", re.ASCII)
_MILLI = re.compile(r"0|[1-9][0-9]{0,9}", re.ASCII)
_SIG = re.compile(r"[A-Za-z0-9_-]{86}", re.ASCII)
_B64 = re.compile(r"[A-Za-z0-9+/]{43}=", re.ASCII)


@dataclass(frozen=True, slots=True)
class AllocationSignature:
    """A parsed signature annotation."""

    key_id: str
    cpu_milli: int
    signature: bytes


def key_id_of(public_key: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_key).hexdigest()[:KEY_ID_CHARS]


def signed_message(
    *, key_id: str, uid: str, namespace: str, name: str, node: str, cpu_milli: int, annotations: Mapping[str, str]
) -> bytes:
    """The bytes a signature covers (see the module docstring). Deterministic: the standard
    library's JSON encoder with ASCII escapes and no spaces."""
    values = [annotations.get(k) for k in SIGNED_ANNOTATIONS]
    fields = [key_id, uid, namespace, name, node, cpu_milli, *values]
    body = json.dumps(fields, ensure_ascii=True, separators=(",", ":"))
    return _DOMAIN + body.encode("ascii")


def format_allocation_signature(key_id: str, cpu_milli: int, signature: bytes) -> str:
    """The annotation value; ``ValueError`` for parts the parser would refuse."""
    if not _KEY_ID.fullmatch(key_id) or not 0 <= cpu_milli < 10**MAX_CPU_MILLI_DIGITS:
        raise ValueError(f"bad key id {key_id!r} or CPU request {cpu_milli}")
    if len(signature) != SIGNATURE_BYTES:
        raise ValueError(f"an Ed25519 signature has {SIGNATURE_BYTES} bytes, not {len(signature)}")
    sig = base64.urlsafe_b64encode(signature).decode("ascii").rstrip("=")
    return f"{VERSION}.{key_id}.{cpu_milli}.{sig}"


def parse_allocation_signature(text: object) -> AllocationSignature:
    """The signature annotation's value, or ``FormatError``: not a string, longer than
    ``MAX_SIGNATURE_CHARS``, another version, or any part out of its exact shape (a signature
    whose base64 is not the canonical encoding of 64 bytes included)."""
    raw = check_text(text, "allocation signature", MAX_SIGNATURE_CHARS)
    parts = raw.split(".")
    if len(parts) != 4:
        raise FormatError(f"allocation signature: expected 4 dot-separated parts, got {len(parts)}")
    version, key_id, milli, sig = parts
    if version != VERSION:
        raise FormatError(f"allocation signature: unknown version {version[:8]!r} (expected {VERSION})")
    if not _KEY_ID.fullmatch(key_id):
        raise FormatError("allocation signature: the key id is not 16 lowercase hex digits")
    if not _MILLI.fullmatch(milli):
        raise FormatError("allocation signature: the CPU request is not a decimal of at most 10 digits")
    if not _SIG.fullmatch(sig):
        raise FormatError("allocation signature: the signature is not 86 URL-safe base64 characters")
    decoded = base64.urlsafe_b64decode(sig + "==")
    if len(decoded) != SIGNATURE_BYTES or base64.urlsafe_b64encode(decoded).decode("ascii").rstrip("=") != sig:
        raise FormatError("allocation signature: the signature is not the canonical encoding of 64 bytes")
    return AllocationSignature(key_id, int(milli), decoded)


def format_public_key(public_key: bytes, comment: str = "") -> str:
    """One line of the public-key list (no newline)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, not {len(public_key)}")
    line = f"ed25519 {base64.b64encode(public_key).decode('ascii')}"
    comment = " ".join(comment.split())
    return f"{line} {comment}" if comment else line


def parse_public_keys(text: object, what: str = "public keys") -> tuple[bytes, ...]:
    """The raw Ed25519 public keys of a public-key list, in order and without repeats, or
    ``FormatError`` naming the first bad line (see the module docstring for the format)."""
    raw = check_text(text, what, MAX_PUBLIC_KEYS_CHARS)
    found: dict[bytes, None] = {}
    for number, line in enumerate(raw.splitlines(), 1):
        fields = line.split(None, 2)
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] != "ed25519" or len(fields) < 2:
            raise FormatError(f"{what}: line {number}: expected 'ed25519 <base64 key>'")
        if not _B64.fullmatch(fields[1]):
            raise FormatError(f"{what}: line {number}: the key is not the base64 of 32 bytes")
        try:
            key = base64.b64decode(fields[1], validate=True)
        except binascii.Error as exc:  # pragma: no cover - the pattern admits only valid base64
            raise FormatError(f"{what}: line {number}: {exc}") from None
        if len(key) != PUBLIC_KEY_BYTES or base64.b64encode(key).decode("ascii") != fields[1]:
            raise FormatError(f"{what}: line {number}: the key is not the canonical base64 of 32 bytes")
        found[key] = None
        if len(found) > MAX_PUBLIC_KEYS:
            raise FormatError(f"{what}: more than {MAX_PUBLIC_KEYS} keys")
    return tuple(found)


def merge_public_keys(text: str, add: Iterable[bytes], comment: str = "") -> str:
    """``text`` (a public-key list, kept as written) with every key of ``add`` it lacks
    appended, one line each."""
    have = set(parse_public_keys(text))
    lines = [text.rstrip("\n")] if text.strip() else []
    lines += [format_public_key(k, comment) for k in add if k not in have]
    return "\n".join(lines) + "\n"

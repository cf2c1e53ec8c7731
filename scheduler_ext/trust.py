"""Who may write the scheduler-owned pod annotations, and how the extender tells.

Who calls this: ``scheduler_ext.state`` judges every bound pod's allocation annotations here
before it counts them; ``scheduler_ext.binder.Binder`` seals what a bind writes;
``scheduler_ext.cli serve`` builds the ``Trust`` from ``--seal-key-file`` and
``--trusted-scheduler-name``. Pure functions over values, no I/O.

The annotations a scheduler writes when it binds (``OWNED``: ``resource-status``,
``device-allocated``, ``reservation-allocated``) say which CPUs, NUMA amounts, GPUs and
reservation a pod holds. Anyone who can create or update a pod can write them too, so the
extender counts a bound pod's allocation only when it can prove who wrote it:

- **sealed**: the pod carries ``SEAL_ANNOTATION``, an HMAC-SHA256 under a key only the
  extender's replicas hold (``--seal-key-file``) over the pod's UID, its node and the exact
  value (or absence) of every owned annotation. A bind writes the owned annotations and the
  seal in the Binding itself, so they land with the node choice. The API server assigns the UID,
  so a seal copied from another pod never verifies, and a value changed after the bind breaks it.
  This survives restarts and is shared by every replica with the same key.
- **trusted scheduler**: the pod's ``spec.schedulerName`` is one of ``--trusted-scheduler-name``
  (default ``koord-scheduler``): its annotations are taken as written by that scheduler. This is
  a trust assumption, not a proof: whoever may create pods can also set ``schedulerName`` and
  ``nodeName`` and so forge such a pod; an admission policy that forbids ``spec.nodeName`` at
  create (or that scheduler name) for tenants closes it.

Anything else (a pod created with ``spec.nodeName``, bound by another scheduler, or whose seal
does not verify) holds nothing as far as the extender is concerned; ``ClusterState`` keeps the
last trusted allocation of a pod whose annotations change on the same node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koord_formats import keys

__all__ = [
    "DEFAULT_TRUSTED_SCHEDULERS",
    "MAX_SEAL_CHARS",
    "MIN_KEY_BYTES",
    "OWNED",
    "SEAL_ANNOTATION",
    "TRUST_ALL",
    "Trust",
    "read_key",
]

# every pod annotation a scheduler writes at bind time; a bind writes or removes each of them
OWNED = (
    keys.ANNOTATION_RESOURCE_STATUS,
    keys.ANNOTATION_DEVICE_ALLOCATED,
    keys.ANNOTATION_RESERVATION_ALLOCATED,
)
SEAL_ANNOTATION = "scheduler-ext.runtime-hook-proxy.io/seal"
DEFAULT_TRUSTED_SCHEDULERS = ("koord-scheduler",)
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096
MAX_SEAL_CHARS = 128
_VERSION = "v1."

SEALED = "sealed"
BY_SCHEDULER = "scheduler"


def read_key(data: bytes, what: str) -> bytes:
    """A seal key from a key file's content (surrounding whitespace dropped); ``ValueError``
    when it is shorter than ``MIN_KEY_BYTES`` or longer than ``MAX_KEY_BYTES``."""
    key = data.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{what}: a seal key needs at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"{what}: a seal key has at most {MAX_KEY_BYTES} bytes")
    return key


def _message(uid: str, node: str, annotations: Mapping[str, str]) -> bytes:
    """What a seal covers, unambiguously: a JSON array (absent annotations are null). The
    standard library's encoder: ``cli`` imports this module without the [scheduler] extra."""
    return json.dumps([uid, node, *(annotations.get(k) for k in OWNED)], separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Trust:
    """The seal keys (the first one seals, every one verifies: rotation adds a key in front)
    and the scheduler names whose annotations count unsealed. ``everyone`` counts every
    annotation as written (``simulate``, which judges a document it was given, and unit tests)."""

    keys: tuple[bytes, ...] = ()
    schedulers: frozenset[str] = frozenset(DEFAULT_TRUSTED_SCHEDULERS)
    everyone: bool = False

    def seal(self, uid: str, node: str, annotations: Mapping[str, str]) -> str | None:
        """The seal of a bind that writes ``annotations`` (the owned ones; absent ones are
        sealed as absent) for ``uid`` on ``node``; ``None`` without a key."""
        if not self.keys:
            return None
        mac = hmac.new(self.keys[0], _message(uid, node, annotations), hashlib.sha256).digest()
        return _VERSION + base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def judge(self, uid: str, node: str, scheduler: str, annotations: Mapping[str, str]) -> str:
        """Why the owned annotations of this bound pod count (``"sealed"``, ``"scheduler"``,
        or ``"everyone"``), or "" when they do not."""
        if self.everyone:
            return "everyone"
        seal = annotations.get(SEAL_ANNOTATION)
        if seal and self.keys and len(seal) <= MAX_SEAL_CHARS and seal.isascii() and seal.startswith(_VERSION):
            message = _message(uid, node, annotations)
            for key in self.keys:
                mac = hmac.new(key, message, hashlib.sha256).digest()
                if hmac.compare_digest(seal, _VERSION + base64.urlsafe_b64encode(mac).decode().rstrip("=")):
                    return SEALED
        if scheduler and scheduler in self.schedulers:
            return BY_SCHEDULER
        return ""

    @staticmethod
    def carries_any(annotations: Mapping[str, str]) -> bool:
        """Whether any owned annotation or a seal is present (an untrusted pod without any is
        not worth a log line)."""
        return any(k in annotations for k in OWNED) or SEAL_ANNOTATION in annotations

    @classmethod
    def of(cls, keys_: Iterable[bytes], schedulers: Iterable[str]) -> Trust:
        return cls(tuple(keys_), frozenset(s for s in schedulers if s))


TRUST_ALL = Trust(everyone=True)

"""cryptography is loaded on the first verification, not by importing the node's code: a node
without allocation keys never verifies, and the library's Rust extension and OpenSSL bindings
were 7 MiB of the proxy's and the NRI plugin's resident memory (issue 35). Once loaded,
verification gives the same verdicts (tests/hooks/plugins/test_plugin_cpuset_signed.py and
tests/hostile/test_signature_hostile.py cover them); here, one signed and one forged pod."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import runtime_proxy.commands.main, runtime_proxy.commands.nri, hooks.signatures
loaded = [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]
print(json.dumps(loaded))
"""

VERIFY = """
import json, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hooks.signatures import AllocationKeys, verify_allocation
from koord_formats import keys
from koord_formats.signature import format_allocation_signature, key_id_of, signed_message

private = Ed25519PrivateKey.generate()
public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
kid = key_id_of(public)
pod = dict(uid="u-1", namespace="ns", name="p", node="n1")
annotations = {keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"2-3"}'}
message = signed_message(key_id=kid, cpu_milli=2000, annotations=annotations, **pod)
annotations[keys.ANNOTATION_ALLOCATION_SIGNATURE] = format_allocation_signature(kid, 2000, private.sign(message))
good = verify_allocation(AllocationKeys.of([public]), annotations=annotations, **pod)
bad = verify_allocation(AllocationKeys.of([public]), annotations=annotations, **{**pod, "node": "n2"})
print(json.dumps([good.kind, good.cpu_milli, bad.kind]))
"""


def _run(code: str) -> object:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_proxy_and_the_nri_plugin_do_not_load_cryptography_at_start() -> None:
    # fails on the old main: hooks.signatures imported cryptography at module level
    assert _run(PROBE) == []


def test_a_signature_still_verifies_once_cryptography_loads() -> None:
    assert _run(VERIFY) == ["signed", 2000, "bad-signature"]

"""Hostile allocation signatures on the node (issue 37 item 1): whatever a pod puts in
``scheduler-ext.runtime-hook-proxy.io/signature`` (garbage, over its bound, another version, a
copy of another pod's, a valid signature over other values, a huge covered annotation) verifies
nothing, costs only its own pod, and never displaces a signed pod; each verdict is computed once
per distinct input (the stages and loops ask again and again)."""

from __future__ import annotations

import time

import pytest

from hooks.facts import PodFacts, with_bound_pods
from hooks.facts import pools as facts_module
from hooks.signatures import AllocationKeys
from koord_formats import keys
from koord_formats.signature import MAX_SIGNATURE_CHARS
from scheduler_ext.trust import Signer, Trust
from tests.hooks.plugins.factories import node, pod, status
from tests.topologies import DUAL_SOCKET_HT, cpus

RS = keys.ANNOTATION_RESOURCE_STATUS
SIG = keys.ANNOTATION_ALLOCATION_SIGNATURE
EXTENDER = Trust.of(Signer.generate(), [])
FACTS = node(DUAL_SOCKET_HT).replace(allocation_keys=AllocationKeys.of(EXTENDER.verify.public_keys))


def _signed(uid: str, cpu_list: str, node_name: str = "node-1") -> dict[str, str]:
    ann = {RS: status(cpu_list)}
    ann[SIG] = EXTENDER.sign(uid, "ns", "p", node_name, 1000 * len(cpus(cpu_list)), ann) or ""
    return ann


HOSTILE = [
    pytest.param("", id="empty"),
    pytest.param("v1." + "A" * (MAX_SIGNATURE_CHARS * 2000), id="far over its bound"),
    pytest.param("v9.0123456789abcdef.1000." + "A" * 86, id="another version"),
    pytest.param("v1.0123456789abcdef.1000." + "\u00c0" * 86, id="non-ASCII"),
    pytest.param("v1.0123456789abcdef.99999999999999999999." + "A" * 86, id="a huge request"),
    pytest.param(_signed("uid-other", "0-15")[SIG], id="another pod's signature"),
    pytest.param(_signed("uid-x", "0-15", node_name="node-2")[SIG], id="signed for another node"),
    pytest.param(_signed("uid-x", "3")[SIG], id="a signature over another cpuset"),
]


@pytest.mark.parametrize("signature", HOSTILE)
def test_a_hostile_signature_holds_nothing_and_costs_only_its_pod(signature: str) -> None:
    forged = pod("LSR", kube="Guaranteed", uid="uid-x", annotations={RS: status("0-15"), SIG: signature})
    real = pod("LSR", kube="Guaranteed", uid="uid-real", annotations=_signed("uid-real", "2-3"))
    start = time.thread_time()
    got = with_bound_pods(FACTS, [forged, real])
    assert time.thread_time() - start < 0.5  # a safety bound on runaway work, not a speed claim
    assert dict(got.bound_cpusets) == {"uid-real": cpus("2-3")}


def test_a_huge_covered_annotation_is_not_kept_by_the_verdict_cache() -> None:
    """A 100 KiB resource-status with a garbage signature: refused each time at its own cost, and
    never kept alive by the verdict cache (small inputs are cached, so healthy pods are verified
    once)."""
    big = status("0-15")[:-1] + ', "pad": "' + "x" * 100_000 + '"}'
    forged = pod("LSR", kube="Guaranteed", uid="uid-big", annotations={RS: big, SIG: _signed("uid-big", "0")[SIG]})
    real = pod("LSR", kube="Guaranteed", uid="uid-real", annotations=_signed("uid-real", "2-3"))
    facts_module._verdict.cache_clear()
    for _ in range(20):
        got = with_bound_pods(FACTS, [forged, real])
        assert dict(got.bound_cpusets) == {"uid-real": cpus("2-3")}
    info = facts_module._verdict.cache_info()
    assert info.currsize == 1 and info.hits == 19


def test_many_poisoned_pods_leave_the_signed_ones_bound() -> None:
    poisoned: list[PodFacts] = [
        pod("LSR", kube="Guaranteed", uid=f"uid-{i}", annotations={RS: status("0-15"), SIG: f"v1.{i}"})
        for i in range(500)
    ]
    real = pod("LSR", kube="Guaranteed", uid="uid-real", annotations=_signed("uid-real", "4-5"))
    got = with_bound_pods(FACTS, [*poisoned, real])
    assert dict(got.bound_cpusets) == {"uid-real": cpus("4-5")}

"""Signed allocations on the node (issue 37 item 1): with public keys in the node facts, a
resource-status cpuset is honoured only when its allocation signature verifies for this pod on
this node (``hooks.signatures.verify_allocation``) and it has no more CPUs than the CPU request
signed with it; an unverified claim is ignored with a recorded skip and holds nothing, so it
can no longer displace a signed pod however early it came. Without keys, unsigned claims count
as before (Koordinator's model).

On the old main there was no signature: the node honoured the first forged LSR cpuset and moved
the signed pod off its CPUs (``test_a_forged_older_claim_no_longer_displaces_the_signed_pod``)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from hooks.facts import PodFacts, format_cpu_list, resolve_cpuset_claims, trusted_cpuset, with_bound_pods
from hooks.plugins import cpuset
from hooks.signatures import BAD, MALFORMED, SIGNED, UNKNOWN_KEY, UNSIGNED, AllocationKeys, verify_allocation
from koord_formats import keys
from koord_formats.pod import parse_resource_status
from scheduler_ext.trust import Signer, Trust
from tests.hooks.plugins.factories import call, container, node, pod, status
from tests.topologies import DUAL_SOCKET_HT, cpus

RS = keys.ANNOTATION_RESOURCE_STATUS
SIG = keys.ANNOTATION_ALLOCATION_SIGNATURE
EXTENDER = Trust.of(Signer.generate(), [])
PUBLIC = EXTENDER.verify.public_keys
NODE_NAME = "node-1"  # the factories' node


def signed(cpu_list: str, *, uid: str = "uid-1", cpu_milli: int | None = None, node_name: str = NODE_NAME,
           trust: Trust = EXTENDER, name: str = "p") -> dict[str, str]:  # fmt: skip
    """The annotations a bind of ``trust`` writes for pod ns/``name`` on ``node_name``."""
    ann = {RS: status(cpu_list)}
    milli = 1000 * len(cpus(cpu_list)) if cpu_milli is None else cpu_milli
    signature = trust.sign(uid, "ns", name, node_name, milli, ann)
    assert signature is not None
    return {**ann, SIG: signature}


def keyed(keys_: AllocationKeys | None = None, **kw: object) -> object:
    return node(DUAL_SOCKET_HT, **kw).replace(  # type: ignore[arg-type]
        allocation_keys=keys_ if keys_ is not None else AllocationKeys.of(PUBLIC))


def lsr(uid: str, annotations: Mapping[str, str]) -> PodFacts:
    return pod("LSR", kube="Guaranteed", uid=uid, annotations=annotations)


@pytest.mark.parametrize(
    ("annotations", "kind"),
    [
        pytest.param(signed("2-3"), SIGNED, id="signed by the extender"),
        pytest.param({RS: status("2-3")}, UNSIGNED, id="no signature"),
        pytest.param({RS: status("2-3"), SIG: "v1.garbage"}, MALFORMED, id="garbage"),
        pytest.param(signed("2-3", trust=Trust.of(Signer.generate(), [])), UNKNOWN_KEY, id="another key"),
        pytest.param({**signed("2-3"), RS: status("2-4")}, BAD, id="the cpuset changed after the bind"),
        pytest.param(signed("2-3", uid="uid-2"), BAD, id="another pod's signature"),
        pytest.param(signed("2-3", name="q"), BAD, id="signed for another name"),
        pytest.param(signed("2-3", node_name="node-2"), BAD, id="signed for another node"),
        pytest.param({**signed("2-3"), keys.ANNOTATION_DEVICE_ALLOCATED: "{}"}, BAD, id="a covered annotation added"),
    ],
)
def test_the_verdicts(annotations: dict[str, str], kind: str) -> None:
    verdict = verify_allocation(AllocationKeys.of(PUBLIC), uid="uid-1", namespace="ns", name="p", node=NODE_NAME,
                                annotations=annotations)  # fmt: skip
    assert verdict.kind == kind, verdict
    assert (verdict.cpu_milli == 2000) is (kind == SIGNED)


def test_rotation_keeps_old_public_keys_verifying() -> None:
    new = Trust.of(Signer.generate(), [])
    both = AllocationKeys.of([*new.verify.public_keys, *PUBLIC])
    for ann in (signed("2-3"), signed("2-3", trust=new)):
        assert verify_allocation(both, uid="uid-1", namespace="ns", name="p", node=NODE_NAME, annotations=ann).signed


@pytest.mark.parametrize(
    ("annotations", "refusal"),
    [
        pytest.param(signed("2-3"), "", id="signed: honoured"),
        pytest.param({RS: status("2-3")}, "not signed", id="unsigned: ignored"),
        pytest.param({**signed("2-3"), RS: status("2-5")}, "not signed by a trusted key (bad-signature",
                     id="widened after the bind: ignored"),
        pytest.param(signed("2-3", cpu_milli=1000), "2 CPUs are more than the pod's CPU request of 1000m",
                     id="more CPUs than the signed request: ignored"),
        pytest.param(signed("2-3", trust=Trust.of(Signer.generate(), [])), "not signed by a trusted key (unknown-key",
                     id="a key the node does not hold: ignored"),
    ],
)
def test_the_cpuset_plugin_honours_only_a_verified_claim(annotations: dict[str, str], refusal: str) -> None:
    the_pod = lsr("uid-1", annotations)
    facts = keyed()
    got, why = trusted_cpuset(the_pod, parse_resource_status(annotations[RS]), facts)  # type: ignore[arg-type]
    assert (got, why[: len(refusal)]) == ((frozenset(), refusal) if refusal else (cpus("2-3"), ""))
    plan = call(cpuset, "rhp_pre_create_container", pod=the_pod, container=container(), node=facts)
    assert (plan.resources.get("cpuset_cpus") == "2-3") is not refusal
    if refusal:
        assert any("ignored: " + refusal in s.reason for s in plan.skipped), plan.skipped


def test_a_forged_older_claim_no_longer_displaces_the_signed_pod() -> None:
    """The probe of issue 37: a tenant's LSR pod created with spec.nodeName and an unsigned
    cpuset of CPU 1, older than the extender's signed pod on CPU 1. Without keys (the old
    behaviour) the forgery wins; with keys the signed pod keeps CPU 1 and the forgery holds
    nothing."""
    thief = lsr("uid-thief", {RS: status("1")})
    real = lsr("uid-real", signed("1", uid="uid-real"))
    old = resolve_cpuset_claims([(thief, cpus("1")), (real, cpus("1"))], DUAL_SOCKET_HT.cpus)
    assert dict(old.bound) == {"uid-thief": cpus("1")}  # what the node did before signatures
    facts = with_bound_pods(keyed(), [thief, real])  # type: ignore[arg-type]
    assert {u: format_cpu_list(c) for u, c in facts.bound_cpusets.items()} == {"uid-real": "1"}
    plan = call(cpuset, "rhp_pre_create_container", pod=real, container=container(), node=facts)
    assert plan.resources.get("cpuset_cpus") == "1"
    forged = call(cpuset, "rhp_pre_create_container", pod=thief, container=container(), node=facts)
    assert forged.resources.get("cpuset_cpus") not in (None, "1") and "1" not in cpus(forged.resources["cpuset_cpus"])


def test_a_forged_claim_larger_than_the_request_takes_nothing() -> None:
    """The other probe: a forged ``0-1`` on a 1-CPU pod made the LS and the signed LSR pod lose
    their cpusets; now it holds nothing and both keep theirs."""
    forged = lsr("uid-forged", {RS: status("0-1")})
    real = lsr("uid-real", signed("1", uid="uid-real"))
    facts = with_bound_pods(keyed(), [forged, real])  # type: ignore[arg-type]
    assert dict(facts.bound_cpusets) == {"uid-real": cpus("1")}


def test_without_keys_unsigned_claims_count_but_a_refuted_signature_does_not() -> None:
    accepting = AllocationKeys.of(PUBLIC, accept_unsigned=True)
    unsigned = lsr("uid-a", {RS: status("2")})
    refuted = lsr("uid-b", {**signed("3", uid="uid-b"), RS: status("3-4")})
    facts = with_bound_pods(keyed(accepting), [unsigned, refuted])  # type: ignore[arg-type]
    assert dict(facts.bound_cpusets) == {"uid-a": cpus("2")}
    plain = with_bound_pods(node(DUAL_SOCKET_HT), [unsigned, refuted])  # no keys at all: as before
    assert dict(plain.bound_cpusets) == {"uid-a": cpus("2"), "uid-b": cpus("3-4")}


def test_public_keys_that_are_not_ed25519_keys_are_refused() -> None:
    with pytest.raises(ValueError):
        AllocationKeys.of([b"\x00" * 31])

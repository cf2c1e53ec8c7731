"""The node's trust rules for a resource-status cpuset (``hooks.facts``, section "which
resource-status cpusets the node trusts"), through the cpuset plugin and the node-wide claims.

A cpuset is trusted only on an LSE or LSR pod, only within the node's CPUs and only when no
older pod holds those CPUs; an untrusted one is ignored with a recorded skip and the pod runs as
if it had none (LS, BE and label-less pods always keep their quota)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.facts import (
    PodFacts,
    all_share_pool_cpus,
    compute_share_pools,
    format_cpu_list,
    resolve_cpuset_claims,
    with_bound_pods,
)
from hooks.plan import Plan
from hooks.plugins import cpu_suppress, cpuset
from koord_formats import keys
from tests.hooks.plugins.factories import call, container, node, pod, status, writes
from tests.topologies import DUAL_SOCKET_HT, cpus

RS = keys.ANNOTATION_RESOURCE_STATUS
# DUAL_SOCKET_HT (CPUs 0-15) with an LSR pod bound to 4-5: LS pools 0-3,6-15.
NODE = node(DUAL_SOCKET_HT, bound={"lsr-pod": "4-5"})
ALL_POOLS = "0-3,6-15"

# (pod, node, resources the container gets, the refusal recorded or "" when trusted)
CASES = [
    pytest.param(pod("BE", kube="BestEffort", annotations={RS: status("1")}), NODE, {"cpuset_cpus": ""},
                 "QoS class BE may not hold a cpuset",
                 id="a BE pod with a forged cpuset 1 keeps its quota and gets the BE empty cpuset, not CPU 1"),
    pytest.param(pod("BE", kube="BestEffort", annotations={RS: status("4-5")}), NODE, {"cpuset_cpus": ""},
                 "QoS class BE", id="a BE pod cannot take an LSR pod's exclusive CPUs by annotation"),
    pytest.param(pod("LS", annotations={RS: status("0-15")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "QoS class LS may not hold a cpuset",
                 id="an LS pod with a forged cpuset 0-15 gets the LS share pools and keeps its quota"),
    pytest.param(pod(None, kube="Guaranteed", annotations={RS: status("1")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "QoS class none", id="a label-less Guaranteed pod with a cpuset is not bound: the share pools"),
    pytest.param(pod(None, kube="BestEffort", annotations={RS: status("1")}), NODE, {"cpuset_cpus": ""},
                 "QoS class none", id="a label-less BestEffort pod with a cpuset gets the empty cpuset"),
    pytest.param(pod("SYSTEM", annotations={RS: status("1")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "QoS class SYSTEM", id="a SYSTEM pod's cpuset comes from the node, not from resource-status"),
    pytest.param(pod("LSR", kube="Guaranteed", annotations={RS: status("30-31")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "CPUs 30-31 are not on this node", id="an LSR cpuset outside the node's CPUs is not trusted"),
    pytest.param(pod("LSR", kube="Guaranteed", annotations={RS: status("15-16")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "CPUs 16 are not on this node", id="an LSR cpuset partly outside the node is not trusted at all"),
    pytest.param(pod("LSR", kube="Guaranteed", annotations={RS: status("5")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "CPUs 5 are held by pod lsr-pod",
                 id="an LSR pod claiming an older LSR pod's exclusive CPU is not bound and keeps its quota"),
    pytest.param(pod("LSE", kube="Guaranteed", annotations={RS: status("3-4")}), NODE, {"cpuset_cpus": ALL_POOLS},
                 "CPUs 4 are held by pod lsr-pod", id="an LSE pod claiming one held CPU among free ones is refused"),
    pytest.param(pod("LSR", kube="Guaranteed", uid="lsr-pod", annotations={RS: status("4-5")}), NODE,
                 {"cpuset_cpus": "4-5", "cpu_quota": -1}, "", id="the pod holding the CPUs is bound to them"),
    pytest.param(pod("LSR", kube="Guaranteed", annotations={RS: status("2-3")}), NODE,
                 {"cpuset_cpus": "2-3", "cpu_quota": -1}, "", id="an LSR pod with free CPUs of this node is bound"),
    pytest.param(pod("LSE", kube="Guaranteed", annotations={RS: status("2-3")}), node(None),
                 {"cpuset_cpus": "2-3", "cpu_quota": -1}, "",
                 id="with the node's CPUs unknown only the class and the held CPUs are checked"),
    pytest.param(pod("BE", kube="BestEffort",
                     annotations={RS: status("1", numa=[{"node": 1, "resources": {"cpu": "2"}}])}), NODE,
                 {"cpuset_cpus": "6-7,12-15"}, "QoS class BE",
                 id="an ignored cpuset leaves the rest of resource-status in force (numaNodeResources)"),
]


@pytest.mark.parametrize(("the_pod", "the_node", "expected", "refusal"), CASES)
def test_container_trust(the_pod: PodFacts, the_node: Any, expected: dict[str, Any], refusal: str) -> None:
    for stage in ("rhp_pre_create_container", "rhp_pre_update_container_resources", "rhp_reconcile_container"):
        plan = call(cpuset, stage, pod=the_pod, container=container(), node=the_node)
        want = dict(expected)
        if stage == "rhp_reconcile_container" and want.get("cpuset_cpus") == "":
            del want["cpuset_cpus"]  # the reconciler never clears a cpuset
        assert plan.resources == want, stage
        reasons = [s.reason for s in plan.skipped]
        if refusal:
            assert len(reasons) == 1 and refusal in reasons[0], reasons
            assert reasons[0].startswith(f"pod ns/p (uid {the_pod.uid}): resource-status cpuset "), reasons
        else:
            assert reasons == []


@pytest.mark.parametrize(("the_pod", "the_node", "expected", "refusal"), CASES)
def test_pod_quota_is_lifted_only_for_a_trusted_cpuset(the_pod: PodFacts, the_node: Any, expected: dict[str, Any],
                                                       refusal: str) -> None:
    plan = call(cpuset, "rhp_pre_run_pod_sandbox", pod=the_pod, node=the_node)
    lifted = [("pod", the_pod.cgroup_parent.strip("/"), "cpu.cfs_quota_us", "-1")]
    assert writes(plan) == ([] if refusal else lifted)
    reconciled = call(cpuset, "rhp_reconcile_pod", pod=the_pod, node=the_node)
    assert [w for w in writes(reconciled) if w[2] == "cpu.cfs_quota_us"] == ([] if refusal else lifted)


def _claims(*rows: tuple[str, str | None, str]) -> list[tuple[PodFacts, frozenset[int]]]:
    return [(pod(qos, uid=uid), cpus(cpu_list)) for uid, qos, cpu_list in rows]


@pytest.mark.parametrize(
    ("claims", "bound", "refused"),
    [
        pytest.param(_claims(("a", "LSR", "2-3"), ("b", "LSR", "3-4")), {"a": "2-3"}, {"b": "held by pod a"},
                     id="two LSR pods claiming CPU 3: the older keeps it, the later is refused"),
        pytest.param(_claims(("b", "LSR", "3-4"), ("a", "LSR", "2-3")), {"b": "3-4"}, {"a": "held by pod b"},
                     id="the order given decides, not the uid"),
        pytest.param(_claims(("x", "BE", "2-3"), ("a", "LSR", "2-3")), {"a": "2-3"}, {"x": "QoS class BE"},
                     id="a refused older claim does not block a later trusted one"),
        pytest.param(_claims(("x", "LSR", "2,99"), ("a", "LSR", "2")), {"a": "2"}, {"x": "not on this node"},
                     id="an older claim partly off the node does not block a later one"),
        pytest.param(_claims(("a", "LSR", "2-3"), ("a", "LSR", "2-3")), {"a": "2-3"}, {},
                     id="two sandboxes of one pod do not conflict"),
        pytest.param(_claims(("a", "LSR", "2-3"), ("b", "LSR", "2"), ("a", "LSR", "4")), {"a": "4", "b": "2"}, {},
                     id="a pod's later claim replaces its earlier one, which holds nothing"),
        pytest.param(_claims(("e", "LSE", "8-9"), ("r", "LSR", "10")), {"e": "8-9", "r": "10"}, {},
                     id="disjoint LSE and LSR claims are both bound"),
        pytest.param(_claims(("ls", "LS", "0-15"), ("none", None, "0-15")), {}, {"ls": "QoS class LS",
                                                                                  "none": "QoS class none"},
                     id="LS and label-less claims are never bound"),
    ],
)
def test_node_wide_claims(claims: list[tuple[PodFacts, frozenset[int]]], bound: dict[str, str],
                          refused: dict[str, str]) -> None:
    resolved = resolve_cpuset_claims(claims, DUAL_SOCKET_HT.cpus)
    assert {uid: format_cpu_list(c) for uid, c in resolved.bound.items()} == bound
    assert set(resolved.refused) == set(refused)
    for uid, reason in refused.items():
        assert reason in resolved.refused[uid]
    assert resolved.lse == frozenset(uid for uid in bound if uid == "e")


def test_forged_cpusets_leave_the_share_pools_whole() -> None:
    """A BE pod claiming 0-15 and a BE pod claiming an 'LSE' set take nothing from the LS or BE
    pools: only the real LSR pod's CPUs leave the LS pool."""
    pods = [
        pod("BE", kube="BestEffort", uid="be", annotations={RS: status("0-15")}),
        pod("LS", uid="ls", annotations={RS: status("0-7")}),
        pod("LSR", kube="Guaranteed", uid="lsr", annotations={RS: status("4-5")}),
    ]
    facts = with_bound_pods(node(DUAL_SOCKET_HT), pods)
    assert {uid: format_cpu_list(c) for uid, c in facts.bound_cpusets.items()} == {"lsr": "4-5"}
    assert format_cpu_list(all_share_pool_cpus(compute_share_pools(facts))) == ALL_POOLS
    assert format_cpu_list(all_share_pool_cpus(compute_share_pools(facts, be=True))) == "0-15"


def test_cpu_suppress_counts_only_trusted_lsr_cpus() -> None:
    pods = [
        pod("BE", kube="BestEffort", uid="be", annotations={RS: status("0-7")}),
        pod("LSR", kube="Guaranteed", uid="lsr", annotations={RS: status("4-5")}),
        pod("LSR", kube="Guaranteed", uid="late", annotations={RS: status("5-6")}),
    ]
    assert format_cpu_list(cpu_suppress._lsr_cpus(node(DUAL_SOCKET_HT), pods, Plan())) == "4-5"


_QOS = st.sampled_from(["LSE", "LSR", "LS", "BE", "SYSTEM", None, "lsr"])
_CLAIM = st.tuples(st.sampled_from([f"u{i}" for i in range(6)]), _QOS, st.frozensets(st.integers(0, 20), max_size=6))


@settings(max_examples=300, deadline=None)
@given(claims=st.lists(_CLAIM, max_size=12))
def test_no_cpu_is_ever_bound_twice_nor_to_an_untrusted_pod(
    claims: list[tuple[str, str | None, frozenset[int]]],
) -> None:
    """Whatever pods claim, in whatever order: bound CPUs are the node's, belong to LSE or LSR
    pods, never to two pods, and the plugin pins no pod to CPUs another pod holds (the pod as its
    latest sandbox knows it; an older sandbox of one uid is judged by the latest one's claim)."""
    pods = [(pod(qos, uid=uid, annotations={RS: status(format_cpu_list(c))} if c else {}), c)
            for uid, qos, c in claims]
    resolved = resolve_cpuset_claims(pods, DUAL_SOCKET_HT.cpus)
    seen: dict[int, str] = {}
    for uid, held in resolved.bound.items():
        assert held <= DUAL_SOCKET_HT.cpus
        assert any(p.uid == uid and p.qos_label in ("LSE", "LSR") and c == held for p, c in pods)
        for c in held:
            assert seen.setdefault(c, uid) == uid
    facts = with_bound_pods(node(DUAL_SOCKET_HT), [p for p, _ in pods])
    assert dict(facts.bound_cpusets) == dict(resolved.bound)
    last = {p.uid: i for i, (p, _) in enumerate(pods)}
    for p, _ in (pods[i] for i in sorted(set(last.values()))):  # a pod uid's current sandbox
        plan = call(cpuset, "rhp_pre_create_container", pod=p, container=container(), node=facts)
        pinned = plan.resources.get("cpuset_cpus")
        if plan.resources.get("cpu_quota") == -1:
            assert pinned == format_cpu_list(resolved.bound[p.uid])
        others = frozenset().union(*(c for uid, c in resolved.bound.items() if uid != p.uid))
        if pinned:
            assert not cpus(pinned) & others, (p.uid, pinned)

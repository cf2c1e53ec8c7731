"""``runtime_proxy.engine.bound.BoundCpusets``: the node-wide bound cpusets the interceptor, the
NRI plugin and the reconciler hand to the hooks follow the node's trust rules, and a refused
claim is logged with the pod's identity and counted once per pod and reason."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from hooks.facts import PodFacts, format_cpu_list
from koord_formats import keys
from runtime_proxy.engine.bound import BoundCpusets
from tests.hooks.plugins.factories import node, pod, status
from tests.topologies import DUAL_SOCKET_HT

RS = keys.ANNOTATION_RESOURCE_STATUS


def _count(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "rhp_untrusted_allocations_total", {"annotation": "resource-status", "reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("pods", "bound", "refused", "reason"),
    [
        pytest.param([pod("BE", kube="BestEffort", uid="be", annotations={RS: status("1")})], {}, "be", "qos-class",
                     id="a BE pod's cpuset is not bound"),
        pytest.param([pod("LSR", uid="far", annotations={RS: status("40-41")})], {}, "far", "off-node",
                     id="an LSR cpuset off the node is not bound"),
        pytest.param([pod("LSR", uid="old", annotations={RS: status("2-3")}),
                      pod("LSR", uid="new", annotations={RS: status("3")})], {"old": "2-3"}, "new", "held",
                     id="the older pod keeps CPU 3; the later claim is refused"),
    ],
)
def test_refused_claims_are_logged_and_counted_once(pods: list[PodFacts], bound: dict[str, str], refused: str,
                                                    reason: str) -> None:
    cache = BoundCpusets(where="test")
    before = _count(reason)
    with capture_logs() as logs:
        for _ in range(3):
            got, _lse = cache.bound(pods, node(DUAL_SOCKET_HT))
    assert {uid: format_cpu_list(c) for uid, c in got.items()} == bound
    assert _count(reason) - before == 1, "once per pod and reason, not once per call"
    lines = [entry for entry in logs if "not trusted" in entry["event"]]
    assert len(lines) == 1
    victim = next(p for p in pods if p.uid == refused)
    assert lines[0]["pod"] == f"{victim.namespace}/{victim.name}" and lines[0]["pod_uid"] == refused
    facts = cache.with_bound_pods(node(DUAL_SOCKET_HT), pods)
    assert {uid: format_cpu_list(c) for uid, c in facts.bound_cpusets.items()} == bound

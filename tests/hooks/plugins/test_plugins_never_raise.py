"""Every built-in plugin, at every stage, on hostile input: a plan or None, never an exception
(bad input is logged and skipped, so under ``Ignore`` it never blocks a pod)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.facts import ResctrlFacts
from hooks.manager import builtin_plugin
from hooks.plan import Plan
from hooks.plugins import BUILTIN_PLUGINS
from hooks.spec import STAGES
from hooks.usage import BEState, BurstRound, BurstState, ContainerCPU, ResourceUsage, Usage, UsageSample
from tests.hooks.plugins.factories import container, node, pod
from tests.topologies import DUAL_SOCKET_HT

KEYS = [
    "scheduling.koordinator.sh/resource-status",
    "scheduling.koordinator.sh/device-allocated",
    "node.koordinator.sh/extended-resource-spec",
    "node.koordinator.sh/resctrl",
    "koordinator.sh/cpuQOS",
    "koordinator.sh/cpuBurst",
    "koordinator.sh/eviction-policy",
]
NODE_KEYS = [
    "node.koordinator.sh/cpu-shared-pools",
    "node.koordinator.sh/reservation",
    "node.koordinator.sh/system-qos-resource",
    "kubelet.koordinator.sh/cpu-manager-policy",
    "node.koordinator.sh/pod-cpu-allocs",
    "node.koordinator.sh/cpu-normalization-ratio",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8) | st.sampled_from(["0-", "3-1", "0-3"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["cpuset", "numaNodeResources", "node", "resources", "cpu", "gpu", "minor", "containers",
                         "requests", "limits", "kubernetes.io/batch-cpu", "llc", "mb", "schemata", "range",
                         "percent", "enable", "groupIdentity", "policy", "cpuBurstPercent", "reservedCPUs",
                         "cpusetExclusive", "socket", "memoryEvictThresholdPercent", "memoryEvictLowerPercent",
                         "cpuEvictBESatisfactionLowerPercent", "cpuEvictBESatisfactionUpperPercent",
                         "cpuEvictTimeWindowSeconds", "cpuEvictPolicy"]), inner, max_size=4),
    max_leaves=10,
)
raw = st.one_of(json_values.map(json.dumps), st.text(max_size=20))
slo_values = st.dictionaries(
    st.sampled_from(["resourceQOSStrategy", "cpuBurstStrategy", "hostApplications", "resourceUsedThresholdWithBE"]),
    json_values, max_size=3)


# A usage window that crosses every eviction trigger (memory at 95%, a busy BE share of one CPU).
_SAMPLE_PODS = MappingProxyType({"uid-1": ResourceUsage(cpu_milli=900, memory_bytes=1 << 30)})
USAGE = Usage(
    samples=tuple(
        UsageSample(at=float(i), node_memory_used_bytes=95, node_memory_total_bytes=100, be_cpu_milli=1000,
                    be=BEState(cpuset=frozenset({0})), pods=_SAMPLE_PODS)
        for i in range(40)
    ),
)


# The groups under a resctrl root, with names a pod cannot choose but a broken tree may hold.
GROUPS = ("BE", "LS", "koordlet-uid-1", "koordlet-", "koordlet-..", "koordlet-\x00", "info")


# A CPU burst round with a throttled container, a token bucket and readings that went backwards.
BURST = BurstRound(
    at=10.0, interval=1.0, share_pool_ratio=0.1,
    containers=MappingProxyType({"c": ContainerCPU(-1, nr_periods=5, nr_throttled=9, usage_ns=-3, draw=0.99)}),
    pod_quotas=MappingProxyType({"kubepods/burstable/podu": 0}),
    states=MappingProxyType({"c": BurstState((10, 20, 11.0), (7, 10.0), (-1.0, 5.0, 9.5))}),
)


@settings(max_examples=60, deadline=None)
@given(
    annotations=st.dictionaries(st.sampled_from(KEYS), raw, max_size=4),
    node_annotations=st.dictionaries(st.sampled_from(NODE_KEYS), raw, max_size=3),
    qos=st.sampled_from(["LSE", "LSR", "LS", "BE", "SYSTEM", "XYZ", None]),
    parent=st.sampled_from(["/kubepods/burstable/podu", "/kubepods/../../x", "kubepods-pod_u.slice", "", "\x00"]),
    slo=slo_values,
)
def test_plugins_never_raise(annotations: dict[str, str], node_annotations: dict[str, str], qos: str | None,
                             parent: str, slo: dict[str, Any]) -> None:
    the_pod = pod(qos, annotations=annotations, parent=parent, sandbox_id="sb",
                  containers=(container(cid="c", cpu_quota=50000, cpu_period=100000),))
    the_node = node(DUAL_SOCKET_HT, annotations=node_annotations, slo=slo,
                    resctrl=ResctrlFacts(cbm_mask="fff", cache_ids=(0,), supported=True)).replace(
        node_slo=MappingProxyType(slo))
    c = container(cid="c", cpu_quota=50000, cpu_period=100000)
    usage = Usage((UsageSample(at=1.0, node_cpu_milli=1500, pods={"uid-1": ResourceUsage(700, 1 << 20)},
                               be=BEState(cfs_quota_us=-1, cpuset=frozenset(range(16)))),))
    for name in BUILTIN_PLUGINS:
        module = builtin_plugin(name)
        for hook in STAGES.values():
            fn = getattr(module, hook, None)
            if fn is None:
                continue
            for window in (usage, USAGE):
                kwargs = {"pod": the_pod, "container": c, "node": the_node, "pods": (the_pod,), "usage": window,
                          "resctrl_groups": GROUPS, "burst": BURST}
                args = {k: v for k, v in kwargs.items()
                        if k in fn.__code__.co_varnames[: fn.__code__.co_argcount]}
                result = fn(**args)
                assert result is None or isinstance(result, Plan)

"""NodeSLO strategies reach plugins as typed rules parsed once per update (issue 34 item 4,
Koordinator's ``rule.go``): ``NodeFacts.rules`` is made with the facts, equals what the
``koord_formats.nodeslo`` accessors give (values and problems), survives ``replace`` while the
spec stays, and the built-in plugins read it instead of parsing the raw mapping on every call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks.facts import SLO_CLASSES, CgroupInfo, NodeFacts, ResctrlFacts, parse_rules
from hooks.manager import builtin_plugin
from hooks.plan import Plan
from hooks.plugins import BUILTIN_PLUGINS
from hooks.spec import STAGES
from hooks.usage import BEState, ResourceUsage, Usage, UsageSample
from koord_formats import nodeslo
from tests.hooks.plugins.factories import container, node, pod
from tests.topologies import DUAL_SOCKET_HT

# Every accessor a plugin read the raw spec with before; after, none is called on a hook call.
ACCESSORS = ("cpu_policy", "cpu_qos", "group_identity_enabled", "class_bvt_value", "resctrl_qos",
             "cpu_suppress", "cpu_burst", "host_applications", "eviction", "memory_qos", "memory_qos_configured")

SPEC: dict[str, Any] = {
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "groupIdentity"},
        "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}, "resctrlQOS": {"enable": True}},
        "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}, "resctrlQOS": {"enable": True},
                    "memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80}},
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": "x"},
                    "resctrlQOS": {"enable": True, "catRangeEndPercent": 30}},
    },
    "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65,
                                    "memoryEvictThresholdPercent": 70, "cpuSuppressPolicy": "cfsQuota"},
    "cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": "a"},
    "hostApplications": [{"name": "nginx", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "relativePath": "n"}},
                         {"name": 3}],
}


def _plans(the_node: NodeFacts) -> Iterator[tuple[str, str, Plan | None]]:
    """Every hook of every built-in plugin on one pod of each class and ``the_node``."""
    usage = Usage(tuple(
        UsageSample(at=float(i), node_cpu_milli=1500, node_memory_used_bytes=95, node_memory_total_bytes=100,
                    be_cpu_milli=1000, pods=MappingProxyType({"uid-1": ResourceUsage(700, 1 << 30)}),
                    be=BEState(cfs_quota_us=-1, cpuset=frozenset(range(16))))
        for i in range(40)))
    c = container(cid="c", cpu_quota=50000, cpu_period=100000)
    for qos in ("LSR", "LS", "BE", None):
        the_pod = pod(qos, sandbox_id="sb", containers=(c,))
        for name in BUILTIN_PLUGINS:
            module = builtin_plugin(name)
            for hook in STAGES.values():
                fn = getattr(module, hook, None)
                if fn is None:
                    continue
                kwargs = {"pod": the_pod, "container": c, "node": the_node, "pods": (the_pod,), "usage": usage,
                          "resctrl_groups": ("BE", "LS")}
                if "burst" in fn.__code__.co_varnames[: fn.__code__.co_argcount]:
                    continue
                args = {k: v for k, v in kwargs.items() if k in fn.__code__.co_varnames[: fn.__code__.co_argcount]}
                yield name, hook, fn(**args)


def test_plugins_read_the_rules_not_the_raw_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    the_node = node(DUAL_SOCKET_HT, slo=SPEC, resctrl=ResctrlFacts(cbm_mask="fff", cache_ids=(0,), supported=True))
    the_node = the_node.replace(cgroup=CgroupInfo(version=2))
    before = [(n, h, repr(p)) for n, h, p in _plans(the_node)]
    assert any("bvt_warp_ns" in p for _, _, p in before)  # the spec is used at all
    assert any(n == "memory_qos" and "memory QoS left alone" in p for n, _, p in before)  # read on cgroup v2

    def parsed_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("a NodeSLO strategy was parsed again on a hook call")

    for name in ACCESSORS:
        monkeypatch.setattr(nodeslo, name, parsed_again)
    assert [(n, h, repr(p)) for n, h, p in _plans(the_node)] == before


def test_rules_are_made_with_the_facts_and_kept_by_replace_while_the_spec_stays() -> None:
    the_node = node(DUAL_SOCKET_HT, slo=SPEC)
    rules = the_node.rules
    assert rules.cpu_qos("beClass").group_identity == -1  # "x" is not an int: the default
    problems: list[str] = []
    assert rules.cpu_qos("beClass", problems).enable and problems  # the problem is handed over
    assert [a.name for a in rules.host_applications.value] == ["nginx"] and rules.host_applications.problems
    assert the_node.replace(name="other").rules is rules
    assert the_node.replace(lse_pods=frozenset({"u"})).rules is rules
    assert the_node.replace(node_slo=MappingProxyType({})).rules == parse_rules({})
    changed = the_node.replace(node_slo=MappingProxyType({"resourceUsedThresholdWithBE": {"enable": False}}))
    assert not changed.rules.cpu_suppress.value.enable and rules.cpu_suppress.value.enable
    assert NodeFacts().rules == parse_rules({})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["enable", "groupIdentity", "schedIdle", "coreExpeller", "cpuQOS", "resctrlQOS",
                         "catRangeStartPercent", "catRangeEndPercent", "mbaPercent", "policies", "cpuPolicy",
                         "lsrClass", "lsClass", "beClass", "systemClass", "cpuSuppressThresholdPercent",
                         "cpuSuppressPolicy", "memoryEvictThresholdPercent", "policy", "cpuBurstPercent",
                         "name", "qos", "cgroupPath", "memoryQOS", "minLimitPercent", "lowLimitPercent",
                         "throttlingPercent"]), inner, max_size=4),
    max_leaves=12,
)
specs = st.dictionaries(
    st.sampled_from(["resourceQOSStrategy", "cpuBurstStrategy", "hostApplications", "resourceUsedThresholdWithBE"]),
    json_values, max_size=4)


@given(spec=specs)
def test_the_rules_are_what_the_accessors_give(spec: dict[str, Any]) -> None:
    rules = parse_rules(spec)
    assert rules.cpu_policy == nodeslo.cpu_policy(spec)
    assert rules.group_identity_enabled == nodeslo.group_identity_enabled(spec)
    assert rules.memory_qos_configured == nodeslo.memory_qos_configured(spec)
    for key in (*SLO_CLASSES, "otherClass"):
        for ours, theirs in ((rules.cpu_qos, nodeslo.cpu_qos), (rules.resctrl_qos, nodeslo.resctrl_qos),
                             (rules.memory_qos, nodeslo.memory_qos)):
            mine: list[str] = []
            found: list[str] = []
            assert ours(key, mine) == theirs(spec, key, found) and mine == found, json.dumps(spec)
        assert rules.class_bvt_value(key) == nodeslo.class_bvt_value(spec, key)
    for rule, accessor in ((rules.cpu_suppress, nodeslo.cpu_suppress), (rules.cpu_burst, nodeslo.cpu_burst),
                           (rules.host_applications, nodeslo.host_applications),
                           (rules.eviction, nodeslo.eviction)):
        found = []
        assert rule.value == accessor(spec, found) and list(rule.problems) == found

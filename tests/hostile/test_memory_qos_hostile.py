"""Hostile input to memory QoS: a NodeSLO memoryQOS of wrong types and out-of-range values, pod
annotations and pod specs that are malformed or ask for absurd memory. Each costs only its own
pod (a skip), the healthy pod beside it keeps its values, the parser stays total and nothing
written ever leaves the kernel's range."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.facts import CgroupInfo, NodeFacts, PodFacts
from hooks.plugins import memory_qos
from hooks.usage import Usage, UsageSample
from koord_formats import nodeslo
from koord_formats.keys import SLO
from koord_formats.pod import ContainerResourceSpec
from tests.formats.hostile import call_total, json_values
from tests.hooks.plugins.factories import container, node, pod

MiB = 1 << 20
EXT = "node.koordinator.sh/extended-resource-spec"
INT64_MAX = 2**63 - 1


def v2(spec: Any) -> NodeFacts:
    return replace(node(slo=spec), cgroup=CgroupInfo(version=2))


def healthy() -> PodFacts:
    spec = {"c": ContainerResourceSpec(requests=MappingProxyType({"memory": Fraction(100 * MiB)}))}
    return replace(pod("LS", uid="good", containers=(container("c", "good-c"),)),
                   batch_resources=MappingProxyType(spec))


def plan_for(spec: Any, *pods: PodFacts) -> Any:
    usage = Usage(samples=(UsageSample(at=1.0, node_memory_total_bytes=8 << 30),))
    return memory_qos.rhp_reconcile_usage(node=v2(spec), pods=pods, usage=usage)


ON = {SLO.RESOURCE_QOS_STRATEGY: {SLO.LS_CLASS: {SLO.MEMORY_QOS: {
    "enable": True, "minLimitPercent": 100, "lowLimitPercent": 100, "throttlingPercent": 50}}}}


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("{", id="not JSON"),
        pytest.param("[" * 100_000, id="deeply nested"),
        pytest.param("x" * 200_000, id="over the size bound"),
        pytest.param(json.dumps({"containers": {"c": {"requests": {"memory": "9Ei"}}}}), id="9 EiB"),
        pytest.param(json.dumps({"containers": {"c": {"requests": {"memory": "1e400"}}}}), id="huge exponent"),
        pytest.param(json.dumps({"containers": {"c": {"requests": {"memory": {"a": 1}}}}}), id="an object"),
        pytest.param(json.dumps({"containers": "all"}), id="containers a string"),
    ],
)
def test_a_poisoned_pod_costs_only_itself(annotation: str) -> None:
    bad = pod("LS", uid="bad", annotations={EXT: annotation}, containers=(container("c", "bad-c"),))
    plan = plan_for(ON, bad, healthy())
    assert not [w for w in plan.writes if "bad" in w.path]
    assert any("ns/p" in s.reason for s in plan.skipped)
    mins = {w.path: w.value for w in plan.writes if w.file == "memory.min" and w.level != "kubeqos"}
    assert mins == {"kubepods/burstable/podgood": str(100 * MiB), "kubepods/burstable/podgood/good-c": str(100 * MiB)}


def test_negative_and_zero_memory_protect_nothing() -> None:
    spec = {"c": ContainerResourceSpec(requests=MappingProxyType({"memory": Fraction(-5)}),
                                       limits=MappingProxyType({"memory": Fraction(0)}))}
    p = replace(pod("LS", uid="neg", containers=(container("c", "neg-c"),)), batch_resources=MappingProxyType(spec))
    plan = plan_for(ON, p)
    assert {w.value for w in plan.writes if w.file in ("memory.min", "memory.low")} == {"0"}


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from([SLO.LSR_CLASS, SLO.LS_CLASS, SLO.BE_CLASS, SLO.SYSTEM_CLASS]))
def test_any_memory_qos_section_parses_totally(section: Any, class_key: str) -> None:
    spec = {SLO.RESOURCE_QOS_STRATEGY: {class_key: {SLO.MEMORY_QOS: section}}}
    got = call_total(nodeslo.memory_qos, spec, class_key)
    assert got is not None
    for value, lo, hi in ((got.min_limit_percent, 0, 100), (got.low_limit_percent, 0, 100),
                          (got.throttling_percent, 0, 100), (got.wmark_min_adj, -25, 50)):
        assert lo <= value <= hi


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["enable", "minLimitPercent", "lowLimitPercent", "throttlingPercent"]),
                       st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=8),
                                 st.none())),
       st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**62))
def test_written_values_stay_in_the_kernels_range(section: dict[str, Any], request_: int, limit: int) -> None:
    spec = {SLO.RESOURCE_QOS_STRATEGY: {SLO.LS_CLASS: {SLO.MEMORY_QOS: section}}}
    res = {"c": ContainerResourceSpec(requests=MappingProxyType({"memory": Fraction(request_)}),
                                      limits=MappingProxyType({"memory": Fraction(limit)}))}
    p = replace(pod("LS", uid="u", containers=(container("c", "u-c"),)), batch_resources=MappingProxyType(res))
    plan = plan_for(spec, p)
    for w in plan.writes:
        assert w.value == "max" or 0 <= int(w.value) <= INT64_MAX
        if w.file == "memory.high" and w.value != "max":
            assert int(w.value) % memory_qos.PAGE_SIZE == 0


POD_MEMORY_QOS = "koordinator.sh/memoryQOS"


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("{", id="not JSON"),
        pytest.param("[" * 100_000, id="deeply nested"),
        pytest.param('{"policy":"auto","x":"' + "y" * 200_000 + '"}', id="over the size bound"),
        pytest.param('{"minLimitPercent":' + "9" * 5000 + "}", id="a 5000-digit number"),
        pytest.param('{"minLimitPercent":1e400}', id="a huge exponent"),
        pytest.param('{"minLimitPercent":9223372036854775808}', id="above int64"),
        pytest.param('{"throttlingPercent":-9223372036854775809}', id="below int64"),
        pytest.param('{"policy":"auto","policy":"none","minLimitPercent":500}', id="duplicate keys, out of range"),
        pytest.param('{"policy":{"a":1}}', id="policy an object"),
        pytest.param('{"policy":"\\u0000"}', id="policy a NUL"),
        pytest.param("\ufeff{}", id="a byte order mark"),
        pytest.param("null", id="null"),
    ],
)
def test_a_poisoned_memory_qos_annotation_costs_only_its_own_pod(annotation: str) -> None:
    """The pod with the hostile koordinator.sh/memoryQOS keeps its class values (a skip says
    why); the healthy pod beside it is untouched by it."""
    bad_spec = {"c": ContainerResourceSpec(requests=MappingProxyType({"memory": Fraction(200 * MiB)}))}
    bad = replace(pod("LS", uid="bad", annotations={POD_MEMORY_QOS: annotation}, containers=(container("c", "bad-c"),)),
                  batch_resources=MappingProxyType(bad_spec))
    plan = plan_for(ON, bad, healthy())
    mins = {w.path: w.value for w in plan.writes if w.file == "memory.min" and w.level != "kubeqos"}
    assert mins == {"kubepods/burstable/podgood": str(100 * MiB), "kubepods/burstable/podgood/good-c": str(100 * MiB),
                    "kubepods/burstable/podbad": str(200 * MiB), "kubepods/burstable/podbad/bad-c": str(200 * MiB)}
    reasons = [s.reason for s in plan.skipped]
    assert len(reasons) == 1 and "ns/p" in reasons[0] and POD_MEMORY_QOS in reasons[0], reasons


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_memory_qos_annotation_parses_totally_and_stays_in_range(value: Any) -> None:
    text = json.dumps(value)
    got = call_total(nodeslo.memory_qos_for_pod, nodeslo.MemoryQOS(), SLO.LS_CLASS, text, [])
    for v, lo, hi in ((got.min_limit_percent, 0, 100), (got.low_limit_percent, 0, 100),
                      (got.throttling_percent, 0, 100), (got.wmark_min_adj, -25, 50), (got.priority, 0, 12)):
        assert lo <= v <= hi

"""memory_evict: the amount to free, Koordinator's victim order, the eviction-policy annotation,
the cool-down and that nothing but BE pods is ever evicted."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from hooks.facts import PodFacts
from hooks.plugins import memory_evict
from hooks.usage import EvictionRecord, ResourceUsage, Usage, UsageSample
from tests.hooks.plugins.factories import call, node

GiB = 1 << 30
SLO_ON = {"resourceUsedThresholdWithBE": {"enable": True}}


def be(name: str, used: int, *, priority: int | None = None, qos: str = "BE",
       annotations: dict[str, str] | None = None) -> tuple[PodFacts, int]:
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    return PodFacts(name=name, namespace="ns", uid=f"uid-{name}", labels=MappingProxyType(labels),
                    annotations=MappingProxyType(annotations or {}), priority=priority,
                    cgroup_parent=f"/kubepods/besteffort/poduid-{name}"), used


def usage(pods: list[tuple[PodFacts, int]], used: int, total: int = 100 * GiB, *, at: float = 100.0,
          evicted: tuple[EvictionRecord, ...] = ()) -> Usage:
    sample = UsageSample(at=at, node_memory_used_bytes=used, node_memory_total_bytes=total,
                         pods=MappingProxyType({p.uid: ResourceUsage(memory_bytes=u) for p, u in pods if u >= 0}))
    return Usage(samples=(sample,), recent_evictions=evicted)


def run(pods: list[tuple[PodFacts, int]], used: int, slo: dict[str, Any] | None = None, **kw: Any) -> list[str]:
    plan = call(memory_evict, "rhp_reconcile_usage", node=node(slo=SLO_ON if slo is None else slo),
                pods=tuple(p for p, _ in pods), usage=usage(pods, used, **kw))
    assert all(e.feature == "BEMemoryEvict" for e in plan.evictions)
    return [e.name for e in plan.evictions]


@pytest.mark.parametrize(
    ("used", "total", "threshold", "lower", "expected"),
    [
        pytest.param(69, 100, 70, 68, 0, id="below the threshold nothing is freed"),
        pytest.param(70, 100, 70, 68, 2, id="at the threshold free down to the lower percent"),
        pytest.param(7999, 10000, 70, 68, 1100, id="the usage percentage is truncated before subtracting"),
        pytest.param(90 * GiB, 100 * GiB, 70, 50, 40 * GiB, id="a lower percent far below frees more"),
        pytest.param(50, 0, 70, 68, 0, id="an unknown total frees nothing"),
        pytest.param(150, 100, 70, 68, 82, id="usage above the total is taken as it is"),
    ],
)
def test_memory_to_free(used: int, total: int, threshold: int, lower: int, expected: int) -> None:
    assert memory_evict.memory_to_free(used, total, threshold, lower) == expected


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([be("a", 1 * GiB), be("b", 5 * GiB), be("c", 3 * GiB)], ["b", "c", "a"],
                     id="same priority: the largest memory user goes first"),
        pytest.param([be("a", 1 * GiB, priority=100), be("b", 5 * GiB, priority=5000), be("c", 3 * GiB)],
                     ["c", "a", "b"], id="lower priority goes first whatever its usage, and no priority counts as 0"),
        pytest.param([be("a", 0), be("b", 2 * GiB), be("c", 0)], ["b", "c", "a"],
                     id="pods without usage come last, by name descending"),
        pytest.param([be("x", 1 * GiB), be("y", 1 * GiB), be("z", 1 * GiB)], ["z", "y", "x"],
                     id="equal priority and usage: name descending"),
        pytest.param([be("a", 1 * GiB, priority=-5), be("b", 1 * GiB, priority=None)], ["a", "b"],
                     id="a negative priority sorts before a missing one"),
    ],
)
def test_victim_order(pods: list[tuple[PodFacts, int]], expected: list[str]) -> None:
    assert [p.name for p, _ in memory_evict.order_victims(pods)] == expected


@pytest.mark.parametrize(
    ("pods", "used", "expected"),
    [
        pytest.param([be("a", 1 * GiB), be("b", 5 * GiB), be("c", 3 * GiB)], 71 * GiB, ["b"],
                     id="the first victim frees enough: only it is evicted"),
        pytest.param([be("a", 1 * GiB), be("b", 5 * GiB), be("c", 3 * GiB)], 75 * GiB, ["b", "c"],
                     id="victims are taken until their usage covers the amount"),
        pytest.param([be("a", 1 * GiB), be("b", 5 * GiB)], 95 * GiB, ["b", "a"],
                     id="all BE pods go when even they cannot free enough"),
        pytest.param([be("a", 1 * GiB), be("b", 5 * GiB)], 69 * GiB, [], id="below the threshold nobody is evicted"),
        pytest.param([be("ls", 50 * GiB, qos="LS"), be("lsr", 50 * GiB, qos="LSR"), be("none", 50 * GiB, qos=""),
                      be("a", 1 * GiB)], 99 * GiB, ["a"], id="pods that are not BE are never evicted"),
        pytest.param([be("a", 1 * GiB, annotations={"koordinator.sh/eviction-policy": '["BECPUEvict"]'}),
                      be("b", 1 * GiB, annotations={"koordinator.sh/eviction-policy": '["BEMemoryEvict"]'})],
                     80 * GiB, ["b"], id="the eviction-policy annotation must list BEMemoryEvict"),
        pytest.param([be("a", 9 * GiB, annotations={"koordinator.sh/eviction-policy": "[garbage"}), be("b", 1 * GiB)],
                     71 * GiB, ["b"], id="a malformed eviction-policy protects only that pod and is recorded"),
    ],
)
def test_evictions(pods: list[tuple[PodFacts, int]], used: int, expected: list[str]) -> None:
    assert run(pods, used) == expected


def test_disabled_or_without_sample_plans_nothing() -> None:
    pods = [be("a", 9 * GiB)]
    assert run(pods, 99 * GiB, slo={}) == []
    assert run(pods, 99 * GiB, slo={"resourceUsedThresholdWithBE": {"enable": False}}) == []
    assert memory_evict.rhp_reconcile_usage(node=node(slo=SLO_ON), pods=(pods[0][0],), usage=Usage()) is None


def test_threshold_and_lower_come_from_the_node_slo() -> None:
    slo = {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 50,
                                           "memoryEvictLowerPercent": 40}}
    pods = [be("a", 6 * GiB), be("b", 5 * GiB)]
    assert run(pods, 49 * GiB, slo=slo) == []
    assert run(pods, 50 * GiB, slo=slo) == ["a", "b"]


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param((EvictionRecord("uid-x", "BEMemoryEvict", 97.0),), [],
                     id="within four seconds of its last eviction nothing is evicted"),
        pytest.param((EvictionRecord("uid-x", "BEMemoryEvict", 96.0),), ["b"],
                     id="four seconds after its last eviction it evicts again"),
        pytest.param((EvictionRecord("uid-x", "BECPUEvict", 99.0),), ["b"],
                     id="a CPU eviction does not hold the memory eviction back"),
        pytest.param((EvictionRecord("uid-b", "BEMemoryEvict", 10.0),), ["a"],
                     id="a pod evicted recently is terminating and not chosen again"),
    ],
)
def test_cool_down_and_recent_evictions(records: tuple[EvictionRecord, ...], expected: list[str]) -> None:
    assert run([be("a", 1 * GiB), be("b", 5 * GiB)], 71 * GiB, at=100.0, evicted=records) == expected


def test_a_refused_victim_is_asked_again_and_the_next_one_taken() -> None:
    pods = [be("a", 1 * GiB), be("b", 5 * GiB), be("c", 3 * GiB)]
    the_usage = usage(pods, 71 * GiB)
    refused = Usage(samples=the_usage.samples, refused_uids=frozenset({"uid-b"}))
    plan = call(memory_evict, "rhp_reconcile_usage", node=node(slo=SLO_ON), pods=tuple(p for p, _ in pods),
                usage=refused)
    assert [e.name for e in plan.evictions] == ["b", "c"]


def test_reason_names_usage_threshold_and_amount() -> None:
    pods = [be("a", 3 * GiB)]
    plan = call(memory_evict, "rhp_reconcile_usage", node=node(slo=SLO_ON), pods=(pods[0][0],),
                usage=usage(pods, 72 * GiB))
    (e,) = plan.evictions
    assert (e.uid, e.namespace, e.name) == ("uid-a", "ns", "a")
    assert "72%" in e.reason and "70%" in e.reason and str(4 * GiB) in e.reason
    assert any("free" in s.reason for s in plan.skipped)

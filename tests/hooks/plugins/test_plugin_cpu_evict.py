"""cpu_evict: satisfaction and the release amount, window validity, the usage threshold, victim
order, the eviction-policy annotation, the cool-down, and that nothing but BE pods is evicted."""

from __future__ import annotations

import json
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import pytest

from hooks.facts import PodFacts
from hooks.plugins import cpu_evict
from hooks.plugins.cpu_evict import BEPoint, Candidate
from hooks.usage import BEState, EvictionRecord, ResourceUsage, Usage, UsageSample
from tests.hooks.plugins.factories import call, node

SLO_ON = {"resourceUsedThresholdWithBE": {"enable": True, "cpuEvictBESatisfactionLowerPercent": 40,
                                          "cpuEvictBESatisfactionUpperPercent": 80}}


def be(name: str, request: int, used: int = 0, *, priority: int | None = None, qos: str = "BE",
       annotations: dict[str, str] | None = None) -> tuple[PodFacts, int]:
    spec = {"containers": {"c": {"requests": {"kubernetes.io/batch-cpu": str(request)}}}}
    all_annotations = {"node.koordinator.sh/extended-resource-spec": json.dumps(spec), **(annotations or {})}
    return PodFacts(name=name, namespace="ns", uid=f"uid-{name}",
                    labels=MappingProxyType({"koordinator.sh/qosClass": qos} if qos else {}),
                    annotations=MappingProxyType(all_annotations), priority=priority), used


def window(pods: list[tuple[PodFacts, int]], *, cpus: int, be_used: int, quota: int = -1, n: int = 30,
           start: float = 0.0, evicted: tuple[EvictionRecord, ...] = ()) -> Usage:
    """``n`` one-second samples of a BE share of ``cpus`` CPUs (and ``quota``) using ``be_used``."""
    state = BEState(cfs_quota_us=quota, cfs_period_us=100000, cpuset=frozenset(range(cpus)))
    per_pod = MappingProxyType({p.uid: ResourceUsage(cpu_milli=u) for p, u in pods})
    samples = tuple(UsageSample(at=start + i, be_cpu_milli=be_used, be=state, pods=per_pod) for i in range(n))
    return Usage(samples=samples, interval=1.0, recent_evictions=evicted)


def run(pods: list[tuple[PodFacts, int]], slo: dict[str, Any] | None = None, **kw: Any) -> list[str]:
    plan = call(cpu_evict, "rhp_reconcile_usage", node=node(slo=SLO_ON if slo is None else slo),
                pods=tuple(p for p, _ in pods), usage=window(pods, **kw))
    assert all(e.feature == "BECPUEvict" for e in plan.evictions)
    return [e.name for e in plan.evictions]


@pytest.mark.parametrize(
    ("limit", "used", "requested", "expected"),
    [
        pytest.param(2000, 2000, 10000, 6000, id="satisfaction 0.2 below 0.4: release request x (0.8 - 0.2)"),
        pytest.param(4000, 4000, 10000, 4000, id="satisfaction exactly at the lower bound still releases"),
        pytest.param(4100, 4100, 10000, 0, id="satisfaction above the lower bound releases nothing"),
        pytest.param(2000, 1700, 10000, 0, id="BE usage below 90 percent of its limit releases nothing"),
        pytest.param(2000, 1800, 10000, 6000, id="BE usage at 90 percent of its limit counts as busy"),
        pytest.param(500, 0, 10000, 7500, id="a limit below one CPU counts as busy whatever the usage"),
        pytest.param(2000, 2000, 0, 0, id="no batch-cpu request releases nothing"),
        pytest.param(1000, 1000, 3, 0, id="a tiny request is far more than satisfied"),
    ],
)
def test_milli_to_release(limit: int, used: int, requested: int, expected: int) -> None:
    point = BEPoint(Fraction(limit), Fraction(used))
    assert cpu_evict.milli_to_release(point, requested, 40, 80, 90) == expected


@pytest.mark.parametrize(
    ("cpus", "quota", "be_used", "expected"),
    [
        pytest.param(4, -1, 3000, 4000, id="without a quota the limit is the BE cpuset's CPUs"),
        pytest.param(4, 150000, 1400, 1500, id="a quota below the cpuset is the limit"),
        pytest.param(2, 900000, 2000, 2000, id="a cpuset below the quota is the limit"),
    ],
)
def test_real_limit(cpus: int, quota: int, be_used: int, expected: int) -> None:
    sample = UsageSample(at=0, be_cpu_milli=be_used,
                         be=BEState(cfs_quota_us=quota, cfs_period_us=100000, cpuset=frozenset(range(cpus))))
    point = cpu_evict.be_point(sample, 64)
    assert point is not None and point.real_limit == expected and point.used == be_used


def test_real_limit_falls_back_to_the_node_cpus() -> None:
    sample = UsageSample(at=0, be=BEState())
    assert cpu_evict.be_point(sample, 8) == BEPoint(Fraction(8000), Fraction(0))
    assert cpu_evict.be_point(sample, 0) is None


@pytest.mark.parametrize(
    ("samples", "interval", "window", "valid"),
    [
        pytest.param(10, 1.0, 30.0, True, id="ten one-second samples cover a third of thirty seconds"),
        pytest.param(9, 1.0, 30.0, False, id="nine one-second samples do not"),
        pytest.param(5, 2.0, 30.0, True, id="five two-second samples do"),
        pytest.param(1, 1.0, 1.0, True, id="one sample covers a one-second window"),
        pytest.param(0, 1.0, 1.0, False, id="no sample is never valid"),
    ],
)
def test_window_valid(samples: int, interval: float, window: float, valid: bool) -> None:
    assert cpu_evict.window_valid(samples, interval, window) is valid


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        pytest.param([("a", 1000, 500, None), ("b", 1000, 900, None), ("c", 2000, 1000, None)], ["b", "a", "c"],
                     id="same priority: the highest usage per request first"),
        pytest.param([("a", 1000, 900, 10), ("b", 1000, 100, 5), ("c", 1000, 500, None)], ["c", "b", "a"],
                     id="lower priority first, no priority counting as 0"),
    ],
)
def test_victim_order(candidates: list[tuple[str, int, int, int | None]], expected: list[str]) -> None:
    built = [Candidate(be(n, r, priority=p)[0], r, u) for n, r, u, p in candidates]
    assert [c.pod.name for c in cpu_evict.order_victims(built)] == expected


@pytest.mark.parametrize(
    ("pods", "kw", "expected"),
    [
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000), be("c", 2000, 1900)], {"cpus": 2, "be_used": 2000},
                     ["c", "b"], id="release request x (upper - satisfaction): victims until their requests cover it"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000)], {"cpus": 6, "be_used": 6000}, [],
                     id="satisfaction above the lower bound evicts nobody"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000)], {"cpus": 2, "be_used": 1000}, [],
                     id="an idle BE share evicts nobody"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000)], {"cpus": 2, "be_used": 2000, "quota": 50000},
                     ["b", "a"], id="a quota below one CPU makes the share busy whatever its usage"),
        pytest.param([be("a", 4000, 1000), be("ls", 4000, 3000, qos="LS"), be("b", 4000, 2000)],
                     {"cpus": 3, "be_used": 3000}, ["b"], id="only BE requests count and only BE pods are evicted"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000, annotations={
                          "koordinator.sh/eviction-policy": '["BEMemoryEvict"]'})],
                     {"cpus": 2, "be_used": 2000}, ["a"], id="the eviction-policy annotation must list BECPUEvict"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000, annotations={
                          "node.koordinator.sh/extended-resource-spec": "{bad"})],
                     {"cpus": 1, "be_used": 1000}, ["a"],
                     id="a malformed extended-resource-spec protects only that pod"),
        pytest.param([be("a", 4000, 1000), be("b", 4000, 2000)], {"cpus": 2, "be_used": 2000, "n": 19}, [],
                     id="nothing is evicted in the first twenty seconds of the window"),
    ],
)
def test_evictions(pods: list[tuple[PodFacts, int]], kw: dict[str, Any], expected: list[str]) -> None:
    assert run(pods, **kw) == expected


def test_release_is_the_smaller_of_the_window_average_and_the_latest_sample() -> None:
    pods = [be("a", 3000, 900), be("b", 3000, 800), be("c", 3000, 700), be("d", 3000, 600)]
    state = BEState(cpuset=frozenset(range(2)))
    busy = [UsageSample(at=float(i), be_cpu_milli=2000, be=state,
                        pods=MappingProxyType({p.uid: ResourceUsage(cpu_milli=u) for p, u in pods}))
            for i in range(30)]
    # the latest sample sees 3 CPUs for BE: satisfaction 0.25, release 12000 x 0.55 = 6600;
    # the average over the 30 samples of the window is 2027m: satisfaction 0.169, release 7573;
    # the smaller wins, and a, b, c (by usage per request) cover it.
    latest = UsageSample(at=30.0, be_cpu_milli=3000, be=BEState(cpuset=frozenset(range(3))), pods=busy[0].pods)
    slo = {"resourceUsedThresholdWithBE": {**SLO_ON["resourceUsedThresholdWithBE"], "cpuEvictTimeWindowSeconds": 30}}
    plan = call(cpu_evict, "rhp_reconcile_usage", node=node(slo=slo), pods=tuple(p for p, _ in pods),
                usage=Usage(samples=(*busy, latest), interval=1.0))
    assert [e.name for e in plan.evictions] == ["a", "b", "c"]
    assert "releasing 6600m" in plan.evictions[0].reason


def test_a_refused_victim_is_asked_again_and_the_next_one_taken() -> None:
    pods = [be("a", 4000, 1000), be("b", 4000, 2000)]
    the_usage = window(pods, cpus=3, be_used=3000)
    refused = Usage(samples=the_usage.samples, interval=1.0, refused_uids=frozenset({"uid-b"}))
    plan = call(cpu_evict, "rhp_reconcile_usage", node=node(slo=SLO_ON), pods=tuple(p for p, _ in pods),
                usage=refused)
    assert [e.name for e in plan.evictions] == ["b", "a"]


def test_an_invalid_window_evicts_nobody_and_says_why() -> None:
    pods = [be("a", 4000, 1000)]
    slo = {"resourceUsedThresholdWithBE": {**SLO_ON["resourceUsedThresholdWithBE"], "cpuEvictTimeWindowSeconds": 300}}
    plan = call(cpu_evict, "rhp_reconcile_usage", node=node(slo=slo), pods=(pods[0][0],),
                usage=window(pods, cpus=1, be_used=1000, n=30))
    assert plan.evictions == [] and any("window" in s.reason for s in plan.skipped)


@pytest.mark.parametrize(
    "slo",
    [
        pytest.param({}, id="no NodeSLO section"),
        pytest.param({"resourceUsedThresholdWithBE": {"enable": True}}, id="no satisfaction bounds"),
        pytest.param({"resourceUsedThresholdWithBE": {"enable": True, "cpuEvictBESatisfactionLowerPercent": 40}},
                     id="only the lower bound"),
        pytest.param({"resourceUsedThresholdWithBE": {**SLO_ON["resourceUsedThresholdWithBE"], "enable": False}},
                     id="disabled"),
        pytest.param({"resourceUsedThresholdWithBE": {**SLO_ON["resourceUsedThresholdWithBE"],
                                                      "cpuEvictPolicy": "evictByAllocatable"}},
                     id="the allocatable policy, which the proxy cannot follow"),
    ],
)
def test_off_until_configured(slo: dict[str, Any]) -> None:
    assert run([be("a", 4000, 1000)], slo=slo, cpus=1, be_used=1000) == []


@pytest.mark.parametrize(
    ("records", "cpus", "expected"),
    [
        pytest.param((EvictionRecord("uid-x", "BECPUEvict", 15.0),), 3, [],
                     id="within twenty seconds of its last eviction nothing is evicted"),
        pytest.param((EvictionRecord("uid-x", "BECPUEvict", 9.0),), 3, ["b"],
                     id="twenty seconds after its last eviction it evicts again"),
        pytest.param((EvictionRecord("uid-x", "BEMemoryEvict", 29.0),), 3, ["b"],
                     id="a memory eviction does not hold the CPU eviction back"),
        pytest.param((EvictionRecord("uid-b", "BEMemoryEvict", 1.0),), 1, ["a"],
                     id="a pod evicted recently is neither a victim nor counted in the request"),
    ],
)
def test_cool_down(records: tuple[EvictionRecord, ...], cpus: int, expected: list[str]) -> None:
    pods = [be("a", 4000, 1000), be("b", 4000, 2000)]
    assert run(pods, cpus=cpus, be_used=cpus * 1000, n=30, evicted=records) == expected

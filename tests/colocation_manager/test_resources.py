"""Batch and mid resources of one node (``colocation_manager.resources``): one row per rule
of Koordinator's formulas (``koordinator-manager.md`` sections 3 and 4), each row with its
description.

The node in every row: capacity 100 cores (100000 milli) and 100000 bytes of memory, so
percentages read off directly; co-location enabled with the default reclaim thresholds (CPU
60 %, memory 65 %: margins 40000 and 35000), system usage 5000 of each, and a fresh NodeMetric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

import pytest

from colocation_manager.resources import (
    Amount,
    Metrics,
    NodeInfo,
    PodInfo,
    PodUsage,
    batch_resources,
    mid_resources,
    needs_write,
    zone_batch_resources,
)
from koord_formats import keys
from koord_formats.colocation import ColocationStrategy

NOW = 1_000_000.0
CAP = Amount(100_000, 100_000)
NODE = NodeInfo("n1", CAP, CAP)
ON = ColocationStrategy(enable=True)
BATCH_CPU, BATCH_MEM = keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY
MID_CPU, MID_MEM = keys.RESOURCE_MID_CPU, keys.RESOURCE_MID_MEMORY


def pod(name: str, request: tuple[int, int], *, priority: str = keys.PRIORITY_PROD, qos: str = keys.QOS_LS,
        phase: str = "Running") -> PodInfo:
    return PodInfo("ns", name, phase, priority, qos, Amount(*request))


def metrics(pods: Mapping[str, tuple[int, int] | tuple[int, int, str]] | None = None, *,
            system: tuple[int, int] = (5000, 5000), host_apps: tuple[tuple[int, int, str], ...] = (),
            node_usage: tuple[int, int] = (0, 0), reclaimable: tuple[int, int] | None = None,
            age: float = 60.0) -> Metrics:
    entries = {}
    for name, usage in (pods or {}).items():
        entries[("ns", name)] = PodUsage(Amount(usage[0], usage[1]), usage[2] if len(usage) > 2 else "")
    return Metrics(
        update_time=NOW - age,
        node_usage=Amount(*node_usage),
        system_usage=Amount(*system),
        pods=entries,
        host_apps=tuple(PodUsage(Amount(c, m), p) for c, m, p in host_apps),
        prod_reclaimable=None if reclaimable is None else Amount(*reclaimable),
    )


@dataclass(frozen=True)
class Row:
    description: str
    want: tuple[int, int] | None  # (cpu milli, memory bytes); None: the resources are removed
    pods: tuple[PodInfo, ...] = ()
    metrics: Metrics | None = field(default_factory=metrics)
    strategy: ColocationStrategy = ON
    node: NodeInfo = NODE
    pod_problem: str = ""


PROD_20 = pod("prod", (20_000, 20_000))
USED_10 = {"prod": (10_000, 10_000)}

BATCH_ROWS = [
    Row("usage policy: capacity x reclaim% minus system usage minus HP usage", (45_000, 50_000),
        (PROD_20,), metrics(USED_10)),
    Row("kubelet's reservation (capacity - allocatable) above system usage counts instead", (42_000, 47_000),
        (PROD_20,), metrics(USED_10), node=replace(NODE, allocatable=Amount(92_000, 92_000))),
    Row("the reservation annotation counts when above kubelet's reservation", (38_000, 47_000),
        (PROD_20,), metrics(USED_10),
        node=replace(NODE, allocatable=Amount(92_000, 92_000), reservation=Amount(12_000, 0))),
    Row("an HP pod without a metric counts its request as used", (35_000, 40_000), (PROD_20,), metrics()),
    Row("a batch pod does not count", (55_000, 60_000),
        (pod("b", (20_000, 20_000), priority=keys.PRIORITY_BATCH, qos=keys.QOS_BE),),
        metrics({"b": (30_000, 30_000)})),
    Row("a free pod does not count", (55_000, 60_000),
        (pod("f", (20_000, 20_000), priority=keys.PRIORITY_FREE, qos=keys.QOS_BE),),
        metrics({"f": (30_000, 30_000)})),
    Row("a mid pod is high priority", (45_000, 50_000),
        (pod("m", (20_000, 20_000), priority=keys.PRIORITY_MID),), metrics({"m": (10_000, 10_000)})),
    Row("a Succeeded pod is not listed: its metric is dangling and counts", (45_000, 50_000),
        (pod("prod", (20_000, 20_000), phase="Succeeded"),), metrics(USED_10)),
    Row("a deleted pod's metric (dangling) counts", (45_000, 50_000), (), metrics(USED_10)),
    Row("a dangling metric of priority koord-batch does not count", (55_000, 60_000), (),
        metrics({"gone": (10_000, 10_000, keys.PRIORITY_BATCH)})),
    Row("a dangling metric of priority koord-free does not count", (55_000, 60_000), (),
        metrics({"gone": (10_000, 10_000, keys.PRIORITY_FREE)})),
    Row("a Pending HP pod counts", (45_000, 50_000),
        (pod("prod", (20_000, 20_000), phase="Pending"),), metrics(USED_10)),
    Row("an LSE pod uses its CPU request and its memory usage", (35_000, 50_000),
        (pod("lse", (20_000, 20_000), qos=keys.QOS_LSE),), metrics({"lse": (10_000, 10_000)})),
    Row("a host application of priority prod adds to system usage", (42_000, 47_000),
        (PROD_20,), metrics(USED_10, host_apps=((3000, 3000, keys.PRIORITY_PROD),))),
    Row("a host application of priority mid adds to system usage", (42_000, 47_000),
        (PROD_20,), metrics(USED_10, host_apps=((3000, 3000, keys.PRIORITY_MID),))),
    Row("a host application without a priority is ignored", (45_000, 50_000),
        (PROD_20,), metrics(USED_10, host_apps=((3000, 3000, ""),))),
    Row("a host application of priority batch is ignored", (45_000, 50_000),
        (PROD_20,), metrics(USED_10, host_apps=((3000, 3000, keys.PRIORITY_BATCH),))),
    Row("memory request policy: capacity x reclaim% minus reserved minus HP requests", (45_000, 45_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, memory_calculate_policy="request")),
    Row("memory request policy ignores system usage but not the reservation", (45_000, 37_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, memory_calculate_policy="request"),
        node=replace(NODE, allocatable=Amount(100_000, 92_000))),
    Row("maxUsageRequest: the larger of request and usage per HP pod", (35_000, 40_000),
        (PROD_20,), metrics(USED_10),
        strategy=replace(ON, cpu_calculate_policy="maxUsageRequest", memory_calculate_policy="maxUsageRequest")),
    Row("maxUsageRequest: usage above the request counts", (30_000, 35_000),
        (PROD_20,), metrics({"prod": (25_000, 25_000)}),
        strategy=replace(ON, cpu_calculate_policy="maxUsageRequest", memory_calculate_policy="maxUsageRequest")),
    Row("maxUsageRequest: an HP pod without a metric adds nothing", (55_000, 60_000),
        (PROD_20,), metrics(),
        strategy=replace(ON, cpu_calculate_policy="maxUsageRequest", memory_calculate_policy="maxUsageRequest")),
    Row("CPU knows no request policy: it is read as usage", (45_000, 50_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, cpu_calculate_policy="request")),
    Row("an unknown memory policy is read as usage", (45_000, 50_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, memory_calculate_policy="nonsense")),
    Row("batchCPUThresholdPercent caps batch CPU at capacity x pct", (30_000, 50_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, batch_cpu_threshold_percent=30)),
    Row("batchMemoryThresholdPercent above the result changes nothing", (45_000, 50_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, batch_memory_threshold_percent=80)),
    Row("batchMemoryThresholdPercent 0 gives no batch memory", (45_000, 0),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, batch_memory_threshold_percent=0)),
    Row("a higher reclaim threshold leaves a smaller margin", (65_000, 60_000),
        (PROD_20,), metrics(USED_10), strategy=replace(ON, cpu_reclaim_threshold_percent=80,
                                                       memory_reclaim_threshold_percent=75)),
    Row("never below zero", (0, 0), (pod("big", (90_000, 90_000)),), metrics({"big": (90_000, 90_000)})),
    Row("CPU normalization ratio 1.5 multiplies batch CPU", (67_500, 50_000),
        (PROD_20,), metrics(USED_10), node=replace(NODE, cpu_normalization_ratio=Fraction(3, 2))),
    Row("a normalized value that is not whole is rounded up", (59_849, 49_999),
        (PROD_20,), metrics(USED_10, system=(5001, 5001)),
        node=replace(NODE, cpu_normalization_ratio=Fraction(133, 100))),
    Row("a ratio of 1 changes nothing", (45_000, 50_000),
        (PROD_20,), metrics(USED_10), node=replace(NODE, cpu_normalization_ratio=Fraction(1))),
    Row("a metric exactly degradeTimeMinutes old still counts", (45_000, 50_000),
        (PROD_20,), metrics(USED_10, age=15 * 60)),
    Row("degrade: a metric older than degradeTimeMinutes removes the resources", None,
        (PROD_20,), metrics(USED_10, age=15 * 60 + 1)),
    Row("degrade: a shorter degradeTimeMinutes", None,
        (PROD_20,), metrics(USED_10, age=61), strategy=replace(ON, degrade_time_minutes=1)),
    Row("degrade: no NodeMetric removes the resources", None, (PROD_20,), None),
    Row("degrade: a metric stamped in 2099 (never to expire) removes the resources", None, (PROD_20,),
        metrics(USED_10, age=NOW - 4_070_908_800)),
    Row("degrade: a metric more than a minute in the future removes the resources", None, (PROD_20,),
        metrics(USED_10, age=-61)),
    Row("a metric a minute ahead (clock skew) still counts", (45_000, 50_000), (PROD_20,),
        metrics(USED_10, age=-60)),
    Row("degrade: a NodeMetric without updateTime removes the resources", None, (PROD_20,),
        Metrics(update_time=None)),
    Row("degrade: an unreadable NodeMetric removes the resources", None, (PROD_20,),
        Metrics(update_time=NOW, problem="podsMetric: more than 4096 items")),
    Row("co-location disabled for the node removes the resources", None, (PROD_20,), metrics(USED_10),
        strategy=ColocationStrategy()),
    Row("an undecodable node removes the resources", None, (PROD_20,), metrics(USED_10),
        node=replace(NODE, problem="capacity: not a quantity")),
    Row("an undecodable pod of the node removes the resources", None, (PROD_20,), metrics(USED_10),
        pod_problem="ns/bad: containers: more than 1024 items"),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.description) for r in BATCH_ROWS])
def test_batch_resources(row: Row) -> None:
    got = batch_resources(row.strategy, row.node, row.pods, row.metrics, NOW, row.pod_problem)
    want = {BATCH_CPU: None, BATCH_MEM: None} if row.want is None else {BATCH_CPU: row.want[0], BATCH_MEM: row.want[1]}
    assert dict(got.values) == want, got.reason
    if row.want is None:
        assert got.reason


MID_ROWS = [
    Row("prod reclaimable, below the node's unused", (20_000, 20_000), (PROD_20,),
        metrics(USED_10, node_usage=(30_000, 30_000), reclaimable=(20_000, 20_000))),
    Row("prod reclaimable is capped by capacity minus node usage", (10_000, 5_000), (PROD_20,),
        metrics(USED_10, node_usage=(90_000, 95_000), reclaimable=(20_000, 20_000))),
    Row("node usage above capacity gives no negative mid", (0, 0), (PROD_20,),
        metrics(USED_10, node_usage=(120_000, 120_000), reclaimable=(20_000, 20_000))),
    Row("no prodReclaimable counts 0", (0, 0), (PROD_20,), metrics(USED_10, node_usage=(30_000, 30_000))),
    Row("midUnallocatedPercent adds a share of what prod pods did not request", (50_000, 50_000), (PROD_20,),
        metrics(USED_10, node_usage=(30_000, 30_000), reclaimable=(20_000, 20_000)),
        strategy=replace(ON, mid_unallocated_percent=40)),
    Row("mid, batch and free pods leave the unallocated share alone", (57_500, 57_500),
        (pod("m", (20_000, 20_000), priority=keys.PRIORITY_MID),
         pod("b", (20_000, 20_000), priority=keys.PRIORITY_BATCH)),
        metrics(node_usage=(30_000, 30_000), reclaimable=(10_000, 10_000)),
        strategy=replace(ON, mid_unallocated_percent=50)),
    Row("midCPUThresholdPercent and midMemoryThresholdPercent cap mid", (15_000, 12_000), (PROD_20,),
        metrics(USED_10, node_usage=(30_000, 30_000), reclaimable=(20_000, 20_000)),
        strategy=replace(ON, mid_cpu_threshold_percent=15, mid_memory_threshold_percent=12)),
    Row("static mode: capacity x midStatic*ReservedPercent", (30_000, 10_000), (PROD_20,), metrics(USED_10),
        strategy=replace(ON, mid_reclaim_mode="static", mid_static_cpu_reserved_percent=30,
                         mid_static_memory_reserved_percent=10)),
    Row("static mode is capped by the mid thresholds", (20_000, 10_000), (PROD_20,), metrics(USED_10),
        strategy=replace(ON, mid_reclaim_mode="static", mid_static_cpu_reserved_percent=30,
                         mid_static_memory_reserved_percent=10, mid_cpu_threshold_percent=20)),
    Row("degrade: a stale metric removes mid resources", None, (PROD_20,),
        metrics(USED_10, reclaimable=(20_000, 20_000), age=3600)),
    Row("co-location disabled removes mid resources", None, (PROD_20,), metrics(USED_10),
        strategy=ColocationStrategy()),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.description) for r in MID_ROWS])
def test_mid_resources(row: Row) -> None:
    got = mid_resources(row.strategy, row.node, row.pods, row.metrics, NOW, row.pod_problem)
    want = {MID_CPU: None, MID_MEM: None} if row.want is None else {MID_CPU: row.want[0], MID_MEM: row.want[1]}
    assert dict(got.values) == want, got.reason


@pytest.mark.parametrize(
    ("old", "new", "last_write", "want"),
    [
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1000}, None, False, id="nothing changed: no write"),
        pytest.param({}, {BATCH_CPU: 1000}, NOW - 10, True, id="a resource that appears is written at once"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: None}, NOW - 10, True,
                     id="a resource that goes (degrade) is written at once"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1050}, NOW - 10, False,
                     id="a change within resourceDiffThreshold waits"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1100}, NOW - 10, False,
                     id="a change of exactly resourceDiffThreshold waits"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1101}, NOW - 10, True,
                     id="a change above resourceDiffThreshold is written at once"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 899}, NOW - 10, True, id="a drop above the threshold too"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1050}, NOW - 300, True,
                     id="any change once updateTimeThresholdSeconds passed"),
        pytest.param({BATCH_CPU: 1000}, {BATCH_CPU: 1050}, None, True, id="any change when never written"),
        pytest.param({BATCH_CPU: 0}, {BATCH_CPU: 1}, NOW - 10, True, id="any change from zero is above the threshold"),
    ],
)
def test_needs_write(old: dict[str, int | None], new: dict[str, int | None], last_write: float | None,
                     want: bool) -> None:
    assert needs_write(old, new, ON, last_write, NOW) is want


ZONES = [Amount(50_000, 50_000), Amount(50_000, 50_000)]  # two NUMA zones, half the node each


@pytest.mark.parametrize(
    ("description", "pods", "metrics_", "want"),
    [
        ("a pod on NUMA node 0 counts there only; system usage is split evenly",
         (replace(PROD_20, numa_nodes=(0,)),), metrics(USED_10),
         [(17_500, 20_000), (27_500, 30_000)]),
        ("a pod without resource-status is split evenly over the zones",
         (PROD_20,), metrics(USED_10), [(22_500, 25_000), (22_500, 25_000)]),
        ("a resource-status naming a zone the node lacks: split evenly",
         (replace(PROD_20, numa_nodes=(7,)),), metrics(USED_10), [(22_500, 25_000), (22_500, 25_000)]),
        ("an HP pod without a metric counts its request in the zone",
         (replace(PROD_20, numa_nodes=(1,)),), metrics(), [(27_500, 30_000), (7_500, 10_000)]),
        ("a dangling metric is split evenly", (), metrics(USED_10), [(22_500, 25_000), (22_500, 25_000)]),
        ("degrade: every zone gets 0", (PROD_20,), metrics(USED_10, age=3600), [(0, 0), (0, 0)]),
        ("no NodeMetric: every zone gets 0", (PROD_20,), None, [(0, 0), (0, 0)]),
    ],
)
def test_zone_batch_resources(description: str, pods: tuple[PodInfo, ...], metrics_: Metrics | None,
                              want: list[tuple[int, int]]) -> None:
    got = zone_batch_resources(ON, NODE, ZONES, pods, metrics_, NOW)
    assert [(z[BATCH_CPU], z[BATCH_MEM]) for z in got] == want, description


def test_no_zones_no_zone_values() -> None:
    assert zone_batch_resources(ON, NODE, [], (PROD_20,), metrics(), NOW) == []

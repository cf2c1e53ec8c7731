"""Load-aware scheduling's pure functions (``scheduler_ext/loadaware.py``): the estimator, the
filter verdict and the score, as tables whose rows say what they show (the numbers follow
koord-scheduler's LoadAwareScheduling plugin: ``koordinator-manager.md`` section 5)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from koord_formats.errors import FormatError
from koord_formats.loadaware import AggregatedArgs, CustomThresholds, LoadAwareArgs, parse_load_aware_args
from koord_formats.nodemetric import AggregatedUsage, NodeMetricStatus, PodMetric, Usage
from scheduler_ext.loadaware import (
    NodeLoad,
    NodeMetricView,
    PodLoad,
    estimate,
    filter_reason,
    read_node_load,
    read_node_metric,
    read_pod_load,
    score,
)

GI = 1024**3
MI = 1024**2
NOW = 1_000_000.0
ARGS = LoadAwareArgs()
NODE = NodeLoad(cpu_milli=10_000, memory_bytes=100 * GI)  # 10 cores, 100 GiB
EMPTY = Usage()
POD = PodLoad(cpu_request=1000, memory_request=GI)


def metric(cpu: int | None = None, mem: int | None = None, *, age: float = 10.0, pods: tuple[PodMetric, ...] = (),
           aggregated: tuple[AggregatedUsage, ...] = (), system: Usage = EMPTY) -> NodeMetricView:
    return NodeMetricView(
        update_time=NOW - age,
        report_interval=60,
        status=NodeMetricStatus(node_usage=Usage(cpu, mem), pods=pods, aggregated_node_usages=aggregated,
                                system_usage=system),
    )


# ---- estimator --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimateCase:
    description: str
    pod: PodLoad
    want: dict[str, int]
    factors: dict[str, int] = field(default_factory=lambda: {"cpu": 85, "memory": 70})


ESTIMATE_CASES = [
    EstimateCase("no requests or limits: 250m CPU and 200 MiB", PodLoad(), {"cpu": 250, "memory": 200 * MI}),
    EstimateCase("request only: request x factor", PodLoad(cpu_request=1000, memory_request=1000 * MI),
                 {"cpu": 850, "memory": 700 * MI}),
    EstimateCase("limit above request: limit x factor, at most the limit",
                 PodLoad(cpu_request=1000, cpu_limit=2000, memory_request=GI, memory_limit=2 * GI),
                 {"cpu": 1700, "memory": round(2 * GI * 0.7)}),
    EstimateCase("factor 100 is capped at the limit", PodLoad(cpu_request=1000, cpu_limit=1000),
                 {"cpu": 1000, "memory": 200 * MI}, {"cpu": 100, "memory": 100}),
    EstimateCase("rounds halves away from zero (Go math.Round)", PodLoad(cpu_request=1, memory_request=1),
                 {"cpu": 1, "memory": 1}, {"cpu": 50, "memory": 50}),
    EstimateCase("factor 0 estimates 0 for a pod that names an amount", PodLoad(cpu_request=500),
                 {"cpu": 0, "memory": 200 * MI}, {"cpu": 0, "memory": 70}),
]


@pytest.mark.parametrize("case", ESTIMATE_CASES, ids=lambda c: c.description)
def test_estimate(case: EstimateCase) -> None:
    assert estimate(case.pod, case.factors) == case.want


# ---- filter -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterCase:
    description: str
    metric: NodeMetricView | None
    want: str
    pod: PodLoad = POD
    args: LoadAwareArgs = ARGS
    node: NodeLoad = NODE
    assigned: tuple[PodLoad, ...] = ()


_RECENT = PodLoad("ns", "new", cpu_request=2000, memory_request=GI, scheduled_at=NOW - 5)
_OLD = PodLoad("ns", "old", cpu_request=2000, memory_request=GI, scheduled_at=NOW - 600)
_AGG = (AggregatedUsage(300, {"p95": Usage(7000, GI)}), AggregatedUsage(1800, {"p95": Usage(3000, GI)}))

FILTER_CASES = [
    FilterCase("no NodeMetric: the node passes", None, ""),
    FilterCase("usage below the cpu threshold passes (5.85 of 10 cores = 59% <= 65%)", metric(5000, GI), ""),
    FilterCase("usage over the cpu threshold is refused with Koordinator's reason",
               metric(6000, GI), "node(s) cpu usage exceed threshold"),
    FilterCase("exactly at the threshold after rounding passes (65%)", metric(5650, GI), ""),
    FilterCase("memory over 95% is refused", metric(1000, 95 * GI), "node(s) memory usage exceed threshold"),
    FilterCase("DaemonSet pods always pass", metric(9000, GI), "", pod=PodLoad(daemonset=True)),
    FilterCase("an expired NodeMetric refuses", metric(0, 0, age=180), "node(s) nodeMetric expired"),
    FilterCase("no updateTime counts as expired", NodeMetricView(None, 60), "node(s) nodeMetric expired"),
    FilterCase("an idle report stamped in 2099 is not believed: refused as expired",
               metric(0, 0, age=NOW - 4_070_908_800), "node(s) nodeMetric expired"),
    FilterCase("a report more than a minute in the future is refused as expired", metric(0, 0, age=-61),
               "node(s) nodeMetric expired"),
    FilterCase("a report a minute ahead (clock skew) is believed", metric(5000, GI, age=-60), ""),
    FilterCase("expired with enableScheduleWhenNodeMetricsExpired passes", metric(9000, GI, age=500), "",
               args=LoadAwareArgs(schedule_when_expired=True)),
    FilterCase("expired with filterExpiredNodeMetrics off is judged on its usage", metric(9000, GI, age=500),
               "node(s) cpu usage exceed threshold", args=LoadAwareArgs(filter_expired=False)),
    FilterCase("a pod assigned after the report counts by its estimate (4.25+1.7+0.85 cores = 68%)",
               metric(4250, GI), "node(s) cpu usage exceed threshold", assigned=(_RECENT,)),
    FilterCase("a pod reported long ago counts only by the node usage", metric(4250, GI, pods=(
        PodMetric("ns", "old", Usage(100, MI)),)), "", assigned=(_OLD,)),
    FilterCase("a pod missing from podsMetric counts by its estimate even when old",
               metric(4250, GI), "node(s) cpu usage exceed threshold", assigned=(_OLD,)),
    FilterCase("a reported pod still inside the report interval adds estimate minus its usage",
               metric(4250, GI, pods=(PodMetric("ns", "new", Usage(1000, MI)),)), "", assigned=(_RECENT,)),
    FilterCase("estimatedSecondsAfterPodScheduled keeps a reported pod counted by its estimate (67%)",
               metric(4250, GI, pods=(PodMetric("ns", "old", Usage(100, MI)),)), "node(s) cpu usage exceed threshold",
               assigned=(_OLD,), args=LoadAwareArgs(seconds_after_scheduled=900)),
    FilterCase("once estimatedSecondsAfterPodScheduled has passed, the report counts",
               metric(4250, GI, pods=(PodMetric("ns", "old", Usage(100, MI)),)), "",
               assigned=(_OLD,), args=LoadAwareArgs(seconds_after_scheduled=300)),
    FilterCase("estimatedSecondsAfterInitialized, for an initialized pod, replaces AfterPodScheduled",
               metric(4250, GI, pods=(PodMetric("ns", "old", Usage(100, MI)),)), "",
               assigned=(PodLoad("ns", "old", cpu_request=2000, scheduled_at=NOW - 600, initialized_at=NOW - 590),),
               args=LoadAwareArgs(seconds_after_scheduled=900, seconds_after_initialized=60)),
    FilterCase("allowCustomizeEstimation: the pod's own factor (100: 5 + 1 = 60%) counts", metric(5000, GI), "",
               pod=PodLoad(cpu_request=1000, factors={"cpu": 100}), args=LoadAwareArgs(allow_customize=True)),
    FilterCase("without allowCustomizeEstimation the pod's own factor is ignored (5.6 + 0.85 = 65%; 100 would be 66%)",
               metric(5600, GI), "",
               pod=PodLoad(cpu_request=1000, factors={"cpu": 100})),
    FilterCase("node annotation thresholds override the args", metric(5000, GI),
               "node(s) cpu usage exceed threshold",
               node=NodeLoad(10_000, 100 * GI, CustomThresholds(usage_thresholds={"cpu": 50}))),
    FilterCase("threshold 0 means no threshold", metric(9900, GI), "",
               args=LoadAwareArgs(usage_thresholds={"cpu": 0, "memory": 95})),
    FilterCase("allocatable 0 skips the resource", metric(9900, GI), "", node=NodeLoad(0, 100 * GI)),
    FilterCase("aggregated thresholds use the duration asked for", metric(1000, GI, aggregated=_AGG),
               "node(s) cpu aggregated usage exceed threshold",
               args=LoadAwareArgs(aggregated=AggregatedArgs({"cpu": 70}, "p95", 300))),
    FilterCase("aggregated duration 0 uses the longest reported", metric(1000, GI, aggregated=_AGG), "",
               args=LoadAwareArgs(aggregated=AggregatedArgs({"cpu": 70}, "p95", 0))),
    FilterCase("aggregation missing for the duration: the assigned pods' full estimates",
               metric(9000, GI, aggregated=_AGG), "",
               args=LoadAwareArgs(aggregated=AggregatedArgs({"cpu": 70}, "p95", 600))),
    FilterCase("a prod pod under prodUsageThresholds counts only prod pods' usage",
               metric(9000, GI, pods=(PodMetric("ns", "p", Usage(1000, MI), priority="koord-prod"),
                                      PodMetric("ns", "b", Usage(7000, MI), priority="koord-batch"))), "",
               pod=PodLoad(cpu_request=1000, prod=True),
               args=LoadAwareArgs(prod_usage_thresholds={"cpu": 30})),
    FilterCase("prodUsageIncludeSys adds system usage to the prod usage",
               metric(9000, GI, pods=(PodMetric("ns", "p", Usage(1000, MI), priority="koord-prod"),),
                      system=Usage(2000, MI)), "node(s) cpu usage exceed threshold",
               pod=PodLoad(cpu_request=1000, prod=True),
               args=LoadAwareArgs(prod_usage_thresholds={"cpu": 30}, prod_usage_include_sys=True)),
]


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: c.description)
def test_filter(case: FilterCase) -> None:
    assert filter_reason(case.args, case.pod, case.node, case.metric, case.assigned, NOW) == case.want


# ---- score ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreCase:
    description: str
    metric: NodeMetricView | None
    want: int
    args: LoadAwareArgs = ARGS
    pod: PodLoad = POD


SCORE_CASES = [
    ScoreCase("no NodeMetric scores 0", None, 0),
    ScoreCase("expired scores 0", metric(0, 0, age=200), 0),
    ScoreCase("a report from the future scores 0", metric(0, 0, age=-3600), 0),
    ScoreCase("weighted mean of free shares: cpu (10-0.85-1.15)/10 = 80, memory (100-0.7-9.3)/100 = 90",
              metric(1150, round(9.3 * GI)), 85),
    ScoreCase("used above allocatable scores 0 for that resource", metric(20_000, round(9.3 * GI)), 45),
    ScoreCase("resourceWeights weigh the mean", metric(1150, round(9.3 * GI)), 82,
              args=LoadAwareArgs(resource_weights={"cpu": 3, "memory": 1})),
    ScoreCase("dominantResourceWeight adds the lowest resource score: (80 + 90 + 2 x 80) / 4", metric(
        1150, round(9.3 * GI)), 82, args=LoadAwareArgs(dominant_weight=2)),
    ScoreCase("dominantResourceWeight without resourceWeights scores the dominant resource alone",
              metric(1150, round(9.3 * GI)), 80, args=LoadAwareArgs(resource_weights={}, dominant_weight=1)),
    ScoreCase("scoreAggregationType scores the aggregated usage", metric(
        1150, round(9.3 * GI), aggregated=(AggregatedUsage(300, {"p99": Usage(5150, round(9.3 * GI))}),)), 65,
        args=LoadAwareArgs(aggregated=AggregatedArgs(score_type="p99"))),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda c: c.description)
def test_score(case: ScoreCase) -> None:
    assert score(case.args, case.pod, NODE, case.metric, (), NOW) == case.want


# ---- decoding -----------------------------------------------------------------------------------------


def test_read_pod_load_translates_batch_resources_and_reads_scheduled_time() -> None:
    pod = {
        "metadata": {"namespace": "b", "name": "job", "labels": {"koordinator.sh/qosClass": "BE"},
                     "ownerReferences": [{"kind": "DaemonSet", "name": "d"}]},
        "spec": {"priority": 5500, "containers": [
            {"resources": {"requests": {"kubernetes.io/batch-cpu": "500", "cpu": "9"},
                           "limits": {"kubernetes.io/batch-memory": "1Gi"}}}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                   "lastTransitionTime": "1970-01-01T00:01:40Z"}]},
    }
    load = read_pod_load(pod)
    assert (load.cpu_request, load.memory_request, load.memory_limit) == (500, GI, GI)
    assert load.daemonset and not load.prod and load.scheduled_at == 100.0


def test_read_pod_load_sums_containers_and_takes_the_larger_init_container() -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "250m"}}},
                                   {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],
                    "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}}
    load = read_pod_load(pod)
    assert (load.cpu_request, load.cpu_limit, load.memory_request) == (2000, 1000, GI)
    assert load.prod  # no priority, no QoS label, no kube QoS: koord-prod by default


def test_read_pod_load_custom_scaling_factors_and_an_unreadable_one() -> None:
    ann = "scheduling.koordinator.sh/load-estimated-scaling-factors"
    assert read_pod_load({"metadata": {"annotations": {ann: '{"cpu": 100}'}}}).factors == {"cpu": 100}
    assert read_pod_load({"metadata": {"annotations": {ann: '{"cpu": "x"}'}}}).factors is None


def test_read_node_load_raw_allocatable_and_bad_annotation_kept_as_error() -> None:
    node = {"metadata": {"annotations": {
        "node.koordinator.sh/raw-allocatable": '{"cpu": "8"}',
        "scheduling.koordinator.sh/usage-thresholds": "{not json"}},
        "status": {"allocatable": {"cpu": "16", "memory": "32Gi"}}}
    load = read_node_load(node)
    assert (load.cpu_milli, load.memory_bytes, load.custom) == (8000, 32 * GI, None)
    assert "usage-thresholds" in load.custom_error


def test_read_node_metric_reads_update_time_and_report_interval() -> None:
    view = read_node_metric({
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 30}},
        "status": {"updateTime": "1970-01-01T00:00:10Z", "nodeMetric": {"nodeUsage": {"resources": {"cpu": "2"}}}},
    })
    assert (view.update_time, view.report_interval, view.status.node_usage.cpu_milli) == (10.0, 30, 2000)
    with pytest.raises(FormatError):
        read_node_metric({"status": {"updateTime": "yesterday"}})


# ---- the args (koord_formats/loadaware.py) ---------------------------------------------------------------


@dataclass(frozen=True)
class ArgsCase:
    description: str
    section: object
    want: LoadAwareArgs | None  # None: FormatError


ARGS_CASES = [
    ArgsCase("empty section: Koordinator's defaults", {}, LoadAwareArgs()),
    ArgsCase("a scaling factor left out keeps its default", {"estimatedScalingFactors": {"cpu": 50}},
             LoadAwareArgs(scaling_factors={"cpu": 50, "memory": 70})),
    ArgsCase("empty thresholds and weights mean the defaults", {"usageThresholds": {}, "resourceWeights": {}},
             LoadAwareArgs()),
    ArgsCase("Koordinator's own args document is accepted", {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "LoadAwareSchedulingArgs",
        "nodeMetricExpirationSeconds": 300, "usageThresholds": {"cpu": 75},
        "aggregated": {"usageThresholds": {"cpu": 70}, "usageAggregationType": "p95",
                       "usageAggregatedDuration": "5m"}},
        LoadAwareArgs(expiration_seconds=300, usage_thresholds={"cpu": 75},
                      aggregated=AggregatedArgs({"cpu": 70}, "p95", 300))),
    ArgsCase("forced estimation seconds", {"estimatedSecondsAfterPodScheduled": 300,
                                           "estimatedSecondsAfterInitialized": 60},
             LoadAwareArgs(seconds_after_scheduled=300, seconds_after_initialized=60)),
    ArgsCase("an unknown setting is refused (a misspelling would keep a default)", {"usageThreshold": {}}, None),
    ArgsCase("a threshold above 100 is refused", {"usageThresholds": {"cpu": 101}}, None),
    ArgsCase("a resource other than cpu and memory is refused", {"usageThresholds": {"gpu": 1}}, None),
    ArgsCase("an unknown aggregation type is refused", {"aggregated": {"scoreAggregationType": "max"}}, None),
    ArgsCase("expiration 0 is refused (Koordinator requires > 0)", {"nodeMetricExpirationSeconds": 0}, None),
    ArgsCase("all weights 0 are refused", {"resourceWeights": {"cpu": 0, "memory": 0}}, None),
    ArgsCase("dominantResourceWeight alone: no default resourceWeights", {"dominantResourceWeight": 5},
             LoadAwareArgs(resource_weights={}, dominant_weight=5)),
    ArgsCase("dominantResourceWeight above 100 is refused", {"dominantResourceWeight": 101}, None),
    ArgsCase("a section that is not an object is refused", ["cpu"], None),
]


@pytest.mark.parametrize("case", ARGS_CASES, ids=lambda c: c.description)
def test_parse_load_aware_args(case: ArgsCase) -> None:
    if case.want is None:
        with pytest.raises(FormatError):
            parse_load_aware_args(case.section)
    else:
        got = parse_load_aware_args(case.section)
        assert got == case.want

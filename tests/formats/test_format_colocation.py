"""slo-controller-config's colocation-config (``koord_formats.colocation``) and label selectors
(``koord_formats.selector``): defaults, the cluster and node strategies, the node's own
annotation and labels, the NodeMetric collect policy, and hostile text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_formats import FormatError, colocation, nodemetric, selector
from koord_formats.colocation import ColocationStrategy, parse_colocation_config
from tests.formats.hostile import FRAGMENTS, call_total, fill


def cfg(doc: dict[str, Any]) -> colocation.ColocationConfig:
    return parse_colocation_config(json.dumps(doc))


GPU = {"matchLabels": {"pool": "gpu"}}


@pytest.mark.parametrize(
    ("description", "doc", "labels", "annotations", "want"),
    [
        ("a missing key gives Koordinator's defaults", None, {}, {}, ColocationStrategy()),
        ("cluster fields overlay the defaults", {"enable": True, "cpuReclaimThresholdPercent": 70},
         {}, {}, ColocationStrategy(enable=True, cpu_reclaim_threshold_percent=70)),
        ("null fields keep the default", {"enable": True, "degradeTimeMinutes": None},
         {}, {}, ColocationStrategy(enable=True)),
        ("the first matching node config overlays the cluster strategy",
         {"enable": True, "nodeConfigs": [
             {"name": "gpu", "nodeSelector": GPU, "memoryReclaimThresholdPercent": 50},
             {"name": "all-gpu", "nodeSelector": GPU, "memoryReclaimThresholdPercent": 40}]},
         {"pool": "gpu"}, {}, ColocationStrategy(enable=True, memory_reclaim_threshold_percent=50)),
        ("a node that matches no entry gets the cluster strategy",
         {"enable": True, "nodeConfigs": [{"nodeSelector": GPU, "enable": False}]},
         {"pool": "cpu"}, {}, ColocationStrategy(enable=True)),
        ("an entry without matchLabels is invalid and matches no node",
         {"enable": True, "nodeConfigs": [
             {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, "enable": False}]},
         {"pool": "gpu"}, {}, ColocationStrategy(enable=True)),
        ("an entry whose merged strategy is invalid stands for the cluster strategy",
         {"enable": True, "cpuReclaimThresholdPercent": 55, "nodeConfigs": [
             {"nodeSelector": GPU, "degradeTimeMinutes": 0},
             {"nodeSelector": GPU, "cpuReclaimThresholdPercent": 90}]},
         {"pool": "gpu"}, {}, ColocationStrategy(enable=True, cpu_reclaim_threshold_percent=55)),
        ("the node annotation overlays the node's strategy",
         {"enable": True},
         {}, {colocation.ANNOTATION_NODE_COLOCATION_STRATEGY: '{"cpuCalculatePolicy":"maxUsageRequest"}'},
         ColocationStrategy(enable=True, cpu_calculate_policy="maxUsageRequest")),
        ("an annotation that is not JSON is ignored", {"enable": True},
         {}, {colocation.ANNOTATION_NODE_COLOCATION_STRATEGY: "{"}, ColocationStrategy(enable=True)),
        ("an annotation that makes the strategy invalid is ignored", {"enable": True},
         {}, {colocation.ANNOTATION_NODE_COLOCATION_STRATEGY: '{"resourceDiffThreshold":2}'},
         ColocationStrategy(enable=True)),
        ("reclaim-ratio labels override the percentages (x100, truncated)", {"enable": True},
         {colocation.LABEL_CPU_RECLAIM_RATIO: "0.555", colocation.LABEL_MEMORY_RECLAIM_RATIO: "0.8",
          colocation.LABEL_MID_STATIC_CPU_RESERVED_RATIO: "0.1",
          colocation.LABEL_MID_STATIC_MEMORY_RESERVED_RATIO: "0.2"}, {},
         ColocationStrategy(enable=True, cpu_reclaim_threshold_percent=55, memory_reclaim_threshold_percent=80,
                            mid_static_cpu_reserved_percent=10, mid_static_memory_reserved_percent=20)),
        ("invalid and negative ratio labels are ignored", {"enable": True},
         {colocation.LABEL_CPU_RECLAIM_RATIO: "x", colocation.LABEL_MEMORY_RECLAIM_RATIO: "-0.5"}, {},
         ColocationStrategy(enable=True)),
        ("durations are read as Go durations",
         {"enable": True, "metricAggregatePolicy": {"durations": ["1m", "1h30m"]}},
         {}, {}, ColocationStrategy(enable=True, metric_aggregate_durations=(60, 5400))),
    ],
)
def test_node_strategy(description: str, doc: dict[str, Any] | None, labels: dict[str, str],
                       annotations: dict[str, str], want: ColocationStrategy) -> None:
    config = parse_colocation_config(None) if doc is None else cfg(doc)
    assert config.for_node(labels, annotations) == want, description


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({"enable": "yes"}, id="enable that is a string"),
        pytest.param({"cpuReclaimThresholdPercent": -1}, id="a negative reclaim threshold"),
        pytest.param({"cpuReclaimThresholdPercent": 60.5}, id="a reclaim threshold that is not an integer"),
        pytest.param({"degradeTimeMinutes": 0}, id="degradeTimeMinutes 0"),
        pytest.param({"updateTimeThresholdSeconds": 0}, id="updateTimeThresholdSeconds 0"),
        pytest.param({"resourceDiffThreshold": 0}, id="resourceDiffThreshold 0"),
        pytest.param({"resourceDiffThreshold": 1.5}, id="resourceDiffThreshold above 1"),
        pytest.param({"midCPUThresholdPercent": 101}, id="a mid threshold above 100"),
        pytest.param({"midReclaimMode": "dynamic"}, id="an unknown mid reclaim mode"),
        pytest.param({"metricMemoryCollectPolicy": ""}, id="an empty memory collect policy"),
        pytest.param({"metricAggregatePolicy": {"durations": ["1.5s"]}}, id="a duration of a fraction of a second"),
        pytest.param({"metricAggregatePolicy": {"durations": ["-5m"]}}, id="a negative duration"),
        pytest.param({"metricAggregatePolicy": {"durations": ["25h"]}}, id="a duration above a day"),
        pytest.param({"nodeConfigs": {}}, id="nodeConfigs that is not a list"),
        pytest.param({"nodeConfigs": [{}] * 300}, id="more than 256 nodeConfigs"),
    ],
)
def test_invalid_cluster_strategy_refuses_the_config(doc: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        cfg(doc)


def test_empty_text_is_the_default() -> None:
    assert parse_colocation_config("").cluster == ColocationStrategy()


@pytest.mark.parametrize(
    ("strategy", "want"),
    [
        pytest.param(ColocationStrategy(), {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
                                            "durations": ["5m0s", "10m0s", "30m0s"]},
                     id="disabled: the default spec"),
        pytest.param(ColocationStrategy(enable=False, metric_report_interval_seconds=30),
                     {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
                      "durations": ["5m0s", "10m0s", "30m0s"]},
                     id="disabled: metric settings do not apply"),
        pytest.param(ColocationStrategy(enable=True, metric_report_interval_seconds=30,
                                        metric_aggregate_durations=(90, 3600)),
                     {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 30,
                      "durations": ["1m30s", "1h0m0s"]},
                     id="enabled: the node's metric settings"),
    ],
)
def test_metric_collect_spec(strategy: ColocationStrategy, want: dict[str, Any]) -> None:
    policy = colocation.metric_collect_spec(strategy)["metricCollectPolicy"]
    assert policy["aggregateDurationSeconds"] == want["aggregateDurationSeconds"]
    assert policy["reportIntervalSeconds"] == want["reportIntervalSeconds"]
    assert policy["nodeAggregatePolicy"]["durations"] == want["durations"]
    assert policy["nodeMemoryCollectPolicy"] == "usageWithoutPageCache"


def test_overlay_merges_objects_and_replaces_lists() -> None:
    base = {"a": {"x": 1, "y": 2}, "l": [1, 2], "k": 1}
    assert colocation.overlay(base, {"a": {"y": 3}, "l": [9], "k": None}) == {"a": {"x": 1, "y": 3}, "l": [9], "k": 1}
    assert base == {"a": {"x": 1, "y": 2}, "l": [1, 2], "k": 1}


@pytest.mark.parametrize(
    ("doc", "labels", "want"),
    [
        pytest.param({}, {"a": "1"}, True, id="an empty selector matches everything"),
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True, id="matchLabels subset"),
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "2"}, False, id="matchLabels other value"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True,
                     id="In"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True,
                     id="NotIn matches an absent key"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False,
                     id="NotIn"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True, id="Exists"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False,
                     id="DoesNotExist"),
    ],
)
def test_label_selector(doc: dict[str, Any], labels: dict[str, str], want: bool) -> None:
    assert selector.parse_label_selector(doc).matches(labels) is want


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, id="In without values"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
                     id="Exists with values"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, id="unknown operator"),
        pytest.param({"matchExpressions": [{"key": "", "operator": "Exists"}]}, id="empty key"),
        pytest.param({"matchLabels": {"a": 1}}, id="a label value that is a number"),
        pytest.param({"matchLabels": {str(i): "x" for i in range(100)}}, id="too many labels"),
        pytest.param([], id="not an object"),
    ],
)
def test_label_selector_refuses(doc: Any) -> None:
    with pytest.raises(FormatError):
        selector.parse_label_selector(doc)


TEMPLATES = [
    '{"enable":true,"cpuReclaimThresholdPercent":HOLE}',
    '{"metricAggregatePolicy":{"durations":[HOLE]}}',
    '{"nodeConfigs":[{"nodeSelector":HOLE,"enable":true}]}',
    '{"nodeConfigs":[{"nodeSelector":{"matchLabels":{"a":"b"}},"resourceDiffThreshold":HOLE}]}',
    "HOLE",
]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("fragment", range(len(FRAGMENTS)))
def test_hostile_colocation_config(template: str, fragment: int) -> None:
    """Every hostile fragment in every position: a strategy or ``FormatError``, within the bound."""
    def parse_and_use(text: str) -> object:
        config = parse_colocation_config(text)
        return colocation.metric_collect_spec(config.for_node({"a": "b"}, {}))

    call_total(parse_and_use, fill(template, FRAGMENTS[fragment]))


def test_oversized_config_is_refused_unparsed() -> None:
    with pytest.raises(FormatError, match="more than"):
        parse_colocation_config('{"enable":true,"x":"' + "a" * (colocation.MAX_CONFIG_CHARS + 1) + '"}')


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(ColocationStrategy(), id="defaults"),
        pytest.param(ColocationStrategy(enable=True, metric_aggregate_duration_seconds=120,
                                        metric_report_interval_seconds=30, metric_aggregate_durations=(90, 3600),
                                        metric_memory_collect_policy="usageWithPageCache"), id="enabled, all set"),
    ],
)
def test_metric_collect_spec_reads_back_as_the_node_agent_reads_it(strategy: ColocationStrategy) -> None:
    """The spec the manager writes is the one ``koord_formats.nodemetric`` (the node agent's
    reader) reads back: one format, written here, parsed there."""
    policy = nodemetric.parse_collect_policy(colocation.metric_collect_spec(strategy))
    s = strategy if strategy.enable else ColocationStrategy()
    assert policy == nodemetric.CollectPolicy(s.metric_aggregate_duration_seconds, s.metric_report_interval_seconds,
                                              s.metric_aggregate_durations, s.metric_memory_collect_policy)

"""koord_formats/nodemetric.py: the collect policy with koordlet's defaults, Go durations, and the
status formatter and parser as each other's inverse; hostile statuses cost a FormatError."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_formats import FormatError
from koord_formats.nodemetric import (
    DEFAULT_COLLECT_POLICY,
    AggregatedUsage,
    CollectPolicy,
    HostAppMetric,
    NodeMetricStatus,
    PodMetric,
    Usage,
    format_go_duration,
    format_node_metric_status,
    parse_collect_policy,
    parse_go_duration,
    parse_node_metric_status,
)
from tests.formats.hostile import FRAGMENTS, HOLE, call_total, fill


@pytest.mark.parametrize(("spec", "expected"), [
    pytest.param(None, DEFAULT_COLLECT_POLICY, id="no spec: koordlet's defaults"),
    pytest.param({}, DEFAULT_COLLECT_POLICY, id="empty spec: defaults"),
    pytest.param({"metricCollectPolicy": {"aggregateDurationSeconds": 60}},
                 CollectPolicy(aggregate_duration_seconds=60), id="one field overlays the defaults"),
    pytest.param({"metricCollectPolicy": {"reportIntervalSeconds": 10,
                                          "nodeAggregatePolicy": {"durations": ["1m0s", "90s"]},
                                          "nodeMemoryCollectPolicy": "usageWithPageCache"}},
                 CollectPolicy(report_interval_seconds=10, durations=(60, 90), memory_policy="usageWithPageCache"),
                 id="every field"),
    pytest.param({"metricCollectPolicy": {"nodeAggregatePolicy": {}}}, DEFAULT_COLLECT_POLICY,
                 id="an aggregate policy without durations keeps the default durations"),
])  # fmt: skip
def test_collect_policy(spec: Any, expected: CollectPolicy) -> None:
    assert parse_collect_policy(spec) == expected


def test_report_interval_is_at_least_thirty_seconds() -> None:
    assert CollectPolicy(report_interval_seconds=10).report_every_seconds == 30
    assert CollectPolicy(report_interval_seconds=90).report_every_seconds == 90


@pytest.mark.parametrize("spec", [
    pytest.param("x", id="spec not an object"),
    pytest.param({"metricCollectPolicy": []}, id="policy not an object"),
    pytest.param({"metricCollectPolicy": {"aggregateDurationSeconds": 0}}, id="zero seconds"),
    pytest.param({"metricCollectPolicy": {"aggregateDurationSeconds": 1e9}}, id="a float"),
    pytest.param({"metricCollectPolicy": {"reportIntervalSeconds": True}}, id="a bool"),
    pytest.param({"metricCollectPolicy": {"reportIntervalSeconds": 10**30}}, id="huge"),
    pytest.param({"metricCollectPolicy": {"nodeMemoryCollectPolicy": "all"}}, id="unknown memory policy"),
    pytest.param({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["5m"] * 17}}}, id="17 durations"),
    pytest.param({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["500ms"]}}}, id="sub-second"),
    pytest.param({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["25h"]}}}, id="over a day"),
    pytest.param({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": [300]}}}, id="a number"),
])  # fmt: skip
def test_bad_collect_policy_is_a_format_error(spec: Any) -> None:
    with pytest.raises(FormatError):
        parse_collect_policy(spec)


@pytest.mark.parametrize(("text", "seconds"), [
    ("5m0s", 300.0), ("300s", 300.0), ("1h0m0s", 3600.0), ("1h30m", 5400.0), ("1.5m", 90.0), ("0", 0.0),
    ("1500ms", 1.5),
])  # fmt: skip
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "m", "-5m", "5 m", "1d", "5m0", "9" * 40 + "s", "\uff11s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(FormatError):
        parse_go_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (30, "30s"), (300, "5m0s"), (600, "10m0s"),
                                               (1800, "30m0s"), (3600, "1h0m0s"), (3661, "1h1m1s")])
def test_go_duration_format(seconds: int, text: str) -> None:
    assert format_go_duration(seconds) == text
    assert parse_go_duration(text) == seconds


FULL = NodeMetricStatus(
    update_time="2026-11-27T08:00:00Z",
    node_usage=Usage(1500, 2 * 1024**3),
    aggregated_node_usages=(
        AggregatedUsage(300, MappingProxyType({"p50": Usage(1000, 1024), "p90": Usage(1200, 2048),
                                               "p95": Usage(1300, 3000), "p99": Usage(1400, 4096)})),
        AggregatedUsage(1800, MappingProxyType({"p50": Usage(), "p90": Usage(), "p95": Usage(), "p99": Usage()})),
    ),
    system_usage=Usage(200, 1000),
    aggregated_system_usages=(AggregatedUsage(300, MappingProxyType({"p99": Usage(300, 5000)})),),
    pods=(PodMetric("default", "web", Usage(100, 4096), "koord-prod", "LS"),
          PodMetric("batch", "job", Usage(0, 0), "koord-batch", "BE")),
    host_apps=(HostAppMetric("nginx", Usage(50, 1 << 20), "koord-prod", "LS"),),
)  # fmt: skip


def test_status_wire_form() -> None:
    doc = format_node_metric_status(FULL)
    assert doc["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "1500m", "memory": "2Gi"}}
    assert doc["nodeMetric"]["aggregatedNodeUsages"][0]["duration"] == "5m0s"
    assert doc["nodeMetric"]["aggregatedNodeUsages"][1]["usage"]["p50"] == {}, "cold start: an empty map"
    assert doc["podsMetric"][0] == {"namespace": "default", "name": "web", "priority": "koord-prod", "qos": "LS",
                                    "podUsage": {"resources": {"cpu": "100m", "memory": "4Ki"}}}
    assert doc["hostApplicationMetric"][0]["usage"] == {"resources": {"cpu": "50m", "memory": "1Mi"}}


def test_empty_status_leaves_out_what_go_leaves_out() -> None:
    assert format_node_metric_status(NodeMetricStatus()) == {"nodeMetric": {"nodeUsage": {}, "systemUsage": {}}}


@pytest.mark.parametrize("status", [FULL, NodeMetricStatus(), NodeMetricStatus(node_usage=Usage(cpu_milli=7))])
def test_status_round_trip(status: NodeMetricStatus) -> None:
    doc = json.loads(json.dumps(format_node_metric_status(status)))
    assert parse_node_metric_status(doc) == status


_usage = st.builds(Usage, st.none() | st.integers(0, 10**12), st.none() | st.integers(0, 2**62))


@given(st.lists(st.tuples(st.text("abc-", min_size=1, max_size=8), _usage), max_size=20), _usage)
def test_status_round_trip_property(pods: list[tuple[str, Usage]], node: Usage) -> None:
    status = NodeMetricStatus(node_usage=node, pods=tuple(PodMetric("ns", n, u, "koord-prod", "LS") for n, u in pods))
    assert parse_node_metric_status(json.loads(json.dumps(format_node_metric_status(status)))) == status


@pytest.mark.parametrize("status", [
    pytest.param([], id="not an object"),
    pytest.param({"nodeMetric": {"nodeUsage": {"resources": {"cpu": "-1"}}}}, id="negative cpu"),
    pytest.param({"nodeMetric": {"nodeUsage": {"resources": {"memory": "1e999"}}}}, id="huge exponent"),
    pytest.param({"nodeMetric": {"nodeUsage": {"resources": []}}}, id="resources not an object"),
    pytest.param({"podsMetric": [{}] * 4097}, id="too many pods"),
    pytest.param({"podsMetric": [{"name": "x" * 300}]}, id="a long name"),
    pytest.param({"podsMetric": [1]}, id="a pod entry not an object"),
    pytest.param({"nodeMetric": {"aggregatedNodeUsages": [{"usage": {"max": {}}}]}}, id="unknown aggregation"),
    pytest.param({"nodeMetric": {"aggregatedNodeUsages": [{"duration": "forever"}]}}, id="bad duration"),
    pytest.param({"nodeMetric": {"aggregatedNodeUsages": [{}] * 17}}, id="too many durations"),
    pytest.param({"updateTime": "x" * 100}, id="long update time"),
])  # fmt: skip
def test_bad_status_is_a_format_error(status: Any) -> None:
    with pytest.raises(FormatError):
        parse_node_metric_status(status)


TEMPLATES = [
    '{"nodeMetric":{"nodeUsage":{"resources":{"cpu":HOLE}}}}',
    '{"podsMetric":[{"name":HOLE,"podUsage":{"resources":{"memory":"1Gi"}}}]}',
    '{"nodeMetric":{"aggregatedNodeUsages":[{"duration":HOLE}]}}',
    '{"hostApplicationMetric":HOLE}',
]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_hostile_status_fragments(template: str, fragment: str) -> None:
    def parse(text: str) -> object:
        from koord_formats.bounded import load_json

        return parse_node_metric_status(load_json(text, "status"))

    call_total(parse, fill(template, fragment))
    call_total(lambda t: parse_collect_policy({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": [t]}}}),
               fragment)
    assert HOLE in template


def test_the_go_duration_parser_keeps_each_callers_bounds() -> None:
    """NodeMetric durations stop at a day and 9-digit numbers; a Reservation's ``spec.ttl`` reads
    with the same parser up to a century and 12-digit numbers."""
    from koord_formats.reservation_spec import parse_ttl

    assert parse_ttl("3153600000s") == 3153600000.0
    assert parse_ttl("100000000000ns") == pytest.approx(100.0)
    for text in ("86401s", "1000000000ns"):
        with pytest.raises(FormatError):
            parse_go_duration(text)
    with pytest.raises(FormatError):
        parse_ttl("3153600001s")

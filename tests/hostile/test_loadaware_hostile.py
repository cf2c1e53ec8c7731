"""Load-aware scheduling under hostile input: NodeMetrics are written by any node (its agent,
or anyone holding its credentials), node annotations by whoever may edit a Node, and the
config file by an operator. Each is bounded and parsed by ``koord_formats``; a bad NodeMetric
costs only its node (treated as missing: the pod passes there and the node scores 0), logged
and counted in ``scheduler_ext_bad_objects_total``; never an exception out of the cache or a
verb, never harm to another node."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from koord_formats.errors import FormatError
from koord_formats.loadaware import LoadAwareArgs, parse_custom_usage_thresholds, parse_load_aware_args
from koord_formats.nodemetric import MAX_METRIC_ENTRIES
from scheduler_ext.decide import DEFAULT_CONFIG
from scheduler_ext.extconfig import MAX_CONFIG_BYTES, ConfigError, parse_config_text, read_config_file
from scheduler_ext.loadaware import read_node_load, read_node_metric, read_pod_load
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState
from scheduler_ext.verbs import filter_nodes, prioritize_nodes
from tests.scheduler_ext.builders import node, pod

NOW = time.time()
OVER = "node(s) cpu usage exceed threshold"


def good(name: str, cpu: str = "9") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"updateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 5)),
                   "nodeMetric": {"nodeUsage": {"resources": {"cpu": cpu, "memory": "1Gi"}}}},
    }


def _spoil(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = good("victim")
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _deep(n: int) -> Any:
    out: Any = "x"
    for _ in range(n):
        out = {"a": out}
    return out


HOSTILE_METRICS = {
    "status not an object": _spoil(("status",), ["x"]),
    "nodeUsage a string": _spoil(("status", "nodeMetric", "nodeUsage"), "lots"),
    "quantity with a huge exponent": _spoil(("status", "nodeMetric", "nodeUsage", "resources", "cpu"), "1e500000"),
    "negative-looking garbage quantity": _spoil(("status", "nodeMetric", "nodeUsage", "resources", "cpu"), "--1"),
    "quantity as a float": _spoil(("status", "nodeMetric", "nodeUsage", "resources", "cpu"), 1e308),
    "updateTime without a time zone": _spoil(("status", "updateTime"), "2026-11-27T08:00:00"),
    "updateTime not a time": _spoil(("status", "updateTime"), "yesterday"),
    "updateTime a huge string": _spoil(("status", "updateTime"), "9" * 100_000),
    "too many podsMetric entries": _spoil(("status", "podsMetric"),
                                          [{"name": "p", "namespace": "n"}] * (MAX_METRIC_ENTRIES + 1)),
    "podsMetric entry name too long": _spoil(("status", "podsMetric"), [{"name": "p" * 10_000}]),
    "aggregated entry with an unknown percentile": _spoil(("status", "nodeMetric", "aggregatedNodeUsages"),
                                                          [{"usage": {"max": {}}, "duration": "5m"}]),
    "aggregated duration longer than a day": _spoil(("status", "nodeMetric", "aggregatedNodeUsages"),
                                                    [{"usage": {}, "duration": "99999h"}]),
    "deeply nested value": _spoil(("status", "nodeMetric", "nodeUsage", "resources", "cpu"), _deep(300)),
    "spec reportIntervalSeconds a bool": {**good("victim"), "spec": {"metricCollectPolicy": {
        "reportIntervalSeconds": True}}},
}


@pytest.mark.parametrize("doc", HOSTILE_METRICS.values(), ids=HOSTILE_METRICS.keys())
def test_parser_refuses_hostile_nodemetric_with_format_error_only(doc: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        read_node_metric(doc)


def _bad_count() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "scheduler_ext_bad_objects":
            total += sum(s.value for s in metric.samples if s.labels.get("kind") == "nodemetrics"
                         and s.name.endswith("_total"))
    return total


@pytest.mark.parametrize("doc", HOSTILE_METRICS.values(), ids=HOSTILE_METRICS.keys())
def test_a_hostile_nodemetric_costs_only_its_node(doc: dict[str, Any]) -> None:
    state = ClusterState(load_args=LoadAwareArgs())
    state.wall = lambda: NOW
    state.replace("nodes", [node("victim", cpu="10"), node("other", cpu="10")])
    state.replace("pods", [])
    state.replace("nodemetrics", [good("victim"), good("other")])
    before = _bad_count()
    assert state.apply("nodemetrics", "MODIFIED", copy.deepcopy(doc)) is False
    assert _bad_count() == before + 1
    plain = parse_pod(pod("p", cpu="1", memory="1Gi", qos=None, priority=None))
    got = filter_nodes(state, plain, ["victim", "other"], DEFAULT_CONFIG)
    assert got.passed == ["victim"]  # treated as a node without a NodeMetric
    assert got.failed == {"other": OVER}  # the other node's report still counts
    assert dict(prioritize_nodes(state, plain, ["victim", "other"], DEFAULT_CONFIG))["victim"] == 0


def test_a_listed_hostile_nodemetric_is_skipped_not_fatal() -> None:
    state = ClusterState(load_args=LoadAwareArgs())
    junk: Any = "junk"
    skipped = state.replace("nodemetrics", [HOSTILE_METRICS["deeply nested value"], good("ok"), junk])
    assert "nodemetrics" in state.synced and len(skipped) == 2
    assert state.nodes["ok"].metric is not None


HOSTILE_ANNOTATIONS = {
    "not JSON": "{",
    "a list": "[1]",
    "threshold a string": '{"usageThresholds": {"cpu": "65"}}',
    "threshold over 100": '{"usageThresholds": {"cpu": 1000}}',
    "a huge integer": '{"usageThresholds": {"cpu": ' + "9" * 400 + "}}",
    "an unknown resource": '{"usageThresholds": {"nvidia.com/gpu": 1}}',
    "too large": '{"usageThresholds": {}, "x": "' + "a" * 10_000 + '"}',
    "too deep": "[" * 5000 + "]" * 5000,
}


@pytest.mark.parametrize("text", HOSTILE_ANNOTATIONS.values(), ids=HOSTILE_ANNOTATIONS.keys())
def test_a_hostile_thresholds_annotation_leaves_the_args_in_force(text: str) -> None:
    with pytest.raises(FormatError):
        parse_custom_usage_thresholds(text)
    load = read_node_load(node("n", cpu="10", annotations={"scheduling.koordinator.sh/usage-thresholds": text}))
    assert load.custom is None and load.custom_error and load.cpu_milli == 10_000


@pytest.mark.parametrize("raw", ["{", '{"cpu": "1e500000"}', '"8"', "[" * 5000])
def test_a_hostile_raw_allocatable_is_a_format_error(raw: str) -> None:
    with pytest.raises(FormatError):
        read_node_load(node("n", annotations={"node.koordinator.sh/raw-allocatable": raw}))


HOSTILE_PODS = {
    "containers not a list": {"spec": {"containers": {"a": 1}}},
    "too many containers": {"spec": {"containers": [{}] * 5000}},
    "cpu request with a huge exponent": {"spec": {"containers": [{"resources": {"requests": {"cpu": "1e500000"}}}]}},
    "priority a string": {"spec": {"priority": "9000"}},
    "conditions not a list": {"status": {"conditions": "x"}},
    "scheduled time garbage": {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                                          "lastTransitionTime": "soon"}]}},
    "owner references not objects": {"metadata": {"ownerReferences": ["DaemonSet"]}},
}


@pytest.mark.parametrize("doc", HOSTILE_PODS.values(), ids=HOSTILE_PODS.keys())
def test_a_hostile_pod_is_a_format_error_and_a_bound_one_counts_by_default_estimate(doc: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        read_pod_load(doc)
    state = ClusterState(load_args=LoadAwareArgs())
    state.replace("nodes", [node("n", cpu="10")])
    bound = copy.deepcopy(doc)
    bound.setdefault("metadata", {}).update({"uid": "u1", "name": "b", "namespace": "x"})
    bound.setdefault("spec", {})["nodeName"] = "n"
    state.apply("pods", "ADDED", bound)
    loads = list(state.nodes["n"].bound.values())
    assert all(load.cpu_request == 0 for load in loads)  # estimated as a pod without amounts


HOSTILE_CONFIGS = {
    "YAML alias bomb": "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nloadAware: {}\n",
    "larger than the bound": "loadAware: {}\n#" + "x" * MAX_CONFIG_BYTES,
    "deeply nested JSON": "[" * 100_000 + "]" * 100_000,
    "deeply nested YAML": "loadAware: " + "[" * 5000 + "]" * 5000,
    "a misspelt section": "loadaware: {}\n",
    "a section of the wrong type": "loadAware: [1]\n",
    "a huge integer": "loadAware: {nodeMetricExpirationSeconds: " + "9" * 400 + "}\n",
    "a Python tag": "loadAware: !!python/object/apply:os.system [echo]\n",
}


@pytest.mark.parametrize("text", HOSTILE_CONFIGS.values(), ids=HOSTILE_CONFIGS.keys())
def test_a_hostile_config_file_is_one_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_config_text(text)


def test_a_config_path_that_is_not_a_regular_file_is_refused(tmp_path: Any) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="cannot read"):
        read_config_file(str(fifo))  # never blocks on a FIFO


def test_args_parser_refuses_non_objects_and_bools_as_numbers() -> None:
    for bad in (None, "x", 1, [], {"usageThresholds": {"cpu": True}}, {"filterExpiredNodeMetrics": "yes"}):
        with pytest.raises(FormatError):
            parse_load_aware_args(bad)


@pytest.mark.parametrize("text", ["{", "[" * 5000, '{"cpu": ' + "9" * 400 + "}", '{"gpu": 1}', "x" * 100_000])
def test_a_hostile_scaling_factors_annotation_leaves_the_args_factors(text: str) -> None:
    ann = {"scheduling.koordinator.sh/load-estimated-scaling-factors": text}
    got = read_pod_load({"metadata": {"annotations": ann},
                         "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}})
    assert got.factors is None and got.cpu_request == 1000


FUTURE_STAMPS = {
    "2099, idle": "2099-01-01T00:00:00Z",
    "the last second of year 9999": "9999-12-31T23:59:59Z",
    "an hour ahead, by a far time zone": time.strftime("%Y-%m-%dT%H:%M:%S+14:00", time.gmtime(NOW + 3600 + 14 * 3600)),
    "two minutes ahead": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + 120)),
}


@pytest.mark.parametrize("stamp", FUTURE_STAMPS.values(), ids=FUTURE_STAMPS.keys())
def test_an_idle_report_from_the_future_never_lets_a_busy_node_pass(stamp: str) -> None:
    """The probe of issue 37: a node agent replaced a 90%-busy node's NodeMetric with zero usage
    stamped in 2099, and the node passed load-aware filtering forever. Now it counts as expired."""
    state = ClusterState(load_args=LoadAwareArgs())
    state.wall = lambda: NOW
    state.replace("nodes", [node("victim", cpu="10")])
    state.replace("pods", [])
    forged = good("victim", cpu="0")
    forged["status"]["updateTime"] = stamp
    state.replace("nodemetrics", [forged])
    plain = parse_pod(pod("p", cpu="1", memory="1Gi", qos=None, priority=None))
    assert filter_nodes(state, plain, ["victim"], DEFAULT_CONFIG).failed == {"victim": "node(s) nodeMetric expired"}
    assert dict(prioritize_nodes(state, plain, ["victim"], DEFAULT_CONFIG))["victim"] == 0

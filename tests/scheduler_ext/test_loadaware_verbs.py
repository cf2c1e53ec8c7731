"""Load-aware scheduling wired into the cache and the verbs: NodeMetrics watched only when
configured, filter refuses with Koordinator's reason (FailedNodes), prioritize adds the load
score, pods bound since the report count by their estimate, a bad NodeMetric costs only its
node, and the config file's loadAware section."""

from __future__ import annotations

import time
from typing import Any

import pytest

from koord_formats.loadaware import LoadAwareArgs
from scheduler_ext.decide import DEFAULT_CONFIG
from scheduler_ext.extconfig import ConfigError, parse_config_text, read_config_file
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import KINDS, ClusterState
from scheduler_ext.verbs import filter_nodes, prioritize_nodes
from tests.scheduler_ext.builders import node, pod

NOW = time.time()


def stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def nodemetric(name: str, cpu: str, memory: str = "1Gi", *, age: float = 10.0,
               pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
        "status": {"updateTime": stamp(age), "nodeMetric": {"nodeUsage": {"resources": {"cpu": cpu, "memory": memory}}},
                   "podsMetric": pods or []},
    }


def state_with(*metrics: dict[str, Any], args: LoadAwareArgs | None = None) -> ClusterState:
    state = ClusterState(load_args=args or LoadAwareArgs())
    state.wall = lambda: NOW
    state.replace("nodes", [node("a", cpu="10"), node("b", cpu="10"), node("c", cpu="10")])
    state.replace("pods", [])
    state.replace("nodemetrics", list(metrics))
    return state


PLAIN = parse_pod(pod("new", cpu="1", memory="1Gi", qos=None, priority=None))


def test_off_unless_configured_nodemetrics_are_not_a_kind() -> None:
    assert "nodemetrics" not in ClusterState().kinds
    assert ClusterState(load_args=LoadAwareArgs()).kinds == (*KINDS, "nodemetrics")
    with pytest.raises(ValueError):
        ClusterState().apply("nodemetrics", "ADDED", nodemetric("a", "1"))


def test_filter_refuses_a_node_over_threshold_with_koordinators_reason() -> None:
    state = state_with(nodemetric("a", "9"), nodemetric("b", "1"))
    got = filter_nodes(state, PLAIN, ["a", "b", "c"], DEFAULT_CONFIG)
    assert got.passed == ["b", "c"]  # c has no NodeMetric: it passes
    assert got.failed == {"a": "node(s) cpu usage exceed threshold"}
    assert got.unresolvable == {}


def test_filter_refuses_an_expired_nodemetric() -> None:
    state = state_with(nodemetric("a", "1", age=600))
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).failed == {"a": "node(s) nodeMetric expired"}


def test_pods_bound_since_the_report_count_by_their_estimate() -> None:
    state = state_with(nodemetric("a", "5"))
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).passed == ["a"]  # 5 + 0.85 of 10 = 59%
    bound = pod("bound", cpu="1", memory="1Gi", qos=None, priority=None, node_name="a")
    state.apply("pods", "ADDED", bound)  # 5 + 0.85 + 0.85 = 67% > 65%
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).failed == {"a": "node(s) cpu usage exceed threshold"}
    state.apply("pods", "DELETED", bound)
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).passed == ["a"]


def test_prioritize_prefers_the_less_loaded_node() -> None:
    state = state_with(nodemetric("a", "6"), nodemetric("b", "1"))
    scores = dict(prioritize_nodes(state, PLAIN, ["a", "b", "c"], DEFAULT_CONFIG))
    assert scores["b"] > scores["a"] > scores["c"] == 0


def test_a_bad_nodemetric_costs_only_its_node() -> None:
    state = state_with(nodemetric("a", "9"), nodemetric("b", "9"))
    bad = nodemetric("a", "9")
    bad["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] = "1e500000"
    assert state.apply("nodemetrics", "MODIFIED", bad) is False
    got = filter_nodes(state, PLAIN, ["a", "b"], DEFAULT_CONFIG)
    assert got.passed == ["a"]  # treated as missing: no load-aware refusal
    assert got.failed == {"b": "node(s) cpu usage exceed threshold"}


def test_a_deleted_or_unlisted_nodemetric_is_forgotten() -> None:
    state = state_with(nodemetric("a", "9"))
    state.replace("nodemetrics", [])
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).passed == ["a"]


def test_node_annotation_overrides_thresholds() -> None:
    state = state_with(nodemetric("a", "5"))
    state.apply("nodes", "MODIFIED", node("a", cpu="10", annotations={
        "scheduling.koordinator.sh/usage-thresholds": '{"usageThresholds": {"cpu": 50}}'}))
    assert filter_nodes(state, PLAIN, ["a"], DEFAULT_CONFIG).failed == {"a": "node(s) cpu usage exceed threshold"}


def test_config_file_sections(tmp_path: Any) -> None:
    assert parse_config_text("").load_aware is None
    assert parse_config_text("{}").load_aware is None
    got = parse_config_text("loadAware:\n  usageThresholds: {cpu: 70}\n").load_aware
    assert got is not None and got.usage_thresholds == {"cpu": 70}
    for bad in ("loadAwre: {}", "[1]", "loadAware: {usageThresholds: {cpu: 200}}",
                "a: &x [1]\nloadAware: *x", "loadAware: {bogus: 1}"):
        with pytest.raises(ConfigError):
            parse_config_text(bad)
    path = tmp_path / "ext.yaml"
    path.write_text("loadAware: {}\n")
    assert read_config_file(str(path)).load_aware == LoadAwareArgs()
    with pytest.raises(ConfigError, match="cannot read"):
        read_config_file(str(tmp_path))


def test_the_incoming_pod_is_estimated_from_what_the_watch_read_of_it() -> None:
    state = state_with(nodemetric("a", "5"))
    batch = pod("be", cpu=None, memory=None, qos="BE", priority=5500, uid="be-uid",
                extra={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "1Gi"})
    request = parse_pod(batch)
    # not yet seen by the watch: its decoded request names no cpu, so the default 250m counts
    assert filter_nodes(state, request, ["a"], DEFAULT_CONFIG).passed == ["a"]
    state.apply("pods", "ADDED", batch)  # the watch reads batch-cpu: 5 + 2 x 0.85 = 67% > 65%
    assert filter_nodes(state, request, ["a"], DEFAULT_CONFIG).failed == {"a": "node(s) cpu usage exceed threshold"}

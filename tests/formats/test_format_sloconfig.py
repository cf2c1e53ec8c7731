"""slo-controller-config's NodeSLO keys (``koord_formats.sloconfig``): defaults, cluster and
node strategies, host applications, a bad key keeping its previous value, hostile text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_formats import nodeslo, sloconfig
from koord_formats.sloconfig import parse_slo_config, render_node_slo
from tests.formats.hostile import FRAGMENTS, call_total, fill

THRESHOLD = "resourceUsedThresholdWithBE"
QOS = "resourceQOSStrategy"
BURST = "cpuBurstStrategy"
SYSTEM = "systemStrategy"
GPU = {"matchLabels": {"pool": "gpu"}}


def key(cluster: dict[str, Any] | None = None, nodes: list[dict[str, Any]] | None = None) -> str:
    doc: dict[str, Any] = {}
    if cluster is not None:
        doc["clusterStrategy"] = cluster
    if nodes is not None:
        doc["nodeStrategies"] = nodes
    return json.dumps(doc)


def test_missing_configmap_renders_the_defaults() -> None:
    cfg, problems = parse_slo_config(None)
    spec = render_node_slo(cfg, {})
    assert problems == ()
    assert spec[THRESHOLD] == {"enable": False, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                               "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}
    assert spec[QOS] == {}, "resource-qos' base is an empty object"
    assert spec[BURST] == {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                           "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50}
    assert spec[SYSTEM]["totalNetworkBandwidth"] == "0"
    assert "hostApplications" not in spec
    # what the node agent reads of it is Koordinator's defaults
    assert nodeslo.cpu_burst(spec) == nodeslo.DEFAULT_CPU_BURST


@pytest.mark.parametrize(
    ("description", "data", "labels", "field", "want"),
    [
        ("the cluster strategy overlays the default",
         {"resource-threshold-config": key({"enable": True, "cpuSuppressThresholdPercent": 50})}, {},
         THRESHOLD, {"enable": True, "cpuSuppressThresholdPercent": 50, "cpuSuppressPolicy": "cpuset",
                     "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}),
        ("the first matching node strategy overlays the cluster strategy",
         {"cpu-burst-config": key({"policy": "auto"}, [
             {"name": "gpu", "nodeSelector": GPU, "cpuBurstPercent": 500},
             {"name": "gpu2", "nodeSelector": GPU, "cpuBurstPercent": 200}])}, {"pool": "gpu"},
         BURST, {"policy": "auto", "cpuBurstPercent": 500, "cfsQuotaBurstPercent": 300,
                 "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50}),
        ("a node that matches no node strategy gets the cluster strategy",
         {"cpu-burst-config": key({"policy": "auto"}, [{"nodeSelector": GPU, "cpuBurstPercent": 500}])},
         {"pool": "cpu"}, BURST, {"policy": "auto", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                                  "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50}),
        ("a node strategy without a selector matches no node",
         {"resource-qos-config": key({}, [{"beClass": {"cpuQOS": {"enable": True}}}])}, {"pool": "gpu"},
         QOS, {}),
        ("resource-qos merges over an empty base",
         {"resource-qos-config": key({"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}})}, {},
         QOS, {"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}}),
        ("a node strategy that does not validate gives its nodes the cluster strategy",
         {"resource-threshold-config": key({"enable": True}, [
             {"nodeSelector": GPU, "cpuSuppressPolicy": "nonsense"}])}, {"pool": "gpu"},
         THRESHOLD, {"enable": True, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                     "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}),
    ],
)
def test_render(description: str, data: dict[str, str], labels: dict[str, str], field: str,
                want: dict[str, Any]) -> None:
    cfg, _ = parse_slo_config(data)
    assert render_node_slo(cfg, labels)[field] == want, description


def test_host_applications_first_match_replaces_the_list() -> None:
    apps = {"applications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}],
            "nodeConfigs": [{"name": "gpu", "nodeSelector": GPU, "applications": [{"name": "dcgm", "qos": "BE"}]}]}
    cfg, problems = parse_slo_config({"host-application-config": json.dumps(apps)})
    assert problems == ()
    assert render_node_slo(cfg, {})["hostApplications"] == [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}]
    assert render_node_slo(cfg, {"pool": "gpu"})["hostApplications"] == [{"name": "dcgm", "qos": "BE"}]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"cpu-burst-config": "{"}, BURST, id="text that is not JSON"),
        pytest.param({"cpu-burst-config": key({"policy": "sometimes"})}, BURST, id="an unknown burst policy"),
        pytest.param({"resource-threshold-config": key({"cpuSuppressThresholdPercent": 500})}, THRESHOLD,
                     id="a threshold out of range"),
        pytest.param({"resource-qos-config": "[]"}, QOS, id="a key that is not an object"),
        pytest.param({"system-config": '{"clusterStrategy":[]}'}, SYSTEM, id="a cluster strategy that is a list"),
    ],
)
def test_a_bad_key_keeps_its_previous_value(data: dict[str, str], field: str) -> None:
    good = {
        "cpu-burst-config": key({"policy": "auto"}),
        "resource-threshold-config": key({"enable": True}),
        "resource-qos-config": key({"lsClass": {"cpuQOS": {"enable": True}}}),
        "system-config": key({"minFreeKbytesFactor": 200}),
    }
    before, _ = parse_slo_config(good)
    after, problems = parse_slo_config({**good, **data}, before)
    assert problems, "the bad key is reported"
    assert render_node_slo(after, {}) == render_node_slo(before, {})
    fresh, _ = parse_slo_config({**good, **data})
    assert render_node_slo(fresh, {})[field] == sloconfig.default_strategy(field), "no previous: the default"


def test_a_bad_key_costs_only_itself() -> None:
    cfg, problems = parse_slo_config({"cpu-burst-config": "{", "resource-threshold-config": key({"enable": True})})
    assert len(problems) == 1
    assert render_node_slo(cfg, {})[THRESHOLD]["enable"] is True


def test_a_key_removed_returns_to_the_default() -> None:
    before, _ = parse_slo_config({"cpu-burst-config": key({"policy": "auto"})})
    after, _ = parse_slo_config({}, before)
    assert render_node_slo(after, {})[BURST]["policy"] == "none"


@pytest.mark.parametrize("config_key", [*sloconfig.STRATEGY_KEYS, sloconfig.CONFIG_KEY_HOST_APPLICATION])
@pytest.mark.parametrize("template", ['{"clusterStrategy":HOLE}', '{"nodeStrategies":[{"nodeSelector":HOLE}]}',
                                      '{"applications":HOLE}', "HOLE"])
def test_hostile_keys(config_key: str, template: str) -> None:
    def parse_and_render(text: str) -> object:
        cfg, _ = parse_slo_config({config_key: text})
        return render_node_slo(cfg, {"pool": "gpu"})

    for fragment in FRAGMENTS:
        call_total(parse_and_render, fill(template, fragment))

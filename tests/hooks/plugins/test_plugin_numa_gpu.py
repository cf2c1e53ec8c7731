"""numa and gpu_env plugins."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.plugins import gpu_env, numa
from tests.hooks.plugins.factories import call, container, node, pod, status
from tests.topologies import DUAL_SOCKET_HT, THIS_VM

RS = "scheduling.koordinator.sh/resource-status"
DEV = "scheduling.koordinator.sh/device-allocated"


@pytest.mark.parametrize(
    ("annotations", "topology", "expected", "skipped"),
    [
        pytest.param({RS: status(numa=[{"node": 1, "resources": {"cpu": "4", "memory": "8Gi"}}])}, DUAL_SOCKET_HT,
                     {"cpuset_mems": "1"}, False, id="pod on NUMA node 1 gets mems 1"),
        pytest.param({RS: status(numa=[{"node": 0, "resources": {"cpu": "2"}},
                                       {"node": 1, "resources": {"cpu": "2"}}])}, DUAL_SOCKET_HT,
                     {"cpuset_mems": "0-1"}, False, id="pod across two NUMA nodes gets both"),
        pytest.param({RS: status(numa=[{"node": 1, "resources": {"cpu": "2"}}])}, THIS_VM, {}, True,
                     id="NUMA node the machine lacks is refused"),
        pytest.param({RS: status(numa=[{"node": 0, "resources": {"cpu": "0"}}])}, DUAL_SOCKET_HT, {}, False,
                     id="zero resources mean no binding"),
        pytest.param({RS: status("2-3")}, DUAL_SOCKET_HT, {}, False, id="cpuset alone does not set mems"),
        pytest.param({}, DUAL_SOCKET_HT, {}, False, id="no annotation, no opinion"),
        pytest.param({RS: '{"numaNodeResources":[{"node":-1}]}'}, DUAL_SOCKET_HT, {}, True, id="negative NUMA node"),
        pytest.param({RS: '{"numaNodeResources":[{"node":0,"resources":{"cpu":"x"}}]}'}, DUAL_SOCKET_HT, {}, True,
                     id="bad quantity"),
    ],
)
def test_cpuset_mems(annotations: dict[str, str], topology: Any, expected: dict[str, str], skipped: bool) -> None:
    for hook in ("rhp_pre_create_container", "rhp_pre_update_container_resources", "rhp_reconcile_container"):
        plan = call(numa, hook, pod=pod("LSR", annotations=annotations), container=container(), node=node(topology))
        assert plan.resources == expected
        assert bool(plan.skipped) == skipped


@pytest.mark.parametrize(
    ("annotation", "expected", "skipped"),
    [
        pytest.param({"gpu": [{"minor": 0}, {"minor": 3}]}, {"NVIDIA_VISIBLE_DEVICES": "0,3"}, False,
                     id="GPU minors in allocation order"),
        pytest.param({"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-core": "100"}, "id": "GPU-1"}],
                      "rdma": [{"minor": 0}]}, {"NVIDIA_VISIBLE_DEVICES": "1"}, False, id="other devices ignored"),
        pytest.param({"rdma": [{"minor": 0}]}, {}, False, id="no GPU, no env"),
        pytest.param({"gpu": [{"minor": "0"}]}, {}, True, id="minor of the wrong type"),
        pytest.param({"gpu": {"minor": 0}}, {}, True, id="gpu of the wrong type"),
        pytest.param("not json", {}, True, id="bad JSON"),
    ],
)
def test_gpu_env(annotation: Any, expected: dict[str, str], skipped: bool) -> None:
    raw = annotation if isinstance(annotation, str) else json.dumps(annotation)
    plan = call(gpu_env, "rhp_pre_create_container", pod=pod("LS", annotations={DEV: raw}), container=container(),
                node=node())
    assert plan.envs == expected
    assert bool(plan.skipped) == skipped

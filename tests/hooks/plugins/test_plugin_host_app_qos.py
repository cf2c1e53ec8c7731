"""host_app_qos plugin: group identity and LS cpuset for NodeSLO hostApplications."""

from __future__ import annotations

from typing import Any

import pytest

from hooks.plugins import host_app_qos
from tests.hooks.plugins.factories import call, node
from tests.topologies import SINGLE_SOCKET_HT

GI = {"lsClass": {"cpuQOS": {"enable": True}}, "beClass": {"cpuQOS": {"enable": True}}}


def slo(*apps: dict[str, Any], gi: bool = True) -> dict[str, Any]:
    return {"hostApplications": list(apps), **({"resourceQOSStrategy": GI} if gi else {})}


@pytest.mark.parametrize(
    ("spec", "expected", "skips"),
    [
        pytest.param(slo({"name": "nginx", "qos": "LS"}),
                     [("host-latency-sensitive/nginx", "cpu.bvt_warp_ns", "2"),
                      ("host-latency-sensitive/nginx", "cpuset.cpus", "0-1,4-7")], 0,
                     id="LS app gets bvt and the LS share pool"),
        pytest.param(slo({"name": "job", "qos": "BE"}), [("host-best-effort/job", "cpu.bvt_warp_ns", "-1")], 1,
                     id="BE app gets bvt; cpuset only for LS"),
        pytest.param(slo({"name": "n", "qos": "LS", "cgroupPath": {"base": "KubepodsBurstable", "relativePath": "n"}},
                         gi=False),
                     [("kubepods/burstable/n", "cpu.bvt_warp_ns", "0"), ("kubepods/burstable/n", "cpuset.cpus",
                                                                         "0-1,4-7")], 0,
                     id="disabled group identity resets to 0"),
        pytest.param(slo({"name": "evil", "qos": "LS", "cgroupPath": {"relativePath": "../../etc"}}), [], 1,
                     id="path escaping the root is refused"),
        pytest.param(slo({"name": "x", "qos": "SYSTEM"}), [], 1, id="no path for other QoS"),
        pytest.param({"hostApplications": "nope"}, [], 1, id="hostApplications of the wrong type"),
    ],
)
def test_host_apps(spec: dict[str, Any], expected: list[tuple[str, str, str]], skips: int) -> None:
    plan = call(host_app_qos, "rhp_reconcile_node", node=node(SINGLE_SOCKET_HT, slo=spec, bound={"lsr": "2-3"}))
    assert [(w.path, w.file, w.value) for w in plan.writes] == expected
    assert all(w.level == "host-app" for w in plan.writes)
    assert len(plan.skipped) == skips

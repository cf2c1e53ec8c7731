"""``runtime-proxy plan``: documents in, plans out (no root, no I/O on the node)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from runtime_proxy.engine.planner import PlanInputError, main, plan_document

TOPO = {"detail": [{"id": i, "core": i % 4, "socket": i // 4 % 2, "node": i // 4 % 2} for i in range(8)]}
RS = "scheduling.koordinator.sh/resource-status"
EXAMPLES = Path(__file__).resolve().parents[3] / "packaging" / "examples"


def doc(stage: str, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "stage": stage,
        "pod": {"name": "web", "namespace": "default", "uid": "u1", "labels": {"koordinator.sh/qosClass": "LS"},
                "annotations": {}, "cgroupParent": "/kubepods/burstable/podu1"},
        "container": {"name": "app", "resources": {"cpu_period": 100000, "cpu_quota": 200000, "cpu_shares": 2048}},
        "node": {"cpuTopology": TOPO, "boundCPUs": {"lsr": "0-1"}},
        "nodeSLO": {},
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("document", "key", "expected"),
    [
        pytest.param(doc("PreCreateContainer"), "cri", {"resources": {"cpuset_cpus": "2-7"}},
                     id="LS container gets the share pool minus bound CPUs"),
        pytest.param(doc("PreCreateContainer", pod={"uid": "u2", "labels": {"koordinator.sh/qosClass": "LSR"},
                                                      "annotations": {RS: '{"cpuset":"0-1"}'},
                                                      "cgroupParent": "/kubepods/podu2"}),
                     "cri", {"resources": {"cpuset_cpus": "0-1", "cpu_quota": -1}}, id="LSR container is bound"),
        pytest.param(doc("PreRunPodSandbox", pod={"uid": "u2", "labels": {"koordinator.sh/qosClass": "LSR"},
                                                    "annotations": {RS: '{"cpuset":"0-1"}'},
                                                    "cgroupParent": "/kubepods/podu2"}),
                     "writes", [{"level": "pod", "path": "kubepods/podu2", "file": "cpu.cfs_quota_us", "value": "-1"}],
                     id="LSR sandbox gets its pod quota unset"),
        pytest.param(doc("PreCreateContainer", plugins=["numa"]), "cri", {}, id="plugins limits what runs"),
        pytest.param(doc("PostStopContainer"), "cri", {}, id="a stage without plugins plans nothing"),
        pytest.param(doc("PreCreateContainer", pod={"labels": {"koordinator.sh/qosClass": "LSR"},
                                                      "annotations": {RS: '{"cpuset":"0-"}'},
                                                      "cgroupParent": "/kubepods/podu2"}),
                     "skipped", [{"plugin": p, "reason": "pod /: bad resource-status: bad CPU list element '0-'"}
                                 for p in ("cpuset", "numa")],
                     id="malformed annotation is skipped, not an error"),
    ],
)
def test_plan_document(document: dict[str, Any], key: str, expected: Any) -> None:
    assert plan_document(document)[key] == expected


def test_reconcile_stage_runs_node_pod_and_container_hooks() -> None:
    slo = {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}}}}
    out = plan_document(doc("Reconcile", nodeSLO=slo))
    levels = {(w["level"], w["file"]) for w in out["writes"]}
    assert ("kubeqos", "cpu.bvt_warp_ns") in levels and ("pod", "cpu.bvt_warp_ns") in levels
    assert out["cri"] == {"resources": {"cpuset_cpus": "2-7"}}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param({"stage": "Nope"}, "unknown stage", id="unknown stage"),
        pytest.param(doc("PreCreateContainer", container=None), "needs a container", id="container missing"),
        pytest.param(doc("PreCreateContainer", plugins=["nope"]), "unknown plugins", id="unknown plugin"),
        pytest.param(doc("PreCreateContainer", pod={"labels": {"a": 1}}), "map of strings", id="label of wrong type"),
        pytest.param(doc("PreCreateContainer", container={"resources": {"cpu_quota": "x"}}), "integer",
                     id="resource of wrong type"),
        pytest.param(doc("PreCreateContainer", node={"cpuTopology": {"detail": 5}}), "cpuTopology",
                     id="bad topology"),
        pytest.param([], "JSON object", id="not an object"),
    ],
)
def test_bad_documents_are_errors(document: Any, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        plan_document(document)


def test_main_reads_stdin_and_prints_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc("PreCreateContainer"))))
    assert main([]) == 0
    assert json.loads(capsys.readouterr().out)["cri"]["resources"]["cpuset_cpus"] == "2-7"


def test_main_reports_bad_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("{"))
    assert main(["-"]) == 2
    assert "error" in json.loads(capsys.readouterr().err)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("plan-*.json")))
def test_examples_in_packaging_plan_cleanly(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLES / example)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["conflicts"] == []


RESCTRL_NODE = {"cpuTopology": TOPO, "resctrl": {"cbmMask": "fff", "cacheIds": [0], "vendor": "amd"}}
RDT_ON = {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}},
                                  "lsClass": {"resctrlQOS": {"enable": True}}}}


@pytest.mark.parametrize(
    ("document", "key", "expected"),
    [
        pytest.param(doc("Reconcile", node=RESCTRL_NODE, nodeSLO=RDT_ON, plugins=["rdt"], pod=None, container=None),
                     "writes", [{"level": "resctrl", "path": "LS", "file": "schemata",
                                 "value": "L3:0=fff;\nMB:0=2048;\n"},
                                {"level": "resctrl", "path": "BE", "file": "schemata",
                                 "value": "L3:0=f;\nMB:0=2048;\n"}],
                     id="Reconcile without a pod plans node-wide resctrl groups (AMD MB)"),
        pytest.param(doc("PostStartContainer", node=RESCTRL_NODE, nodeSLO=RDT_ON, plugins=["rdt"],
                         container={"name": "app", "id": "c1"}),
                     "moves", [{"level": "container", "path": "kubepods/burstable/podu1/c1", "group": "LS"}],
                     id="PostStartContainer moves the container's tasks"),
        pytest.param(doc("PostStartContainer", nodeSLO={"cpuBurstStrategy": {"policy": "auto",
                                                                             "cpuBurstPercent": 50}},
                         plugins=["cpu_burst"], container={"name": "app", "id": "c1", "resources": {
                             "cpu_quota": 200000, "cpu_period": 100000}}),
                     "writes", [{"level": "container", "path": "kubepods/burstable/podu1/c1",
                                 "file": "cpu.cfs_burst_us", "value": "100000"}],
                     id="PostStartContainer sets cfs_burst_us"),
        pytest.param(doc("PostStartContainer", plugins=["cpuset"]), "cri", {}, id="post stages never change CRI"),
    ],
)
def test_plan_document_issue5(document: dict[str, Any], key: str, expected: Any) -> None:
    assert plan_document(document)[key] == expected

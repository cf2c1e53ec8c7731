"""``runtime-proxy plan`` with a ``usage`` input: the ``ReconcileUsage`` stage runs through the
hook runner with the document's pods and usage window, and the output lists its writes and
evictions; keys in camelCase or snake_case give the same window."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.facts import NodeFacts, PodFacts
from hooks.manager import make_plugin_manager
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import Usage
from runtime_proxy.commands.plan import main
from runtime_proxy.engine.planner import plan_document
from runtime_proxy.engine.usage_input import usage_from_json


class MemoryStub:
    """Evicts the BE pod using the most memory when the latest node memory is above 70%, and
    writes the BE quota from the latest BE state; records what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[PodFacts, ...], Usage]] = []

    @hookimpl
    def rhp_reconcile_usage(self, node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
        self.seen.append((pods, usage))
        last = usage.latest
        if last is None:
            return None
        plan = Plan().write("kubeqos", "kubepods/besteffort", "cpu.cfs_quota_us", str(last.be.cfs_quota_us // 2))
        if last.node_memory_used_bytes * 100 >= 70 * last.node_memory_total_bytes:
            be = [p for p in pods if p.qos_class == "BE" and p.uid in last.pods]
            if be:
                victim = max(be, key=lambda p: last.pods[p.uid].memory_bytes)
                plan.evict(victim.uid, victim.namespace, victim.name, "BEMemoryEvict", "node memory above 70%")
        return plan


def pod(uid: str, qos: str) -> dict[str, Any]:
    return {"name": uid, "namespace": "ns", "uid": uid, "labels": {"koordinator.sh/qosClass": qos},
            "cgroupParent": f"/kubepods/besteffort/pod{uid}", "priority": 0}


def usage_doc(*, snake: bool = False) -> dict[str, Any]:
    sample = {"at": 10.0, "nodeCpuMilli": 3000, "nodeMemoryUsedBytes": 80, "nodeMemoryTotalBytes": 100,
              "beCpuMilli": 500,
              "pods": {"a": {"cpuMilli": 10, "memoryBytes": 5}, "b": {"cpuMilli": 10, "memoryBytes": 9}},
              "containers": {"c1": {"cpuMilli": 1, "memoryBytes": 2}},
              "hostApps": {"nginx": {"cpuMilli": 100, "memoryBytes": 1}},
              "be": {"cfsQuotaUs": 400000, "cfsPeriodUs": 100000, "cpuset": "0-3"}}
    doc = {"interval": 1, "samples": [dict(sample, at=9.0), sample],
           "recentEvictions": [{"uid": "old", "feature": "BEMemoryEvict", "at": 5}]}
    if snake:
        text = json.dumps(doc)
        for camel, snake_name in [("nodeCpuMilli", "node_cpu_milli"), ("cpuMilli", "cpu_milli"),
                                  ("memoryBytes", "memory_bytes"), ("hostApps", "host_apps"),
                                  ("cfsQuotaUs", "cfs_quota_us"), ("recentEvictions", "recent_evictions")]:
            text = text.replace(f'"{camel}"', f'"{snake_name}"')
        doc = json.loads(text)
    return doc


@pytest.mark.parametrize("stage", [pytest.param("ReconcileUsage", id="the usage stage alone"),
                                   pytest.param("Reconcile", id="a whole reconcile round with usage")])
def test_the_planner_shows_writes_and_evictions_for_a_usage_snapshot(stage: str) -> None:
    stub = MemoryStub()
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(stub, name="memory_stub")
    doc = {"stage": stage, "pods": [pod("a", "BE"), pod("b", "BE"), pod("ls", "LS")], "usage": usage_doc()}
    out = plan_document(doc, pm=pm)
    assert out["evictions"] == [{"uid": "b", "namespace": "ns", "name": "b", "feature": "BEMemoryEvict",
                                 "reason": "node memory above 70%"}]
    assert out["writes"] == [{"level": "kubeqos", "path": "kubepods/besteffort", "file": "cpu.cfs_quota_us",
                              "value": "200000"}]
    pods, usage = stub.seen[0]
    assert [p.uid for p in pods] == ["a", "b", "ls"]
    assert pods[0].priority == 0
    assert len(usage.samples) == 2
    assert usage.latest is not None and usage.latest.be.cpuset == frozenset(range(4))
    assert usage.evicted_uids == {"old"}


def test_camel_and_snake_case_keys_give_the_same_window() -> None:
    assert usage_from_json(usage_doc()) == usage_from_json(usage_doc(snake=True))


def test_a_usage_stage_without_usage_plans_nothing_and_lists_no_evictions() -> None:
    stub = MemoryStub()
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(stub, name="memory_stub")
    out = plan_document({"stage": "ReconcileUsage"}, pm=pm)
    assert out["evictions"] == [] and out["writes"] == []


def test_a_reconcile_without_usage_leaves_the_usage_stage_out() -> None:
    stub = MemoryStub()
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(stub, name="memory_stub")
    out = plan_document({"stage": "Reconcile"}, pm=pm)
    assert "evictions" not in out and stub.seen == []


def test_the_command_prints_the_usage_plan(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"stage": "ReconcileUsage", "pods": [pod("a", "BE")], "usage": usage_doc()}))
    assert main([str(path), "--no-entry-points", "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "ReconcileUsage" and out["evictions"] == []

"""A hostile CPU normalization ratio or quota record costs only a logged skip.

Through the reconciler with every built-in plugin and a fake runtime: a hostile node ratio
leaves every quota as it is (each container reports a skip, the round has no error), and a
hostile record on one container leaves that container alone while a healthy pod on the same
node is normalized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, Resources
from hooks.manager import make_plugin_manager
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.reconciler import Reconciler
from tests.cgroup_files import make_files, read_file

RATIO = "node.koordinator.sh/cpu-normalization-ratio"
RECORD = "runtimeproxy.koordinator.sh/cpu-quota-normalization"

HOSTILE_RATIOS = [
    pytest.param("9" * 1_000_000, id="a megabyte of nines"),
    pytest.param("1e400", id="an exponent past a float's range"),
    pytest.param("1e-400", id="an exponent below a float's range"),
    pytest.param("NaN", id="not a number"),
    pytest.param("-inf", id="minus infinity"),
    pytest.param("\u0661.\u0662\u0665", id="Arabic-Indic digits"),
    pytest.param("\U0001d7d9.25", id="mathematical bold digits"),
    pytest.param("5.01", id="just above the largest ratio"),
    pytest.param("0.99", id="just below one"),
    pytest.param("0", id="zero"),
    pytest.param("1.25\x00", id="a trailing NUL"),
    pytest.param("1_000", id="digits with an underscore, which float() accepts"),
]

HOSTILE_RECORDS = [
    pytest.param("9" * 100_000 + "/1", id="a hundred-kilobyte quota"),
    pytest.param("1e99999999/1", id="an exponent"),
    pytest.param("\u0661\u0660\u0660/1", id="Arabic-Indic digits"),
    pytest.param("0/0", id="zero quotas"),
    pytest.param("/" * 10_000, id="ten thousand slashes"),
    pytest.param("999999999999/1", id="a quota the record does not explain"),
]


@dataclass
class Runtime:
    node_facts: NodeFacts
    pod_list: list[PodFacts]
    container_list: list[tuple[PodFacts, ContainerFacts]]
    updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def node(self) -> NodeFacts:
        return self.node_facts

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.container_list)

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        self.updates.append((container_id, changes))


def _pod(uid: str, record: str, root: Path) -> tuple[PodFacts, ContainerFacts]:
    the_pod = PodFacts(name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}",
                       labels=MappingProxyType({"koordinator.sh/qosClass": "LS"}),
                       cgroup_parent=f"/kubepods/burstable/pod{uid}")
    c = ContainerFacts(name="app", id=f"c-{uid}", annotations=MappingProxyType({RECORD: record}),
                       resources=Resources(cpu_quota=200000, cpu_period=100000))
    make_files(root, f"kubepods/burstable/pod{uid}", {"cpu.cfs_quota_us": "200000"})
    make_files(root, f"kubepods/burstable/pod{uid}/c-{uid}", {"cpu.cfs_quota_us": "200000"})
    return the_pod, c


@pytest.mark.parametrize("value", HOSTILE_RATIOS)
async def test_a_hostile_ratio_changes_nothing(tmp_path: Path, value: str) -> None:
    p, c = _pod("a", "200000/200000", tmp_path)
    rt = Runtime(NodeFacts(annotations=MappingProxyType({RATIO: value})), [p], [(p, c)])
    r = Reconciler(rt, pm=make_plugin_manager(entry_points=False), cgroups=Cgroups(tmp_path, version=1))
    report = await r.reconcile_once("node-config")
    assert report.errors == [] and rt.updates == []
    assert read_file(tmp_path, "kubepods/burstable/poda/c-a", "cpu.cfs_quota_us") == "200000"
    assert read_file(tmp_path, "kubepods/burstable/poda", "cpu.cfs_quota_us") == "200000"
    assert any(s.startswith("cpu_normalization:") and "cpu-normalization-ratio" in s for s in report.skipped)


@pytest.mark.parametrize("record", HOSTILE_RECORDS)
async def test_a_hostile_record_costs_only_its_container(tmp_path: Path, record: str) -> None:
    bad_pod, bad = _pod("bad", record, tmp_path)
    good_pod, good = _pod("good", "200000/200000", tmp_path)
    rt = Runtime(NodeFacts(annotations=MappingProxyType({RATIO: "1.25"})), [bad_pod, good_pod],
                 [(bad_pod, bad), (good_pod, good)])
    r = Reconciler(rt, pm=make_plugin_manager(entry_points=False), cgroups=Cgroups(tmp_path, version=1))
    report = await r.reconcile_once("node-config")
    assert report.errors == []
    assert rt.updates == [("c-good", {"cpu_quota": 160000})]
    assert read_file(tmp_path, "kubepods/burstable/podgood", "cpu.cfs_quota_us") == "160000"
    assert read_file(tmp_path, "kubepods/burstable/podbad/c-bad", "cpu.cfs_quota_us") == "200000"
    assert read_file(tmp_path, "kubepods/burstable/podbad", "cpu.cfs_quota_us") == "200000"

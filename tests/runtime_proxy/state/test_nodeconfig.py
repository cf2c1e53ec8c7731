"""Node config: the local file (validation, change detection, subscription) and the cluster
(watch-event handling, and a live watch against the in-process fake API server)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hooks.facts import CPUInfo, CPUTopology
from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig, load_document

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOOD = """
name: n1
labels: {a: b}
annotations: {x: "1"}
nodeResourceTopology:
  annotations: {x: "2"}
nodeSLO:
  resourceQOSStrategy:
    lsClass: {cpuQOS: {enable: true, groupIdentity: 1}}
  somethingNew: {kept: true}
"""


def write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new mtime even within one tick


def test_file_is_read_and_nrt_annotations_win(tmp_path: Path) -> None:
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f)
    facts = cfg.current()
    assert facts.name == "n1" and facts.labels == {"a": "b"}
    assert facts.annotations["x"] == "2"
    assert facts.node_slo["somethingNew"] == {"kept": True}
    assert cfg.generation == 1


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nodeSLO: {resourceQOSStrategy: {lsClass: {cpuQOS: {groupIdentity: 9}}}}", id="groupIdentity 9"),
        pytest.param("nodeSLO: {cpuBurstStrategy: {policy: sometimes}}", id="unknown burst policy"),
        pytest.param("nodeSLO: {resourceQOSStrategy: {beClass: {resctrlQOS: {mbaPercent: 0}}}}", id="mba 0"),
        pytest.param("nodeSLO: {cpuBurstStrategy: {cfsQuotaBurstPercent: '300'}}", id="percent as a string"),
        pytest.param("nodeSLO: {hostApplications: [{qos: LS}]}", id="host app without a name"),
        pytest.param("labels: [1, 2]", id="labels of the wrong type"),
        pytest.param("unknownTopKey: 1", id="unknown top-level key"),
        pytest.param("{not yaml", id="not YAML"),
        pytest.param("annotations: {a: '" + "x" * (4 << 20) + "'}", id="a file past the 4 MiB bound"),
        pytest.param("nodeSLO: " + "[" * 3000 + "]" * 3000, id="a node config nested three thousand deep"),
        pytest.param("a: &a [1, 1]\nb: &b [*a, *a]\nnodeSLO: [*b, *b]", id="YAML aliases where the NodeSLO belongs"),
    ],
)
def test_bad_file_keeps_the_previous_config(tmp_path: Path, text: str) -> None:
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f)
    before = cfg.current()
    write(f, text)
    assert cfg.reload() is False
    assert cfg.current() is before
    with pytest.raises(ValueError):
        load_document(text)


def test_json_file_and_sysfs_topology(tmp_path: Path) -> None:
    f = tmp_path / "node.json"
    write(f, '{"name": "n2", "nodeSLO": {}}')
    topo = CPUTopology((CPUInfo(0, 0, 0, 0), CPUInfo(1, 1, 0, 0)))
    cfg = NodeConfig(path=f, topology=topo)
    assert cfg.current().cpu_topology == topo and cfg.current().name == "n2"


async def test_changes_are_published_without_restart(tmp_path: Path) -> None:
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f, poll_interval=0.05)
    await cfg.start()
    changes = cfg.changes()
    try:
        waiter = asyncio.ensure_future(changes.__anext__())
        await asyncio.sleep(0.01)
        write(f, GOOD.replace("groupIdentity: 1", "groupIdentity: 2"))
        facts = await asyncio.wait_for(waiter, 3)
        assert facts.node_slo["resourceQOSStrategy"]["lsClass"]["cpuQOS"]["groupIdentity"] == 2
        assert cfg.current() is facts
    finally:
        await changes.aclose()
        await cfg.stop()


NODE_EVENT = {"type": "ADDED", "object": {"metadata": {"name": "n1", "labels": {"l": "v"}, "annotations": {"a": "1"}}}}


@pytest.mark.parametrize(
    ("kind", "event", "changed", "check"),
    [
        pytest.param("Node", NODE_EVENT, True, lambda s: s.labels == {"l": "v"}, id="node labels and annotations"),
        pytest.param("Node", {"type": "ADDED", "object": {"metadata": {"name": "other"}}}, False,
                     lambda s: s.labels is None, id="another node is ignored"),
        pytest.param("NodeSLO", {"type": "MODIFIED", "object": {"metadata": {"name": "n1"}, "spec": {
            "cpuBurstStrategy": {"policy": "auto"}}}}, True,
                     lambda s: s.node_slo["cpuBurstStrategy"]["policy"] == "auto", id="NodeSLO spec"),
        pytest.param("NodeSLO", {"type": "MODIFIED", "object": {"metadata": {"name": "n1"}, "spec": {
            "cpuBurstStrategy": {"policy": 3}}}}, False, lambda s: s.node_slo is None, id="bad NodeSLO is rejected"),
        pytest.param("NodeResourceTopology", {"type": "ADDED", "object": {"metadata": {
            "name": "n1", "annotations": {"node.koordinator.sh/cpu-shared-pools": "[]"}}}}, True,
                     lambda s: "node.koordinator.sh/cpu-shared-pools" in s.nrt_annotations, id="NRT annotations"),
        pytest.param("NodeSLO", {"type": "DELETED", "object": {"metadata": {"name": "n1"}}}, True,
                     lambda s: s.node_slo == {}, id="deleted NodeSLO means defaults"),
        pytest.param("Node", {"type": "BOOKMARK", "object": {"metadata": {"name": "n1"}}}, False,
                     lambda s: True, id="bookmarks change nothing"),
    ],
)
def test_watch_event_handling(kind: str, event: dict[str, Any], changed: bool, check: Any) -> None:
    watch = ClusterWatch("n1", api_client=object())
    assert watch.handle_event(kind, event) is changed
    assert check(watch.state)


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)


async def test_cluster_mode_against_the_fake_api_server(tmp_path: Path) -> None:
    import kubernetes

    from tests.fakeapi import FakeAPIServer

    with FakeAPIServer() as api:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}})
        api.create({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"},
                    "spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}}})
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        watch = ClusterWatch("n1", api_client=kubernetes.client.ApiClient(conf), watch_timeout=5)
        f = tmp_path / "node.yaml"
        write(f, "nodeSLO: {cpuBurstStrategy: {policy: auto}}\n")
        cfg = NodeConfig(path=f, cluster=watch, node_name="n1")
        await cfg.start()
        try:
            await wait_for(lambda: cfg.current().labels.get("zone") == "a" and "resourceQOSStrategy" in
                           cfg.current().node_slo)
            api.create({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
                        "metadata": {"name": "n1", "annotations": {
                            "node.koordinator.sh/cpu-shared-pools": '[{"socket":0,"node":0,"cpuset":"1"}]'}}})
            api.patch_direct("NodeSLO", "n1", {"spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {
                "enable": False}}}}})
            await wait_for(lambda: "node.koordinator.sh/cpu-shared-pools" in cfg.current().annotations)
            await wait_for(lambda: cfg.current().node_slo["resourceQOSStrategy"]["beClass"]["cpuQOS"]["enable"]
                           is False)
        finally:
            await cfg.stop()


# ---- sysfs and RDT detection (fake trees) ---------------------------------------------------------


def fake_sysfs(root: Path, cpus: dict[int, tuple[int, int, int]]) -> None:
    """cpu id -> (core_id, package, numa node), as the kernel lays it out."""
    base = root / "devices/system/cpu"
    base.mkdir(parents=True)
    (base / "online").write_text(f"0-{max(cpus)}\n")
    nodes: dict[int, list[int]] = {}
    for cpu, (core, pkg, numa) in cpus.items():
        t = base / f"cpu{cpu}" / "topology"
        t.mkdir(parents=True)
        (t / "core_id").write_text(f"{core}\n")
        (t / "physical_package_id").write_text(f"{pkg}\n")
        nodes.setdefault(numa, []).append(cpu)
    for numa, ids in nodes.items():
        d = root / f"devices/system/node/node{numa}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(",".join(map(str, ids)) + "\n")


def test_sysfs_topology_makes_core_ids_unique(tmp_path: Path) -> None:
    from runtime_proxy.state.sysfs import read_cpu_topology, read_numa_nodes

    # two sockets, two cores each, HT; core_id repeats across sockets as in real sysfs
    fake_sysfs(tmp_path, {0: (0, 0, 0), 1: (1, 0, 0), 2: (0, 1, 1), 3: (1, 1, 1),
                          4: (0, 0, 0), 5: (1, 0, 0), 6: (0, 1, 1), 7: (1, 1, 1)})
    topo = read_cpu_topology(tmp_path)
    assert [(c.id, c.core, c.socket, c.node) for c in topo.infos] == [
        (0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 1, 1), (3, 3, 1, 1), (4, 0, 0, 0), (5, 1, 0, 0), (6, 2, 1, 1), (7, 3, 1, 1)]
    assert read_numa_nodes(tmp_path) == {0: frozenset({0, 1, 4, 5}), 1: frozenset({2, 3, 6, 7})}


@pytest.mark.parametrize(
    ("flags", "cmdline", "vendor", "expected"),
    [
        pytest.param("fpu cat_l3 mba", "", "GenuineIntel", (True, True), id="intel with CAT and MBA"),
        pytest.param("fpu cat_l3 mba", "rdt=!l3cat", "GenuineIntel", (False, True), id="CAT disabled on cmdline"),
        pytest.param("fpu sse", "", "AuthenticAMD", (False, False), id="no RDT flags (this VM)"),
    ],
)
def test_rdt_detection(tmp_path: Path, flags: str, cmdline: str, vendor: str, expected: tuple[bool, bool]) -> None:
    from runtime_proxy.state.sysfs import detect_rdt

    (tmp_path / "cpuinfo").write_text(f"vendor_id\t: {vendor}\nflags\t\t: {flags}\n")
    (tmp_path / "cmdline").write_text(cmdline)
    (tmp_path / "mounts").write_text("proc /proc proc rw 0 0\n")
    found = detect_rdt(tmp_path)
    assert (found.l3_cat, found.mba) == expected and found.mounted is False

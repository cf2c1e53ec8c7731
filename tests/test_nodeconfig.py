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
from runtime_proxy.nodeconfig import ClusterWatch, NodeConfig, load_document

ROOT = Path(__file__).resolve().parents[1]
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
            "cpuBurstStrategy": {"policy": "auto"}}}}, True, lambda s: s.node_slo["cpuBurstStrategy"]["policy"] == "auto",
                     id="NodeSLO spec"),
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
    kubernetes = pytest.importorskip("kubernetes")
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

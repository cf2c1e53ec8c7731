"""Node config: the local file (validation, change detection, subscription) and the cluster
(watch-event handling, and a live watch against the in-process fake API server)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from hooks.facts import CPUInfo, CPUTopology
from koord_formats.keys import NODE_ANNOTATION_CPU_TOPOLOGY
from koord_formats.topology import MAX_TOPOLOGY_CPUS, format_cpu_topology
from runtime_proxy.state import nodeconfig, nodedoc
from runtime_proxy.state.nodeconfig import MAX_NODE_CONFIG_BYTES, ClusterWatch, NodeConfig, load_document

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
        pytest.param("annotations: {a: '" + "x" * (1 << 20) + "'}", id="a file past the 1 MiB bound"),
        pytest.param("annotations: {a: '" + "x" * (257 << 10) + "'}", id="node annotations over 256 KiB"),
        pytest.param("nodeResourceTopology: {annotations: {a: '" + "x" * (257 << 10) + "'}}",
                     id="NRT annotations over the API server's 256 KiB"),
        pytest.param("nodeSLO: {extensions: {at: 2024-01-01}}", id="a YAML timestamp in the NodeSLO"),
        pytest.param("nodeSLO: {extensions: {x: .nan}}", id="NaN in the NodeSLO"),
        pytest.param("nodeSLO: {extensions: {x: '" + "y" * (257 << 10) + "'}}", id="a NodeSLO over 256 KiB"),
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
        facts = await asyncio.wait_for(waiter, 30)  # generous: a loaded 2-core machine
        assert facts.node_slo["resourceQOSStrategy"]["lsClass"]["cpuQOS"]["groupIdentity"] == 2
        assert cfg.current() is facts
    finally:
        await changes.aclose()
        await cfg.stop()


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("rhp_node_config_rejected_total", {"source": "file", "reason": reason}) or 0.0


def test_a_file_over_the_bound_is_refused_with_its_reason_and_the_last_config_stays(tmp_path: Path) -> None:
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f)
    before, refused = cfg.current(), rejected("too-large")
    text = "labels:\n" + "".join(f"  l{i:06d}: v\n" for i in range(MAX_NODE_CONFIG_BYTES // 12))
    write(f, text[: MAX_NODE_CONFIG_BYTES - 1] + "\n" * 2)  # one byte over the bound, otherwise valid YAML
    assert f.stat().st_size == MAX_NODE_CONFIG_BYTES + 1
    assert cfg.reload() is False
    assert cfg.current() is before
    assert rejected("too-large") == refused + 1


def test_the_bound_holds_a_4096_cpu_topology_in_both_annotation_sets() -> None:
    """The largest legitimate part of a node config, the cpu-topology annotation of a machine
    with ``MAX_TOPOLOGY_CPUS`` and the largest ids the format takes, in node and NRT annotations
    of a JSON file (its quotes escaped), with a real node's labels and the example NodeSLO."""
    topo = format_cpu_topology(CPUTopology(tuple(
        CPUInfo(cpu, 4096 + cpu, 1000 + cpu % 24, 1000 + cpu % 23) for cpu in range(MAX_TOPOLOGY_CPUS))))
    example = load_document((ROOT / "packaging/examples/nodeslo.yaml").read_text())
    text = json.dumps({
        "name": "a-node-name-of-the-longest-kind." + "x" * 200,
        "labels": {f"example.com/label-{i}": "v" * 63 for i in range(100)},
        "annotations": {NODE_ANNOTATION_CPU_TOPOLOGY: topo},
        "nodeResourceTopology": {"annotations": {NODE_ANNOTATION_CPU_TOPOLOGY: topo}},
        "nodeSLO": example.nodeSLO,
    }, indent=2)
    assert len(text.encode()) < MAX_NODE_CONFIG_BYTES
    assert load_document(text).annotations[NODE_ANNOTATION_CPU_TOPOLOGY] == topo


async def test_the_file_is_parsed_in_another_process_and_built_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a reload costs runs off the event loop: YAML and pydantic in the parser process
    (never in this one), ``NodeFacts`` in a worker thread."""
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f)
    here: list[str] = []
    built_in: list[int] = []
    real_load_yaml, real_validate, real_build = nodedoc.load_yaml, nodedoc.NodeConfigDocument.model_validate, \
        nodeconfig.node_facts_from_document
    monkeypatch.setattr(nodedoc, "load_yaml", lambda *a, **k: here.append("yaml") or real_load_yaml(*a, **k))
    monkeypatch.setattr(nodedoc.NodeConfigDocument, "model_validate",
                        lambda *a, **k: here.append("pydantic") or real_validate(*a, **k))
    monkeypatch.setattr(nodeconfig, "node_facts_from_document",
                        lambda *a, **k: built_in.append(threading.get_ident()) or real_build(*a, **k))
    write(f, GOOD.replace("groupIdentity: 1", "groupIdentity: 2"))
    assert await cfg.reload_async() is True
    assert cfg.current().node_slo["resourceQOSStrategy"]["lsClass"]["cpuQOS"]["groupIdentity"] == 2
    assert here == []
    assert built_in and threading.get_ident() not in built_in


async def test_cluster_changes_are_built_in_the_watch_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = ClusterWatch("n1", api_client=object())
    callbacks: list[Any] = []
    monkeypatch.setattr(watch, "start", callbacks.append)
    cfg = NodeConfig(cluster=watch, node_name="n1")
    built_in: list[int] = []
    real_build = nodeconfig.node_facts_from_document
    monkeypatch.setattr(nodeconfig, "node_facts_from_document",
                        lambda *a, **k: built_in.append(threading.get_ident()) or real_build(*a, **k))
    await cfg.start()
    try:
        def watch_thread() -> None:  # what ClusterWatch._watch_loop does with an event
            if watch.handle_event("Node", NODE_EVENT):
                callbacks[0]()

        thread = threading.Thread(target=watch_thread)
        thread.start()
        thread.join()
        await wait_for(lambda: cfg.current().labels == {"l": "v"})
        assert built_in == [thread.ident]
    finally:
        await cfg.stop()


@pytest.mark.parametrize(
    ("command", "reason", "deadline"),
    [
        pytest.param("import time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)", "timeout", 1.0,
                     id="a parser past its deadline is killed"),
        pytest.param("os.kill(os.getpid(), signal.SIGXCPU)", "timeout", 120.0, id="a parser past its CPU limit"),
        pytest.param("sys.exit(3)", "worker-failed", 120.0, id="a parser that fails"),
        pytest.param("sys.stdout.buffer.write(b'garbage')", "worker-failed", 120.0, id="a parser that answers garbage"),
        pytest.param("import datetime, pickle; sys.stdout.buffer.write(pickle.dumps(('ok', datetime.date.today())))",
                     "worker-failed", 120.0, id="an answer that names a class"),
    ],
)
def test_a_parser_that_does_not_answer_properly_keeps_the_last_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, reason: str, deadline: float) -> None:
    f = tmp_path / "node.yaml"
    write(f, GOOD)
    cfg = NodeConfig(path=f)
    cfg.parse_deadline = deadline
    before, refused = cfg.current(), rejected(reason)
    pid_file = tmp_path / "pid"
    monkeypatch.setattr(nodedoc, "worker_command", lambda cpu_seconds: [
        sys.executable, "-c", "import os, signal, sys\n" + command, str(pid_file)])
    write(f, GOOD.replace("groupIdentity: 1", "groupIdentity: 2"))
    assert cfg.reload() is False
    assert cfg.current() is before
    assert rejected(reason) == refused + 1
    if pid_file.exists():  # the parser that slept was killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)


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


async def test_a_watch_event_over_the_bound_is_refused_and_the_last_object_stays() -> None:
    import kubernetes

    from tests.fakeapi import FakeAPIServer

    refused = REGISTRY.get_sample_value("rhp_node_config_rejected_total",
                                        {"source": "cluster", "reason": "too-large"}) or 0.0
    with FakeAPIServer() as api:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}})
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        watch = ClusterWatch("n1", api_client=kubernetes.client.ApiClient(conf), watch_timeout=30)
        cfg = NodeConfig(cluster=watch, node_name="n1")
        await cfg.start()
        try:
            await wait_for(lambda: cfg.current().labels.get("zone") == "a")
            huge = {f"l{i:06d}": "v" * 63 for i in range(nodeconfig.MAX_WATCH_EVENT_CHARS // 70)}
            api.patch_direct("Node", "n1", {"metadata": {"labels": huge}})
            await wait_for(lambda: (REGISTRY.get_sample_value("rhp_node_config_rejected_total", {
                "source": "cluster", "reason": "too-large"}) or 0.0) > refused)
            assert cfg.current().labels == {"zone": "a"}
            api.patch_direct("Node", "n1", {"metadata": {"labels": {"zone": "b"}}})  # a merge patch: huge stays
            api.patch_direct("Node", "n1", {"metadata": {"labels": {k: None for k in huge}}})
            await wait_for(lambda: cfg.current().labels == {"zone": "b"})
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


async def test_public_key_files_are_loaded_and_followed(tmp_path: Path) -> None:
    """``allocationTrust.publicKeyFiles`` (issue 37 item 1): missing at start (the extender has
    not published them yet) the node has no key and, with files configured, accepts no unsigned
    cpuset; once the file appears, and again when a key is added, the facts carry the keys; a
    malformed file keeps the keys in use."""
    from koord_formats.signature import format_public_key
    from scheduler_ext.trust import Signer

    first, second = Signer.generate().public_raw, Signer.generate().public_raw
    keys_file = tmp_path / "keys" / "public-keys"
    cfg = NodeConfig(key_files=(str(keys_file),), poll_interval=0.05)
    assert cfg.current().allocation_keys.public_keys == ()
    assert cfg.current().allocation_keys.accept_unsigned is False
    pending = cfg.keys_pending()  # /readyz says not ready until a key is read
    assert pending is not None and str(keys_file) in pending
    await cfg.start()
    try:
        keys_file.parent.mkdir()
        write(keys_file, format_public_key(first) + "\n")
        deadline = time.monotonic() + 20
        while cfg.current().allocation_keys.public_keys != (first,):
            assert time.monotonic() < deadline, cfg.current().allocation_keys
            await asyncio.sleep(0.05)
        assert cfg.keys_pending() is None
        assert REGISTRY.get_sample_value("rhp_allocation_public_keys") == 1.0
        write(keys_file, format_public_key(first) + "\n" + format_public_key(second) + "\n")
        while cfg.current().allocation_keys.public_keys != (first, second):
            assert time.monotonic() < deadline, cfg.current().allocation_keys
            await asyncio.sleep(0.05)
        write(keys_file, "ed25519 broken\n")
        await asyncio.sleep(0.3)
        assert cfg.current().allocation_keys.public_keys == (first, second)
    finally:
        await cfg.stop()


def test_no_key_files_or_unsigned_claims_accepted_leave_readiness_alone(tmp_path: Path) -> None:
    assert NodeConfig().keys_pending() is None
    missing = str(tmp_path / "absent")
    assert NodeConfig(key_files=(missing,), accept_unsigned=True).keys_pending() is None
    assert NodeConfig(key_files=(missing,)).keys_pending() is not None

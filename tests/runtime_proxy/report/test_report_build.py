"""runtime_proxy/report/build.py: the NRT's and Device's managed parts as koordlet writes them,
and their merge into what the API server holds (None when nothing would change)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from hooks.facts import NodeFacts, PodFacts, with_bound_pods
from koord_formats import FormatError, keys
from koord_formats.cpulist import parse_cpu_list
from koord_formats.device import GPUInfo
from koord_formats.node import parse_kubelet_cpu_manager_policy, parse_share_pools
from koord_formats.topology import parse_cpu_topology
from runtime_proxy.report.build import (
    build_nrt,
    merge_device,
    merge_nrt,
    new_device,
    new_nrt,
    static_reserved_cpus,
)
from runtime_proxy.report.sources import KubeletConfig
from scheduler_ext.topology import cpu_topology, unbindable_cpus
from tests.topologies import DUAL_SOCKET_HT, SINGLE_SOCKET_HT

GiB = 1024**3


def _lsr(uid: str, cpus: str, qos: str = "LSR") -> PodFacts:
    status = json.dumps({"cpuset": cpus})
    return PodFacts(name=uid, namespace="ns", uid=uid, labels={keys.LABEL_QOS_CLASS: qos},
                    annotations={keys.ANNOTATION_RESOURCE_STATUS: status}, kube_qos="Guaranteed")


def test_topology_and_zones() -> None:
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {0: 8 * GiB, 1: 4 * GiB})
    assert parse_cpu_topology(report.annotations[keys.NODE_ANNOTATION_CPU_TOPOLOGY]) == DUAL_SOCKET_HT
    assert report.policy == "None"
    assert [(z["name"], z["resources"][0]["allocatable"], z["resources"][1]["capacity"]) for z in report.zones] == [
        ("node-0", "8", "8Gi"), ("node-1", "8", "4Gi")]
    policy = parse_kubelet_cpu_manager_policy(report.annotations[keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY])
    assert policy.policy == "none" and not policy.reserved_cpus


def test_a_numa_node_without_meminfo_reports_no_memory() -> None:
    report = build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(), {})
    assert report.zones[0]["resources"][1]["capacity"] == "0"


@pytest.mark.parametrize(("pods", "ls_pool", "be_pool"), [
    pytest.param([], "0-15", "0-15", id="no bound pods: every CPU shared"),
    pytest.param([_lsr("a", "2-3,10-11")], "0-1,4-9,12-15", "0-15", id="LSR CPUs leave the LS pool only"),
    pytest.param([_lsr("a", "2-3,10-11", "LSE")], "0-1,4-9,12-15", "0-1,4-9,12-15", id="LSE CPUs leave both"),
])  # fmt: skip
def test_share_pools(pods: list[PodFacts], ls_pool: str, be_pool: str) -> None:
    node = with_bound_pods(NodeFacts(cpu_topology=DUAL_SOCKET_HT), pods)
    report = build_nrt(DUAL_SOCKET_HT, node, KubeletConfig(), {})

    def cpus(key: str) -> frozenset[int]:
        out: frozenset[int] = frozenset()
        for pool in parse_share_pools(report.annotations[key]):
            out |= pool.cpus
        return out

    assert cpus(keys.NODE_ANNOTATION_CPU_SHARED_POOLS) == parse_cpu_list(ls_pool)
    assert cpus(keys.NODE_ANNOTATION_BE_CPU_SHARED_POOLS) == parse_cpu_list(be_pool)


def test_share_pools_leave_out_the_node_reservation_and_exclusive_system_cpus() -> None:
    node = NodeFacts(annotations={keys.NODE_ANNOTATION_RESERVATION: '{"reservedCPUs":"0"}',
                                  keys.NODE_ANNOTATION_SYSTEM_QOS_RESOURCE: '{"cpuset":"1"}'})
    report = build_nrt(SINGLE_SOCKET_HT, node, KubeletConfig(), {})
    (pool,) = parse_share_pools(report.annotations[keys.NODE_ANNOTATION_CPU_SHARED_POOLS])
    assert pool.cpus == parse_cpu_list("2-7")


def test_a_malformed_node_annotation_is_a_format_error() -> None:
    node = NodeFacts(annotations={keys.NODE_ANNOTATION_RESERVATION: "{"})
    with pytest.raises(FormatError):
        build_nrt(SINGLE_SOCKET_HT, node, KubeletConfig(), {})


@pytest.mark.parametrize(("kubelet", "reserved"), [
    pytest.param(KubeletConfig("static", reserved_system_cpus=parse_cpu_list("0,8")), "0,8", id="reservedSystemCPUs"),
    pytest.param(KubeletConfig("static", reserved_cpu_milli=1500), "0,8", id="1.5 CPUs: one whole core"),
    pytest.param(KubeletConfig("static", reserved_cpu_milli=3000), "0-1,8", id="3 CPUs: a core and a half"),
    pytest.param(KubeletConfig("static"), "", id="nothing reserved"),
])  # fmt: skip
def test_static_reserved_cpus(kubelet: KubeletConfig, reserved: str) -> None:
    assert static_reserved_cpus(DUAL_SOCKET_HT, kubelet) == parse_cpu_list(reserved)


def test_static_policy_reports_its_reserved_cpus_and_the_extender_withholds_them() -> None:
    kubelet = KubeletConfig("static", {"full-pcpus-only": "true"}, reserved_system_cpus=parse_cpu_list("0,8"),
                            topology_manager_policy="single-numa-node", topology_manager_scope="pod")
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), kubelet, {})
    assert report.policy == "SingleNUMANodePodLevel"
    nrt = new_nrt("n1", report, None)
    assert cpu_topology(nrt["metadata"]["annotations"], {}) == DUAL_SOCKET_HT
    assert unbindable_cpus({}, nrt["metadata"]["annotations"]) == parse_cpu_list("0,8")


def _existing(report: Any) -> dict[str, Any]:
    obj = json.loads(json.dumps(new_nrt("n1", report, {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"})))
    obj["metadata"]["resourceVersion"] = "7"
    return obj


def test_merge_of_what_is_there_is_none() -> None:
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {0: GiB, 1: GiB})
    assert merge_nrt(_existing(report), report) is None


def test_merge_keeps_others_zone_resources_and_annotations_and_drops_foreign_zones() -> None:
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {0: GiB, 1: GiB})
    existing = _existing(report)
    batch = {"name": "kubernetes.io/batch-cpu", "capacity": "3000", "allocatable": "3000", "available": "3000"}
    existing["zones"][0]["resources"].append(batch)
    existing["zones"].append({"name": "socket-0", "type": "Socket", "resources": []})
    existing["metadata"]["annotations"]["other"] = "kept"
    existing["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_SHARED_POOLS] = "[]"
    merged = merge_nrt(copy.deepcopy(existing), report)
    assert merged is not None
    assert merged["metadata"]["resourceVersion"] == "7", "the write is conditional on what was read"
    assert merged["metadata"]["annotations"]["other"] == "kept"
    assert merged["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_SHARED_POOLS] == \
        report.annotations[keys.NODE_ANNOTATION_CPU_SHARED_POOLS]
    assert [z["name"] for z in merged["zones"]] == ["node-0", "node-1"]
    assert batch in merged["zones"][0]["resources"]
    assert merge_nrt(merged, report) is None


def test_a_changed_zone_amount_is_written() -> None:
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {0: GiB, 1: GiB})
    grown = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {0: 2 * GiB, 1: GiB})
    merged = merge_nrt(_existing(report), grown)
    assert merged is not None and merged["zones"][0]["resources"][1]["capacity"] == "2Gi"


@pytest.mark.parametrize("bad", [
    pytest.param({"zones": "x"}, id="zones not a list"),
    pytest.param({"zones": [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "capacity": "-1"}]}]},
                 id="negative quantity"),
    pytest.param({"metadata": {"annotations": {"a": 1}}}, id="annotation not a string"),
])  # fmt: skip
def test_a_malformed_nrt_read_back_is_a_format_error(bad: dict[str, Any]) -> None:
    report = build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(), {})
    with pytest.raises(FormatError):
        merge_nrt(bad, report)


GPUS = (GPUInfo(0, "GPU-a", "0000:3b:00.0", 0, "pci0000:3a", 16 * GiB), GPUInfo(1, "GPU-b", "0000:af:00.0", 1,
                                                                                 "pci0000:ae", 16 * GiB))


def test_a_node_without_gpus_creates_no_device() -> None:
    assert new_device("n1", (), None) is None


def test_device_merge() -> None:
    created = new_device("n1", GPUS, None)
    assert created is not None and [d["minor"] for d in created["spec"]["devices"]] == [0, 1]
    assert merge_device(created, GPUS) is None
    rdma = {"type": "rdma", "id": "0000:09:00.0", "minor": 0, "health": True}
    created["spec"]["devices"].append(rdma)
    assert merge_device(created, GPUS) is None, "others' entries are not ours to compare"
    fewer = merge_device(created, GPUS[:1])
    assert fewer is not None and fewer["spec"]["devices"][0] == rdma and len(fewer["spec"]["devices"]) == 2
    gone = merge_device(created, ())
    assert gone is not None and gone["spec"]["devices"] == [rdma], "a node that lost its GPUs keeps none"


def test_a_malformed_device_read_back_is_a_format_error() -> None:
    with pytest.raises(FormatError):
        merge_device({"spec": {"devices": [1]}}, GPUS)
    with pytest.raises(FormatError):
        merge_device({"spec": {"devices": [{}] * 1025}}, GPUS)


def test_kubelet_pinned_cpus_are_reported_under_the_static_policy_and_leave_the_ls_pool() -> None:
    from koord_formats.node import parse_pod_cpu_allocs
    from runtime_proxy.report.build import kubelet_allocs

    pinned = {"g1": parse_cpu_list("4-5"), "ls": parse_cpu_list("6"), "koord": parse_cpu_list("7"),
              "gone": parse_cpu_list("12")}
    pods = [PodFacts(name="guaranteed", namespace="ns", uid="g1", kube_qos="Guaranteed"),
            PodFacts(name="ls", namespace="ns", uid="ls", labels={keys.LABEL_QOS_CLASS: "LS"}),
            _lsr("koord", "7")]
    allocs = kubelet_allocs(pinned, pods)
    assert [(a.namespace, a.name, a.uid, a.cpus, a.managed_by_kubelet) for a in allocs] == [
        ("ns", "guaranteed", "g1", parse_cpu_list("4-5"), True), ("", "", "gone", parse_cpu_list("12"), True)]
    static = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig("static"), {}, allocs)
    assert parse_pod_cpu_allocs(static.annotations[keys.NODE_ANNOTATION_POD_CPU_ALLOCS]) == allocs
    (pool0, pool1) = parse_share_pools(static.annotations[keys.NODE_ANNOTATION_CPU_SHARED_POOLS])
    assert not (pool0.cpus | pool1.cpus) & parse_cpu_list("4-5,12")
    (be0, be1) = parse_share_pools(static.annotations[keys.NODE_ANNOTATION_BE_CPU_SHARED_POOLS])
    assert parse_cpu_list("4-5,12") <= be0.cpus | be1.cpus, "kubelet's pinned CPUs stay in the BE pool"
    assert unbindable_cpus({}, static.annotations) >= parse_cpu_list("4-5,12"), "the extender withholds them"
    none = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig(), {}, allocs)
    assert none.annotations[keys.NODE_ANNOTATION_POD_CPU_ALLOCS] == "[]", "only under the static policy"


def test_cpu_basic_info_is_reported_and_merged() -> None:
    from koord_formats.cpunormalization import CPUBasicInfo, parse_cpu_basic_info

    info = CPUBasicInfo("Intel(R) Xeon(R) Processor", True, False, "", "GenuineIntel")
    report = build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(), {}, (), info)
    assert parse_cpu_basic_info(report.annotations[keys.NODE_ANNOTATION_CPU_BASIC_INFO]) == info
    assert keys.NODE_ANNOTATION_CPU_BASIC_INFO not in build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(),
                                                                  {}).annotations
    existing = new_nrt("n", build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(), {}), None)
    merged = merge_nrt(existing, report)
    assert merged is not None, "an NRT without the basic info gets it"
    assert merge_nrt(merged, report) is None
    turbo = build_nrt(SINGLE_SOCKET_HT, NodeFacts(), KubeletConfig(), {}, (),
                      CPUBasicInfo("Intel(R) Xeon(R) Processor", True, True))
    again = merge_nrt(merged, turbo)
    assert again is not None and parse_cpu_basic_info(
        again["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_BASIC_INFO]).turbo_enabled, "a change is written"

"""koord_formats/nrt.py and the NRT annotations koord_formats/node.py writes: the zones koordlet
writes, read back by the extender (scheduler_ext.numa.parse_nrt_zones, through parse_zones), kubelet's
CPU manager policy annotation through its one parser, and the topology policy names."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_formats.cpulist import parse_cpu_list
from koord_formats.node import (
    KubeletCPUManagerPolicy,
    PodCPUAlloc,
    format_kubelet_cpu_manager_policy,
    format_pod_cpu_allocs,
    parse_kubelet_cpu_manager_policy,
    parse_pod_cpu_allocs,
)
from koord_formats.nrt import ZoneAmounts, format_zones, topology_policy
from scheduler_ext import numa
from scheduler_ext.views import zone_amount


def test_zones_wire_form() -> None:
    zones = format_zones({1: ZoneAmounts(4000, 3000, 8 * 1024**3, 8 * 1024**3), 0: ZoneAmounts(4000, 4000, 1000, 900)})
    assert [z["name"] for z in zones] == ["node-0", "node-1"]
    assert zones[1] == {"name": "node-1", "type": "Node", "resources": [
        {"name": "cpu", "capacity": "4", "allocatable": "3", "available": "3"},
        {"name": "memory", "capacity": "8Gi", "allocatable": "8Gi", "available": "8Gi"},
    ]}  # fmt: skip


@given(st.dictionaries(st.integers(0, 255), st.tuples(st.integers(0, 4096), st.integers(0, 2**50)), max_size=8))
def test_zones_round_trip_through_the_extenders_parser(raw: dict[int, tuple[int, int]]) -> None:
    zones = {n: ZoneAmounts(cpus * 1000, cpus * 1000, mem, mem) for n, (cpus, mem) in raw.items()}
    parsed = numa.parse_nrt_zones(json.loads(json.dumps(format_zones(zones))), zone_amount)
    assert parsed == {n: {"cpu": cpus * 1000, "memory": mem} for n, (cpus, mem) in raw.items()}


@pytest.mark.parametrize("policy", [
    KubeletCPUManagerPolicy(),
    KubeletCPUManagerPolicy("static", reserved_cpus=parse_cpu_list("0-1")),
    KubeletCPUManagerPolicy("static", options={"full-pcpus-only": "true"}, reserved_cpus=parse_cpu_list("0,4")),
])  # fmt: skip
def test_kubelet_cpu_manager_policy_round_trip(policy: KubeletCPUManagerPolicy) -> None:
    text = format_kubelet_cpu_manager_policy(policy)
    assert parse_kubelet_cpu_manager_policy(text) == policy


def test_kubelet_cpu_manager_policy_wire_form() -> None:
    text = format_kubelet_cpu_manager_policy(KubeletCPUManagerPolicy("static", reserved_cpus=parse_cpu_list("0-1")))
    assert text == '{"policy":"static","reservedCPUs":"0-1"}'


@pytest.mark.parametrize(("policy", "scope", "expected"), [
    ("", "", "None"), ("none", "container", "None"), ("single-numa-node", "", "SingleNUMANodeContainerLevel"),
    ("single-numa-node", "pod", "SingleNUMANodePodLevel"), ("restricted", "container", "RestrictedContainerLevel"),
    ("best-effort", "pod", "BestEffortPodLevel"), ("best-effort", "node", "None"), ("whatever", "pod", "None"),
])  # fmt: skip
def test_topology_policy(policy: str, scope: str, expected: str) -> None:
    assert topology_policy(policy, scope) == expected


def test_zones_read_back_keep_every_resource() -> None:
    from koord_formats.nrt import Zone, ZoneResource, format_zone, parse_zones

    raw = format_zones({0: ZoneAmounts(2000, 2000, 1024, 1024)})
    raw[0]["resources"].append({"name": "kubernetes.io/batch-cpu", "capacity": 1500, "allocatable": "1500",
                                "available": "1500"})
    raw.append({"name": "socket-0", "type": "Socket"})
    zones = parse_zones(json.loads(json.dumps(raw)))
    assert zones[0].resources[2] == ZoneResource("kubernetes.io/batch-cpu", "1500", "1500", "1500")
    assert zones[1] == Zone("socket-0", "Socket")
    assert parse_zones([format_zone(z) for z in zones]) == zones


@pytest.mark.parametrize("zones", [
    pytest.param({}, id="not a list"), pytest.param([{}] * 257, id="too many"),
    pytest.param([{"type": "Node"}], id="no name"), pytest.param([{"name": "n", "type": 5}], id="bad type"),
    pytest.param([{"name": "n", "type": "Node", "resources": [{"name": "cpu", "capacity": "-1"}]}], id="negative"),
    pytest.param([{"name": "n", "type": "Node", "resources": [{"name": "cpu", "capacity": "1e999"}]}], id="huge"),
    pytest.param([{"name": "n", "type": "Node", "resources": [{}] * 65}], id="too many resources"),
])  # fmt: skip
def test_bad_zones_are_a_format_error(zones: object) -> None:
    from koord_formats import FormatError
    from koord_formats.nrt import parse_zones

    with pytest.raises(FormatError):
        parse_zones(zones)


def test_annotations_are_bounded() -> None:
    from koord_formats import FormatError
    from koord_formats.nrt import read_annotations

    assert read_annotations({"a": "b"}) == {"a": "b"}
    for bad in ({"a": 1}, {"a": "x" * (256 * 1024 + 1)}, {str(i): "v" for i in range(1025)}, []):
        with pytest.raises(FormatError):
            read_annotations(bad)


@pytest.mark.parametrize("allocs", [
    (),
    (PodCPUAlloc(uid="u1", cpus=parse_cpu_list("2-3"), managed_by_kubelet=True),),
    (PodCPUAlloc("ns", "p", "u1", parse_cpu_list("2,4"), True), PodCPUAlloc(uid="u2", cpus=parse_cpu_list("6"))),
])  # fmt: skip
def test_pod_cpu_allocs_round_trip(allocs: tuple[PodCPUAlloc, ...]) -> None:
    text = format_pod_cpu_allocs(allocs)
    assert parse_pod_cpu_allocs(text) == allocs
    assert text != "null"

"""Pure core: parsers, CPU and GPU allocation, NUMA hint merging, annotation round trips."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from koord_formats.errors import FormatError
from koord_formats.pod import format_resource_status
from koord_formats.quantity import format_bytes, format_milli_cpu, parse_cpu_milli
from koord_formats.topology import format_cpu_topology, parse_cpu_topology
from scheduler_ext.allocator import AllocationError, GPUUsage, take_gpus
from scheduler_ext.annotations import parse_allocation
from scheduler_ext.pods import GPURequest, parse_gpu_request, parse_pod
from scheduler_ext.topology import parse_gpu_devices, unbindable_cpus
from tests.scheduler_ext.builders import TOPO_QUAD_NUMA, cpus, device, pod

F = frozenset


@pytest.mark.parametrize(
    ("text", "milli"),
    [("4", 4000), ("1500m", 1500), ("0.5", 500), ("1e3", 1_000_000), ("100m", 100)],
    ids=["whole-cores", "milli", "fraction", "exponent", "small-milli"],
)
def test_cpu_quantities_parse_to_milli(text: str, milli: int) -> None:
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("amount", "text"),
    [(8 << 30, "8Gi"), (1536 << 20, "1536Mi"), (1000, "1000"), (0, "0")],
    ids=["gibibytes", "mebibytes", "no-binary-suffix-divides", "zero"],
)
def test_bytes_format_canonically(amount: int, text: str) -> None:
    assert format_bytes(amount) == text


def test_milli_cpu_formats_whole_cores_without_suffix() -> None:
    assert (format_milli_cpu(4000), format_milli_cpu(1500)) == ("4", "1500m")


def test_cpu_topology_round_trips_through_the_koordinator_annotation() -> None:
    topo = parse_cpu_topology(format_cpu_topology(TOPO_QUAD_NUMA))
    assert len(topo.cpus) == 32
    assert topo.numa_nodes == (0, 1, 2, 3)
    assert topo.cpus_per_core == 2
    assert topo.numa_cpus[0] == cpus("0-3,16-19")


def test_core_ids_repeated_per_socket_stay_distinct_cores() -> None:
    detail = [
        {"id": 0, "core": 0, "socket": 0, "node": 0},
        {"id": 1, "core": 0, "socket": 1, "node": 1},
        {"id": 2, "core": 0, "socket": 0, "node": 0},
        {"id": 3, "core": 0, "socket": 1, "node": 1},
    ]
    topo = parse_cpu_topology(json.dumps({"detail": detail}))
    assert sorted(topo.core_cpus, key=min) == [F({0, 2}), F({1, 3})]


@pytest.mark.parametrize(
    "text",
    ["not json", "{}", '{"detail": []}', '{"detail": [{"id": -1, "core": 0}]}',
     '{"detail": [{"id": 0, "core": 0}, {"id": 0, "core": 1}]}'],
    ids=["garbage", "no-detail", "empty-detail", "negative-id", "duplicate-cpu"],
)
def test_bad_cpu_topology_is_a_clear_error(text: str) -> None:
    with pytest.raises(FormatError):
        parse_cpu_topology(text)


KUBELET = "kubelet.koordinator.sh/cpu-manager-policy"
ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
RESERVATION = "node.koordinator.sh/reservation"
SYSTEM_QOS = "node.koordinator.sh/system-qos-resource"


@pytest.mark.parametrize(
    ("node_ann", "nrt_ann", "expected"),
    [
        pytest.param({}, {KUBELET: '{"policy":"static","reservedCPUs":"0-1"}'}, cpus("0-1"),
                     id="kubelet's reserved CPUs are withheld"),
        pytest.param({SYSTEM_QOS: '{"cpuset":"2-3","cpusetExclusive":true}'}, {}, cpus("2-3"),
                     id="explicitly exclusive system-QoS CPUs are withheld"),
        pytest.param({SYSTEM_QOS: '{"cpuset":"2-3"}'}, {}, cpus("2-3"),
                     id="system-QoS CPUs without cpusetExclusive are exclusive as in Koordinator"),
        pytest.param({SYSTEM_QOS: '{"cpuset":"2-3","cpusetExclusive":false}'}, {}, F(),
                     id="shared system-QoS CPUs stay bindable"),
        pytest.param({}, {SYSTEM_QOS: '{"cpuset":"6"}'}, cpus("6"),
                     id="system-QoS on the NRT counts when the Node has none"),
        pytest.param({}, {ALLOCS: '[{"uid":"a","cpuset":"4-5","managedByKubelet":true},{"uid":"b","cpuset":"6"}]'},
                     cpus("4-5"), id="only CPUs kubelet's static policy handed out are withheld"),
        pytest.param({RESERVATION: '{"reservedCPUs":"7"}'}, {RESERVATION: '{"reservedCPUs":"1"}'}, cpus("7"),
                     id="the Node's reservation wins over the NRT's copy"),
        pytest.param({}, {}, F(), id="a node without annotations withholds nothing"),
    ],
)
def test_unbindable_cpu_sources(node_ann: dict[str, str], nrt_ann: dict[str, str], expected: frozenset[int]) -> None:
    assert unbindable_cpus(node_ann, nrt_ann) == expected


@pytest.mark.parametrize(
    ("amounts", "expected"),
    [
        ({"nvidia.com/gpu": "2"}, GPURequest(2, 100, 100, 0)),
        ({"koordinator.sh/gpu": "50"}, GPURequest(1, 50, 50, 0)),
        ({"koordinator.sh/gpu": "200"}, GPURequest(2, 100, 100, 0)),
        ({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}, GPURequest(1, 50, 50, 0)),
        ({"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory": "8Gi"}, GPURequest(1, 30, 0, 8 << 30)),
        ({"koordinator.sh/gpu-memory-ratio": "25"}, GPURequest(1, 0, 25, 0)),
        ({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}, GPURequest(2, 100, 100, 0)),
        ({"koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-core": "100",
          "koordinator.sh/gpu-memory-ratio": "100"}, GPURequest(2, 50, 50, 0)),
    ],
    ids=["nvidia-whole-cards", "koord-half-card", "koord-two-cards", "core-and-ratio",
         "core-and-bytes", "ratio-alone", "percent-over-100-means-cards", "shared-over-two-gpus"],
)
def test_gpu_requests_normalise_like_koordinator(amounts: dict[str, str], expected: GPURequest) -> None:
    assert parse_gpu_request({k: Fraction(v.removesuffix("Gi")) * (1 << 30) if v.endswith("Gi")
                              else Fraction(v) for k, v in amounts.items()}) == expected


@pytest.mark.parametrize(
    "extra",
    [
        {"koordinator.sh/gpu-core": "50"},
        {"koordinator.sh/gpu-core": "150", "koordinator.sh/gpu-memory-ratio": "150"},
        {"nvidia.com/gpu": "1", "koordinator.sh/gpu-core": "50"},
        {"koordinator.sh/gpu-memory-ratio": "50", "koordinator.sh/gpu-memory": "1Gi"},
    ],
    ids=["gpu-core-alone-is-rejected", "percent-over-100-not-multiple-of-100",
         "whole-card-mixed-with-shares", "ratio-and-bytes-together"],
)
def test_invalid_gpu_requests_become_pod_errors(extra: dict[str, str]) -> None:
    req = parse_pod(pod("p", extra=extra))
    assert req.error.startswith("invalid pod request")


@pytest.mark.parametrize(
    ("labels_qos", "priority", "cpu", "wants"),
    [("LSR", 9000, "4", True), ("LSE", None, "2", True), ("LSR", 0, "2", True),
     ("LSR", 5500, "4", False), ("LS", 9000, "4", False), ("LSR", 9000, "1500m", False)],
    ids=["lsr-prod-integer", "lse-unset-priority", "priority-out-of-range-defaults-to-prod",
         "lsr-batch-priority", "ls-never", "fractional-cpu"],
)
def test_which_pods_want_a_cpuset(labels_qos: str, priority: int | None, cpu: str, wants: bool) -> None:
    assert parse_pod(pod("p", qos=labels_qos, priority=priority, cpu=cpu)).koord_wants_cpuset is wants


GPUS = parse_gpu_devices(device("n", 4, numa_of=[0, 0, 1, 1], pcie_of=["a", "b", "c", "c"])["spec"])


@pytest.mark.parametrize(
    ("usage", "req", "kwargs", "minors"),
    [
        ({}, GPURequest(2, 100, 100, 0), {}, [2, 3]),
        ({0: GPUUsage(50, 50, 0)}, GPURequest(1, 25, 25, 0), {}, [0]),
        ({0: GPUUsage(50, 50, 0), 1: GPUUsage(20, 20, 0)}, GPURequest(1, 25, 25, 0),
         {"strategy": "MostAllocated"}, [0]),
        ({0: GPUUsage(50, 50, 0), 1: GPUUsage(20, 20, 0)}, GPURequest(1, 25, 25, 0),
         {"strategy": "LeastAllocated"}, [1]),
        ({}, GPURequest(1, 100, 100, 0), {"affinity": F({1}), "strict": True}, [2]),
        ({0: GPUUsage(80, 80, 0)}, GPURequest(1, 30, 30, 0), {}, [1]),
    ],
    ids=["two-cards-share-a-pcie-switch", "shares-fill-a-partly-used-gpu-first",
         "most-allocated-binpacks", "least-allocated-spreads-among-partial",
         "numa-affinity-is-honoured", "no-gpu-passes-100-percent"],
)
def test_take_gpus(usage, req, kwargs, minors) -> None:  # type: ignore[no-untyped-def]
    assert [g.minor for g in take_gpus(GPUS, usage, req, **kwargs)] == minors


def test_unhealthy_gpus_are_never_given() -> None:
    gpus = parse_gpu_devices(device("n", 2, unhealthy=[0])["spec"])
    assert [g.minor for g in take_gpus(gpus, {}, GPURequest(1, 100, 100, 0))] == [1]
    with pytest.raises(AllocationError):
        take_gpus(gpus, {}, GPURequest(2, 100, 100, 0))


def test_allocation_round_trips_through_annotations() -> None:
    status = format_resource_status(cpus("2,54"), {0: {"cpu": "2", "memory": "8Gi"}})
    assert status == '{"cpuset":"2,54","numaNodeResources":[{"node":0,"resources":{"cpu":"2","memory":"8Gi"}}]}'
    devices = json.dumps({"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-core": "50",
                                                             "koordinator.sh/gpu-memory": "40Gi",
                                                             "koordinator.sh/gpu-memory-ratio": "50"}}]})
    alloc = parse_allocation(status, devices, "PCPULevel")
    assert alloc.cpus == cpus("2,54")
    assert alloc.numa == {0: 2000}  # a cpuset pod's NUMA booking counts in zone accounting
    assert [(g.minor, g.core, g.ratio, g.memory) for g in alloc.gpus] == [(1, 50, 50, 40 << 30)]

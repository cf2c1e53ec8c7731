"""The extender's parse paths, happy and hostile: placed pods' allocation annotations, pending
pods' requests, node CPU annotations and Device objects.

Every parse goes through ``koord_formats``; a malformed or hostile value raises
``koord_formats.FormatError`` and nothing else (``parse_pod`` turns it into
``PodRequest.error``), and the cache skips the bad object without touching the others.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats.errors import FormatError
from koord_formats.topology import format_cpu_topology
from scheduler_ext.admission import Refusal, amplification_ratio, node_cpu_bind_policy
from scheduler_ext.allocator import GPUGrant
from scheduler_ext.annotations import EMPTY, parse_allocation
from scheduler_ext.pods import MAX_CONTAINERS, exclusive_policy_of, parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import cpu_topology, parse_gpu_devices, unbindable_cpus
from tests.scheduler_ext.builders import TOPO_SMALL, cpus, device, node, nrt, pod

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"
SPEC = "scheduling.koordinator.sh/resource-spec"
NUMA_SPEC = "scheduling.koordinator.sh/numa-topology-spec"
TOPOLOGY = "node.koordinator.sh/cpu-topology"
SYSTEM_QOS = "node.koordinator.sh/system-qos-resource"
KUBELET = "kubelet.koordinator.sh/cpu-manager-policy"
ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
RESERVATION = "node.koordinator.sh/reservation"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_RATIO = "koordinator.sh/gpu-memory-ratio"
DEEP = "[" * 3000
HUGE_CPUSET = "0-16383," * 20000


def _gpu(minor: object, **resources: object) -> str:
    return json.dumps({"gpu": [{"minor": minor, "resources": resources}]})


# ---- placed pods: resource-status and device-allocated ------------------------------------------


@pytest.mark.parametrize(
    ("status", "devices", "cpu_set", "numa", "grants"),
    [
        pytest.param('{"cpuset":"2,54"}', None, cpus("2,54"), {}, (), id="a cpuset pod holds its CPUs"),
        pytest.param('{"cpuset":"2-3","numaNodeResources":[{"node":0,"resources":{"cpu":"2"}}]}', None,
                     cpus("2-3"), {0: 2000}, (), id="a cpuset pod's NUMA booking counts next to its CPUs"),
        pytest.param('{"numaNodeResources":[{"node":1,"resources":{"cpu":"1500m","memory":"1Gi"}}]}', None,
                     frozenset(), {1: 1500}, (), id="a shared pod books milli-CPUs per NUMA node"),
        pytest.param(None, _gpu(3, **{GPU_CORE: "50", GPU_MEMORY: "40Gi", GPU_RATIO: "50"}), frozenset(), {},
                     (GPUGrant(3, 50, 50, 40 << 30),), id="a GPU share carries core, ratio and bytes"),
        pytest.param("", "", frozenset(), {}, (), id="empty annotations hold nothing"),
    ],
)
def test_allocations_parse_from_placed_pods(
    status: str | None, devices: str | None, cpu_set: frozenset[int], numa: dict[int, int],
    grants: tuple[GPUGrant, ...],
) -> None:
    alloc = parse_allocation(status, devices)
    assert (alloc.cpus, dict(alloc.numa), alloc.gpus) == (cpu_set, numa, grants)


@pytest.mark.parametrize(
    ("status", "devices"),
    [
        pytest.param(None, '{"gpu":[5]}', id="a device entry that is a number"),
        pytest.param(None, '{"gpu":[{"minor":1e400}]}', id="a minor that overflows a float"),
        pytest.param(None, '{"gpu":[{"minor":1.5}]}', id="a fractional minor"),
        pytest.param(None, '{"gpu":[{"minor":-1}]}', id="a negative minor"),
        pytest.param(None, '{"gpu":[{"minor":true}]}', id="a boolean minor"),
        pytest.param(None, '{"gpu":[{}]}', id="a device without a minor"),
        pytest.param(None, '{"gpu":{"minor":0}}', id="a device list that is an object"),
        pytest.param(None, '["gpu"]', id="device-allocated that is a list"),
        pytest.param(None, DEEP, id="device-allocated nested thousands deep"),
        pytest.param(None, _gpu(0, **{GPU_CORE: "1e9999999"}), id="a device quantity with a huge exponent"),
        pytest.param(None, _gpu(0, **{GPU_CORE: "\u0661\u0660\u0660"}), id="a device quantity in non-ASCII digits"),
        pytest.param(None, '{"gpu":[{"minor":0,"resources":[1]}]}', id="device resources that are a list"),
        pytest.param(None, '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":NaN}}]}',
                     id="a NaN device quantity"),
        pytest.param('{"cpuset":5}', None, id="a cpuset that is a number"),
        pytest.param(DEEP, None, id="resource-status nested thousands deep"),
        pytest.param('{"cpuset":"0-99999999"}', None, id="a cpuset range far beyond any CPU id"),
        pytest.param(json.dumps({"cpuset": HUGE_CPUSET}), None, id="a cpuset repeating one range 20000 times"),
        pytest.param('{"cpuset":"3-1"}', None, id="a descending cpuset range"),
        pytest.param('{"numaNodeResources":[{"node":0,"resources":{"cpu":Infinity}}]}', None,
                     id="an infinite NUMA CPU amount"),
        pytest.param('{"numaNodeResources":[{"node":0,"resources":{"cpu":"1e9999999"}}]}', None,
                     id="a NUMA CPU amount with a huge exponent"),
        pytest.param('{"numaNodeResources":[{"node":"0"}]}', None, id="a NUMA node id that is a string"),
        pytest.param('{"numaNodeResources":5}', None, id="numaNodeResources that is a number"),
        pytest.param("[]", None, id="resource-status that is a list"),
        pytest.param("not json", None, id="resource-status that is not JSON"),
        pytest.param(5, None, id="resource-status that is not a string"),
        pytest.param(None, ["gpu"], id="device-allocated that is not a string"),
    ],
)
def test_hostile_allocation_annotations_raise_only_format_errors(status: Any, devices: Any) -> None:
    with pytest.raises(FormatError):
        parse_allocation(status, devices)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
allocation_docs = st.one_of(
    json_values,
    st.fixed_dictionaries({"cpuset": json_values, "numaNodeResources": json_values}),
    st.fixed_dictionaries({"gpu": st.lists(st.fixed_dictionaries({"minor": json_values, "resources": json_values}))}),
)


@settings(max_examples=300, deadline=None)
@given(status=allocation_docs, devices=allocation_docs, raw=st.booleans())
def test_any_allocation_annotation_parses_or_raises_format_error(status: Any, devices: Any, raw: bool) -> None:
    def text(doc: Any) -> Any:
        return doc if raw else json.dumps(doc, allow_nan=True)

    with contextlib.suppress(FormatError):
        parse_allocation(text(status), text(devices))


# ---- pending pods: requests, resource-spec, numa-topology-spec ----------------------------------


def test_a_valid_pod_request_parses() -> None:
    req = parse_pod(pod("p", cpu="4", memory="8Gi", resource_spec={"preferredCPUBindPolicy": "SpreadByPCPUs",
                                                                   "preferredCPUExclusivePolicy": "PCPULevel"},
                        numa_policy="SingleNUMANode"))
    assert not req.error
    assert (req.cpu_milli, req.memory, req.bind_policy, req.exclusive_policy, req.numa_policy) == (
        4000, 8 << 30, "SpreadByPCPUs", "PCPULevel", "SingleNUMANode")


def _with(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(pod("p", annotations={SPEC: DEEP}), id="resource-spec nested thousands deep"),
        pytest.param(pod("p", annotations={SPEC: '{"requiredCPUBindPolicy":5}'}), id="a bind policy that is a number"),
        pytest.param(pod("p", annotations={SPEC: '{"preferredCPUBindPolicy":"Fastest"}'}),
                     id="an unknown bind policy"),
        pytest.param(pod("p", annotations={SPEC: "[]"}), id="resource-spec that is a list"),
        pytest.param(pod("p", annotations={SPEC: 5}), id="resource-spec that is not a string"),
        pytest.param(pod("p", annotations={NUMA_SPEC: DEEP}), id="numa-topology-spec nested thousands deep"),
        pytest.param(pod("p", annotations={NUMA_SPEC: '{"numaTopologyPolicy":"Anywhere"}'}),
                     id="an unknown NUMA policy"),
        pytest.param(pod("p", memory="1e500000"), id="a memory request with a huge exponent"),
        pytest.param(pod("p", cpu="1e9999999"), id="a CPU request with a huge exponent"),
        pytest.param(pod("p", cpu="\u0664"), id="a CPU request in non-ASCII digits"),
        pytest.param(pod("p", cpu="-4"), id="a negative CPU request"),
        pytest.param(pod("p", cpu=float("inf")), id="an infinite CPU request"),  # type: ignore[arg-type]
        pytest.param(pod("p", extra={"nvidia.com/gpu": "1e400"}), id="a GPU count beyond any card count"),
        pytest.param(pod("p", extra={"koordinator.sh/gpu-core": "50"}), id="gpu-core alone"),
        pytest.param(_with(pod("p"), ("spec", "containers"), 5), id="containers that are a number"),
        pytest.param(_with(pod("p"), ("spec", "containers"), [5]), id="a container that is a number"),
        pytest.param(_with(pod("p"), ("spec", "containers"), [{"resources": []}]), id="resources that are a list"),
        pytest.param(_with(pod("p"), ("spec", "containers"), [{"resources": {"requests": "4"}}]),
                     id="requests that are a string"),
        pytest.param(_with(pod("p"), ("spec", "containers"), [{}] * (MAX_CONTAINERS + 1)),
                     id="more containers than any pod has"),
        pytest.param(_with(pod("p"), ("spec", "initContainers"), {"a": 1}), id="init containers that are an object"),
        pytest.param(_with(pod("p"), ("metadata", "labels"), ["LSR"]), id="labels that are a list"),
        pytest.param(_with(pod("p"), ("metadata", "annotations"), 5), id="annotations that are a number"),
        pytest.param(_with(pod("p"), ("metadata", "uid"), [[1]]), id="a uid that is a list"),
        pytest.param(_with(pod("p"), ("metadata",), "x"), id="metadata that is a string"),
        pytest.param(_with(pod("p"), ("spec",), [1]), id="a spec that is a list"),
        pytest.param([1, 2], id="a pod that is a list"),
        pytest.param(None, id="no pod at all"),
    ],
)
def test_hostile_pod_requests_become_pod_errors(bad: Any) -> None:
    req = parse_pod(bad)
    assert req.error.startswith("invalid pod request")


@settings(max_examples=300, deadline=None)
@given(doc=st.one_of(
    json_values,
    st.fixed_dictionaries({"metadata": json_values, "spec": json_values}),
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"containers": st.lists(
        st.fixed_dictionaries({"resources": st.fixed_dictionaries({"requests": json_values})}), max_size=3)})}),
    st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"annotations": st.dictionaries(
        st.sampled_from([SPEC, NUMA_SPEC]), json_values.map(json.dumps) | json_values)})}),
))
def test_parse_pod_never_raises(doc: Any) -> None:
    parse_pod(doc)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({SPEC: '{"preferredCPUExclusivePolicy":"NUMANodeLevel"}'}, "NUMANodeLevel",
                     id="the exclusive policy of a placed pod is read"),
        pytest.param({}, "None", id="no resource-spec means no exclusive policy"),
        pytest.param({SPEC: DEEP}, "None", id="a hostile resource-spec only loses the preference"),
        pytest.param({SPEC: 5}, "None", id="a resource-spec that is not a string only loses the preference"),
    ],
)
def test_exclusive_policy_of_placed_pods(annotations: dict[str, Any], expected: str) -> None:
    assert exclusive_policy_of(annotations) == expected


# ---- nodes: CPU topology and CPU annotations, Device objects -------------------------------------


@pytest.mark.parametrize(
    ("node_ann", "nrt_ann"),
    [
        pytest.param({}, {TOPOLOGY: DEEP}, id="a topology nested thousands deep"),
        pytest.param({}, {TOPOLOGY: '{"detail":[{"id":0,"core":0},{"id":0,"core":1}]}'}, id="a CPU listed twice"),
        pytest.param({}, {TOPOLOGY: '{"detail":[{"id":1e400,"core":0}]}'}, id="a CPU id that overflows"),
        pytest.param({}, {TOPOLOGY: 5}, id="a topology that is not a string"),
        pytest.param({SYSTEM_QOS: '{"cpuset":5}'}, {}, id="a system-QoS cpuset that is a number"),
        pytest.param({SYSTEM_QOS: '{"cpuset":"0-1","cpusetExclusive":"yes"}'}, {},
                     id="a system-QoS exclusive flag that is a string"),
        pytest.param({}, {KUBELET: DEEP}, id="a kubelet policy nested thousands deep"),
        pytest.param({}, {ALLOCS: '{"uid":"a"}'}, id="pod-cpu-allocs that is an object"),
        pytest.param({RESERVATION: json.dumps({"reservedCPUs": HUGE_CPUSET})}, {},
                     id="a reservation repeating one range 20000 times"),
    ],
)
def test_hostile_node_cpu_annotations_raise_only_format_errors(
    node_ann: dict[str, Any], nrt_ann: dict[str, Any]
) -> None:
    nrt_ann = {TOPOLOGY: format_cpu_topology(TOPO_SMALL), **nrt_ann}
    with pytest.raises(FormatError):  # what the cache does for each node, in this order
        cpu_topology(nrt_ann, node_ann)
        unbindable_cpus(node_ann, nrt_ann)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"devices": 5}, id="devices that are a number"),
        pytest.param({"devices": [{"type": "gpu", "minor": 1e400}]}, id="a GPU minor that is an infinite float"),
        pytest.param({"devices": [{"type": "gpu"}]}, id="a GPU without a minor"),
        pytest.param({"devices": [{"type": "gpu", "minor": 0, "resources": {GPU_MEMORY: "1e500000"}}]},
                     id="a GPU memory with a huge exponent"),
        pytest.param({"devices": [{"type": "gpu", "minor": 0, "resources": 5}]}, id="GPU resources that are a number"),
        pytest.param({"devices": [{"type": "gpu", "minor": 0, "id": ["x"]}]}, id="a GPU id that is a list"),
        pytest.param({"devices": [{"type": "gpu", "minor": 0, "topology": []}]}, id="a GPU topology that is a list"),
        pytest.param({"devices": [{"type": "rdma"}] * 2000}, id="more devices than any node has"),
        pytest.param([1], id="a spec that is a list"),
    ],
)
def test_hostile_device_objects_raise_only_format_errors(spec: Any) -> None:
    with pytest.raises(FormatError):
        parse_gpu_devices(spec)


def test_device_objects_parse() -> None:
    gpus = parse_gpu_devices(device("n", 2, memory="16Gi")["spec"])
    assert [(g.minor, g.core, g.ratio, g.memory, g.numa, g.pcie) for g in gpus] == [
        (0, 100, 100, 16 << 30, 0, "pci0"), (1, 100, 100, 16 << 30, 1, "pci0")]


# ---- the cache: one poisoned object costs only itself -------------------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({DA: '{"gpu":[5]}'}, id="device-allocated with a number for a device"),
        pytest.param({DA: '{"gpu":[{"minor":1e400}]}'}, id="device-allocated with an overflowing minor"),
        pytest.param({RS: '{"cpuset":5}'}, id="resource-status with a number for a cpuset"),
        pytest.param({RS: DEEP}, id="resource-status nested thousands deep"),
        pytest.param({RS: '{"cpuset":"0-1"}', SPEC: DEEP}, id="resource-spec nested thousands deep"),
    ],
)
def test_a_poisoned_placed_pod_costs_only_itself(annotations: dict[str, str]) -> None:
    state = ClusterState()
    poisoned = pod("bad", node_name="n1", annotations=annotations)
    healthy = pod("good", node_name="n1", annotations={RS: '{"cpuset":"4-5"}'})
    load_objects(state, [node("n1"), nrt("n1", format_cpu_topology(TOPO_SMALL)), poisoned, healthy])
    ns = state.nodes["n1"]
    ns.refresh()
    assert ns.allocs[healthy["metadata"]["uid"]].cpus == cpus("4-5")
    assert cpus("4-5").isdisjoint(ns.free)
    if SPEC in annotations:  # the CPUs are still known; only the exclusive preference is lost
        assert ns.allocs[poisoned["metadata"]["uid"]].cpus == cpus("0-1")
    else:
        assert state.pods[poisoned["metadata"]["uid"]].alloc == EMPTY


def test_a_poisoned_node_costs_only_itself() -> None:
    state = ClusterState()
    load_objects(state, [
        node("bad", annotations={SYSTEM_QOS: '{"cpuset":5}'}), nrt("bad", format_cpu_topology(TOPO_SMALL)),
        {**device("bad", 2), "spec": {"devices": [{"type": "gpu", "minor": 1e400}]}},
        node("good"), nrt("good", format_cpu_topology(TOPO_SMALL)), device("good", 2),
    ])
    bad, good = state.nodes["bad"], state.nodes["good"]
    assert bad.topo is None and "system-qos-resource" in bad.topo_error
    assert not bad.gpus and bad.gpu_error
    assert good.topo is not None and good.bindable == TOPO_SMALL.cpus and len(good.gpus) == 2


# ---- admission: node annotations read while filtering ---------------------------------------------

AMPLIFICATION = "node.koordinator.sh/resource-amplification-ratio"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({}, 1.0, id="no amplification ratio is 1"),
        pytest.param({AMPLIFICATION: '{"cpu":1.5}'}, 1.5, id="a CPU amplification ratio is read"),
        pytest.param({AMPLIFICATION: DEEP}, None, id="a ratio nested thousands deep is refused"),
        pytest.param({AMPLIFICATION: '{"cpu":1e400}'}, None, id="a ratio that overflows is refused"),
        pytest.param({AMPLIFICATION: '{"cpu":NaN}'}, None, id="a NaN ratio is refused"),
    ],
)
def test_amplification_ratio(annotations: dict[str, str], expected: float | None) -> None:
    got = amplification_ratio(annotations)
    assert got == expected if expected is not None else isinstance(got, Refusal)


@pytest.mark.parametrize(
    ("labels", "nrt_ann", "expected"),
    [
        pytest.param({}, {KUBELET: '{"policy":"static","options":{"full-pcpus-only":"true"}}'}, "FullPCPUsOnly",
                     id="kubelet's static policy with full-pcpus-only forces whole cores"),
        pytest.param({"node.koordinator.sh/cpu-bind-policy": "SpreadByPCPUs"}, {}, "SpreadByPCPUs",
                     id="the node label sets the policy"),
        pytest.param({}, {KUBELET: DEEP}, "", id="a kubelet policy nested thousands deep sets nothing"),
        pytest.param({}, {KUBELET: '{"policy":"static","options":{"full-pcpus-only":true}}'}, "",
                     id="a kubelet option that is not a string sets nothing"),
    ],
)
def test_node_cpu_bind_policy(labels: dict[str, str], nrt_ann: dict[str, str], expected: str) -> None:
    assert node_cpu_bind_policy(labels, nrt_ann) == expected

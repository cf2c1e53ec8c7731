"""Pod annotations: resource-status, resource-spec, numa-topology-spec, device-allocated and
extended-resource-spec."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, keys, pod
from tests.formats.hostile import HOLE, call_total, fill, fragments

# ---- resource-status ----------------------------------------------------------------------


def test_resource_status_as_the_scheduler_writes_it() -> None:
    status = pod.parse_resource_status(
        '{"cpuset":"2,54","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}'
    )
    assert status.cpuset == frozenset({2, 54})
    assert status.numa_node_resources == (pod.NUMANodeResource(0, {"cpu": Fraction(4), "memory": Fraction(8 * 2**30)}),)
    assert status.numa_node_resources[0].has_cpu()


@pytest.mark.parametrize(
    ("text", "cpuset", "numa_nodes"),
    [
        pytest.param("{}", frozenset(), (), id="an empty object binds nothing"),
        pytest.param('{"cpuset":""}', frozenset(), (), id="an empty cpuset binds nothing"),
        pytest.param('{"numaNodeResources":null}', frozenset(), (), id="null NUMA resources are none"),
        pytest.param('{"numaNodeResources":[{"node":1}]}', frozenset(), (1,), id="a NUMA node without resources"),
    ],
)
def test_resource_status_shapes(text: str, cpuset: frozenset[int], numa_nodes: tuple[int, ...]) -> None:
    status = pod.parse_resource_status(text)
    assert status.cpuset == cpuset
    assert tuple(n.node for n in status.numa_node_resources) == numa_nodes


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 3000, id="the annotation that broke every other pod"),
        pytest.param('{"numaNodeResources":[{"node":0,"resources":{"cpu":"1e9999999"}}]}', id="a huge exponent"),
        pytest.param('{"numaNodeResources":[{"node":0,"resources":{"cpu":Infinity}}]}', id="Infinity"),
        pytest.param('{"cpuset":5}', id="a cpuset that is a number"),
        pytest.param('{"cpuset":"' + "0-16383," * 20000 + '"}', id="a 160 KB cpuset"),
        pytest.param('{"numaNodeResources":[{"node":-1}]}', id="a negative NUMA node"),
        pytest.param('{"numaNodeResources":[{"node":true}]}', id="a boolean NUMA node"),
        pytest.param('{"numaNodeResources":{}}', id="NUMA resources that are not a list"),
        pytest.param('"x"', id="a string"),
    ],
)
def test_resource_status_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_resource_status(text)


@pytest.mark.parametrize(
    ("cpus", "numa", "text"),
    [
        pytest.param(frozenset(), {}, None, id="nothing to write"),
        pytest.param(frozenset({2, 3}), {}, '{"cpuset":"2-3"}', id="a cpuset"),
        pytest.param(
            frozenset(),
            {1: {"cpu": "2"}, 0: {"cpu": "1500m"}},
            '{"numaNodeResources":[{"node":0,"resources":{"cpu":"1500m"}},{"node":1,"resources":{"cpu":"2"}}]}',
            id="NUMA nodes in ascending order",
        ),
    ],
)
def test_format_resource_status(cpus: frozenset[int], numa: dict[int, dict[str, str]], text: str | None) -> None:
    assert pod.format_resource_status(cpus, numa) == text
    if text is not None:
        assert pod.parse_resource_status(text).cpuset == cpus


# ---- resource-spec and numa-topology-spec -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("{}", pod.ResourceSpec(), id="nothing given"),
        pytest.param(
            '{"requiredCPUBindPolicy":"FullPCPUs","preferredCPUExclusivePolicy":"PCPULevel"}',
            pod.ResourceSpec(required_cpu_bind_policy="FullPCPUs", preferred_cpu_exclusive_policy="PCPULevel"),
            id="required bind and preferred exclusive policies",
        ),
        pytest.param(
            '{"preferredCPUBindPolicy":"Default"}',
            pod.ResourceSpec(preferred_cpu_bind_policy=keys.BIND_POLICY_DEFAULT),
            id="Default is kept for the scheduler to resolve",
        ),
    ],
)
def test_parse_resource_spec(text: str, expected: pod.ResourceSpec) -> None:
    assert pod.parse_resource_spec(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"requiredCPUBindPolicy":"Everything"}', id="an unknown bind policy"),
        pytest.param('{"preferredCPUExclusivePolicy":"Socket"}', id="an unknown exclusive policy"),
        pytest.param('{"requiredCPUBindPolicy":5}', id="a policy that is a number"),
        pytest.param("[[[[[[[[[[[[[[[[[[[[[[[[", id="deep nesting"),
    ],
)
def test_parse_resource_spec_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_resource_spec(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '{"numaTopologyPolicy":"SingleNUMANode","singleNUMANodeExclusive":"Required"}',
            pod.NUMATopologySpec("SingleNUMANode", "Required"),
            id="a policy with Required exclusivity keeps both",
        ),
        pytest.param(
            '{"numaTopologyPolicy":"Restricted","singleNUMANodeExclusive":"Preferred"}',
            pod.NUMATopologySpec("Restricted", "Preferred"),
            id="Preferred exclusivity is kept as written",
        ),
        pytest.param(
            '{"numaTopologyPolicy":"BestEffort"}',
            pod.NUMATopologySpec("BestEffort", ""),
            id="exclusivity left out reads as empty for the scheduler to default",
        ),
        pytest.param(
            '{"singleNUMANodeExclusive":"Required"}',
            pod.NUMATopologySpec("", "Required"),
            id="exclusivity without a policy is kept",
        ),
        pytest.param('{"singleNUMANodeExclusive":""}', pod.NUMATopologySpec(), id="an empty value means not given"),
    ],
)
def test_parse_numa_topology_spec(text: str, expected: pod.NUMATopologySpec) -> None:
    assert pod.parse_numa_topology_spec(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"numaTopologyPolicy":"Anywhere"}', id="an unknown NUMA policy"),
        pytest.param('{"singleNUMANodeExclusive":"Always"}', id="an unknown exclusivity"),
        pytest.param('{"singleNUMANodeExclusive":"required"}', id="exclusivity in the wrong case"),
        pytest.param('{"singleNUMANodeExclusive":true}', id="exclusivity that is a boolean"),
        pytest.param('{"singleNUMANodeExclusive":"' + "R" * 100 + '"}', id="an overlong exclusivity"),
        pytest.param('["Required"]', id="a list instead of an object"),
    ],
)
def test_parse_numa_topology_spec_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_numa_topology_spec(text)


# ---- device-allocated ------------------------------------------------------------------------


def test_device_allocated_as_the_scheduler_writes_it() -> None:
    text = (
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"16Gi",'
        '"koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-1"}],"rdma":[{"minor":0,"id":"0000:09:00.0"}]}'
    )
    devices = pod.parse_device_allocated(text)
    (gpu,) = devices["gpu"]
    assert gpu.minor == 0 and gpu.id == "GPU-1"
    assert gpu.resources[keys.RESOURCE_GPU_MEMORY] == 16 * 2**30
    assert pod.format_device_allocated({"gpu": [gpu]}) == (
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"16Gi",'
        '"koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-1"}]}'
    )
    assert devices["rdma"][0].resources == {}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"gpu":[5]}', id="the entry that wedged the extender's watch"),
        pytest.param('{"gpu":[{"minor":1e400}]}', id="a minor that overflows"),
        pytest.param('{"gpu":[{"minor":1.0}]}', id="a float minor"),
        pytest.param('{"gpu":[{"minor":"1"}]}', id="a string minor"),
        pytest.param('{"gpu":[{}]}', id="no minor"),
        pytest.param('{"gpu":{"minor":1}}', id="a device list that is an object"),
        pytest.param('{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"1e500000"}}]}', id="a huge exponent"),
    ],
)
def test_device_allocated_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_device_allocated(text)


def test_format_device_allocated_without_devices_writes_nothing() -> None:
    assert pod.format_device_allocated({}) is None
    assert pod.format_device_allocated({"gpu": []}) is None


# ---- extended-resource-spec ------------------------------------------------------------------


def test_extended_resource_spec() -> None:
    spec = pod.parse_extended_resource_spec(
        '{"containers":{"c1":{"requests":{"kubernetes.io/batch-cpu":"1000"},'
        '"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"4Gi"}}}}'
    )
    assert spec["c1"].requests[keys.RESOURCE_BATCH_CPU] == 1000
    assert spec["c1"].limits[keys.RESOURCE_BATCH_MEMORY] == 4 * 2**30


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"containers":[]}', id="containers that are a list"),
        pytest.param('{"containers":{"c1":5}}', id="a container that is a number"),
        pytest.param('{"containers":{"c1":{"limits":{"kubernetes.io/batch-cpu":true}}}}', id="a boolean quantity"),
    ],
)
def test_extended_resource_spec_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_extended_resource_spec(text)


# ---- cpuQOS and resctrl ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('{"enable":true,"groupIdentity":-1}', pod.PodCPUQOS(True, -1), id="enabled with a value"),
        pytest.param("{}", pod.PodCPUQOS(False, None), id="absent enable means disabled"),
        pytest.param('{"enable":true}', pod.PodCPUQOS(True, None), id="enabled without a value takes the class value"),
    ],
)
def test_pod_cpu_qos(text: str, expected: pod.PodCPUQOS) -> None:
    assert pod.parse_pod_cpu_qos(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"enable":"yes"}', id="enable that is a string"),
        pytest.param('{"enable":true,"groupIdentity":7}', id="group identity out of range"),
        pytest.param('{"enable":true,"groupIdentity":1.0}', id="group identity that is a float"),
    ],
)
def test_pod_cpu_qos_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_pod_cpu_qos(text)


def test_pod_resctrl() -> None:
    cfg = pod.parse_pod_resctrl(
        '{"llc":{"schemata":{"range":[20,80]},"schemataPerCache":[{"cacheID":1,"range":[20,50]}]},'
        '"mb":{"schemata":{"percent":20},"schemataPerCache":[{"cacheID":1,"percent":40}]}}'
    )
    assert cfg.llc == pod.ResctrlSchemata((20, 80), {1: (20, 50)})
    assert cfg.mb == pod.ResctrlSchemata(20, {1: 40})


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{}", id="neither llc nor mb"),
        pytest.param('{"llc":{"schemata":{"range":[20]}}}', id="a range of one value"),
        pytest.param('{"llc":{"schemata":{"range":[20,180]}}}', id="a range above 100"),
        pytest.param('{"mb":{"schemata":{"percent":"20"}}}', id="a percentage that is a string"),
    ],
)
def test_pod_resctrl_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_pod_resctrl(text)


# ---- one property test per format ------------------------------------------------------------

PARSERS: list[Any] = [
    pytest.param(
        pod.parse_resource_status,
        [
            HOLE,
            '{"cpuset":HOLE}',
            '{"numaNodeResources":HOLE}',
            '{"numaNodeResources":[HOLE]}',
            '{"numaNodeResources":[{"node":HOLE,"resources":{"cpu":"1"}}]}',
            '{"numaNodeResources":[{"node":0,"resources":HOLE}]}',
            '{"numaNodeResources":[{"node":0,"resources":{"cpu":HOLE,"memory":HOLE}}]}',
        ],
        id="resource-status",
    ),
    pytest.param(
        pod.parse_resource_spec,
        [HOLE, '{"requiredCPUBindPolicy":HOLE}', '{"preferredCPUExclusivePolicy":HOLE}'],
        id="resource-spec",
    ),
    pytest.param(
        pod.parse_numa_topology_spec,
        [HOLE, '{"numaTopologyPolicy":HOLE}', '{"singleNUMANodeExclusive":HOLE}'],
        id="numa-topology-spec",
    ),
    pytest.param(
        pod.parse_device_allocated,
        [
            HOLE,
            '{"gpu":HOLE}',
            '{"gpu":[HOLE]}',
            '{"gpu":[{"minor":HOLE}]}',
            '{"gpu":[{"minor":0,"resources":HOLE,"id":HOLE}]}',
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":HOLE}}]}',
        ],
        id="device-allocated",
    ),
    pytest.param(
        pod.parse_extended_resource_spec,
        [
            HOLE,
            '{"containers":HOLE}',
            '{"containers":{"c":HOLE}}',
            '{"containers":{"c":{"requests":HOLE}}}',
            '{"containers":{"c":{"limits":{"kubernetes.io/batch-cpu":HOLE}}}}',
        ],
        id="extended-resource-spec",
    ),
    pytest.param(pod.parse_pod_cpu_qos, [HOLE, '{"enable":HOLE}', '{"groupIdentity":HOLE}'], id="cpuQOS"),
    pytest.param(
        pod.parse_pod_resctrl,
        [
            HOLE,
            '{"llc":HOLE}',
            '{"llc":{"schemata":{"range":HOLE}}}',
            '{"llc":{"schemataPerCache":[{"cacheID":HOLE,"range":[0,50]}]}}',
            '{"mb":{"schemata":HOLE,"schemataPerCache":HOLE}}',
            '{"mb":{"schemata":{"percent":HOLE}}}',
        ],
        id="resctrl",
    ),
]


@pytest.mark.parametrize(("parse", "templates"), PARSERS)
@settings(max_examples=200, deadline=None)
@given(data=st.data(), fragment=fragments, repeat=st.integers(min_value=1, max_value=2))
def test_pod_annotation_parsers_are_total_and_bounded(
    parse: Callable[[str], object], templates: list[str], data: st.DataObject, fragment: str, repeat: int
) -> None:
    template = data.draw(st.sampled_from(templates))
    call_total(parse, fill(template, ",".join([fragment] * repeat)))


# ---- a Pod object's batch resources -------------------------------------------------------------

BCPU, BMEM = keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY


def _pod_object(*containers: Any, uid: Any = "u1") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": "p"},
            "spec": {"containers": list(containers)}}


def _c(name: str, requests: Any = None, limits: Any = None) -> dict[str, Any]:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    return {"name": name, "image": "busybox", "resources": resources}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(_pod_object(_c("c1", {BCPU: "500", BMEM: "64Mi"}, {BCPU: "500", BMEM: "64Mi"})),
                     {"c1": ({BCPU: 500, BMEM: 64 << 20}, {BCPU: 500, BMEM: 64 << 20})}, id="issue 36's pod"),
        pytest.param(_pod_object(_c("c1", None, {BCPU: "1", BMEM: "1Gi"})),
                     {"c1": ({BCPU: 1, BMEM: 1 << 30}, {BCPU: 1, BMEM: 1 << 30})},
                     id="limits alone give the requests"),
        pytest.param(_pod_object(_c("c1", {BCPU: "250", "cpu": "1"}, {BCPU: "500", "memory": "1Gi"})),
                     {"c1": ({BCPU: 250, "memory": 1 << 30}, {BCPU: 500, "memory": 1 << 30})},
                     id="other resources are left out, but memory (memory_qos reads it)"),
        pytest.param(_pod_object(_c("c1", {BCPU: "0.5"}, {BCPU: "0.5"})), {"c1": ({BCPU: 1}, {BCPU: 1})},
                     id="fractions round up"),
        pytest.param(_pod_object(_c("a"), _c("b", {"cpu": "1"}, {"cpu": "1"}), _c("c", {BCPU: 100}, {BCPU: 100})),
                     {"c": ({BCPU: 100}, {BCPU: 100})}, id="only the containers asking for batch resources"),
        pytest.param({"metadata": {"uid": "u1"}}, {}, id="no spec: none"),
        pytest.param(_pod_object(*[_c(f"c{i}") for i in range(1024)]), {}, id="1024 containers"),
    ],
)
def test_pod_batch_resources(obj: dict[str, Any], expected: dict[str, Any]) -> None:
    parsed = pod.parse_pod_batch_resources(obj)
    assert parsed.uid == "u1"
    got = {name: ({k: int(v) for k, v in spec.requests.items()}, {k: int(v) for k, v in spec.limits.items()})
           for name, spec in parsed.containers.items()}
    assert got == expected


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(_pod_object(*[_c(f"c{i}") for i in range(1025)]), id="1025 containers"),
        pytest.param(_pod_object(_c("c1", None, {BCPU: "100000001"})), id="batch-cpu above 10^8 milli"),
        pytest.param(_pod_object(_c("c1", None, {BMEM: "5Ei"})), id="batch-memory above 4 EiB"),
        pytest.param(_pod_object(_c("c1", None, {BMEM: "1e30"})), id="quantity above int64"),
        pytest.param(_pod_object(_c("c1", None, {BCPU: "-1"})), id="negative quantity"),
        pytest.param(_pod_object(_c("c1", None, {BCPU: "lots"})), id="not a quantity"),
        pytest.param(_pod_object(_c("c1", None, {BCPU: True})), id="boolean quantity"),
        pytest.param(_pod_object(_c("c1", None, {f"r{i}": "1" for i in range(65)})), id="65 resources"),
        pytest.param(_pod_object(_c("c1"), _c("c1")), id="a container name twice"),
        pytest.param(_pod_object({"resources": {}}), id="a container without a name"),
        pytest.param(_pod_object({"name": "x" * 254}), id="a container name too long"),
        pytest.param(_pod_object({"name": "c1", "resources": []}), id="resources not an object"),
        pytest.param(_pod_object({"name": "c1", "resources": {"limits": [1]}}), id="limits not an object"),
        pytest.param(_pod_object("c1"), id="a container not an object"),
        pytest.param({"metadata": {"uid": "u1"}, "spec": {"containers": {}}}, id="containers not a list"),
        pytest.param({"metadata": {"uid": "u1"}, "spec": []}, id="spec not an object"),
        pytest.param(_pod_object(uid=None), id="no uid"),
        pytest.param(_pod_object(uid=""), id="empty uid"),
        pytest.param(_pod_object(uid=7), id="uid not a string"),
        pytest.param(_pod_object(uid="u" * 129), id="uid too long"),
        pytest.param([], id="not an object"),
        pytest.param(None, id="null"),
    ],
)
def test_pod_batch_resources_refuses(obj: Any) -> None:
    assert call_total(pod.parse_pod_batch_resources, obj) is None


def test_pod_spec_memory_request_and_limit_for_memory_qos() -> None:
    """The plain memory request (a limit alone gives it) rides along with the batch resources."""
    obj = {"metadata": {"uid": "u"}, "spec": {"containers": [
        {"name": "a", "resources": {"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}},
        {"name": "b", "resources": {"limits": {"memory": "1Gi"}}},
        {"name": "c", "resources": {"requests": {"cpu": "1"}}},
    ]}}
    got = pod.parse_pod_batch_resources(obj).containers
    assert got["a"].requests["memory"] == 256 << 20 and got["a"].limits["memory"] == 512 << 20
    assert got["b"].requests["memory"] == 1 << 30
    assert "c" not in got
    huge = {"metadata": {"uid": "u"},
            "spec": {"containers": [{"name": "a", "resources": {"requests": {"memory": "9Ei"}}}]}}
    with pytest.raises(FormatError, match="memory"):
        pod.parse_pod_batch_resources(huge)

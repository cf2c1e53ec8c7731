"""Field numbers of our NRI and ttrpc protos, checked against containerd/nri pkg/api/api.proto
and containerd/ttrpc request.proto; a mismatch means a broken wire format."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from cri_protos import nri_pb2, ttrpc_pb2

FDP = descriptor_pb2.FieldDescriptorProto
I64, U64, I32, STR, BOOL, MSG, ENUM, BYTES = (
    FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_INT32, FDP.TYPE_STRING, FDP.TYPE_BOOL,
    FDP.TYPE_MESSAGE, FDP.TYPE_ENUM, FDP.TYPE_BYTES,
)
OPT, REP = FDP.LABEL_OPTIONAL, FDP.LABEL_REPEATED

NRI_FIELDS = [
    ("RegisterPluginRequest", "plugin_name", 1, STR, OPT),
    ("RegisterPluginRequest", "plugin_idx", 2, STR, OPT),
    ("RegisterPluginRequest", "NRI_version", 3, STR, OPT),
    ("UpdateContainersRequest", "update", 1, MSG, REP),
    ("UpdateContainersRequest", "evict", 2, MSG, REP),
    ("UpdateContainersResponse", "failed", 1, MSG, REP),
    ("ConfigureRequest", "config", 1, STR, OPT),
    ("ConfigureRequest", "runtime_name", 2, STR, OPT),
    ("ConfigureRequest", "runtime_version", 3, STR, OPT),
    ("ConfigureRequest", "registration_timeout", 4, I64, OPT),
    ("ConfigureRequest", "request_timeout", 5, I64, OPT),
    ("ConfigureRequest", "NRI_version", 6, STR, OPT),
    ("ConfigureResponse", "events", 2, I32, OPT),
    ("SynchronizeRequest", "pods", 1, MSG, REP),
    ("SynchronizeRequest", "containers", 2, MSG, REP),
    ("SynchronizeRequest", "more", 3, BOOL, OPT),
    ("SynchronizeResponse", "update", 1, MSG, REP),
    ("SynchronizeResponse", "more", 2, BOOL, OPT),
    ("CreateContainerRequest", "pod", 1, MSG, OPT),
    ("CreateContainerRequest", "container", 2, MSG, OPT),
    ("CreateContainerResponse", "adjust", 1, MSG, OPT),
    ("CreateContainerResponse", "update", 2, MSG, REP),
    ("CreateContainerResponse", "evict", 3, MSG, REP),
    ("UpdateContainerRequest", "linux_resources", 3, MSG, OPT),
    ("UpdateContainerResponse", "update", 1, MSG, REP),
    ("UpdateContainerResponse", "evict", 2, MSG, REP),
    ("StopContainerResponse", "update", 1, MSG, REP),
    ("StateChangeEvent", "event", 1, ENUM, OPT),
    ("StateChangeEvent", "pod", 2, MSG, OPT),
    ("StateChangeEvent", "container", 3, MSG, OPT),
    ("PodSandbox", "id", 1, STR, OPT),
    ("PodSandbox", "name", 2, STR, OPT),
    ("PodSandbox", "uid", 3, STR, OPT),
    ("PodSandbox", "namespace", 4, STR, OPT),
    ("PodSandbox", "labels", 5, MSG, REP),
    ("PodSandbox", "annotations", 6, MSG, REP),
    ("PodSandbox", "runtime_handler", 7, STR, OPT),
    ("PodSandbox", "linux", 8, MSG, OPT),
    ("LinuxPodSandbox", "pod_overhead", 1, MSG, OPT),
    ("LinuxPodSandbox", "pod_resources", 2, MSG, OPT),
    ("LinuxPodSandbox", "cgroup_parent", 3, STR, OPT),
    ("LinuxPodSandbox", "cgroups_path", 4, STR, OPT),
    ("LinuxPodSandbox", "resources", 6, MSG, OPT),
    ("Container", "id", 1, STR, OPT),
    ("Container", "pod_sandbox_id", 2, STR, OPT),
    ("Container", "name", 3, STR, OPT),
    ("Container", "state", 4, ENUM, OPT),
    ("Container", "labels", 5, MSG, REP),
    ("Container", "annotations", 6, MSG, REP),
    ("Container", "env", 8, STR, REP),
    ("Container", "linux", 11, MSG, OPT),
    ("LinuxContainer", "resources", 3, MSG, OPT),
    ("LinuxContainer", "oom_score_adj", 4, MSG, OPT),
    ("LinuxContainer", "cgroups_path", 5, STR, OPT),
    ("LinuxResources", "memory", 1, MSG, OPT),
    ("LinuxResources", "cpu", 2, MSG, OPT),
    ("LinuxResources", "hugepage_limits", 3, MSG, REP),
    ("LinuxResources", "rdt_class", 5, MSG, OPT),
    ("LinuxResources", "unified", 6, MSG, REP),
    ("LinuxMemory", "limit", 1, MSG, OPT),
    ("LinuxMemory", "swap", 3, MSG, OPT),
    ("LinuxCPU", "shares", 1, MSG, OPT),
    ("LinuxCPU", "quota", 2, MSG, OPT),
    ("LinuxCPU", "period", 3, MSG, OPT),
    ("LinuxCPU", "cpus", 6, STR, OPT),
    ("LinuxCPU", "mems", 7, STR, OPT),
    ("ContainerAdjustment", "annotations", 2, MSG, REP),
    ("ContainerAdjustment", "env", 4, MSG, REP),
    ("ContainerAdjustment", "linux", 6, MSG, OPT),
    ("LinuxContainerAdjustment", "resources", 2, MSG, OPT),
    ("LinuxContainerAdjustment", "oom_score_adj", 4, MSG, OPT),
    ("ContainerUpdate", "container_id", 1, STR, OPT),
    ("ContainerUpdate", "linux", 2, MSG, OPT),
    ("ContainerUpdate", "ignore_failure", 3, BOOL, OPT),
    ("LinuxContainerUpdate", "resources", 1, MSG, OPT),
    ("ContainerEviction", "container_id", 1, STR, OPT),
    ("KeyValue", "key", 1, STR, OPT),
    ("KeyValue", "value", 2, STR, OPT),
    ("OptionalInt64", "value", 1, I64, OPT),
    ("OptionalUInt64", "value", 1, U64, OPT),
]

TTRPC_FIELDS = [
    ("Request", "service", 1, STR, OPT),
    ("Request", "method", 2, STR, OPT),
    ("Request", "payload", 3, BYTES, OPT),
    ("Request", "timeout_nano", 4, I64, OPT),
    ("Request", "metadata", 5, MSG, REP),
    ("Response", "status", 1, MSG, OPT),
    ("Response", "payload", 2, BYTES, OPT),
    ("Status", "code", 1, I32, OPT),
    ("Status", "message", 2, STR, OPT),
    ("Status", "details", 3, MSG, REP),
]


def _field(fd: object, message: str, field: str) -> descriptor_pb2.FieldDescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    fd.message_types_by_name[message].CopyToProto(proto)  # type: ignore[attr-defined]
    for candidate in proto.field:
        if candidate.name == field:
            return candidate
    raise AssertionError(f"{message} has no field {field}")


@pytest.mark.parametrize(("message", "field", "number", "ftype", "label"), NRI_FIELDS)
def test_nri_field_numbers(message: str, field: str, number: int, ftype: int, label: int) -> None:
    got = _field(nri_pb2.DESCRIPTOR, message, field)
    assert (got.number, got.type, got.label) == (number, ftype, label)


@pytest.mark.parametrize(("message", "field", "number", "ftype", "label"), TTRPC_FIELDS)
def test_ttrpc_field_numbers(message: str, field: str, number: int, ftype: int, label: int) -> None:
    got = _field(ttrpc_pb2.DESCRIPTOR, message, field)
    assert (got.number, got.type, got.label) == (number, ftype, label)


def test_event_numbers_match_the_nri_enum() -> None:
    names = ["RUN_POD_SANDBOX", "STOP_POD_SANDBOX", "REMOVE_POD_SANDBOX", "CREATE_CONTAINER",
             "POST_CREATE_CONTAINER", "START_CONTAINER", "POST_START_CONTAINER", "UPDATE_CONTAINER",
             "POST_UPDATE_CONTAINER", "STOP_CONTAINER", "REMOVE_CONTAINER", "UPDATE_POD_SANDBOX",
             "POST_UPDATE_POD_SANDBOX", "VALIDATE_CONTAINER_ADJUSTMENT"]
    assert [nri_pb2.Event.Value(name) for name in names] == list(range(1, 15))


def test_package_and_service_names() -> None:
    assert nri_pb2.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    assert nri_pb2.DESCRIPTOR.services_by_name["Plugin"].full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert nri_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name == "nri.pkg.api.v1alpha1.Runtime"
    assert list(nri_pb2.DESCRIPTOR.dependencies) == []


def test_unknown_fields_survive_a_roundtrip() -> None:
    # Container.rlimits (13) is not in our subset; it must come back byte for byte.
    unknown = bytes([13 << 3 | 2, 3]) + b"\x0a\x01x"
    raw = nri_pb2.Container(id="c1").SerializeToString() + unknown
    assert nri_pb2.Container.FromString(raw).SerializeToString() == raw

"""Checks of the CRI and hook-server protos and of their generated modules.

Field numbers in the tables below were checked against k8s.io/cri-api
``pkg/apis/runtime/v1/api.proto`` and koordinator-sh/koordinator
``apis/runtime/v1alpha1/api.proto``; a mismatch means a broken wire format.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from cri_protos import api_pb2, api_pb2_grpc, hookserver_pb2, hookserver_pb2_grpc, regen

FDP = descriptor_pb2.FieldDescriptorProto

# --------------------------------------------------------------------------------------------------
# (a) generated modules are up to date
# --------------------------------------------------------------------------------------------------


def test_generated_modules_are_fresh() -> None:
    assert regen.stale_files() == [], "run scripts/gen-protos.sh and commit the result"


def test_regen_check_entry_point_passes() -> None:
    assert regen.main(["--check"]) == 0


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the protos and their committed generated files."""
    pkg = tmp_path / "cri_protos"
    pkg.mkdir()
    for name in [*regen.PROTOS, *regen.generated_names()]:
        shutil.copyfile(regen.PACKAGE_DIR / name, pkg / name)
    return pkg


def test_check_flags_an_edited_generated_module(package_copy: Path) -> None:
    assert regen.stale_files(package_copy) == []
    target = package_copy / "hookserver_pb2.py"
    target.write_text(target.read_text() + "\n# edited by hand\n")
    assert regen.stale_files(package_copy) == ["hookserver_pb2.py"]


def test_check_flags_modules_older_than_their_proto(package_copy: Path) -> None:
    proto = package_copy / "api.proto"
    proto.write_text(proto.read_text() + "\nmessage AddedLater { string x = 1; }\n")
    assert set(regen.stale_files(package_copy)) == {"api_pb2.py", "api_pb2.pyi"}


def test_check_flags_a_missing_module(package_copy: Path) -> None:
    (package_copy / "api_pb2_grpc.py").unlink()
    assert regen.stale_files(package_copy) == ["api_pb2_grpc.py"]


def test_regenerate_repairs_the_copy(package_copy: Path) -> None:
    (package_copy / "api_pb2.pyi").write_text("stale\n")
    assert regen.regenerate(package_copy) == ["api_pb2.pyi"]
    assert regen.stale_files(package_copy) == []


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _declared_floor(package: str) -> tuple[int, ...]:
    pyproject = tomllib.loads((regen.PACKAGE_DIR.parent / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["dependencies"]:
        match = re.fullmatch(rf"{package}\s*>=\s*([0-9.]+).*", requirement)
        if match:
            return _version(match.group(1))
    raise AssertionError(f"no lower bound for {package} in pyproject.toml")


def test_generated_code_fits_declared_dependency_floors() -> None:
    for proto in regen.PROTOS:
        stem = proto.removesuffix(".proto")
        pb2 = (regen.PACKAGE_DIR / f"{stem}_pb2.py").read_text()
        grpc_mod = (regen.PACKAGE_DIR / f"{stem}_pb2_grpc.py").read_text()
        gencode = re.search(r"^# Protobuf Python Version: ([0-9.]+)$", pb2, re.M)
        grpc_gen = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", grpc_mod, re.M)
        assert gencode is not None and grpc_gen is not None
        assert _version(gencode.group(1)) <= _declared_floor("protobuf"), proto
        assert _version(grpc_gen.group(1)) <= _declared_floor("grpcio"), proto


# --------------------------------------------------------------------------------------------------
# (b) decode -> mutate -> encode keeps unknown fields byte for byte
# --------------------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _vfield(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _lfield(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


# Unknown to LinuxContainerResources: a length-delimited field 77 and a varint field 50.
RES_UNKNOWN = _lfield(77, b"future-knob") + _vfield(50, 7)
# Unknown to CreateContainerRequest: field 999 (length-delimited) and a fixed32 field 1000.
TOP_UNKNOWN = _lfield(999, b"\x08\x01extra") + _varint((1000 << 3) | 5) + b"\x01\x02\x03\x04"


def _resources(cpu_shares: int) -> bytes:
    # cpu_shares (3), cpuset_cpus (6), then the unknown fields.
    return _vfield(3, cpu_shares) + _lfield(6, b"0-3") + RES_UNKNOWN


def _create_container_request(cpu_shares: int) -> bytes:
    metadata = _lfield(1, b"app")  # ContainerMetadata.name
    linux = _lfield(1, _resources(cpu_shares))  # LinuxContainerConfig.resources
    config = _lfield(1, metadata) + _lfield(15, linux)  # ContainerConfig.metadata / linux
    sandbox_linux = _lfield(1, b"/kubepods/burstable/pod1")  # LinuxPodSandboxConfig.cgroup_parent
    sandbox = _lfield(8, sandbox_linux)  # PodSandboxConfig.linux
    return _lfield(1, b"sandbox-1") + _lfield(2, config) + _lfield(3, sandbox) + TOP_UNKNOWN


def test_roundtrip_without_change_is_identical() -> None:
    raw = _create_container_request(1024)
    req = api_pb2.CreateContainerRequest.FromString(raw)
    assert req.pod_sandbox_id == "sandbox-1"
    assert req.config.linux.resources.cpu_shares == 1024
    assert req.sandbox_config.linux.cgroup_parent == "/kubepods/burstable/pod1"
    assert req.SerializeToString() == raw


def test_mutation_keeps_unknown_fields_byte_for_byte() -> None:
    req = api_pb2.CreateContainerRequest.FromString(_create_container_request(1024))
    req.config.linux.resources.cpu_shares = 2048
    out = req.SerializeToString()

    # The whole message is exactly what a peer that knows the new value would have sent,
    # unknown fields included, at both nesting levels.
    assert out == _create_container_request(2048)
    assert out.endswith(TOP_UNKNOWN)
    assert _resources(2048) in out

    again = api_pb2.CreateContainerRequest.FromString(out)
    assert again.config.linux.resources.cpu_shares == 2048
    assert again.config.linux.resources.cpuset_cpus == "0-3"


def test_unknown_fields_survive_copy_into_another_message() -> None:
    req = api_pb2.CreateContainerRequest.FromString(_create_container_request(1024))
    update = api_pb2.UpdateContainerResourcesRequest(container_id="c1")
    update.linux.CopyFrom(req.config.linux.resources)
    assert update.linux.SerializeToString() == _resources(1024)


# --------------------------------------------------------------------------------------------------
# (c) field numbers and types that matter to us
# --------------------------------------------------------------------------------------------------

I64, U64, U32, I32, STR, BOOL, MSG, ENUM = (
    FDP.TYPE_INT64,
    FDP.TYPE_UINT64,
    FDP.TYPE_UINT32,
    FDP.TYPE_INT32,
    FDP.TYPE_STRING,
    FDP.TYPE_BOOL,
    FDP.TYPE_MESSAGE,
    FDP.TYPE_ENUM,
)
OPT, REP = FDP.LABEL_OPTIONAL, FDP.LABEL_REPEATED

# (message, field, number, type, label); maps are repeated messages.
CRI_FIELDS: list[tuple[str, str, int, int, int]] = [
    ("CreateContainerRequest", "pod_sandbox_id", 1, STR, OPT),
    ("CreateContainerRequest", "config", 2, MSG, OPT),
    ("CreateContainerRequest", "sandbox_config", 3, MSG, OPT),
    ("CreateContainerResponse", "container_id", 1, STR, OPT),
    ("ContainerConfig", "metadata", 1, MSG, OPT),
    ("ContainerConfig", "image", 2, MSG, OPT),
    ("ContainerConfig", "envs", 6, MSG, REP),
    ("ContainerConfig", "mounts", 7, MSG, REP),
    ("ContainerConfig", "devices", 8, MSG, REP),
    ("ContainerConfig", "labels", 9, MSG, REP),
    ("ContainerConfig", "annotations", 10, MSG, REP),
    ("ContainerConfig", "linux", 15, MSG, OPT),
    ("ContainerConfig", "CDI_devices", 17, MSG, REP),
    ("ContainerConfig", "stop_signal", 18, ENUM, OPT),
    ("ContainerMetadata", "name", 1, STR, OPT),
    ("ContainerMetadata", "attempt", 2, U32, OPT),
    ("KeyValue", "key", 1, STR, OPT),
    ("KeyValue", "value", 2, STR, OPT),
    ("LinuxContainerConfig", "resources", 1, MSG, OPT),
    ("LinuxContainerConfig", "security_context", 2, MSG, OPT),
    ("LinuxContainerResources", "cpu_period", 1, I64, OPT),
    ("LinuxContainerResources", "cpu_quota", 2, I64, OPT),
    ("LinuxContainerResources", "cpu_shares", 3, I64, OPT),
    ("LinuxContainerResources", "memory_limit_in_bytes", 4, I64, OPT),
    ("LinuxContainerResources", "oom_score_adj", 5, I64, OPT),
    ("LinuxContainerResources", "cpuset_cpus", 6, STR, OPT),
    ("LinuxContainerResources", "cpuset_mems", 7, STR, OPT),
    ("LinuxContainerResources", "hugepage_limits", 8, MSG, REP),
    ("LinuxContainerResources", "unified", 9, MSG, REP),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10, I64, OPT),
    ("HugepageLimit", "page_size", 1, STR, OPT),
    ("HugepageLimit", "limit", 2, U64, OPT),
    ("PodSandboxConfig", "metadata", 1, MSG, OPT),
    ("PodSandboxConfig", "hostname", 2, STR, OPT),
    ("PodSandboxConfig", "labels", 6, MSG, REP),
    ("PodSandboxConfig", "annotations", 7, MSG, REP),
    ("PodSandboxConfig", "linux", 8, MSG, OPT),
    ("PodSandboxMetadata", "name", 1, STR, OPT),
    ("PodSandboxMetadata", "uid", 2, STR, OPT),
    ("PodSandboxMetadata", "namespace", 3, STR, OPT),
    ("PodSandboxMetadata", "attempt", 4, U32, OPT),
    ("LinuxPodSandboxConfig", "cgroup_parent", 1, STR, OPT),
    ("LinuxPodSandboxConfig", "security_context", 2, MSG, OPT),
    ("LinuxPodSandboxConfig", "sysctls", 3, MSG, REP),
    ("LinuxPodSandboxConfig", "overhead", 4, MSG, OPT),
    ("LinuxPodSandboxConfig", "resources", 5, MSG, OPT),
    ("RunPodSandboxRequest", "config", 1, MSG, OPT),
    ("RunPodSandboxRequest", "runtime_handler", 2, STR, OPT),
    ("RunPodSandboxResponse", "pod_sandbox_id", 1, STR, OPT),
    ("StopPodSandboxRequest", "pod_sandbox_id", 1, STR, OPT),
    ("RemovePodSandboxRequest", "pod_sandbox_id", 1, STR, OPT),
    ("StartContainerRequest", "container_id", 1, STR, OPT),
    ("StopContainerRequest", "container_id", 1, STR, OPT),
    ("StopContainerRequest", "timeout", 2, I64, OPT),
    ("RemoveContainerRequest", "container_id", 1, STR, OPT),
    ("UpdateContainerResourcesRequest", "container_id", 1, STR, OPT),
    ("UpdateContainerResourcesRequest", "linux", 2, MSG, OPT),
    ("UpdateContainerResourcesRequest", "windows", 3, MSG, OPT),
    ("UpdateContainerResourcesRequest", "annotations", 4, MSG, REP),
    ("UpdatePodSandboxResourcesRequest", "pod_sandbox_id", 1, STR, OPT),
    ("UpdatePodSandboxResourcesRequest", "overhead", 2, MSG, OPT),
    ("UpdatePodSandboxResourcesRequest", "resources", 3, MSG, OPT),
    ("PodSandbox", "id", 1, STR, OPT),
    ("PodSandbox", "metadata", 2, MSG, OPT),
    ("PodSandbox", "labels", 5, MSG, REP),
    ("PodSandbox", "annotations", 6, MSG, REP),
    ("PodSandbox", "runtime_handler", 7, STR, OPT),
    ("Container", "pod_sandbox_id", 2, STR, OPT),
    ("Container", "metadata", 3, MSG, OPT),
    ("Container", "annotations", 9, MSG, REP),
    ("ContainerStatus", "resources", 16, MSG, OPT),
    ("ContainerResources", "linux", 1, MSG, OPT),
    ("ImageSpec", "image", 1, STR, OPT),
    ("ImageSpec", "user_specified_image", 18, STR, OPT),
    ("ImageSpec", "runtime_handler", 19, STR, OPT),
    ("ImageSpec", "image_ref", 20, STR, OPT),
    ("LinuxSandboxSecurityContext", "run_as_group", 8, MSG, OPT),
    ("LinuxSandboxSecurityContext", "supplemental_groups_policy", 11, ENUM, OPT),
    ("ExecRequest", "tty", 3, BOOL, OPT),
    ("ExecRequest", "stdin", 4, BOOL, OPT),
    ("AttachRequest", "stdin", 2, BOOL, OPT),
    ("AttachRequest", "tty", 3, BOOL, OPT),
    ("ContainerEventResponse", "container_id", 1, STR, OPT),
    ("ContainerEventResponse", "container_event_type", 2, ENUM, OPT),
    ("ContainerEventResponse", "created_at", 3, I64, OPT),
    ("ContainerEventResponse", "pod_sandbox_status", 4, MSG, OPT),
    ("ContainerEventResponse", "containers_statuses", 5, MSG, REP),
    ("VersionResponse", "runtime_api_version", 4, STR, OPT),
    ("PortMapping", "container_port", 2, I32, OPT),
]

HOOK_FIELDS: list[tuple[str, str, int, int, int]] = [
    ("PodSandboxMetadata", "name", 1, STR, OPT),
    ("PodSandboxMetadata", "uid", 2, STR, OPT),
    ("PodSandboxMetadata", "namespace", 3, STR, OPT),
    ("PodSandboxMetadata", "attempt", 4, U32, OPT),
    ("PodSandboxHookRequest", "pod_meta", 1, MSG, OPT),
    ("PodSandboxHookRequest", "runtime_handler", 2, STR, OPT),
    ("PodSandboxHookRequest", "labels", 3, MSG, REP),
    ("PodSandboxHookRequest", "annotations", 4, MSG, REP),
    ("PodSandboxHookRequest", "cgroup_parent", 5, STR, OPT),
    ("PodSandboxHookRequest", "overhead", 6, MSG, OPT),
    ("PodSandboxHookRequest", "resources", 7, MSG, OPT),
    ("PodSandboxHookResponse", "labels", 1, MSG, REP),
    ("PodSandboxHookResponse", "annotations", 2, MSG, REP),
    ("PodSandboxHookResponse", "cgroup_parent", 3, STR, OPT),
    ("PodSandboxHookResponse", "resources", 4, MSG, OPT),
    ("LinuxContainerResources", "cpu_period", 1, I64, OPT),
    ("LinuxContainerResources", "cpu_quota", 2, I64, OPT),
    ("LinuxContainerResources", "cpu_shares", 3, I64, OPT),
    ("LinuxContainerResources", "memory_limit_in_bytes", 4, I64, OPT),
    ("LinuxContainerResources", "oom_score_adj", 5, I64, OPT),
    ("LinuxContainerResources", "cpuset_cpus", 6, STR, OPT),
    ("LinuxContainerResources", "cpuset_mems", 7, STR, OPT),
    ("LinuxContainerResources", "hugepage_limits", 8, MSG, REP),
    ("LinuxContainerResources", "unified", 9, MSG, REP),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10, I64, OPT),
    ("HugepageLimit", "page_size", 1, STR, OPT),
    ("HugepageLimit", "limit", 2, U64, OPT),
    ("ContainerMetadata", "name", 1, STR, OPT),
    ("ContainerMetadata", "attempt", 2, U32, OPT),
    ("ContainerMetadata", "id", 3, STR, OPT),
    ("ContainerResourceHookRequest", "pod_meta", 1, MSG, OPT),
    ("ContainerResourceHookRequest", "container_meta", 2, MSG, OPT),
    ("ContainerResourceHookRequest", "container_annotations", 3, MSG, REP),
    ("ContainerResourceHookRequest", "container_resources", 4, MSG, OPT),
    ("ContainerResourceHookRequest", "pod_resources", 5, MSG, OPT),
    ("ContainerResourceHookRequest", "pod_annotations", 6, MSG, REP),
    ("ContainerResourceHookRequest", "pod_labels", 7, MSG, REP),
    ("ContainerResourceHookRequest", "pod_cgroup_parent", 8, STR, OPT),
    ("ContainerResourceHookRequest", "container_envs", 9, MSG, REP),
    ("ContainerResourceHookResponse", "container_annotations", 1, MSG, REP),
    ("ContainerResourceHookResponse", "container_resources", 2, MSG, OPT),
    ("ContainerResourceHookResponse", "pod_cgroup_parent", 3, STR, OPT),
    ("ContainerResourceHookResponse", "container_envs", 4, MSG, REP),
]


def _field_proto(fd: FileDescriptor, message: str, field: str) -> descriptor_pb2.FieldDescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    fd.message_types_by_name[message].CopyToProto(proto)
    for candidate in proto.field:
        if candidate.name == field:
            return candidate
    raise AssertionError(f"{fd.package}.{message} has no field {field}")


@pytest.mark.parametrize(("message", "field", "number", "ftype", "label"), CRI_FIELDS)
def test_cri_field_numbers(message: str, field: str, number: int, ftype: int, label: int) -> None:
    got = _field_proto(api_pb2.DESCRIPTOR, message, field)
    assert (got.number, got.type, got.label) == (number, ftype, label)


@pytest.mark.parametrize(("message", "field", "number", "ftype", "label"), HOOK_FIELDS)
def test_hook_field_numbers(message: str, field: str, number: int, ftype: int, label: int) -> None:
    got = _field_proto(hookserver_pb2.DESCRIPTOR, message, field)
    assert (got.number, got.type, got.label) == (number, ftype, label)


def test_packages_and_own_copies() -> None:
    assert api_pb2.DESCRIPTOR.package == "runtime.v1"
    assert hookserver_pb2.DESCRIPTOR.package == "runtime.v1alpha1"
    assert list(hookserver_pb2.DESCRIPTOR.dependencies) == []
    assert list(api_pb2.DESCRIPTOR.dependencies) == []
    hook_res = hookserver_pb2.ContainerResourceHookRequest.DESCRIPTOR.fields_by_name["container_resources"]
    assert hook_res.message_type is not None
    assert hook_res.message_type.full_name == "runtime.v1alpha1.LinuxContainerResources"


def test_cri_and_hook_resources_share_a_wire_format() -> None:
    cri = api_pb2.LinuxContainerResources(
        cpu_period=100000,
        cpu_quota=-1,
        cpu_shares=2,
        memory_limit_in_bytes=1 << 30,
        oom_score_adj=-997,
        cpuset_cpus="0-3",
        cpuset_mems="0",
        hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=1 << 21)],
        unified={"memory.high": "max"},
        memory_swap_limit_in_bytes=1 << 31,
    )
    raw = cri.SerializeToString(deterministic=True)
    hook = hookserver_pb2.LinuxContainerResources.FromString(raw)
    assert hook.SerializeToString(deterministic=True) == raw
    assert hook.oom_score_adj == -997 and hook.unified["memory.high"] == "max"


# --------------------------------------------------------------------------------------------------
# (d) services: every method with the right streaming flags
# --------------------------------------------------------------------------------------------------

UNARY, SERVER_STREAM = "unary_unary", "unary_stream"

RUNTIME_METHODS: dict[str, tuple[str, str, str]] = {
    "Version": ("VersionRequest", "VersionResponse", UNARY),
    "RunPodSandbox": ("RunPodSandboxRequest", "RunPodSandboxResponse", UNARY),
    "StopPodSandbox": ("StopPodSandboxRequest", "StopPodSandboxResponse", UNARY),
    "RemovePodSandbox": ("RemovePodSandboxRequest", "RemovePodSandboxResponse", UNARY),
    "PodSandboxStatus": ("PodSandboxStatusRequest", "PodSandboxStatusResponse", UNARY),
    "ListPodSandbox": ("ListPodSandboxRequest", "ListPodSandboxResponse", UNARY),
    "StreamPodSandboxes": ("StreamPodSandboxesRequest", "StreamPodSandboxesResponse", SERVER_STREAM),
    "CreateContainer": ("CreateContainerRequest", "CreateContainerResponse", UNARY),
    "StartContainer": ("StartContainerRequest", "StartContainerResponse", UNARY),
    "StopContainer": ("StopContainerRequest", "StopContainerResponse", UNARY),
    "RemoveContainer": ("RemoveContainerRequest", "RemoveContainerResponse", UNARY),
    "ListContainers": ("ListContainersRequest", "ListContainersResponse", UNARY),
    "StreamContainers": ("StreamContainersRequest", "StreamContainersResponse", SERVER_STREAM),
    "ContainerStatus": ("ContainerStatusRequest", "ContainerStatusResponse", UNARY),
    "UpdateContainerResources": (
        "UpdateContainerResourcesRequest",
        "UpdateContainerResourcesResponse",
        UNARY,
    ),
    "ReopenContainerLog": ("ReopenContainerLogRequest", "ReopenContainerLogResponse", UNARY),
    "ExecSync": ("ExecSyncRequest", "ExecSyncResponse", UNARY),
    "Exec": ("ExecRequest", "ExecResponse", UNARY),
    "Attach": ("AttachRequest", "AttachResponse", UNARY),
    "PortForward": ("PortForwardRequest", "PortForwardResponse", UNARY),
    "ContainerStats": ("ContainerStatsRequest", "ContainerStatsResponse", UNARY),
    "ListContainerStats": ("ListContainerStatsRequest", "ListContainerStatsResponse", UNARY),
    "StreamContainerStats": ("StreamContainerStatsRequest", "StreamContainerStatsResponse", SERVER_STREAM),
    "PodSandboxStats": ("PodSandboxStatsRequest", "PodSandboxStatsResponse", UNARY),
    "ListPodSandboxStats": ("ListPodSandboxStatsRequest", "ListPodSandboxStatsResponse", UNARY),
    "StreamPodSandboxStats": (
        "StreamPodSandboxStatsRequest",
        "StreamPodSandboxStatsResponse",
        SERVER_STREAM,
    ),
    "UpdateRuntimeConfig": ("UpdateRuntimeConfigRequest", "UpdateRuntimeConfigResponse", UNARY),
    "Status": ("StatusRequest", "StatusResponse", UNARY),
    "CheckpointContainer": ("CheckpointContainerRequest", "CheckpointContainerResponse", UNARY),
    "GetContainerEvents": ("GetEventsRequest", "ContainerEventResponse", SERVER_STREAM),
    "ListMetricDescriptors": ("ListMetricDescriptorsRequest", "ListMetricDescriptorsResponse", UNARY),
    "ListPodSandboxMetrics": ("ListPodSandboxMetricsRequest", "ListPodSandboxMetricsResponse", UNARY),
    "StreamPodSandboxMetrics": (
        "StreamPodSandboxMetricsRequest",
        "StreamPodSandboxMetricsResponse",
        SERVER_STREAM,
    ),
    "RuntimeConfig": ("RuntimeConfigRequest", "RuntimeConfigResponse", UNARY),
    "UpdatePodSandboxResources": (
        "UpdatePodSandboxResourcesRequest",
        "UpdatePodSandboxResourcesResponse",
        UNARY,
    ),
}

IMAGE_METHODS: dict[str, tuple[str, str, str]] = {
    "ListImages": ("ListImagesRequest", "ListImagesResponse", UNARY),
    "StreamImages": ("StreamImagesRequest", "StreamImagesResponse", SERVER_STREAM),
    "ImageStatus": ("ImageStatusRequest", "ImageStatusResponse", UNARY),
    "PullImage": ("PullImageRequest", "PullImageResponse", UNARY),
    "RemoveImage": ("RemoveImageRequest", "RemoveImageResponse", UNARY),
    "ImageFsInfo": ("ImageFsInfoRequest", "ImageFsInfoResponse", UNARY),
}

_CONTAINER_HOOK = ("ContainerResourceHookRequest", "ContainerResourceHookResponse", UNARY)
HOOK_METHODS: dict[str, tuple[str, str, str]] = {
    "PreRunPodSandboxHook": ("PodSandboxHookRequest", "PodSandboxHookResponse", UNARY),
    "PostStopPodSandboxHook": ("PodSandboxHookRequest", "PodSandboxHookResponse", UNARY),
    "PreCreateContainerHook": _CONTAINER_HOOK,
    "PreStartContainerHook": _CONTAINER_HOOK,
    "PostStartContainerHook": _CONTAINER_HOOK,
    "PostStopContainerHook": _CONTAINER_HOOK,
    "PreUpdateContainerResourcesHook": _CONTAINER_HOOK,
}

SERVICES: list[tuple[FileDescriptor, str, dict[str, tuple[str, str, str]]]] = [
    (api_pb2.DESCRIPTOR, "RuntimeService", RUNTIME_METHODS),
    (api_pb2.DESCRIPTOR, "ImageService", IMAGE_METHODS),
    (hookserver_pb2.DESCRIPTOR, "RuntimeHookService", HOOK_METHODS),
]


@pytest.mark.parametrize(("fd", "service", "expected"), SERVICES, ids=[s[1] for s in SERVICES])
def test_service_descriptors(fd: FileDescriptor, service: str, expected: dict[str, tuple[str, str, str]]) -> None:
    svc = fd.services_by_name[service]
    got = {
        m.name: (
            m.input_type.name,
            m.output_type.name,
            SERVER_STREAM if m.server_streaming else UNARY,
            m.client_streaming,
        )
        for m in svc.methods
    }
    want = {name: (*spec, False) for name, spec in expected.items()}
    assert got == want


class _RecordingChannel:
    """Stands in for grpc.Channel and records how a generated stub wires each method."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def _recorder(self, kind: str) -> Callable[..., object]:
        def record(path: str, *args: Any, **kwargs: Any) -> object:
            self.calls[path] = kind
            return object()

        return record

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._recorder(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize(
    ("stub_factory", "prefix", "expected"),
    [
        (api_pb2_grpc.RuntimeServiceStub, "/runtime.v1.RuntimeService/", RUNTIME_METHODS),
        (api_pb2_grpc.ImageServiceStub, "/runtime.v1.ImageService/", IMAGE_METHODS),
        (hookserver_pb2_grpc.RuntimeHookServiceStub, "/runtime.v1alpha1.RuntimeHookService/", HOOK_METHODS),
    ],
    ids=["RuntimeService", "ImageService", "RuntimeHookService"],
)
def test_generated_stubs_use_full_method_paths(
    stub_factory: Callable[[Any], object], prefix: str, expected: dict[str, tuple[str, str, str]]
) -> None:
    channel = _RecordingChannel()
    stub_factory(channel)
    assert channel.calls == {prefix + name: spec[2] for name, spec in expected.items()}

"""The CRI v1 method table: which full method paths exist, which stream, which we intercept.

Used by both transports to pick a handler shape without importing protobuf, and by the
interceptor to map a method to its hook stage. Kept by hand in step with ``cri_protos/api.proto``
(``tests/test_layers.py::test_method_table_matches_the_proto`` checks the two agree).
"""

from __future__ import annotations

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGE = "/runtime.v1.ImageService/"

_RUNTIME_UNARY = (
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
)
_RUNTIME_STREAMING = (
    "StreamPodSandboxes",
    "StreamContainers",
    "StreamContainerStats",
    "StreamPodSandboxStats",
    "GetContainerEvents",
    "StreamPodSandboxMetrics",
)
_IMAGE_UNARY = (
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
)
_IMAGE_STREAMING = ("StreamImages",)

UNARY: frozenset[str] = frozenset(
    [RUNTIME + m for m in _RUNTIME_UNARY] + [IMAGE + m for m in _IMAGE_UNARY]
)
SERVER_STREAMING: frozenset[str] = frozenset(
    [RUNTIME + m for m in _RUNTIME_STREAMING] + [IMAGE + m for m in _IMAGE_STREAMING]
)

# Intercepted lifecycle calls, mapped to the CRI call name used in hook stage names.
INTERCEPTED: dict[str, str] = {
    RUNTIME + name: name
    for name in (
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "CreateContainer",
        "StartContainer",
        "UpdateContainerResources",
        "StopContainer",
        "RemoveContainer",
    )
}


def is_known_unary(method: str) -> bool:
    return method in UNARY

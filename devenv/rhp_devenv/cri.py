"""A small synchronous CRI v1 client and request builders, for tests, the demo and benchmarks.

Built on the generated stubs :mod:`cri_protos.api_pb2` and :mod:`cri_protos.api_pb2_grpc`
(package ``runtime.v1``). It talks to any CRI socket: a :class:`PrivateContainerd`, or our proxy
in front of one. The builders make what this kind of machine needs and what kubelet would send:

- pods use the host network namespace (``network = NODE``) with an empty hostname (a hostname
  without a private UTS namespace makes runc fail), and the cgroup parent you give;
- every pod gets a fresh UID and name, so calls never collide;
- containers run the busybox image, by default ``sleep 3600`` (:data:`SLEEP_COMMAND`) or a CPU
  burner (:data:`BURN_CPU_COMMAND`).

Works unchanged against containerd 1.6, 1.7 and 2.1; 1.6 answers GetContainerEvents with
UNIMPLEMENTED, which :meth:`CriClient.container_events` passes on as :class:`grpc.RpcError`.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from cri_protos import api_pb2, api_pb2_grpc
from rhp_devenv.image import DEFAULT_IMAGE

__all__ = [
    "BURN_CPU_COMMAND",
    "SLEEP_COMMAND",
    "CriClient",
    "PodHandle",
    "container_config",
    "linux_resources",
    "pod_sandbox_config",
    "unique_suffix",
]

SLEEP_COMMAND: tuple[str, ...] = ("sleep", "3600")
"""A container that idles for an hour."""

BURN_CPU_COMMAND: tuple[str, ...] = ("sh", "-c", "while :; do :; done")
"""A container that spins one CPU at 100% until it is killed."""

_counter = itertools.count(1)


def unique_suffix() -> str:
    """A short string unique within this machine for practical purposes (pid, counter, random)."""
    return f"{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def _host_network_namespaces() -> api_pb2.NamespaceOption:
    return api_pb2.NamespaceOption(network=api_pb2.NODE, pid=api_pb2.CONTAINER, ipc=api_pb2.POD)


def pod_sandbox_config(
    *,
    cgroup_parent: str,
    name: str | None = None,
    namespace: str = "default",
    uid: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    attempt: int = 0,
) -> api_pb2.PodSandboxConfig:
    """A RunPodSandbox config for a host-network pod in *cgroup_parent*.

    :param cgroup_parent: the pod cgroup (cgroupfs driver), e.g.
        ``/rhptest-ab12/kubepods/burstable/pod<uid>``; see
        :func:`rhp_devenv.cgroupfs.pod_cgroup_parent`.
    :param name: pod name; default ``rhp-pod-<unique>``.
    :param uid: pod UID; default a fresh UUID.
    :param labels: pod labels (Koordinator QoS labels go here).
    :param annotations: pod annotations.
    """
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(
            name=name or f"rhp-pod-{unique_suffix()}",
            uid=uid or str(uuid.uuid4()),
            namespace=namespace,
            attempt=attempt,
        ),
        hostname="",
        labels=dict(labels or {}),
        annotations=dict(annotations or {}),
        linux=api_pb2.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=_host_network_namespaces(),
            ),
        ),
    )


def linux_resources(
    *,
    cpu_shares: int | None = None,
    cpu_quota: int | None = None,
    cpu_period: int | None = None,
    cpuset_cpus: str | None = None,
    cpuset_mems: str | None = None,
    memory_limit_in_bytes: int | None = None,
    oom_score_adj: int | None = None,
) -> api_pb2.LinuxContainerResources:
    """``LinuxContainerResources`` with only the given fields set (others stay zero/empty).

    A CPU quota without a period gets kubelet's 100000 µs period.
    """
    fields: dict[str, Any] = {
        "cpu_shares": cpu_shares,
        "cpu_quota": cpu_quota,
        "cpu_period": cpu_period if cpu_period is not None else (100_000 if cpu_quota else None),
        "cpuset_cpus": cpuset_cpus,
        "cpuset_mems": cpuset_mems,
        "memory_limit_in_bytes": memory_limit_in_bytes,
        "oom_score_adj": oom_score_adj,
    }
    return api_pb2.LinuxContainerResources(**{k: v for k, v in fields.items() if v is not None})


def container_config(
    *,
    name: str | None = None,
    image: str = DEFAULT_IMAGE,
    command: Sequence[str] = SLEEP_COMMAND,
    resources: api_pb2.LinuxContainerResources | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    envs: Mapping[str, str] | None = None,
) -> api_pb2.ContainerConfig:
    """A CreateContainer config running *command* in the busybox image, in the pod's host network.

    :param name: container name; default ``rhp-ctr-<unique>``.
    :param command: argv; :data:`SLEEP_COMMAND` or :data:`BURN_CPU_COMMAND` are handy.
    :param resources: see :func:`linux_resources`.
    """
    linux = api_pb2.LinuxContainerConfig(
        security_context=api_pb2.LinuxContainerSecurityContext(namespace_options=_host_network_namespaces()),
    )
    if resources is not None:
        linux.resources.CopyFrom(resources)
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=name or f"rhp-ctr-{unique_suffix()}"),
        image=api_pb2.ImageSpec(image=image),
        command=list(command),
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
        labels=dict(labels or {}),
        annotations=dict(annotations or {}),
        linux=linux,
    )


@dataclass
class PodHandle:
    """A running pod and the containers this client started in it."""

    pod_id: str
    """The sandbox ID containerd returned."""
    config: api_pb2.PodSandboxConfig
    """The config it was run with (CreateContainer needs it again)."""
    container_ids: list[str] = field(default_factory=list)
    """Containers created in it through :meth:`CriClient.run_container`, in order."""

    @property
    def cgroup_parent(self) -> str:
        """The pod's cgroup parent."""
        return self.config.linux.cgroup_parent

    @property
    def uid(self) -> str:
        """The pod's UID."""
        return self.config.metadata.uid


class CriClient:
    """Synchronous CRI v1 client over a unix socket: RuntimeService and ImageService stubs plus helpers.

    Each helper makes one CRI call (except the ``run_*`` and ``remove_all_pods`` conveniences) and
    returns plain values or response messages; gRPC failures surface as :class:`grpc.RpcError`.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, socket: str | Path, *, timeout: float = 30.0, wait_for_ready: bool = False) -> None:
        """Open a channel to the CRI server on *socket* (a path, or a ``unix://`` target).

        :param timeout: default deadline in seconds for every call.
        :param wait_for_ready: make calls wait (up to their deadline) for the server to come up,
            instead of failing with UNAVAILABLE at once; handy around a daemon restart.
        """
        target = str(socket)
        self.target = target if target.startswith("unix:") else f"unix://{target}"
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        # A local socket comes back fast (containerd restarts in ~0.1 s): retry sooner than
        # gRPC's default 1 s reconnect backoff.
        self.channel = grpc.insecure_channel(
            self.target,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.min_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        """Raw RuntimeService stub, for calls the helpers do not cover."""
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)
        """Raw ImageService stub."""

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _opts(self, timeout: float | None, extra: float = 0.0) -> dict[str, Any]:
        """Per-call keyword arguments: the deadline, and ``wait_for_ready`` when asked for."""
        opts: dict[str, Any] = {"timeout": (self.timeout if timeout is None else timeout) + extra}
        if self.wait_for_ready:
            opts["wait_for_ready"] = True
        return opts

    # -- runtime -----------------------------------------------------------------------------------

    def version(self, *, timeout: float | None = None) -> api_pb2.VersionResponse:
        """RuntimeService.Version."""
        response: api_pb2.VersionResponse = self.runtime.Version(
            api_pb2.VersionRequest(version="v1"), **self._opts(timeout)
        )
        return response

    def status(self, *, verbose: bool = False, timeout: float | None = None) -> api_pb2.StatusResponse:
        """RuntimeService.Status (runtime and network conditions)."""
        response: api_pb2.StatusResponse = self.runtime.Status(
            api_pb2.StatusRequest(verbose=verbose), **self._opts(timeout)
        )
        return response

    # -- pods --------------------------------------------------------------------------------------

    def run_pod_sandbox(
        self, config: api_pb2.PodSandboxConfig, *, runtime_handler: str = "", timeout: float | None = None
    ) -> str:
        """RunPodSandbox; returns the sandbox ID."""
        response: api_pb2.RunPodSandboxResponse = self.runtime.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler),
            **self._opts(timeout),
        )
        return str(response.pod_sandbox_id)

    def stop_pod_sandbox(self, pod_id: str, *, timeout: float | None = None) -> None:
        """StopPodSandbox (kills the sandbox and its containers; idempotent)."""
        self.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id), **self._opts(timeout))

    def remove_pod_sandbox(self, pod_id: str, *, timeout: float | None = None) -> None:
        """RemovePodSandbox (idempotent)."""
        self.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id), **self._opts(timeout))

    def pod_sandbox_status(
        self, pod_id: str, *, verbose: bool = False, timeout: float | None = None
    ) -> api_pb2.PodSandboxStatusResponse:
        """PodSandboxStatus."""
        response: api_pb2.PodSandboxStatusResponse = self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=verbose), **self._opts(timeout)
        )
        return response

    def list_pod_sandboxes(
        self, *, labels: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> list[api_pb2.PodSandbox]:
        """ListPodSandbox, optionally filtered by a label selector."""
        request = api_pb2.ListPodSandboxRequest()
        if labels:
            request.filter.label_selector.update(labels)
        response: api_pb2.ListPodSandboxResponse = self.runtime.ListPodSandbox(request, **self._opts(timeout))
        return list(response.items)

    # -- containers --------------------------------------------------------------------------------

    def create_container(
        self,
        pod_id: str,
        config: api_pb2.ContainerConfig,
        pod_config: api_pb2.PodSandboxConfig,
        *,
        timeout: float | None = None,
    ) -> str:
        """CreateContainer; returns the container ID."""
        response: api_pb2.CreateContainerResponse = self.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config),
            **self._opts(timeout),
        )
        return str(response.container_id)

    def start_container(self, container_id: str, *, timeout: float | None = None) -> None:
        """StartContainer."""
        self.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id), **self._opts(timeout))

    def stop_container(self, container_id: str, *, grace: int = 0, timeout: float | None = None) -> None:
        """StopContainer; *grace* is the CRI timeout in seconds before SIGKILL (0 kills at once).

        ``sleep`` runs as PID 1 and ignores SIGTERM, so a grace period only delays the kill.
        """
        self.runtime.StopContainer(
            api_pb2.StopContainerRequest(container_id=container_id, timeout=grace),
            **self._opts(timeout, extra=grace),
        )

    def remove_container(self, container_id: str, *, timeout: float | None = None) -> None:
        """RemoveContainer (forcibly, if it runs)."""
        self.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id), **self._opts(timeout))

    def container_status(
        self, container_id: str, *, verbose: bool = False, timeout: float | None = None
    ) -> api_pb2.ContainerStatus:
        """ContainerStatus; returns the ``status`` part (``.resources.linux`` has current limits)."""
        response: api_pb2.ContainerStatusResponse = self.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose),
            **self._opts(timeout),
        )
        return response.status

    def list_containers(
        self,
        *,
        pod_id: str = "",
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> list[api_pb2.Container]:
        """ListContainers, optionally for one pod and/or by label selector."""
        request = api_pb2.ListContainersRequest()
        if pod_id:
            request.filter.pod_sandbox_id = pod_id
        if labels:
            request.filter.label_selector.update(labels)
        response: api_pb2.ListContainersResponse = self.runtime.ListContainers(request, **self._opts(timeout))
        return list(response.containers)

    def update_container_resources(
        self,
        container_id: str,
        resources: api_pb2.LinuxContainerResources,
        *,
        annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """UpdateContainerResources with Linux resources."""
        self.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(
                container_id=container_id, linux=resources, annotations=dict(annotations or {})
            ),
            **self._opts(timeout),
        )

    def container_events(self, *, timeout: float | None = None) -> Iterator[api_pb2.ContainerEventResponse]:
        """GetContainerEvents as an iterator; it ends when *timeout* expires (DEADLINE_EXCEEDED).

        The stream starts lazily: the first ``next()`` sends the request. containerd 1.6 answers
        UNIMPLEMENTED, raised from the first ``next()`` as :class:`grpc.RpcError`. Cancel early
        with ``.cancel()`` on the returned object.
        """
        stream: Iterator[api_pb2.ContainerEventResponse] = self.runtime.GetContainerEvents(
            api_pb2.GetEventsRequest(), **self._opts(timeout)
        )
        return stream

    # -- conveniences ------------------------------------------------------------------------------

    def run_pod(
        self,
        *,
        cgroup_parent: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        name: str | None = None,
        uid: str | None = None,
    ) -> PodHandle:
        """Build a config with :func:`pod_sandbox_config` and run it."""
        config = pod_sandbox_config(
            cgroup_parent=cgroup_parent, labels=labels, annotations=annotations, name=name, uid=uid
        )
        return PodHandle(pod_id=self.run_pod_sandbox(config), config=config)

    def run_container(
        self,
        pod: PodHandle,
        *,
        command: Sequence[str] = SLEEP_COMMAND,
        resources: api_pb2.LinuxContainerResources | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        start: bool = True,
    ) -> str:
        """Create (and by default start) a container in *pod*; returns its ID."""
        config = container_config(
            name=name, command=command, resources=resources, labels=labels, annotations=annotations
        )
        container_id = self.create_container(pod.pod_id, config, pod.config)
        pod.container_ids.append(container_id)
        if start:
            self.start_container(container_id)
        return container_id

    def remove_pod(self, pod: PodHandle | str) -> None:
        """Stop and remove a pod sandbox (and its containers)."""
        pod_id = pod.pod_id if isinstance(pod, PodHandle) else pod
        self.stop_pod_sandbox(pod_id)
        self.remove_pod_sandbox(pod_id)

    def remove_all_pods(self) -> int:
        """Stop and remove every pod sandbox this runtime knows; returns how many."""
        pods = self.list_pod_sandboxes()
        for pod in pods:
            self.remove_pod(pod.id)
        return len(pods)

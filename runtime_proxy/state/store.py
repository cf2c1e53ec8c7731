"""What the proxy remembers about pods and containers, and how it rebuilds that from the runtime.

Written by the CRI door (``runtime_proxy.cri.door``) after each successful lifecycle call; read by it to give
hooks the context of calls that carry only an ID (StartContainer, UpdateContainerResources...),
and by the reconciler. Nothing is persisted: ``rebuild`` recovers everything from containerd
after a restart — pod labels, annotations, cgroup parent and runtime handler from
``PodSandboxStatus(verbose)``; container labels, annotations and envs from the container config
that ``ContainerStatus(verbose)`` returns, and its current resources from
``ContainerStatus.status.resources`` (falling back to the config). A pod or container the store
does not know is looked up the same way on first use (``ensure_*``).

Released pods: the one rule both doors follow (``runtime_proxy.cri.door`` in proxy
mode, ``runtime_proxy.nri.adapter`` in NRI mode) and the loops see through their backends. A
pod holds the CPUs of its resource-status cpuset (``holding_pods``: the input of the bound
cpusets and so of the share pools, ``runtime_proxy.engine.bound``) from the time it is stored
until it is released:

- its sandbox stopped (``stop_pod``: StopPodSandbox, or a NotReady sandbox read from the
  runtime). That is for good: a stopped sandbox never runs a container again, its cgroups are
  gone, and the loops no longer plan it (``live_pods``);
- the runtime stopped every container it had (``stop_container``: StopContainer, or an exited
  container read from the runtime). Removing those containers keeps it released; a new
  container (``add_container``) makes it hold its CPUs again.

A pod with no container yet holds them. Nothing but ``add_container`` (in a sandbox that did not
stop) brings a released pod back, so a late call or event for it (StopPodSandbox again, a
StopContainer, RemoveContainer or UpdateContainerResources of one of its containers) leaves its
CPUs in the share pools.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, PodFacts
from runtime_proxy import metrics
from runtime_proxy.codecs.cri import (
    container_facts_from_config,
    pod_facts_from_config,
    resources_from_pb,
    verbose_config,
    verbose_sandbox_id,
)
from runtime_proxy.runtime.errors import RpcError

log = structlog.get_logger(__name__)

__all__ = ["RuntimeReader", "Store"]


class RuntimeReader(Protocol):
    """What the store's rebuild reads of the runtime (``runtime_proxy.runtime.client.RuntimeClient``)."""

    async def list_sandboxes(self) -> list[api_pb2.PodSandbox]: ...

    async def list_containers(self) -> list[api_pb2.Container]: ...

    async def sandbox_status(self, sandbox_id: str) -> api_pb2.PodSandboxStatusResponse: ...

    async def container_status(self, container_id: str) -> api_pb2.ContainerStatusResponse: ...


@dataclass
class _Container:
    sandbox_id: str
    facts: ContainerFacts


class Store:
    """Pods by sandbox ID and containers by container ID, and which of them the runtime stopped
    (the module docstring: released pods). Single event loop; no locking needed."""

    def __init__(self) -> None:
        self._pods: dict[str, PodFacts] = {}
        self._containers: dict[str, _Container] = {}
        # Ids of containers the runtime stopped (kept until removed): the loops leave them alone.
        self._stopped: set[str] = set()
        # Sandbox ids of pods whose sandbox the runtime stopped (released for good).
        self._ended: set[str] = set()
        # Sandbox ids of pods that no longer hold their bound CPUs (``_ended`` among them).
        self._released: set[str] = set()
        # Bumped on every change, so derived values (bound cpusets) can be cached.
        self.version = 0

    # -- writes --------------------------------------------------------------------------------

    def put_pod(self, pod: PodFacts) -> None:
        self._pods[pod.sandbox_id] = pod
        self._changed()

    def drop_pod(self, sandbox_id: str) -> None:
        self._pods.pop(sandbox_id, None)
        for cid in [c for c, e in self._containers.items() if e.sandbox_id == sandbox_id]:
            del self._containers[cid]
            self._stopped.discard(cid)
        self._ended.discard(sandbox_id)
        self._released.discard(sandbox_id)
        self._changed()

    def put_container(self, sandbox_id: str, container: ContainerFacts) -> None:
        """Record ``container`` (new, or what changed of it); whether its pod holds its CPUs is
        left as it is (``add_container`` for a container the runtime just created)."""
        self._containers[container.id] = _Container(sandbox_id, container)
        self._changed()

    def add_container(self, sandbox_id: str, container: ContainerFacts) -> None:
        """Record a container the runtime created: its pod holds its CPUs again, unless its
        sandbox stopped (then the container counts as stopped too: it cannot run there)."""
        self._containers[container.id] = _Container(sandbox_id, container)
        if sandbox_id in self._ended:
            self._stopped.add(container.id)
        else:
            self._stopped.discard(container.id)
            self._released.discard(sandbox_id)
        self._changed()

    def drop_container(self, container_id: str) -> None:
        entry = self._containers.pop(container_id, None)
        if entry is not None:
            self._stopped.discard(container_id)
            self._release_if_all_stopped(entry.sandbox_id)
            self._changed()

    def stop_container(self, container_id: str) -> bool:
        """The runtime stopped ``container_id``: its pod is released when every container it
        has is stopped. False when the container is unknown or was stopped already."""
        entry = self._containers.get(container_id)
        if entry is None or container_id in self._stopped:
            return False
        self._stopped.add(container_id)
        self._release_if_all_stopped(entry.sandbox_id)
        self._changed()
        return True

    def stop_pod(self, sandbox_id: str) -> bool:
        """The runtime stopped the sandbox (and so every container in it): the pod is released
        for good. False when the pod is unknown or its sandbox was stopped already."""
        if sandbox_id not in self._pods or sandbox_id in self._ended:
            return False
        self._ended.add(sandbox_id)
        self._released.add(sandbox_id)
        self._stopped.update(c for c, e in self._containers.items() if e.sandbox_id == sandbox_id)
        self._changed()
        return True

    def _release_if_all_stopped(self, sandbox_id: str) -> None:
        mine = [c for c, e in self._containers.items() if e.sandbox_id == sandbox_id]
        if mine and all(c in self._stopped for c in mine):
            self._released.add(sandbox_id)

    def _changed(self) -> None:
        self.version += 1
        metrics.STORE_OBJECTS.labels("pod").set(len(self._pods))
        metrics.STORE_OBJECTS.labels("container").set(len(self._containers))

    # -- reads ---------------------------------------------------------------------------------

    def pod(self, sandbox_id: str) -> PodFacts | None:
        return self._pods.get(sandbox_id)

    def container(self, container_id: str) -> tuple[PodFacts | None, ContainerFacts] | None:
        entry = self._containers.get(container_id)
        if entry is None:
            return None
        return self._pods.get(entry.sandbox_id), entry.facts

    def sandbox_of(self, container_id: str) -> str | None:
        entry = self._containers.get(container_id)
        return entry.sandbox_id if entry else None

    def pods(self) -> list[PodFacts]:
        """Every stored pod, oldest first (stopped sandboxes too, until they are removed)."""
        return list(self._pods.values())

    def holding_pods(self) -> list[PodFacts]:
        """The stored pods that hold the CPUs of their resource-status cpuset, oldest first:
        every pod but the released ones (the module docstring)."""
        released = self._released
        return [p for sid, p in self._pods.items() if sid not in released] if released else self.pods()

    def live_pods(self) -> list[PodFacts]:
        """The stored pods whose sandbox did not stop, oldest first: the pods the loops plan."""
        ended = self._ended
        return [p for sid, p in self._pods.items() if sid not in ended] if ended else self.pods()

    def containers(self) -> Iterator[tuple[PodFacts, ContainerFacts]]:
        """Every stored container of a stored pod (stopped ones too, until they are removed)."""
        for entry in list(self._containers.values()):
            pod = self._pods.get(entry.sandbox_id)
            if pod is not None:
                yield pod, entry.facts

    def running_containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        """The stored containers the runtime has not stopped, with their pods."""
        return [(pod, c) for pod, c in self.containers() if c.id not in self._stopped]

    def is_stopped(self, container_id: str) -> bool:
        return container_id in self._stopped

    @property
    def stopped(self) -> frozenset[str]:
        """Ids of the stored containers the runtime stopped."""
        return frozenset(self._stopped)

    @property
    def released(self) -> frozenset[str]:
        """Sandbox ids of the stored pods that do not hold their CPUs."""
        return frozenset(self._released)

    def __len__(self) -> int:
        return len(self._pods) + len(self._containers)

    # -- recovery from the runtime --------------------------------------------------------------

    async def ensure_pod(self, client: RuntimeReader, sandbox_id: str) -> PodFacts | None:
        """The stored pod, or the one the runtime reports (stored; released when its sandbox
        is not ready)."""
        pod = self._pods.get(sandbox_id)
        if pod is None:
            loaded = await self._load_pod(client, sandbox_id)
            if loaded is not None:
                pod, ready = loaded
                self.put_pod(pod)
                if not ready:
                    self.stop_pod(sandbox_id)
        return pod

    async def ensure_container(
        self, client: RuntimeReader, container_id: str
    ) -> tuple[PodFacts | None, ContainerFacts] | None:
        found = self.container(container_id)
        if found is not None and found[0] is not None:
            return found
        loaded = await self._load_container(client, container_id)
        if loaded is None:
            return found
        sandbox_id, facts, exited = loaded
        await self.ensure_pod(client, sandbox_id)
        self.put_container(sandbox_id, facts)
        if exited:
            self.stop_container(container_id)
        return self.container(container_id)

    async def _load_pod(self, client: RuntimeReader, sandbox_id: str) -> tuple[PodFacts, bool] | None:
        """The pod the runtime reports for ``sandbox_id`` and whether its sandbox is ready."""
        try:
            status = await client.sandbox_status(sandbox_id)
        except RpcError as err:
            log.info("cannot load pod from runtime", sandbox_id=sandbox_id, code=err.code.name)
            return None
        config = verbose_config(status.info, api_pb2.PodSandboxConfig())
        s = status.status
        if config is None:
            # Without the verbose config we still have metadata, labels and annotations.
            config = api_pb2.PodSandboxConfig()
            config.metadata.CopyFrom(s.metadata)
            config.labels.update(dict(s.labels))
            config.annotations.update(dict(s.annotations))
        pod = pod_facts_from_config(config, runtime_handler=s.runtime_handler, sandbox_id=sandbox_id)
        return pod, s.state == api_pb2.SANDBOX_READY

    async def _load_container(
        self, client: RuntimeReader, container_id: str
    ) -> tuple[str, ContainerFacts, bool] | None:
        """The container the runtime reports: its sandbox id, facts, and whether it exited."""
        try:
            status = await client.container_status(container_id)
        except RpcError as err:
            log.info("cannot load container from runtime", container_id=container_id, code=err.code.name)
            return None
        s = status.status
        config = verbose_config(status.info, api_pb2.ContainerConfig())
        if config is None:
            config = api_pb2.ContainerConfig()
            config.metadata.CopyFrom(s.metadata)
            config.labels.update(dict(s.labels))
            config.annotations.update(dict(s.annotations))
        facts = container_facts_from_config(config, container_id=container_id)
        # The status reports what the runtime applies now (after updates); prefer it.
        if s.HasField("resources") and s.resources.HasField("linux"):
            current = resources_from_pb(s.resources.linux)
            # containerd turns "no swap limit asked" into swap == memory limit; report what was
            # asked, as the store did before the restart.
            if (
                facts.resources.memory_swap_limit_in_bytes == 0
                and current.memory_swap_limit_in_bytes == current.memory_limit_in_bytes
            ):
                current = current.with_changes({"memory_swap_limit_in_bytes": 0})
            facts = facts.replace(resources=current)
        sandbox_id = verbose_sandbox_id(status.info)
        if not sandbox_id:
            sandbox_id = await self._sandbox_id_by_listing(client, container_id)
        return sandbox_id, facts, s.state == api_pb2.CONTAINER_EXITED

    async def _sandbox_id_by_listing(self, client: RuntimeReader, container_id: str) -> str:
        for c in await client.list_containers():
            if c.id == container_id:
                return str(c.pod_sandbox_id)
        return ""

    async def rebuild(self, client: RuntimeReader) -> None:
        """Replace the store's content with what the runtime reports now: NotReady sandboxes
        are stopped and exited containers stopped, so the pods they release stay released
        (the module docstring)."""
        pods: dict[str, PodFacts] = {}
        ended: set[str] = set()
        # Oldest first: the store's order is the order in which pods claim bound CPUs
        # (``hooks.facts.resolve_cpuset_claims``), so it survives a restart.
        for sandbox in sorted(await client.list_sandboxes(), key=lambda sb: (sb.created_at, sb.id)):
            loaded = await self._load_pod(client, sandbox.id)
            if loaded is not None:
                pods[sandbox.id] = loaded[0]
                if sandbox.state != api_pb2.SANDBOX_READY:
                    ended.add(sandbox.id)
        containers: dict[str, _Container] = {}
        stopped: set[str] = set()
        for c in await client.list_containers():
            loaded_container = await self._load_container(client, c.id)
            if loaded_container is None:
                continue
            _, facts, _ = loaded_container
            containers[c.id] = _Container(c.pod_sandbox_id, facts)
            if c.state == api_pb2.CONTAINER_EXITED or c.pod_sandbox_id in ended:
                stopped.add(c.id)
        self._pods = pods
        self._containers = containers
        self._stopped = stopped
        self._ended = ended
        self._released = set(ended)
        for sandbox_id in {e.sandbox_id for e in containers.values()}:
            self._release_if_all_stopped(sandbox_id)
        self._changed()
        log.info("store rebuilt from runtime", pods=len(pods), containers=len(containers),
                 stopped_sandboxes=len(ended), released=len(self._released))

"""Adapters that plug the node-config source, the file applier, the hook-server registry and the
reconciler into a ``runtime_proxy.server.Proxy``. Called only by ``server``."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING, Any

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.intercept import NodeSource

if TYPE_CHECKING:
    from runtime_proxy.server import Proxy


def node_source(config: ProxyConfig) -> tuple[NodeSource, Any]:
    """The node config: a local file (``nodeConfigFile``) watched for changes, and the cluster's
    Node, NodeSLO and NodeResourceTopology when ``fromCluster`` is set; topology from sysfs."""
    from hooks.facts import CgroupInfo
    from runtime_proxy.host.cgroups import detect_cgroup_version
    from runtime_proxy.host.resctrl import Resctrl
    from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig
    from runtime_proxy.state.sysfs import read_cpu_topology

    node_name = config.nodeName or os.environ.get("NODE_NAME", "") or socket.gethostname()
    source = NodeConfig(
        path=config.nodeConfigFile,
        cluster=ClusterWatch(node_name) if config.fromCluster else None,
        node_name=node_name,
        topology=read_cpu_topology(),
        resctrl=Resctrl(config.resctrlRoot).facts(),
        cgroup=CgroupInfo(version=detect_cgroup_version(config.cgroupRoot), driver=config.cgroupDriver),
    )
    return source, source


def applier(config: ProxyConfig, *, dry_run: bool = False) -> Any:
    """The single file applier over the configured cgroup and resctrl roots."""
    from runtime_proxy.host.apply import FileApplier
    from runtime_proxy.host.cgroups import Cgroups
    from runtime_proxy.host.resctrl import Resctrl

    return FileApplier(
        cgroups=Cgroups(config.cgroupRoot, driver=config.cgroupDriver),
        resctrl=Resctrl(config.resctrlRoot),
        dry_run=dry_run or config.dryRun,
    )


async def start_hook_servers(proxy: Proxy) -> Any:
    """Watch ``hookServerDir`` and keep the pipeline's remote steps in line with it (see
    ``runtime_proxy.engine.remote``). Returns the registry; ``await registry.stop()`` ends it."""
    from runtime_proxy.engine.remote import HookServerRegistry

    cfg = proxy.opts.config
    registry = HookServerRegistry(cfg.hookServerDir, proxy.pipeline, default_timeout=cfg.hookServerTimeout,
                                  own_sockets=(proxy.opts.backend, proxy.opts.listen))
    await registry.start()
    return registry


class _Backend:
    """What the reconciler and the burst loop see of the proxy: the store and the runtime."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def node(self) -> NodeFacts:
        return self.proxy.interceptor.node()

    def pods(self) -> list[PodFacts]:
        return self.proxy.store.pods()

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.proxy.store.containers())

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        """Send only the changed fields (the runtime keeps the rest), then record them."""
        from cri_protos import api_pb2
        from runtime_proxy.engine.intercept import _set_resources

        linux = api_pb2.LinuxContainerResources()
        _set_resources(linux, changes)
        await self.proxy.client.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux),
            timeout=self.proxy.client.timeout,
        )
        store = self.proxy.store
        found, sandbox_id = store.container(container_id), store.sandbox_of(container_id)
        if found is not None and sandbox_id is not None:
            store.put_container(sandbox_id, found[1].replace(resources=found[1].resources.with_changes(changes)))


class _Loops:
    """Starts the loops once the store is rebuilt (never blocks the proxy's start)."""

    def __init__(self, proxy: Proxy, *parts: Any) -> None:
        self.parts = parts
        self.reconciler = parts[0]
        self._started = False
        self._task = asyncio.create_task(self._start(proxy))

    async def _start(self, proxy: Proxy) -> None:
        await proxy.ready.wait()
        for part in self.parts:
            await part.start()
        self._started = True

    def store_changed(self, pools_changed: bool = True) -> None:
        if self._started:
            self.reconciler.store_changed(pools_changed)

    async def stop(self) -> None:
        self._task.cancel()
        for part in self.parts:
            await part.stop()


async def start_reconciler(proxy: Proxy) -> Any:
    """The reconciler (at start, on node-config changes, every period) and the CPU burst loop."""
    from hooks.manager import plugin_order
    from runtime_proxy.loops.burst import CPUBurstLoop
    from runtime_proxy.loops.reconciler import Reconciler

    cfg = proxy.opts.config
    applier = proxy.applier
    dry_run = proxy.opts.dry_run or cfg.dryRun
    backend = _Backend(proxy)
    changes = proxy.node_source.changes() if hasattr(proxy.node_source, "changes") else None
    names = [step.name for step in proxy.pipeline.steps if step.name in plugin_order(proxy.pm)]
    reconciler = Reconciler(
        backend, pm=proxy.pm, order=names, cgroups=applier.cgroups, resctrl=applier.resctrl,
        period=cfg.reconcilePeriodSeconds, dry_run=dry_run, node_changes=changes,
    )
    burst = CPUBurstLoop(backend, cgroups=applier.cgroups, dry_run=dry_run)
    return _Loops(proxy, reconciler, burst)

"""Builders of the node-side parts every entry point shares: the node config source, kubelet's
cgroup root (``kubelet_root``), the file applier and the periodic loops (``Loops``: the
reconciler, the cfsQuotaBurst loop and, with ``usageLoop.enable``, the usage loop), from a
``ProxyConfig``.

Used by the composition roots: ``runtime_proxy.server`` (``runtime-proxy serve``),
``runtime_proxy.engine.hook_service`` (``runtime-proxy hook-server``) and
``runtime_proxy.nri.cli`` (``runtime-proxy nri``). Imports none of them.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pluggy
import structlog

from hooks.facts import CgroupInfo
from hooks.manager import plugin_order
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.host.apply import FileApplier
from runtime_proxy.host.cgroups import Cgroups, detect_cgroup_version
from runtime_proxy.host.resctrl import Resctrl
from runtime_proxy.loops.burst import CPUBurstLoop
from runtime_proxy.loops.evict import evictor_for
from runtime_proxy.loops.qos import Evictor, UsageLoop
from runtime_proxy.loops.reconciler import ReconcileBackend, Reconciler
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig
from runtime_proxy.state.sysfs import read_cpu_topology

__all__ = ["Loops", "applier", "kubelet_root", "loops", "node_source"]

log = structlog.get_logger(__name__)


def node_source(config: ProxyConfig) -> tuple[NodeConfig, NodeConfig]:
    """The node config: a local file (``nodeConfigFile``) watched for changes, and the cluster's
    Node, NodeSLO and NodeResourceTopology when ``fromCluster`` is set; topology from sysfs.
    Returned twice (as the source of ``NodeFacts`` and as the watch to start and stop)."""
    node_name = config.nodeName or os.environ.get("NODE_NAME", "") or socket.gethostname()
    source = NodeConfig(
        path=config.nodeConfigFile,
        cluster=ClusterWatch(node_name) if config.fromCluster else None,
        node_name=node_name,
        topology=read_cpu_topology(),
        resctrl=Resctrl(config.resctrlRoot).facts(),
        cgroup=CgroupInfo(version=detect_cgroup_version(config.cgroupRoot), driver=config.cgroupDriver,
                          kubelet_root=config.kubeletCgroupRoot or "/"),
    )
    return source, source


def kubelet_root(config: ProxyConfig) -> KubeletRoot:
    """kubelet's cgroup root for the node facts: ``kubeletCgroupRoot`` when set, else learned from
    the stored pods' cgroup parents (``runtime_proxy.state.kubelet_root``)."""
    return KubeletRoot(config.kubeletCgroupRoot)


def applier(config: ProxyConfig, *, dry_run: bool = False) -> FileApplier:
    """The single file applier over the configured cgroup and resctrl roots."""
    return FileApplier(
        cgroups=Cgroups(config.cgroupRoot, driver=config.cgroupDriver),
        resctrl=Resctrl(config.resctrlRoot),
        dry_run=dry_run or config.dryRun,
    )


class Loops:
    """The periodic loops of one entry point (the reconciler, the CPU burst loop and, when
    enabled, the usage loop), started once ``ready`` is set (the store is rebuilt from the
    runtime), never blocking the start of the entry point itself."""

    def __init__(
        self, ready: asyncio.Event, reconciler: Reconciler, burst: CPUBurstLoop, usage: UsageLoop | None = None
    ) -> None:
        self.reconciler = reconciler
        self.burst = burst
        self.usage = usage
        self._started = False
        self._task = asyncio.create_task(self._start(ready))

    async def _start(self, ready: asyncio.Event) -> None:
        await ready.wait()
        await self.reconciler.start()
        await self.burst.start()
        if self.usage is not None:
            await self.usage.start()
        self._started = True

    def store_changed(self, pools_changed: bool = True) -> None:
        """A pod or container arrived, changed or left (see ``Reconciler.store_changed``)."""
        if self._started:
            self.reconciler.store_changed(pools_changed)

    async def stop(self) -> None:
        self._task.cancel()
        await self.reconciler.stop()
        await self.burst.stop()
        if self.usage is not None:
            await self.usage.stop()


def loops(
    config: ProxyConfig,
    backend: ReconcileBackend,
    *,
    pm: pluggy.PluginManager,
    pipeline: Pipeline,
    applier: FileApplier,
    node_source: NodeConfig,
    ready: asyncio.Event,
    dry_run: bool = False,
    runtime: Any = None,
) -> Loops:
    """The reconciler (at start, on node-config changes, on store changes, every
    ``reconcilePeriodSeconds``; through the entry point's own hook runner, so plugin policies and
    timeouts are the configured ones), the CPU burst loop and, with ``usageLoop.enable``, the
    usage loop (``runtime_proxy.loops.qos``: the ``ReconcileUsage`` stage through the same hook
    runner, writes through the applier's cgroup tree), over ``backend``'s pods, containers and
    container updates. The usage loop's evictor follows ``usageLoop.evictBy``
    (``runtime_proxy.loops.evict``): ``api`` evicts through the Kubernetes Eviction API,
    ``runtime`` stops the pod's containers through ``runtime`` (the proxy's
    ``RuntimeClient``; without one, evictions are only logged). Call it on the running event
    loop."""
    dry_run = dry_run or config.dryRun
    in_process = set(plugin_order(pm))
    reconciler = Reconciler(
        backend,
        pm=pm,
        order=[step.name for step in pipeline.steps if step.name in in_process],
        pipeline=pipeline,
        cgroups=applier.cgroups,
        resctrl=applier.resctrl,
        period=config.reconcilePeriodSeconds,
        dry_run=dry_run,
        node_changes=node_source.changes(),
    )
    burst = CPUBurstLoop(backend, cgroups=applier.cgroups, dry_run=dry_run)
    usage: UsageLoop | None = None
    if config.usageLoop.enable:
        usage = UsageLoop(
            backend,
            pipeline=pipeline,
            cgroups=applier.cgroups,
            interval=config.usageLoop.intervalSeconds,
            proc_root=config.usageLoop.procRoot,
            dry_run=dry_run,
            evictor=_evictor(config, runtime, node_source.node_name),
        )
    return Loops(ready, reconciler, burst, usage)


def _evictor(config: ProxyConfig, runtime: Any, node_name: str) -> Evictor | None:
    """The usage loop's evictor for ``usageLoop.evictBy`` (``None``: the loop's default, which
    only logs, when ``runtime`` is asked for and there is no runtime client)."""
    evict_by = config.usageLoop.evictBy
    if evict_by == "runtime" and runtime is None:
        log.error("usageLoop.evictBy is runtime but this command has no CRI runtime client; evictions are logged only")
        return None
    return evictor_for(evict_by, runtime=runtime, node_name=node_name)

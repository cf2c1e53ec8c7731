"""Builders of the node-side parts every entry point shares, from a ``ProxyConfig``: the plugin
settings (``plugin_settings``: the configured plugins, less those whose hardware this node lacks,
with a warning naming installed entry-point plugins that will not run), kubelet's cgroup driver
(``cgroup_driver``: configured or detected), the node config source, kubelet's cgroup root
(``kubelet_root``), the file applier and the periodic loops (``Loops``: the reconciler, the
cfsQuotaBurst loop, when ``usage_loop_decision`` says so the usage loop, and with
``report.enable`` the reporter; ``loops`` logs which run and why).

Used by the composition root, ``runtime_proxy.compose``, which every command calls (``nri``
also asks ``usage_loop_decision``). Imports neither.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import pluggy
import structlog

from hooks.facts import CgroupInfo
from hooks.manager import installed_entry_points, plugin_order
from rhp_kube.events import EventRecorder, EventSink, KubeEventsApi
from runtime_proxy.config import Policy, ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.host.apply import FileApplier, RecordingApplier
from runtime_proxy.host.cgroups import Cgroups, detect_cgroup_driver, detect_cgroup_version
from runtime_proxy.host.resctrl import RESCTRL_PLUGINS, Resctrl
from runtime_proxy.loops.burst import CPUBurstLoop
from runtime_proxy.loops.evict import _load_api_client, evictor_for
from runtime_proxy.loops.qos import Evictor, UsageLoop
from runtime_proxy.loops.reconciler import ReconcileBackend, Reconciler
from runtime_proxy.report.loop import Reporter, reporter
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig
from runtime_proxy.state.podspecs import ClusterPods, NoPodSpecs, PodSpecSource
from runtime_proxy.state.sysfs import read_cpu_topology

if TYPE_CHECKING:
    from runtime_proxy.runtime.client import RuntimeClient

__all__ = [
    "HARDWARE",
    "Loops",
    "applier",
    "cgroup_driver",
    "kubelet_root",
    "loops",
    "missing_hardware",
    "node_source",
    "plugin_settings",
    "usage_loop_decision",
]

log = structlog.get_logger(__name__)

# Built-in plugins that need hardware a node may lack: the name, what is missing (a format
# string over the config's keys) and the test that it is there. Such a plugin, configured on a
# node without it, is left out at start with a warning (``plugin_settings``) and doctor warns.
HARDWARE: dict[str, tuple[str, Callable[[ProxyConfig], bool]]] = {
    name: ("no resctrl at {resctrlRoot} (Intel RDT or AMD PQoS, mounted with mount -t resctrl resctrl "
           "{resctrlRoot})", lambda config: Resctrl(config.resctrlRoot).available)
    for name in RESCTRL_PLUGINS
}


def missing_hardware(name: str, config: ProxyConfig) -> str:
    """Why plugin ``name`` cannot work on this node ("" when it can, or needs nothing)."""
    need = HARDWARE.get(name)
    if need is None or need[1](config):
        return ""
    return need[0].format(**config.model_dump())


def plugin_settings(config: ProxyConfig, pm: pluggy.PluginManager, *, entry_points: bool = True,
                    announce: bool = True) -> list[tuple[str, Policy, float]]:
    """``(name, policy, timeout)`` of each plugin to run, in calling order: the config's
    (``ProxyConfig.plugin_settings``, which raises ``ValueError`` for a configured plugin that is
    not installed), less those whose hardware this node lacks (``HARDWARE``), each left out with
    a warning. Installed entry-point plugins that will not run because the config leaves them
    out, or because ``entry_points`` is false (``--no-entry-points``), are named in one warning.
    ``runtime_proxy.compose`` calls it once at start; ``announce`` false (``serve``'s check of
    the config before it starts, ``compose.check_plugins``) logs nothing."""
    names = plugin_order(pm, [p.name for p in config.plugins] if config.plugins else None)
    out: list[tuple[str, Policy, float]] = []
    for name, policy, timeout in config.plugin_settings(names):
        why = missing_hardware(name, config)
        if why:
            if announce:
                log.warning("plugin skipped: this node lacks what it needs", plugin=name, reason=why)
            continue
        out.append((name, policy, timeout))
    named = {p.name for p in config.plugins or ()}  # `enabled: false` is a choice: not warned about
    unused = {
        name: "not in the config's plugins" if entry_points else "--no-entry-points"
        for name in installed_entry_points()
        if name not in names or (name not in named and config.plugins is not None)
    }
    if unused and announce:
        log.warning("installed entry-point plugins will not run; name them in the config's plugins "
                    "(and drop --no-entry-points) to run them", plugins=unused)
    return out


@functools.cache
def _detected_driver(cgroup_root: str, kubelet_cgroup_root: str) -> Literal["cgroupfs", "systemd"]:
    seen = detect_cgroup_driver(cgroup_root, kubelet_cgroup_root)
    if seen == "systemd":
        log.info("cgroup driver detected", driver="systemd", cgroup_root=cgroup_root, found="kubepods.slice")
        return "systemd"
    if seen == "cgroupfs":
        log.info("cgroup driver detected", driver="cgroupfs", cgroup_root=cgroup_root, found="kubepods")
        return "cgroupfs"
    log.warning("cgroup driver cannot be detected (no kubepods cgroup of kubelet's yet); using cgroupfs. "
                "Set cgroupDriver in the config when kubelet uses systemd", cgroup_root=cgroup_root)
    return "cgroupfs"


def cgroup_driver(config: ProxyConfig) -> Literal["cgroupfs", "systemd"]:
    """kubelet's cgroup driver: ``cgroupDriver`` when set, else detected once per process from
    kubelet's cgroups (``runtime_proxy.host.cgroups.detect_cgroup_driver``) and logged;
    ``cgroupfs`` when they do not tell (kubelet has not started yet), with a warning."""
    if config.cgroupDriver is not None:
        return config.cgroupDriver
    return _detected_driver(config.cgroupRoot, config.kubeletCgroupRoot)


def usage_loop_decision(config: ProxyConfig, pm: pluggy.PluginManager, pipeline: Pipeline) -> tuple[bool, str]:
    """Whether the usage loop runs, and why: ``usageLoop.enable`` when set, else whether an
    enabled plugin of ``pipeline`` implements ``ReconcileUsage``."""
    implementing = {impl.plugin_name for impl in pm.hook.rhp_reconcile_usage.get_hookimpls()}
    users = [step.name for step in pipeline.steps if step.name in implementing]
    if config.usageLoop.enable is False:
        return False, "usageLoop.enable is false" + (f"; ReconcileUsage of {', '.join(users)} will not run"
                                                     if users else "")
    if config.usageLoop.enable:
        return True, "usageLoop.enable is true"
    if users:
        return True, f"enabled plugins implement ReconcileUsage: {', '.join(users)}"
    return False, "no enabled plugin implements ReconcileUsage"


def node_source(config: ProxyConfig) -> tuple[NodeConfig, NodeConfig]:
    """The node config: a local file (``nodeConfigFile``) watched for changes, and the cluster's
    Node, NodeSLO and NodeResourceTopology when ``fromCluster`` is set; topology from sysfs.
    Returned twice (as the source of ``NodeFacts`` and as the watch to start and stop)."""
    name = node_name(config)
    source = NodeConfig(
        path=config.nodeConfigFile,
        cluster=ClusterWatch(name) if config.fromCluster else None,
        node_name=name,
        topology=read_cpu_topology(),
        resctrl=Resctrl(config.resctrlRoot).facts(),
        cgroup=CgroupInfo(version=detect_cgroup_version(config.cgroupRoot), driver=cgroup_driver(config),
                          kubelet_root=config.kubeletCgroupRoot or "/"),
        key_files=tuple(config.allocationTrust.publicKeyFiles),
        accept_unsigned=config.allocationTrust.acceptUnsigned,
    )
    return source, source


def pod_specs(config: ProxyConfig) -> ClusterPods | NoPodSpecs:
    """The batch resources of this node's pods from the cluster (``runtime_proxy.state.podspecs``:
    a pod watch by ``spec.nodeName``) when ``fromCluster`` is set; else none (then only the
    ``extended-resource-spec`` annotation gives BE pods their limits)."""
    return ClusterPods(node_name(config)) if config.fromCluster else NoPodSpecs()


def node_name(config: ProxyConfig) -> str:
    """This node's name: ``nodeName``, else ``NODE_NAME``, else the host name."""
    return config.nodeName or os.environ.get("NODE_NAME", "") or socket.gethostname()


def events(config: ProxyConfig) -> EventRecorder:
    """The recorder of Events on pods (``rhp_kube.events``): sent through the API
    with the node's credentials (in-cluster, else ``KUBECONFIG``) when ``fromCluster`` is set,
    else counted only."""

    def api() -> KubeEventsApi:
        return KubeEventsApi(_load_api_client())

    return EventRecorder(api if config.fromCluster else None, host=node_name(config))


def kubelet_root(config: ProxyConfig) -> KubeletRoot:
    """kubelet's cgroup root for the node facts: ``kubeletCgroupRoot`` when set, else learned from
    the stored pods' cgroup parents (``runtime_proxy.state.kubelet_root``)."""
    return KubeletRoot(config.kubeletCgroupRoot)


def applier(config: ProxyConfig) -> FileApplier:
    """The file applier over the configured cgroup and resctrl roots."""
    return FileApplier(
        cgroups=Cgroups(config.cgroupRoot, driver=cgroup_driver(config)),
        resctrl=Resctrl(config.resctrlRoot),
    )


class Loops:
    """The periodic loops of one entry point (the reconciler, the CPU burst loop and, when
    enabled, the usage loop), started once ``ready`` is set (the store is rebuilt from the
    runtime), never blocking the start of the entry point itself."""

    def __init__(
        self, ready: asyncio.Event, reconciler: Reconciler, burst: CPUBurstLoop, usage: UsageLoop | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.burst = burst
        self.usage = usage
        self.reporter = reporter
        self._started = False
        self._task = asyncio.create_task(self._start(ready))

    async def _start(self, ready: asyncio.Event) -> None:
        await ready.wait()
        await self.reconciler.start()
        await self.burst.start()
        if self.usage is not None:
            await self.usage.start()
        if self.reporter is not None:
            await self.reporter.start()
        self._started = True

    def store_changed(self, pools_changed: bool = True) -> None:
        """A pod or container arrived, changed or left (see ``Reconciler.store_changed``)."""
        if self._started:
            self.reconciler.store_changed(pools_changed)
            if self.reporter is not None:
                self.reporter.store_changed()

    async def stop(self) -> None:
        self._task.cancel()
        await self.reconciler.stop()
        await self.burst.stop()
        if self.usage is not None:
            await self.usage.stop()
        if self.reporter is not None:
            await self.reporter.stop()


def loops(
    config: ProxyConfig,
    backend: ReconcileBackend,
    *,
    pm: pluggy.PluginManager,
    pipeline: Pipeline,
    applier: FileApplier | RecordingApplier,
    node_source: NodeConfig,
    ready: asyncio.Event,
    runtime: RuntimeClient | None = None,
    events: EventSink | None = None,
    pod_specs: PodSpecSource | None = None,
) -> Loops:
    """The reconciler (at start, on node-config changes, on store changes, every
    ``reconcilePeriodSeconds``; through the entry point's own hook runner, so plugin policies and
    timeouts are the configured ones), the CPU burst loop and, when ``usage_loop_decision`` says
    so, the usage loop (``runtime_proxy.loops.qos``: the ``ReconcileUsage`` stage through the same hook
    runner), over ``backend``'s pods, containers and container updates. Every loop hands its
    plans to ``applier`` (the recording applier in a dry run) and reads through its trees. The
    usage loop's evictor follows ``usageLoop.evictBy``
    (``runtime_proxy.loops.evict``): ``api`` evicts through the Kubernetes Eviction API,
    ``runtime`` stops the pod's containers through ``runtime`` (the proxy's
    ``RuntimeClient``; without one, evictions are only logged). Which loops run, and why, is
    logged once. Hook failures of the reconciler's pod and container stages become Events on the
    pod through ``events``. The reconciler puts ``pod_specs``' batch resources into its pods'
    facts and runs a round when they change. Call it on the running event loop."""
    cgroups, resctrl = applier.cgroups, applier.resctrl
    if cgroups is None:
        raise ValueError("the periodic loops need an applier over a cgroup tree")
    in_process = set(plugin_order(pm))
    reconciler = Reconciler(
        backend,
        pm=pm,
        order=[step.name for step in pipeline.steps if step.name in in_process],
        pipeline=pipeline,
        cgroups=cgroups,
        resctrl=resctrl,
        period=config.reconcilePeriodSeconds,
        applier=applier,
        node_changes=node_source.changes(),
        events=events,
        pod_specs=pod_specs,
    )
    burst = CPUBurstLoop(backend, pipeline=pipeline, applier=applier, cgroups=cgroups)
    usage: UsageLoop | None = None
    run_usage, why = usage_loop_decision(config, pm, pipeline)
    log.info("periodic loops", reconciler=f"every {config.reconcilePeriodSeconds:g} s and on changes",
             cpu_burst="always (acts where cpuBurstStrategy asks)", usage_loop=run_usage, usage_loop_why=why)
    if run_usage:
        usage = UsageLoop(
            backend,
            pipeline=pipeline,
            cgroups=cgroups,
            interval=config.usageLoop.intervalSeconds,
            proc_root=config.usageLoop.procRoot,
            applier=applier,
            evictor=_evictor(config, runtime, node_source.node_name, events),
        )
    # report.enable: the node's NRT, Device and NodeMetric status (runtime_proxy.report.loop).
    report = reporter(config.report, backend, node_name=node_source.node_name, cgroups=cgroups,
                      sampler=usage.sampler if usage is not None else None,
                      usage_interval=config.usageLoop.intervalSeconds, proc_root=config.usageLoop.procRoot)
    return Loops(ready, reconciler, burst, usage, report)


def _evictor(config: ProxyConfig, runtime: RuntimeClient | None, node_name: str,
             events: EventSink | None = None) -> Evictor | None:
    """The usage loop's evictor for ``usageLoop.evictBy`` (``None``: the loop's default, which
    only logs, when ``runtime`` is asked for and there is no runtime client). Its Events go
    through the node's recorder ``events`` when that one sends (``fromCluster``), so the node-wide
    cap covers them; else through the evictor's own recorder over the credentials it evicts with."""
    evict_by = config.usageLoop.evictBy
    if evict_by == "runtime" and runtime is None:
        log.error("usageLoop.evictBy is runtime but this command has no CRI runtime client; evictions are logged only")
        return None
    sink = events if isinstance(events, EventRecorder) and events.has_access else None
    return evictor_for(evict_by, runtime=runtime, node_name=node_name, events=sink)

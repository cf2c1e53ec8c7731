"""Adapters that plug the node-config source, the file applier, the hook-server registry and the
reconciler into a ``runtime_proxy.server.Proxy``. Called only by ``server``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime_proxy.config import ProxyConfig
from runtime_proxy.intercept import NodeSource, StaticNode

if TYPE_CHECKING:
    from runtime_proxy.server import Proxy


def node_source(config: ProxyConfig) -> tuple[NodeSource, Any]:
    """The node-config source and the object to start/stop for it (or None)."""
    from hooks.facts import NodeFacts
    from runtime_proxy.sysfs import read_cpu_topology

    return StaticNode(NodeFacts(cpu_topology=read_cpu_topology())), None


def applier(config: ProxyConfig, *, dry_run: bool = False) -> Any:
    """The single file applier over the configured cgroup and resctrl roots."""
    from runtime_proxy.apply import FileApplier
    from runtime_proxy.cgroups import Cgroups
    from runtime_proxy.resctrl import Resctrl

    return FileApplier(
        cgroups=Cgroups(config.cgroupRoot, driver=config.cgroupDriver),
        resctrl=Resctrl(config.resctrlRoot),
        dry_run=dry_run or config.dryRun,
    )


async def start_hook_servers(proxy: Proxy) -> Any:
    """Watch ``hookServerDir`` and keep the pipeline's remote steps in line with it (see
    ``runtime_proxy.hookservers``). Returns the registry; ``await registry.stop()`` ends it."""
    from runtime_proxy.hookservers import HookServerRegistry

    cfg = proxy.opts.config
    registry = HookServerRegistry(cfg.hookServerDir, proxy.pipeline, default_timeout=cfg.hookServerTimeout)
    await registry.start()
    return registry


async def start_reconciler(proxy: Proxy) -> Any:
    return None

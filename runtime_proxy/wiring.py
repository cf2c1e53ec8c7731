"""Builders of the node-side parts every entry point shares: the node config source and the file
applier, from a ``ProxyConfig``.

Used by the composition roots: ``runtime_proxy.server`` (``runtime-proxy serve``),
``runtime_proxy.engine.hook_service`` (``runtime-proxy hook-server``) and
``runtime_proxy.nri.cli`` (``runtime-proxy nri``). Imports none of them.
"""

from __future__ import annotations

import os
import socket

from hooks.facts import CgroupInfo
from runtime_proxy.config import ProxyConfig
from runtime_proxy.host.apply import FileApplier
from runtime_proxy.host.cgroups import Cgroups, detect_cgroup_version
from runtime_proxy.host.resctrl import Resctrl
from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig
from runtime_proxy.state.sysfs import read_cpu_topology

__all__ = ["applier", "node_source"]


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
        cgroup=CgroupInfo(version=detect_cgroup_version(config.cgroupRoot), driver=config.cgroupDriver),
    )
    return source, source


def applier(config: ProxyConfig, *, dry_run: bool = False) -> FileApplier:
    """The single file applier over the configured cgroup and resctrl roots."""
    return FileApplier(
        cgroups=Cgroups(config.cgroupRoot, driver=config.cgroupDriver),
        resctrl=Resctrl(config.resctrlRoot),
        dry_run=dry_run or config.dryRun,
    )

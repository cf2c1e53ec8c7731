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
    return StaticNode(), None


def applier(config: ProxyConfig) -> Any:
    return None


async def start_hook_servers(proxy: Proxy) -> Any:
    return None


async def start_reconciler(proxy: Proxy) -> Any:
    return None

"""``runtime-proxy nri``: run the plugins as a containerd NRI plugin (no kubelet change).

Builds the same parts as ``serve`` from the same ``--config`` file (``runtime_proxy.compose.build``:
plugins and their failure policies, the pipeline, node config, the applier), then hook-server
registrations and the periodic loops (``runtime_proxy.compose.loops``: reconciler, CPU burst loop
and usage loop, started after the first Synchronize; their container updates ride in the next
reply that can carry them, or with ``--unsolicited-updates`` go as ``UpdateContainers``,
``runtime_proxy.nri.backend``); then registers with the runtime's NRI socket and serves events
until SIGTERM or SIGINT, reconnecting whenever the runtime goes away (``runtime_proxy.nri.plugin``).

The runtime's CRI socket (``--backend``) is used for two things: with ``usageLoop.evictBy:
runtime`` the usage loop's victims are stopped through it (``runtime_proxy.loops.evict``), as
in proxy mode (NRI itself can only evict in a reply to a container event); and a container
update that no NRI reply carried for ``runtime_proxy.nri.backend.CARRY_WAIT`` seconds goes
through its UpdateContainerResources, as kubelet's would (a quiet node, or a CreateContainer
whose reply did not reach the runtime in its request timeout). The client (gRPC over h2, not the
gRPC library) is made only when one of them first needs it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from runtime_proxy.commands import HELP
from runtime_proxy.config import DEFAULT_BACKEND, ProxyConfig
from runtime_proxy.nri.plugin import DEFAULT_SOCKET, PluginIdentity

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime_proxy.compose import Parts
    from runtime_proxy.nri.adapter import NriEngine
    from runtime_proxy.nri.plugin import NriPlugin
    from runtime_proxy.runtime.client import RuntimeClient

log = structlog.get_logger(__name__)

__all__ = ["NriOptions", "NriParts", "add_parser", "build", "main_from_args", "run"]

DEFAULT_NAME = "runtime-hook-proxy"
DEFAULT_IDX = "50"


@dataclass
class NriOptions:
    socket: str = DEFAULT_SOCKET
    identity: PluginIdentity = field(default_factory=lambda: PluginIdentity(DEFAULT_NAME, DEFAULT_IDX))
    config: ProxyConfig = field(default_factory=ProxyConfig)
    dry_run: bool = False
    metrics_addr: str | None = None
    entry_points: bool = True
    hook_servers: bool = True
    extra_plugins: tuple[object, ...] = ()
    builtins: tuple[str, ...] | None = None
    reconcile: bool = True
    unsolicited_updates: bool = False
    backend: str | None = None


@dataclass
class NriParts:
    """What ``build`` makes; nothing is started: the plugin, its engine and the parts they share
    with the loops (``runtime_proxy.compose.Parts``)."""

    plugin: NriPlugin
    engine: NriEngine
    parts: Parts


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("nri", help=HELP["nri"],
                       description="Run the plugins as a containerd NRI plugin (no kubelet change).")
    p.add_argument("--nri-socket", default=DEFAULT_SOCKET, help="the runtime's NRI socket (default %(default)s)")
    p.add_argument("--plugin-name", default=DEFAULT_NAME, help="name to register under (default %(default)s)")
    p.add_argument("--plugin-idx", default=DEFAULT_IDX,
                   help="two-digit index; plugins are called in ascending order (default %(default)s)")
    p.add_argument("--config", help="plugin config file (YAML or JSON), the same file as serve takes")
    p.add_argument("--metrics-addr", help="HOST:PORT to serve Prometheus metrics on")
    p.add_argument("--dry-run", action="store_true", help="log plans, change and apply nothing")
    p.add_argument("--hook-server-dir", help="directory of hook-server registrations (*.json)")
    p.add_argument("--node-config", help="node config file (NodeSLO spec, node labels and annotations)")
    p.add_argument("--cgroup-root", help="cgroup filesystem root (default /sys/fs/cgroup)")
    p.add_argument("--cgroup-driver", choices=("cgroupfs", "systemd"), help="kubelet's cgroup driver")
    p.add_argument("--no-entry-points", action="store_true", help="do not load third-party plugins")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help="the runtime's CRI socket, used to stop evicted pods' containers under "
                        "usageLoop.evictBy: runtime and to send container updates no NRI reply carried "
                        "(default %(default)s)")
    p.add_argument("--unsolicited-updates", action="store_true",
                   help="send the loops' container updates at once (UpdateContainers) instead of in the next "
                        "reply; only on a runtime whose NRI has the lock-order fix (containerd/nri#301)")
    return p


def main_from_args(args: argparse.Namespace) -> int:
    from runtime_proxy import compose
    from runtime_proxy.config import check_usable, load_config

    try:
        cfg = load_config(args.config)
        identity = PluginIdentity(args.plugin_name, args.plugin_idx)
    except (OSError, ValueError) as exc:
        print(f"runtime-proxy nri: {exc}", file=sys.stderr)
        return 2
    cfg = compose.with_flags(cfg, args)
    try:
        check_usable(cfg)
    except ValueError as exc:
        print(f"runtime-proxy nri: {exc}", file=sys.stderr)
        return 2
    socket_path = args.nri_socket.removeprefix("unix://")
    opts = NriOptions(socket=socket_path, identity=identity, config=cfg, dry_run=args.dry_run,
                      metrics_addr=args.metrics_addr, entry_points=not args.no_entry_points,
                      unsolicited_updates=args.unsolicited_updates,
                      backend=args.backend.removeprefix("unix://"))
    asyncio.run(run(opts))
    return 0


def build(opts: NriOptions) -> NriParts:
    """The plugin, its engine and the parts the loops share with it, for ``opts``."""
    from runtime_proxy import compose
    from runtime_proxy.nri.adapter import NriEngine
    from runtime_proxy.nri.plugin import NriPlugin

    parts = compose.build(opts.config, dry_run=opts.dry_run, builtins=opts.builtins,
                          entry_points=opts.entry_points, extra=opts.extra_plugins)
    engine = NriEngine(parts.pipeline, node_source=parts.node_source, applier=parts.applier, background=True,
                       kubelet_root=parts.kubelet_root, events=parts.events, pod_specs=parts.pod_specs)
    plugin = NriPlugin(opts.identity, engine, socket_path=opts.socket)
    return NriParts(plugin=plugin, engine=engine, parts=parts)


def _runtime_for_updates(opts: NriOptions, made: RuntimeClient | None) -> Callable[[], RuntimeClient | None] | None:
    """What makes the CRI client the container updates no reply carried go through
    (``runtime_proxy.nri.backend``): the evictions' client when there is one, else one made at
    the first such update when the socket exists (so its HTTP/2 client is loaded only then); None without
    ``--backend`` or in a dry run."""
    if not opts.backend or opts.dry_run:
        return None
    backend = opts.backend

    def make() -> RuntimeClient | None:
        if made is not None:
            return made
        if not Path(backend).exists():
            return None
        from runtime_proxy.runtime.client import RuntimeClient

        return RuntimeClient(backend)

    return make


async def run(opts: NriOptions, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT when no event is given)."""
    from runtime_proxy import compose, memory, metrics, wiring
    from runtime_proxy.hookclient.registry import HookServerRegistry
    from runtime_proxy.nri.backend import NriBackend

    memory.map_large_blocks()  # a large Synchronize's buffers are unmapped once freed
    built = build(opts)
    plugin, engine, parts = built.plugin, built.engine, built.parts
    node_watch = parts.node_source
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    metrics_server = None
    if opts.metrics_addr:

        def readiness() -> tuple[bool, str]:
            if not plugin.synchronized.is_set():
                return False, f"not registered and synchronized with the runtime at {opts.socket}"
            pending = node_watch.keys_pending()
            if pending is not None:
                return False, pending
            ok, why = metrics.socket_accepts(opts.socket)
            return (True, "ok") if ok else (False, f"runtime's NRI socket {opts.socket}: {why}")

        metrics_server = metrics.serve(opts.metrics_addr, readiness, parts.liveness)
    registry = None
    if opts.hook_servers:
        registry = HookServerRegistry(opts.config.hookServerDir, engine.pipeline,
                                      default_timeout=opts.config.hookServerTimeout)
        await registry.start()
    await node_watch.start()
    await parts.pod_specs.start()
    loops = None
    runtime = None
    backend = None
    if opts.reconcile:
        # The loops start once the first Synchronize has filled the store.
        usage_loop, _ = wiring.usage_loop_decision(opts.config, parts.pm, parts.pipeline)
        if opts.backend and usage_loop and opts.config.usageLoop.evictBy == "runtime":
            from runtime_proxy.runtime.client import RuntimeClient

            runtime = RuntimeClient(opts.backend)
        backend = NriBackend(engine, plugin, unsolicited=opts.unsolicited_updates,
                             runtime=_runtime_for_updates(opts, runtime))
        loops = compose.loops(parts, backend, ready=plugin.synchronized, runtime=runtime)
        engine.on_store_change = loops.store_changed
        # In a dry run nothing rides on a reply, so the reconciler's round is not waited for.
        if not opts.unsolicited_updates and not parts.dry_run:
            reconciler = loops.reconciler
            engine.settle = lambda: reconciler.reconcile_once("pools")
    # What start-up built lives as long as the process: the cyclic collector's full passes (tens
    # of ms over it, on the event loop) leave it alone from now on.
    gc.collect()
    gc.freeze()
    log.info("NRI plugin starting", socket=opts.socket, name=opts.identity.name, idx=opts.identity.idx,
             dry_run=parts.dry_run)
    try:
        await plugin.run(stop)
    finally:
        await engine.close()
        for part in (loops, registry, node_watch, parts.pod_specs):
            if part is not None:
                await part.stop()
        if backend is not None:
            await backend.drain()
            if backend.runtime_client is not None and backend.runtime_client is not runtime:
                await backend.runtime_client.close()
        if runtime is not None:
            await runtime.close()
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.shutdown)
            metrics_server.server_close()
        log.info("NRI plugin stopped")

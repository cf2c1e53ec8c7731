"""Wiring for ``runtime-proxy serve``: one coroutine builds every part, starts the transport and
stops it gracefully.

Called by ``runtime_proxy.cli``. Start order: plugins (built-ins and the entry-point group,
validated at registration) -> pipeline -> store rebuilt from the runtime (in the background and
retried while the runtime is down, so the proxy answers UNAVAILABLE instead of not starting) ->
node config -> applier -> interceptor -> hook-server registrations -> transport -> reconciler.
SIGTERM and SIGINT drain calls in flight (``grace`` seconds) before exit.
"""

from __future__ import annotations

import asyncio
import importlib
import signal
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from hooks.manager import make_plugin_manager, plugin_order
from runtime_proxy import memory, metrics
from runtime_proxy.config import ProxyConfig
from runtime_proxy.cri.transport import CallInterceptor
from runtime_proxy.engine.intercept import CriInterceptor, NodeSource, StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.state.store import RuntimeClient, Store

log = structlog.get_logger(__name__)

DEFAULT_LISTEN = "/var/run/koord-runtimeproxy/runtimeproxy.sock"
DEFAULT_BACKEND = "/var/run/containerd/containerd.sock"


class Transport(Protocol):
    async def start(self) -> None: ...

    async def stop(self, grace: float = 5.0) -> None: ...


@dataclass
class ProxyOptions:
    listen: str = DEFAULT_LISTEN
    backend: str = DEFAULT_BACKEND
    config: ProxyConfig = field(default_factory=ProxyConfig)
    transport: str = "relay"
    metrics_addr: str | None = None
    dry_run: bool = False
    grace: float = 10.0
    entry_points: bool = True
    # Extra plugin objects registered after built-ins and entry points (tests).
    extra_plugins: tuple[object, ...] = ()
    builtins: tuple[str, ...] | None = None
    hook_servers: bool = True
    reconcile: bool = True


def make_transport(kind: str, listen: str, backend: str, interceptor: CallInterceptor) -> Transport:
    if kind == "grpc":
        from runtime_proxy.cri.grpc_transport import GrpcTransport

        return GrpcTransport(listen, backend, interceptor)
    if kind == "relay":
        from runtime_proxy.cri.relay import RelayTransport

        return RelayTransport(listen, backend, interceptor)
    raise ValueError(f"unknown transport {kind!r} (relay or grpc)")


class Proxy:
    """A running proxy: the parts, so tests can reach them."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        cfg = opts.config
        modules = [importlib.import_module(name) for name in cfg.pluginModules]
        self.pm = make_plugin_manager(
            builtins=opts.builtins, entry_points=opts.entry_points, extra=[*modules, *opts.extra_plugins]
        )
        names = plugin_order(self.pm, [p.name for p in cfg.plugins] if cfg.plugins else None)
        self.pipeline = Pipeline(plugin_steps(self.pm, cfg.plugin_settings(names)))
        self.store = Store()
        self.client = RuntimeClient(opts.backend)
        self.node_source: NodeSource = StaticNode()
        self.node_watch: Any = None
        self.applier: Any = None
        self.reconciler: Any = None
        self.hook_servers: Any = None
        self._setup_node_and_applier()
        self.interceptor = CriInterceptor(
            store=self.store,
            pipeline=self.pipeline,
            client=self.client,
            node_source=self.node_source,
            applier=self.applier,
            dry_run=opts.dry_run or cfg.dryRun,
            on_store_change=self._store_changed,
        )
        self.transport = make_transport(opts.transport, opts.listen, opts.backend, self.interceptor)
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()

    def _setup_node_and_applier(self) -> None:
        from runtime_proxy import wiring

        self.node_source, self.node_watch = wiring.node_source(self.opts.config)
        self.applier = wiring.applier(self.opts.config, dry_run=self.opts.dry_run)

    def _store_changed(self, pools_changed: bool) -> None:
        if self.reconciler is not None:
            notify = getattr(self.reconciler, "store_changed", None)
            if notify is not None:
                notify(pools_changed)

    async def _recover(self) -> None:
        """Rebuild the store from the runtime; retry until the runtime answers."""
        delay = 0.2
        while True:
            try:
                await self.store.rebuild(self.client)
                metrics.BACKEND_UP.set(1)
                self.ready.set()
                await asyncio.to_thread(memory.trim)
                return
            except Exception as exc:
                metrics.BACKEND_UP.set(0)
                log.warning("runtime not reachable; store rebuild retried", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def start(self) -> None:
        if self.opts.metrics_addr:
            metrics.serve(self.opts.metrics_addr)
        await self.transport.start()
        self._tasks.append(asyncio.create_task(self._recover()))
        from runtime_proxy import wiring

        if self.opts.hook_servers:
            self.hook_servers = await wiring.start_hook_servers(self)
        if self.node_watch is not None:
            await self.node_watch.start()
        if self.opts.reconcile:
            self.reconciler = await wiring.start_reconciler(self)
        log.info("proxy serving", listen=self.opts.listen, backend=self.opts.backend, transport=self.opts.transport)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for part in (self.reconciler, self.hook_servers, self.node_watch):
            stop = getattr(part, "stop", None)
            if stop is None:
                continue
            # A part that cannot stop must not keep the proxy from draining and exiting.
            try:
                async with asyncio.timeout(self.opts.grace):
                    await stop()
            except TimeoutError:
                log.warning("part did not stop in time; going on", part=type(part).__name__, grace=self.opts.grace)
            except Exception:
                log.exception("part failed to stop", part=type(part).__name__)
        await self.transport.stop(self.opts.grace)
        await self.client.close()
        log.info("proxy stopped")


async def serve(opts: ProxyOptions) -> None:
    """Run until SIGTERM or SIGINT."""
    proxy = Proxy(opts)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received; draining calls in flight", grace=opts.grace)
    await proxy.stop()

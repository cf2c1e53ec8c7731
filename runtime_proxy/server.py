"""The composition root of ``runtime-proxy serve``: ``Proxy`` builds every part, typed, starts the
transport and the loops and stops them gracefully.

Called by ``runtime_proxy.cli`` (``serve``) and by tests and the demo (``Proxy``). Imports the
parts; no part imports it. Start order: plugins (built-ins and the entry-point group,
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
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

import structlog

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager
from runtime_proxy import memory, metrics, wiring
from runtime_proxy.config import DEFAULT_BACKEND, DEFAULT_LISTEN, ProxyConfig
from runtime_proxy.cri.grpc_transport import GrpcTransport
from runtime_proxy.cri.relay import RelayTransport
from runtime_proxy.cri.transport import CallInterceptor
from runtime_proxy.engine.intercept import CriInterceptor, set_linux_resources
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.engine.remote import HookServerRegistry
from runtime_proxy.host.apply import FileApplier
from runtime_proxy.state.nodeconfig import NodeConfig
from runtime_proxy.state.store import RuntimeClient, Store

log = structlog.get_logger(__name__)


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
        return GrpcTransport(listen, backend, interceptor)
    if kind == "relay":
        return RelayTransport(listen, backend, interceptor)
    raise ValueError(f"unknown transport {kind!r} (relay or grpc)")


class StoreBackend:
    """What the reconciler and the burst loop see of the proxy: the store, the interceptor's node
    facts and the runtime."""

    def __init__(self, store: Store, interceptor: CriInterceptor, client: RuntimeClient) -> None:
        self.store = store
        self.interceptor = interceptor
        self.client = client

    def node(self) -> NodeFacts:
        return self.interceptor.node()

    def pods(self) -> list[PodFacts]:
        """The pods whose sandbox did not stop (``Store.live_pods``)."""
        return self.store.live_pods()

    def bound_pods(self) -> list[PodFacts]:
        """The pods whose bound CPUs count for the share pools (``Store.holding_pods``)."""
        return self.store.holding_pods()

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        """The containers the runtime has not stopped."""
        return self.store.running_containers()

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        """Send only the changed fields (the runtime keeps the rest), then record them."""
        linux = api_pb2.LinuxContainerResources()
        set_linux_resources(linux, changes)
        await self.client.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux),
            timeout=self.client.timeout,
        )
        found, sandbox_id = self.store.container(container_id), self.store.sandbox_of(container_id)
        if found is not None and sandbox_id is not None:
            self.store.put_container(sandbox_id, found[1].replace(resources=found[1].resources.with_changes(changes)))


class Proxy:
    """A running proxy: the parts, so tests can reach them."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        cfg = opts.config
        modules = [importlib.import_module(name) for name in cfg.pluginModules]
        self.pm = make_plugin_manager(
            builtins=opts.builtins, entry_points=opts.entry_points, extra=[*modules, *opts.extra_plugins]
        )
        self.pipeline = Pipeline(plugin_steps(self.pm, wiring.plugin_settings(cfg, self.pm,
                                                                             entry_points=opts.entry_points)))
        self.store = Store()
        self.client = RuntimeClient(opts.backend)
        self.node_source: NodeConfig
        self.node_watch: NodeConfig
        self.node_source, self.node_watch = wiring.node_source(cfg)
        self.applier: FileApplier = wiring.applier(cfg, dry_run=opts.dry_run)
        self.reconciler: wiring.Loops | None = None
        self.hook_servers: HookServerRegistry | None = None
        self.interceptor = CriInterceptor(
            store=self.store,
            pipeline=self.pipeline,
            client=self.client,
            node_source=self.node_source,
            applier=self.applier,
            dry_run=opts.dry_run or cfg.dryRun,
            on_store_change=self._store_changed,
            kubelet_root=wiring.kubelet_root(cfg),
        )
        self.transport = make_transport(opts.transport, opts.listen, opts.backend, self.interceptor)
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()
        self.metrics_server: ThreadingHTTPServer | None = None

    def _store_changed(self, pools_changed: bool) -> None:
        if self.reconciler is not None:
            self.reconciler.store_changed(pools_changed)

    async def _start_hook_servers(self) -> HookServerRegistry:
        """Watch ``hookServerDir`` and keep the pipeline's remote steps in line with it (see
        ``runtime_proxy.engine.remote``)."""
        cfg = self.opts.config
        registry = HookServerRegistry(cfg.hookServerDir, self.pipeline, default_timeout=cfg.hookServerTimeout,
                                      own_sockets=(self.opts.backend, self.opts.listen))
        await registry.start()
        return registry

    def _loops(self) -> wiring.Loops:
        """The reconciler and the CPU burst loop (``runtime_proxy.wiring.loops``) over the store,
        the interceptor's node facts and containerd's UpdateContainerResources."""
        backend = StoreBackend(self.store, self.interceptor, self.client)
        return wiring.loops(self.opts.config, backend, pm=self.pm, pipeline=self.pipeline, applier=self.applier,
                            node_source=self.node_source, ready=self.ready,
                            dry_run=self.opts.dry_run or self.opts.config.dryRun, runtime=self.client)

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

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: ready once the store was rebuilt from the runtime and while the runtime's
        socket accepts connections (checked at each probe, off the event loop)."""
        if not self.ready.is_set():
            return False, "store not rebuilt from the runtime yet"
        ok, reason = metrics.socket_accepts(self.opts.backend)
        metrics.BACKEND_UP.set(1 if ok else 0)
        return ok, "ok" if ok else f"runtime not reachable at {self.opts.backend}: {reason}"

    async def start(self) -> None:
        if self.opts.metrics_addr:
            self.metrics_server = metrics.serve(self.opts.metrics_addr, self.readiness)
        await self.transport.start()
        self._tasks.append(asyncio.create_task(self._recover()))
        if self.opts.hook_servers:
            self.hook_servers = await self._start_hook_servers()
        await self.node_watch.start()
        if self.opts.reconcile:
            self.reconciler = self._loops()
        log.info("proxy serving", listen=self.opts.listen, backend=self.opts.backend, transport=self.opts.transport)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        parts: list[wiring.Loops | HookServerRegistry | NodeConfig | None] = [
            self.reconciler, self.hook_servers, self.node_watch
        ]
        for part in parts:
            if part is None:
                continue
            # A part that cannot stop must not keep the proxy from draining and exiting.
            try:
                async with asyncio.timeout(self.opts.grace):
                    await part.stop()
            except TimeoutError:
                log.warning("part did not stop in time; going on", part=type(part).__name__, grace=self.opts.grace)
            except Exception:
                log.exception("part failed to stop", part=type(part).__name__)
        await self.transport.stop(self.opts.grace)
        await self.client.close()
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.shutdown)
            self.metrics_server.server_close()
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

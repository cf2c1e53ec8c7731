"""``runtime-proxy serve``: the CRI proxy in front of the runtime.

``add_parser`` and ``main_from_args`` are the command line (``runtime_proxy.commands.main``
dispatches to them); ``Proxy`` is the running proxy, also built by tests and the demo. Its parts
come from the composition root (``runtime_proxy.compose.build``: plugins, validated at
registration -> pipeline -> node config -> applier), then: store rebuilt from the runtime (in the
background and retried while the runtime is down, so the proxy answers UNAVAILABLE instead of not
starting) -> interceptor -> hook-server registrations -> transport -> the periodic loops
(``runtime_proxy.compose.loops``). SIGTERM and SIGINT drain calls in flight (``grace`` seconds)
before exit.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Protocol

import structlog

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import ResourceChanges
from runtime_proxy import compose, memory, metrics, wiring
from runtime_proxy.codecs.cri import set_linux_resources
from runtime_proxy.commands import HELP
from runtime_proxy.config import DEFAULT_BACKEND, DEFAULT_LISTEN, ConfigError, ProxyConfig, check_usable, load_config
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.cri.transport import CallInterceptor
from runtime_proxy.engine.table import record_sent
from runtime_proxy.hookclient.registry import HookServerRegistry
from runtime_proxy.host.apply import FileApplier, RecordingApplier
from runtime_proxy.process import EXIT_CODES_EPILOG, EXIT_USAGE, fail, run_main
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.nodeconfig import NodeConfig
from runtime_proxy.state.podspecs import ClusterPods, NoPodSpecs
from runtime_proxy.state.store import Store

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
    """The transport ``kind`` names, imported only when chosen (the grpc one loads gRPC, which
    no other command needs: ``runtime-proxy`` imports this module to build its parser)."""
    if kind == "grpc":
        from runtime_proxy.cri.grpc_transport import GrpcTransport

        return GrpcTransport(listen, backend, interceptor)
    if kind == "relay":
        from runtime_proxy.cri.relay import RelayTransport

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

    async def update_container_resources(self, container_id: str, changes: ResourceChanges) -> None:
        """Send only the changed fields (the runtime keeps the rest), then record them."""
        linux = api_pb2.LinuxContainerResources()
        set_linux_resources(linux, changes)
        await self.client.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux),
            timeout=self.client.timeout,
        )
        record_sent(self.store, container_id, changes)


class Proxy:
    """A running proxy: the parts, so tests can reach them."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        parts = compose.build(opts.config, dry_run=opts.dry_run, builtins=opts.builtins,
                              entry_points=opts.entry_points, extra=opts.extra_plugins)
        self.parts = parts
        self.pm = parts.pm
        self.pipeline = parts.pipeline
        self.store = Store()
        self.client = RuntimeClient(opts.backend)
        self.node_source: NodeConfig = parts.node_source
        self.node_watch: NodeConfig = parts.node_source
        self.applier: FileApplier | RecordingApplier = parts.applier
        self.reconciler: wiring.Loops | None = None
        self.hook_servers: HookServerRegistry | None = None
        self.interceptor = CriInterceptor(
            store=self.store,
            pipeline=self.pipeline,
            client=self.client,
            node_source=self.node_source,
            applier=self.applier,
            on_store_change=self._store_changed,
            kubelet_root=parts.kubelet_root,
            events=parts.events,
            pod_specs=parts.pod_specs,
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
        ``runtime_proxy.hookclient``)."""
        cfg = self.opts.config
        registry = HookServerRegistry(cfg.hookServerDir, self.pipeline, default_timeout=cfg.hookServerTimeout,
                                      own_sockets=(self.opts.backend, self.opts.listen))
        await registry.start()
        return registry

    def _loops(self) -> wiring.Loops:
        """The periodic loops (``runtime_proxy.compose.loops``) over the store, the
        interceptor's node facts and containerd's UpdateContainerResources."""
        backend = StoreBackend(self.store, self.interceptor, self.client)
        return compose.loops(self.parts, backend, ready=self.ready, runtime=self.client)

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
        pending = self.node_source.keys_pending()
        if pending is not None:
            return False, pending
        ok, reason = metrics.socket_accepts(self.opts.backend)
        metrics.BACKEND_UP.set(1 if ok else 0)
        return ok, "ok" if ok else f"runtime not reachable at {self.opts.backend}: {reason}"

    async def start(self) -> None:
        if self.opts.metrics_addr:
            self.metrics_server = metrics.serve(self.opts.metrics_addr, self.readiness, self.parts.liveness)
        await self.transport.start()
        self._tasks.append(asyncio.create_task(self._recover()))
        if self.opts.hook_servers:
            self.hook_servers = await self._start_hook_servers()
        await self.node_watch.start()
        await self.parts.pod_specs.start()
        if self.opts.reconcile:
            self.reconciler = self._loops()
        log.info("proxy serving", listen=self.opts.listen, backend=self.opts.backend, transport=self.opts.transport)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        parts: list[wiring.Loops | HookServerRegistry | NodeConfig | ClusterPods | NoPodSpecs | None] = [
            self.reconciler, self.hook_servers, self.node_watch, self.parts.pod_specs
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


# ---- the command line ---------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help=HELP["serve"], description="Run the CRI proxy in front of the runtime.",
                       epilog=EXIT_CODES_EPILOG)
    p.add_argument("--listen", "--koord-runtimeproxy-endpoint", dest="listen", default=DEFAULT_LISTEN,
                   help="unix socket to serve CRI on (default %(default)s)")
    p.add_argument("--backend", "--remote-runtime-service-endpoint", dest="backend", default=DEFAULT_BACKEND,
                   help="the runtime's CRI unix socket (default %(default)s)")
    p.add_argument("--config", help="plugin config file (YAML or JSON)")
    p.add_argument("--metrics-addr", metavar="[HOST]:PORT",
                   help="serve Prometheus metrics on HOST:PORT; :PORT means 127.0.0.1:PORT")
    p.add_argument("--transport", choices=("relay", "grpc"), default="relay",
                   help="relay: HTTP/2 frame relay (default); grpc: the grpcio fallback")
    p.add_argument("--dry-run", action="store_true", help="log plans, change and apply nothing")
    p.add_argument("--hook-server-dir", help="directory of hook-server registrations (*.json)")
    p.add_argument("--node-config", help="node config file (NodeSLO spec, node labels and annotations)")
    p.add_argument("--cgroup-root", help="cgroup filesystem root (default /sys/fs/cgroup)")
    p.add_argument("--cgroup-driver", choices=("cgroupfs", "systemd"), help="kubelet's cgroup driver")
    p.add_argument("--resctrl-root", help="resctrl filesystem root (default /sys/fs/resctrl)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds to drain calls on SIGTERM")
    p.add_argument("--no-entry-points", action="store_true", help="do not load third-party plugins")
    return p


def _strip(s: str | None) -> str | None:
    if s is None:
        return None
    return s[len("unix://"):] if s.startswith("unix://") else s


def main_from_args(args: argparse.Namespace) -> int:
    """Check the config, the flags and the plugins (exit code 2 with one line on stderr), then
    serve until SIGTERM or SIGINT (exit codes: ``runtime_proxy.process.EXIT_CODES_EPILOG``)."""
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        return fail("serve", f"bad config {exc}", EXIT_USAGE)
    cfg = compose.with_flags(cfg, args)
    try:
        check_usable(cfg)
    except ConfigError as exc:
        return fail("serve", str(exc), EXIT_USAGE)
    if args.metrics_addr is not None:
        try:
            metrics.parse_addr(args.metrics_addr)
        except ValueError as exc:
            return fail("serve", f"--metrics-addr: {exc}", EXIT_USAGE)
    if not args.grace >= 0:
        return fail("serve", "--grace must be a number of seconds >= 0", EXIT_USAGE)
    try:
        compose.check_plugins(cfg, entry_points=not args.no_entry_points)
    except (compose.PluginLoadError, ConfigError) as exc:
        where = f"config {args.config}" if args.config else "plugins"
        return fail("serve", f"bad {where}: {exc}", EXIT_USAGE)
    opts = ProxyOptions(
        listen=_strip(args.listen) or DEFAULT_LISTEN,
        backend=_strip(args.backend) or DEFAULT_BACKEND,
        config=cfg,
        transport=args.transport,
        metrics_addr=args.metrics_addr,
        dry_run=args.dry_run,
        grace=args.grace,
        entry_points=not args.no_entry_points,
    )
    return run_main("serve", serve(opts))

"""``colocation-manager`` (also ``scheduler-ext manager``): the co-location manager command.

Who calls this: ``colocation_manager.entry`` (the ``colocation-manager`` console script) parses
with ``build_parser`` and calls ``main``; ``scheduler_ext.cli.build_parser`` adds the same flags
as its ``manager`` sub-command with ``add_parser``, the command the chart, the kustomize manifests
and the images run (the manager ships in the cluster package beside the extender: the same
install and the same ``[scheduler]`` extra, over the one Kubernetes access layer ``rhp_kube``).
``run`` wires the parts of ``colocation_manager``: watches, the Lease elector, the reconciler, and optionally the
admission webhook and a metrics listener. The elector and the reconciler share one event loop;
the watches run in threads, and the webhook (``colocation_manager.serving``) on a thread and
event loop of its own, so its traffic never delays the Lease.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import ssl
import sys
from typing import Any

import structlog

from koord_formats.colocation import CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE
from rhp_kube import credentials
from rhp_kube.liveness import DEAD_AFTER, all_of
from rhp_ops import logs, probes
from rhp_ops.cli import FORMAT_HELP, LEVEL_HELP, Parser, add_global_flags, add_version_flag, resolve_log_flags
from rhp_ops.files import MAX_KUBECONFIG_BYTES, FileRefused, kubeconfig_files, read_regular_file

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "PROG", "add_flags", "add_parser", "build_parser", "main", "run"]

PROG = "colocation-manager"
EXIT_OK = 0
EXIT_FAILED = 1  # a listener could not start
EXIT_USAGE = 2  # bad flags, or a configuration file that cannot be read

MAX_PEM_BYTES = 1 << 20

EXIT_CODES = """exit codes:
  0  stopped by SIGTERM or SIGINT
  1  the webhook or metrics listener could not start, or no webhook certificate came in time
  2  bad flags, or a kubeconfig or TLS file that cannot be read"""


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    print(f"{getattr(args, 'prog', PROG)}: {message}", file=sys.stderr)
    return code


HELP = "publish batch resources, NodeMetrics and NodeSLOs (koord-manager's co-location part)"
DESCRIPTION = ("Watch Nodes, Pods, NodeMetrics and slo-controller-config; keep one NodeMetric and one "
               "NodeSLO per Node and write kubernetes.io/batch-cpu and batch-memory into each Node's "
               "status. Only the replica holding the Lease writes.")


def build_parser() -> argparse.ArgumentParser:
    """``colocation-manager``'s own parser: the manager's flags, ``--version`` and the global flags."""
    p = Parser(prog=PROG, description=DESCRIPTION, epilog=EXIT_CODES)
    add_version_flag(p, PROG)
    add_flags(p)
    add_global_flags(p, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    p.set_defaults(prog=PROG)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse, set up the logs (a server's defaults: info, JSON lines, on stderr) and ``run``."""
    args = build_parser().parse_args(argv)
    level, fmt = resolve_log_flags(args, server=True)
    logs.configure(fmt, level)
    return run(args)


def add_parser(sub: Any, *, level_help: str, fmt_help: str) -> argparse.ArgumentParser:
    """Add ``manager`` to the ``scheduler-ext`` sub-commands (the same flags as ``colocation-manager``)."""
    p: argparse.ArgumentParser = sub.add_parser("manager", help=HELP, description=DESCRIPTION, epilog=EXIT_CODES)
    add_flags(p)
    add_global_flags(p, subcommand=True, level_help=level_help, fmt_help=fmt_help)
    p.set_defaults(func=run, prog="scheduler-ext manager")
    return p


def add_flags(p: argparse.ArgumentParser) -> None:
    """The manager's own flags (not the global ones)."""
    credentials.add_flags(p)
    p.add_argument("--config-namespace", default=CONFIG_MAP_NAMESPACE,
                   help="namespace of slo-controller-config (default %(default)s)")
    p.add_argument("--slo-config-name", default=CONFIG_MAP_NAME, help="its name (default %(default)s)")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", CONFIG_MAP_NAMESPACE),
                   help="namespace of the leader-election Lease (default $POD_NAMESPACE or %(default)s)")
    p.add_argument("--lease-name", default="rhp-manager", help="the Lease's name (default %(default)s)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()),
                   help="this replica's holder identity (default $POD_NAME or the host name)")
    p.add_argument("--mid-resources", action="store_true",
                   help="also publish kubernetes.io/mid-cpu and mid-memory (off by default)")
    p.add_argument("--resync-seconds", type=float, default=30.0,
                   help="reconcile every node at least this often (default %(default)s)")
    p.add_argument("--api-timeout", type=float, default=5.0, help="limit of each API write (default %(default)s)")
    p.add_argument("--watch-timeout", type=int, default=60,
                   help="seconds after which the API server ends each watch stream (default %(default)s)")
    p.add_argument("--watch-idle-timeout", type=float, default=90.0, metavar="SECONDS",
                   help="a watch stream silent this long (no event, bookmark or end) is dropped and the watch "
                        "resumed (default %(default)s; longer than --watch-timeout)")
    p.add_argument("--watch-dead-after", type=float, default=DEAD_AFTER, metavar="SECONDS",
                   help="a watch without a word from the API server for this long makes /healthz fail, so "
                        "kubelet restarts the manager (default %(default)s; longer than --watch-idle-timeout)")
    p.add_argument("--metrics-listen", default="", metavar="HOST:PORT",
                   help="serve Prometheus /metrics, /healthz (503 while a watch is dead past --watch-dead-after) "
                        "and /readyz (503 until every kind was listed) here (:PORT is loopback)")
    p.add_argument("--webhook-listen", default="", metavar="HOST:PORT",
                   help="also serve the pod admission webhook (POST /mutate-pod: ClusterColocationProfile; "
                        "POST /validate-pod: the co-location rules) over HTTPS here; needs --webhook-cert "
                        "and --webhook-key")
    p.add_argument("--webhook-cert", default="", help="the webhook's serving certificate (PEM)")
    p.add_argument("--webhook-key", default="", help="its private key (PEM)")
    p.add_argument("--webhook-cert-secret", default="", metavar="NAME",
                   help="keep the webhook's CA and serving certificate in this Secret (in --webhook-cert-namespace), "
                        "issued and renewed by the manager (no cert-manager); replaces --webhook-cert/--webhook-key")
    p.add_argument("--webhook-cert-namespace", default=os.environ.get("POD_NAMESPACE", CONFIG_MAP_NAMESPACE),
                   help="namespace of --webhook-cert-secret (default $POD_NAMESPACE or %(default)s)")
    p.add_argument("--webhook-cert-dir", default="", help="where the Secret's serving pair is written "
                                                          "(tls.crt, tls.key); needed with --webhook-cert-secret")
    p.add_argument("--webhook-dns-name", action="append", default=[], metavar="NAME",
                   help="a DNS name the API server reaches the webhook by (repeatable)")
    p.add_argument("--webhook-ip", action="append", default=[], metavar="IP",
                   help="an IP address the API server reaches the webhook by (repeatable)")
    p.add_argument("--webhook-configuration", action="append", default=[], metavar="NAME",
                   help="a MutatingWebhookConfiguration whose caBundle the manager keeps (repeatable)")
    p.add_argument("--webhook-max-inflight", type=int, default=32,
                   help="reviews answered at once; more get 503 at once (default %(default)s)")


def _kubeconfig_problem(args: argparse.Namespace) -> str:
    if args.in_cluster:
        return ""
    for path in kubeconfig_files(args.kubeconfig):
        try:
            read_regular_file(path, limit=MAX_KUBECONFIG_BYTES)
        except FileRefused as exc:
            if exc.reason != "missing":
                return f"--kubeconfig {path}: {exc.message}"
    return ""


def _readiness(cache: Any) -> tuple[bool, str]:
    """``/readyz``: every kind the manager caches was listed once (``Cache.synced``)."""
    from colocation_manager.kubeio import KINDS

    with cache.lock:
        missing = [k for k in KINDS if k not in cache.synced]
    return (False, "not listed yet: " + ", ".join(missing)) if missing else (True, "ok")


def _pem_problem(args: argparse.Namespace) -> str:
    """Read the webhook's TLS files once through the one reader of configured files and load
    them, so a FIFO, a huge file or a bad PEM is a one-line error instead of a hang or a
    traceback."""
    for flag, path in (("--webhook-cert", args.webhook_cert), ("--webhook-key", args.webhook_key)):
        if path:
            try:
                read_regular_file(path, limit=MAX_PEM_BYTES)
            except FileRefused as exc:
                return f"{flag} {path}: {exc.message}"
    if args.webhook_cert:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(args.webhook_cert, args.webhook_key)
        except (OSError, ssl.SSLError) as exc:
            return f"cannot load --webhook-cert/--webhook-key: {exc}"
    return ""


def _host_port(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


FIRST_CERT_SECONDS = 120.0


async def _first_certificate(keeper: Any, api: Any) -> bool:
    """Rounds of ``keeper`` until its files hold a certificate (False after FIRST_CERT_SECONDS)."""
    stop, first = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(keeper.run(stop, first=first))
    try:
        await asyncio.wait_for(first.wait(), FIRST_CERT_SECONDS)
        return True
    except TimeoutError:
        return False
    finally:
        stop.set()
        await task
        await api.aclose()  # its session belongs to this event loop


# long: the composition root, wiring each part in the order it starts and stops; reads top to bottom
def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM or SIGINT."""
    from colocation_manager.controller import Cache, Reconciler
    from colocation_manager.kubeio import LeaseCalls, ManagerAPI, manager_resources, webhook_resources
    from rhp_kube.http import KubeHTTP
    from rhp_kube.lease import Elector
    from rhp_kube.watch import Informer, WatchOptions

    log = structlog.get_logger("colocation_manager")
    if args.metrics_listen:
        try:
            probes.parse_addr(args.metrics_listen)
        except ValueError:
            return _fail(args, "--metrics-listen must be HOST:PORT", EXIT_USAGE)
    if args.webhook_max_inflight < 1:
        return _fail(args, "--webhook-max-inflight must be at least 1", EXIT_USAGE)
    if not args.identity:
        return _fail(args, "--identity must not be empty (it names the Lease's holder)", EXIT_USAGE)
    if args.resync_seconds <= 0 or args.api_timeout <= 0 or args.watch_timeout < 1:
        return _fail(args, "--resync-seconds, --api-timeout and --watch-timeout must be positive", EXIT_USAGE)
    if not args.watch_timeout < args.watch_idle_timeout < args.watch_dead_after:
        return _fail(args, "--watch-idle-timeout must be longer than --watch-timeout, and --watch-dead-after longer "
                     "than --watch-idle-timeout", EXIT_USAGE)
    webhook_listen = _host_port(args.webhook_listen) if args.webhook_listen else None
    if args.webhook_cert_secret:
        if args.webhook_cert or args.webhook_key or not args.webhook_cert_dir or webhook_listen is None:
            return _fail(args, "--webhook-cert-secret needs --webhook-listen and --webhook-cert-dir, and replaces "
                         "--webhook-cert and --webhook-key", EXIT_USAGE)
        if not args.webhook_dns_name and not args.webhook_ip:
            return _fail(args, "--webhook-cert-secret needs a --webhook-dns-name or --webhook-ip", EXIT_USAGE)
        try:
            for ip in args.webhook_ip:
                ipaddress.ip_address(ip)
        except ValueError as exc:
            return _fail(args, f"--webhook-ip: {exc}", EXIT_USAGE)
        args.webhook_cert = os.path.join(args.webhook_cert_dir, "tls.crt")
        args.webhook_key = os.path.join(args.webhook_cert_dir, "tls.key")
    elif args.webhook_listen and (webhook_listen is None or not args.webhook_cert or not args.webhook_key):
        return _fail(args, "--webhook-listen must be HOST:PORT and needs --webhook-cert and --webhook-key", EXIT_USAGE)
    problem = _kubeconfig_problem(args) or ("" if args.webhook_cert_secret else _pem_problem(args))
    if problem:
        return _fail(args, problem, EXIT_USAGE)
    try:
        api_client = credentials.from_args(args)
    except Exception as exc:  # the kubernetes config loaders raise their own types
        return _fail(args, f"cannot load the API server configuration: {exc}", EXIT_USAGE)
    api = ManagerAPI(api_client, timeout=args.api_timeout)
    options = WatchOptions(watch_timeout=args.watch_timeout, read_deadline=args.watch_idle_timeout,
                           dead_after=args.watch_dead_after)
    cache = Cache()
    elector = Elector(LeaseCalls(api), args.lease_namespace, args.lease_name, args.identity)
    reconciler = Reconciler(cache, api, elector, mid_resources=args.mid_resources,
                            resync_seconds=args.resync_seconds)
    watched = manager_resources(args.config_namespace, args.slo_config_name)
    watches = [Informer(KubeHTTP(api_client, timeout=None), watched, cache, component="manager", options=options)]
    server = None
    if args.metrics_listen:
        try:
            server = probes.serve(args.metrics_listen, "scheduler-ext-manager", readiness=lambda: _readiness(cache),
                                  liveness=lambda: all_of(*(w.liveness for w in watches))())
        except OSError as exc:
            return _fail(args, f"cannot listen on {args.metrics_listen}: {exc}", EXIT_FAILED)
    webhook = None
    keeper = None
    if webhook_listen is not None:
        from colocation_manager.serving import ReloadingCertificate, WebhookServer
        from colocation_manager.webhook import WebhookState, create_app

        state = WebhookState()
        watches.append(Informer(KubeHTTP(api_client, timeout=None), webhook_resources(), state, component="webhook",
                                options=options))
        if args.webhook_cert_secret:
            from colocation_manager.certs import CertKeeper

            keeper = CertKeeper(api, args.webhook_cert_namespace, args.webhook_cert_secret,
                                dns_names=args.webhook_dns_name, ips=args.webhook_ip, cert_dir=args.webhook_cert_dir,
                                webhooks=args.webhook_configuration)
            if not asyncio.run(_first_certificate(keeper, api)):
                return _fail(args, f"no webhook certificate in Secret {args.webhook_cert_namespace}/"
                             f"{args.webhook_cert_secret} after {FIRST_CERT_SECONDS:.0f} s", EXIT_FAILED)
        try:
            webhook = WebhookServer(create_app(state), webhook_listen[0], webhook_listen[1],
                                    ReloadingCertificate(args.webhook_cert, args.webhook_key),
                                    max_inflight=args.webhook_max_inflight)
        except OSError as exc:
            return _fail(args, f"cannot listen on {args.webhook_listen}: {exc}", EXIT_FAILED)
        except (ssl.SSLError, FileRefused) as exc:
            return _fail(args, f"cannot load --webhook-cert/--webhook-key: {exc}", EXIT_USAGE)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("manager started", identity=args.identity, lease=f"{args.lease_namespace}/{args.lease_name}",
                 config=f"{args.config_namespace}/{args.slo_config_name}")
        electing = asyncio.create_task(elector.run(stop))
        tasks = [asyncio.create_task(reconciler.run(stop))]
        if keeper is not None:
            tasks.append(asyncio.create_task(keeper.run(stop)))
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            stop.set()
            # the elector hands the Lease back when it sees stop (writes ended above)
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(electing, 15.0)
            await api.aclose()

    for w in watches:
        w.start_thread()  # each on its own thread and event loop
    if webhook is not None:
        webhook.start()  # its own thread and event loop: its traffic never delays the Lease
    try:
        asyncio.run(main())
    finally:
        if webhook is not None:
            webhook.stop()
        for w in watches:
            w.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    log.info("manager stopped")
    return EXIT_OK

"""``scheduler-ext``: run the extender (``serve``) or try a placement offline (``simulate``).

Who calls this: the console script. ``serve`` wires the pieces once: credentials
(``rhp_kube.credentials``), API client and watches (``scheduler_ext.kube`` over ``rhp_kube``),
cache (``scheduler_ext.state``), HA ledger
(``scheduler_ext.ledger``), binder (``scheduler_ext.binder``) and the HTTP app
(``scheduler_ext.server``) under uvicorn. ``simulate`` feeds the same cache from a document and
prints what filter, prioritize and bind would decide, without any cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import ssl
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from colocation_manager.cli import add_parser as add_manager_parser
from rhp_kube import credentials
from rhp_kube.liveness import DEAD_AFTER, Liveness, all_of
from rhp_ops import logs
from rhp_ops.build import extra_hint
from rhp_ops.cli import (
    FORMAT_HELP,
    LEVEL_HELP,
    Parser,
    add_global_flags,
    add_output_flag,
    add_version_flag,
    resolve_log_flags,
)
from rhp_ops.files import MAX_KUBECONFIG_BYTES, FileRefused, kubeconfig_files, read_regular_file
from rhp_ops.yamlsafe import DocumentError, load_document
from scheduler_ext.allocator import AllocationError
from scheduler_ext.cleanup import add_parser as add_cleanup_parser
from scheduler_ext.decide import DEFAULT_CONFIG, STRATEGIES, ExtenderConfig, evaluate, plan
from scheduler_ext.guard import MAX_BODY_BYTES, decode_pod, describe
from scheduler_ext.keystore import KeyStoreError, keys_from_cluster, public_keys_from_files, signer_from_file
from scheduler_ext.reserve import GC_AFTER as RESERVATION_GC_AFTER
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.trust import DEFAULT_TRUSTED_SCHEDULERS, TRUST_ALL, Trust

if TYPE_CHECKING:  # the [scheduler] extra: imported where serve runs, so --help and simulate need it not
    import uvicorn

__all__ = ["EXIT_OK", "EXIT_USAGE", "config_files_problem", "is_loopback", "main", "simulate", "tls_problem"]

EXIT_OK = 0
EXIT_SERVE_FAILED = 1  # serve: the listener could not start (address in use)
EXIT_INTERNAL = 1  # simulate: an unexpected failure (a bug); one line on stderr, no traceback
EXIT_USAGE = 2  # bad flags or configuration, or an input that cannot be read; argparse uses 2 too
EXIT_BAD_DOCUMENT = 3  # simulate: the document is not JSON/YAML or not of the documented shape
# seconds past --watch-idle-timeout after which a silent kind is stale; the ledger's TTL must
# exceed that staleness by as much again (watch lag)
STALE_MARGIN = 15.0

EXIT_CODES = """exit codes (each command's --help has its own):
  0  done, or stopped by a signal
  1  failed while running, or an internal error
  2  bad command line: unknown flag or value (one line on stderr), bad configuration or input file
  3  simulate: the document is not JSON or YAML of the documented shape"""

SIMULATE_EXIT_CODES = """exit codes:
  0  the placement was computed; the JSON document is on stdout
  1  an unexpected internal error (reported on stderr in one line)
  2  bad flags, or the input cannot be read (missing file, no permission, not UTF-8)
  3  the document is not JSON or YAML, or not {"objects": [...], "pod": {...}}

stdout carries only the result document; messages and logs go to stderr. Objects that cannot
be read (wrong types, malformed annotations) are skipped as the extender's watch skips them,
logged on stderr and listed under "skipped"; a pod that cannot be decoded is reported as
infeasible on every node with the reason."""

SERVE_EXIT_CODES = """exit codes:
  0  stopped by a signal
  1  the listener could not start (for example the address is in use), or --key-secret could not
     get or publish the signing keys
  2  bad flags or configuration: a non-loopback --listen without --tls-cert, --tls-key and
     --tls-client-ca (and without --insecure), unreadable TLS files, no API server configuration,
     neither --signing-key-file nor --key-secret, or an unreadable key or public-key file"""


def _fail(command: str, message: str, code: int) -> int:
    print(f"scheduler-ext {command}: {message}", file=sys.stderr)
    return code


def _configure_logging(level: str, fmt: str) -> None:
    """Logs go to stderr only (stdout is for results): the shared set-up of ``rhp_ops.logs``,
    which also formats the standard ``logging`` module (uvicorn, urllib3, kubernetes)."""
    logs.configure(fmt, level)


def format_simulation(out: Mapping[str, Any]) -> str:
    """``simulate``'s result for people: the selected node, then one line per node."""
    lines = [f"pod:      {out['pod']}", f"selected: {out['selected'] or '(no feasible node)'}"]
    nodes = out["nodes"]
    width = max([4, *(len(n["name"]) for n in nodes)])
    lines.append(f"{'NODE':<{width}}  FEASIBLE  SCORE  REASON")
    for n in nodes:
        feasible = "yes" if n["feasible"] else "no"
        lines.append(f"{n['name']:<{width}}  {feasible:<8}  {n['score']:>5}  {n['reason'] or ''}".rstrip())
        for key, value in sorted(n["annotations"].items()):
            lines.append(f"{'':<{width}}  {key}: {value}")
    if out["skipped"]:
        lines.append("skipped: " + ", ".join(map(str, out["skipped"])))
    return "\n".join(lines)


def simulate(
    doc: Mapping[str, Any], cfg: ExtenderConfig = DEFAULT_CONFIG, trust: Trust | None = None
) -> dict[str, Any]:
    """Filter, score and plan the bind of ``doc["pod"]`` over ``doc["objects"]``.

    Placed pods' allocation annotations are judged by ``trust`` as the live extender judges them
    (``scheduler_ext.trust``; default: no public key and the default trusted schedulers, so only
    pods of those schedulers count, and signatures by unknown keys count within their pod's
    request); ``TRUST_ALL`` counts every annotation as written (``--trust-all``).

    Returns ``{"pod", "nodes": [{"name", "feasible", "unresolvable", "reason", "score",
    "annotations"}], "selected", "skipped"}`` where ``annotations`` is exactly what a bind would
    write and ``skipped`` names the objects that could not be read. The selected node is the
    feasible one with the highest score, ties by name. Raises ``ValueError`` when the document
    does not have that shape.
    """
    objects = doc.get("objects")
    objects = [] if objects is None else objects
    pod_json = doc.get("pod")
    if not isinstance(objects, list) or not isinstance(pod_json, dict):
        raise ValueError('the document needs "objects" (a list) and "pod" (an object)')
    state = ClusterState(Trust() if trust is None else trust)
    skipped = load_objects(state, objects)
    pod = decode_pod(pod_json)
    nodes: list[dict[str, Any]] = []
    with state.lock:
        for name in sorted(n for n, ns in state.nodes.items() if ns.node_seen):
            ns = state.nodes[name]
            verdict = evaluate(ns, pod, cfg)
            annotations: dict[str, str] = {}
            feasible, reason = verdict.ok, verdict.reason
            if feasible:
                try:
                    annotations = dict(plan(ns, pod, cfg).annotations)
                except AllocationError as exc:
                    feasible, reason = False, str(exc)
            nodes.append(
                {
                    "name": name,
                    "feasible": feasible,
                    "unresolvable": verdict.unresolvable,
                    "reason": reason,
                    "score": verdict.score if feasible else 0,
                    "annotations": annotations,
                }
            )
    best = sorted((n for n in nodes if n["feasible"]), key=lambda n: (-n["score"], n["name"]))
    return {
        "pod": pod.full_name,
        "nodes": nodes,
        "selected": best[0]["name"] if best else None,
        "skipped": skipped,
    }


class _Unreadable(Exception):
    """The input cannot be read at all (exit 2)."""


class _BadDocument(Exception):
    """The input is not a JSON or YAML document of the expected shape (exit 3)."""


# The largest document ``simulate`` reads (a cluster's objects as JSON or YAML).
MAX_SIMULATE_BYTES = 64 << 20


def _read_doc(path: str) -> dict[str, Any]:
    """``simulate``'s document, read bounded (``MAX_SIMULATE_BYTES``; a path through the one
    reader of files, regular files only) and parsed by the one reader of documents
    (``rhp_ops.yamlsafe``: JSON, else YAML without anchors or aliases)."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_SIMULATE_BYTES + 1)
            if len(raw) > MAX_SIMULATE_BYTES:
                raise _Unreadable(f"{path}: larger than {MAX_SIMULATE_BYTES} bytes")
        else:
            raw = read_regular_file(path, limit=MAX_SIMULATE_BYTES)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except FileRefused as exc:
        raise _Unreadable(f"{path}: {exc.message}") from None
    except OSError as exc:
        raise _Unreadable(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = load_document(text, max_bytes=MAX_SIMULATE_BYTES)
    except DocumentError as exc:
        reason = str(exc)
        if reason.startswith("not valid YAML"):
            reason = f"neither JSON nor YAML: {reason}"
        raise _BadDocument(f"{path}: {reason[:400]}") from None
    if not isinstance(doc, dict):
        raise _BadDocument(f"{path}: the document must be an object with \"objects\" and \"pod\"")
    return doc


def _cmd_simulate(args: argparse.Namespace) -> int:
    try:
        doc = _read_doc(args.input)
        try:
            public = public_keys_from_files(args.public_key_file)
            trust = TRUST_ALL if args.trust_all else Trust.of(None, _names(args), public)
        except KeyStoreError as exc:
            raise _Unreadable(f"--public-key-file {' '.join(str(exc).split())}") from None
        try:
            out = simulate(doc, ExtenderConfig(args.score_strategy, args.gpu_strategy), trust)
        except ValueError as exc:
            raise _BadDocument(f"{args.input}: {exc}") from None
        text = format_simulation(out) if args.output == "text" else json.dumps(out, indent=2 if args.pretty else None)
    except _Unreadable as exc:
        return _fail("simulate", str(exc), EXIT_USAGE)
    except _BadDocument as exc:
        return _fail("simulate", str(exc), EXIT_BAD_DOCUMENT)
    except Exception as exc:  # the last line: a bug must not print a traceback either
        return _fail("simulate", f"internal error: {describe(exc)}", EXIT_INTERNAL)
    sys.stdout.write(text + "\n")
    for name in out["skipped"]:
        print(f"scheduler-ext simulate: skipped {name}", file=sys.stderr)
    return EXIT_OK


def _host_port(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (IPv6 hosts in brackets) -> (host without brackets, port); ``None`` if bad."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return None
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address literal or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything, so it counts as reachable


def tls_problem(args: argparse.Namespace, host: str) -> str:
    """Why ``serve`` must refuse to start with these TLS flags on ``host`` ("" when it may start).

    The verbs can bind any pending pod, so a listener that other machines can reach must serve
    HTTPS and require client certificates from ``--tls-client-ca``; ``--insecure`` overrides
    that (the caller logs a warning). Loopback listeners may serve plain HTTP.
    """
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    if args.tls_client_ca and not args.tls_cert:
        return "--tls-client-ca needs --tls-cert and --tls-key"
    if is_loopback(host) or args.insecure:
        return ""
    if not (args.tls_cert and args.tls_client_ca):
        return (
            f"refusing to serve the extender verbs on {host}, reachable from other machines, "
            "without --tls-cert, --tls-key and --tls-client-ca: anyone who can connect could "
            "bind pending pods. Give the three TLS flags, listen on a loopback address "
            "(--listen 127.0.0.1:PORT), or pass --insecure to accept the risk"
        )
    return ""


# A PEM certificate chain, key or CA bundle.
MAX_PEM_BYTES = 1 << 20


def config_files_problem(args: argparse.Namespace) -> str:
    """Why a file ``serve`` was told to read cannot be ("" when each can): each of
    ``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` and the kubeconfig (``--kubeconfig``,
    each file of a ``KUBECONFIG``-style list, else ``~/.kube/config`` when it exists) is read
    once by the one reader of configured files (``rhp_ops.files.read_regular_file``), so a FIFO,
    a socket, a device, a directory or a huge file is a one-line error instead of a hang in the
    TLS or kubeconfig loader, which then read the files again by path (and report a missing
    file in their own words)."""
    files = [(flag, path, MAX_PEM_BYTES) for flag, path in
             (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-client-ca", args.tls_client_ca))
             if path]
    if not args.api_server and not args.in_cluster:
        files += [("--kubeconfig", p, MAX_KUBECONFIG_BYTES) for p in kubeconfig_files(args.kubeconfig)]
    for flag, path, limit in files:
        try:
            read_regular_file(path, limit=limit)
        except FileRefused as exc:
            if exc.reason != "missing":  # a missing file gets the loader's own message
                return f"{flag} {path}: {exc.message}"
    return ""


def _tls_context_error(args: argparse.Namespace) -> str:
    """Load the TLS files once before serving, so a bad file is a message, not a traceback."""
    if not args.tls_cert:
        return ""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load --tls-cert/--tls-key: {exc}"
    if args.tls_client_ca:
        try:
            ctx.load_verify_locations(cafile=args.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            return f"cannot load --tls-client-ca: {exc}"
    return ""


def _no_signal_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that leaves signal handling to the main server next to it."""
    import uvicorn

    class NoSignalServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return NoSignalServer(config)


def _uvicorn_config(app: Any, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        log_config=None,  # uvicorn's records go through the shared set-up (rhp_ops.logs)
        access_log=False,
        http="httptools",  # the C parser: h11 cost ~0.2 ms of CPU per verb call
        proxy_headers=False,  # kube-scheduler calls directly; no X-Forwarded-* to honour
        timeout_keep_alive=60,
        **kwargs,
    )


async def _serve_all(main_server: uvicorn.Server, health: uvicorn.Server | None) -> None:
    task = asyncio.create_task(health.serve()) if health is not None else None
    try:
        await main_server.serve()
    finally:
        if health is not None and task is not None:
            health.should_exit = True
            await task


def _names(args: argparse.Namespace) -> list[str]:
    return [n.strip() for n in args.trusted_scheduler_names.split(",")]


def _trust_from_files(args: argparse.Namespace) -> Trust | str:
    """The ``Trust`` from ``--signing-key-file``, ``--public-key-file`` and
    ``--trusted-scheduler-names`` (with ``--key-secret``: ``_trust_from_cluster``), or why not."""
    if args.key_secret:
        if args.signing_key_file:
            return "--signing-key-file and --key-secret exclude each other"
        return Trust()  # completed by _trust_from_cluster once the API client exists
    if not args.signing_key_file:
        return ("a signing key is required (--signing-key-file, or --key-secret to keep it in a Secret): binds "
                "sign the annotations they write with it, and only signed allocations (or those of "
                "--trusted-scheduler-names) are counted and honoured by the nodes; every replica needs the "
                "same key (see scheduler_ext/README.md)")
    try:
        signer = signer_from_file(args.signing_key_file)
    except KeyStoreError as exc:
        return f"--signing-key-file {' '.join(str(exc).split())}"
    try:
        public = public_keys_from_files(args.public_key_file)
    except KeyStoreError as exc:
        return f"--public-key-file {' '.join(str(exc).split())}"
    return Trust.of(signer, _names(args), public)


def _trust_from_cluster(args: argparse.Namespace, api_client: Any) -> Trust | str:  # Any: kubernetes.client.ApiClient
    """``--key-secret``: the signing key from that Secret (made when absent), every public key of
    ``--public-keys-configmap`` (the signing key's published there) and of ``--public-key-file``."""
    from scheduler_ext.errors import APIError
    from scheduler_ext.kube import KubeKeyAPI

    key_api = KubeKeyAPI(api_client)
    try:
        public = public_keys_from_files(args.public_key_file)
        signer, published = keys_from_cluster(key_api, args.ledger_namespace, args.key_secret,
                                              args.public_keys_configmap or f"{args.key_secret}-public")  # fmt: skip
    except (KeyStoreError, APIError) as exc:
        return f"cannot get the signing keys: {' '.join(str(exc).split())}"
    finally:
        key_api.close()
    return Trust.of(signer, _names(args), [*published, *public])


def _cmd_serve(args: argparse.Namespace) -> int:
    from scheduler_ext.extra import EXIT_MISSING_EXTRA, missing

    absent = missing()
    if absent:
        return _fail("serve", f"the extender's dependencies are not installed ({', '.join(absent)}): "
                     f"{extra_hint('scheduler')}", EXIT_MISSING_EXTRA)
    return _serve(args)


# long: the extender's composition root, wiring each part in the order it starts and stops
def _serve(args: argparse.Namespace) -> int:
    from rhp_kube.http import KubeHTTP
    from rhp_kube.watch import WatchOptions
    from scheduler_ext.binder import Binder
    from scheduler_ext.kube import BindClient, watch_cluster
    from scheduler_ext.ledger import LeaseLedger
    from scheduler_ext.requeue import Requeuer
    from scheduler_ext.server import create_app, create_health_app

    log = structlog.get_logger("scheduler_ext.cli")
    listen = _host_port(args.listen)
    if listen is None:
        return _fail("serve", "--listen must be HOST:PORT", EXIT_USAGE)
    host, port = listen
    health_listen = _host_port(args.health_listen) if args.health_listen else None
    if args.health_listen and health_listen is None:
        return _fail("serve", "--health-listen must be HOST:PORT", EXIT_USAGE)
    problem = tls_problem(args, host) or config_files_problem(args) or _tls_context_error(args)
    if problem:
        return _fail("serve", problem, EXIT_USAGE)
    if not is_loopback(host) and not (args.tls_cert and args.tls_client_ca):
        log.warning(
            "INSECURE: the extender verbs are served without client certificates on an address "
            "other machines can reach; anyone who can connect can bind pending pods",
            listen=args.listen,
            tls=bool(args.tls_cert),
            client_ca=bool(args.tls_client_ca),
        )
    cfg = ExtenderConfig(args.score_strategy, args.gpu_strategy)
    if args.api_server:
        api_client = credentials.plain(args.api_server)
    else:
        try:
            api_client = credentials.from_args(args)
        except Exception as exc:  # the kubernetes config loaders raise their own types
            return _fail("serve", f"cannot load the API server configuration: {exc}", EXIT_USAGE)
    trust = _trust_from_files(args)
    if isinstance(trust, str):
        return _fail("serve", trust, EXIT_USAGE)
    if args.key_secret:
        trust = _trust_from_cluster(args, api_client)
        if isinstance(trust, str):
            return _fail("serve", trust, EXIT_SERVE_FAILED)
    from scheduler_ext.extconfig import ConfigError, ExtenderFileConfig, read_config_file

    try:
        file_cfg = read_config_file(args.config) if args.config else ExtenderFileConfig()
    except ConfigError as exc:
        return _fail("serve", f"--config {exc}", EXIT_USAGE)
    if args.watch_timeout < 1 or args.watch_idle_timeout <= args.watch_timeout:
        return _fail("serve", "--watch-idle-timeout must be longer than --watch-timeout (at least 1 s)", EXIT_USAGE)
    stale_after = args.watch_idle_timeout + STALE_MARGIN
    if args.watch_dead_after < stale_after + STALE_MARGIN:
        return _fail("serve", f"--watch-dead-after must be at least --watch-idle-timeout + {2 * STALE_MARGIN:g} s "
                     f"({stale_after + STALE_MARGIN:g})", EXIT_USAGE)
    if args.ha_ledger and args.ledger_ttl < stale_after + STALE_MARGIN:
        # a replica binds only while its watch heard from the API server within ``stale_after``;
        # an entry leaves the Lease no sooner than its TTL: the TTL must cover that plus watch lag
        return _fail("serve", f"--ledger-ttl must be at least --watch-idle-timeout + {2 * STALE_MARGIN:g} s "
                     f"({stale_after + STALE_MARGIN:g})", EXIT_USAGE)
    try:
        bind_api = BindClient(api_client, timeout=args.api_timeout)
        watch_api = KubeHTTP(api_client, timeout=None)  # the watches' own, on their loop (each list page bounded)
    except (ValueError, OSError) as exc:  # unsupported proxy, unreadable TLS files
        return _fail("serve", f"cannot talk to the API server: {exc}", EXIT_USAGE)
    state = ClusterState(trust, load_args=file_cfg.load_aware)
    # a kind whose watch said nothing for this long is stale: the idle timeout has cut the
    # silent stream and a fresh list had time to answer
    state.stale_after = stale_after
    store = None
    if args.place_reservations:
        from scheduler_ext.reserver import ReservationStore

        store = ReservationStore()
    watches = watch_cluster(state, watch_api, WatchOptions(
        watch_timeout=args.watch_timeout, read_deadline=args.watch_idle_timeout, dead_after=args.watch_dead_after),
        store)
    ledger = None
    if args.ha_ledger:
        ledger = LeaseLedger(
            bind_api,
            args.ledger_namespace,
            identity=args.identity,
            ttl=args.ledger_ttl,
            is_deleted=state.recently_deleted,
            settled=state.settled,
        )
    binder = Binder(state, bind_api, cfg, ledger)
    requeuer = None
    if args.topology_requeue_rate > 0:
        requeuer = Requeuer(bind_api, state.with_topology, rate=args.topology_requeue_rate,
                            fresh=lambda: not state.stale_kinds())
    background = []
    liveness: Liveness = watches.liveness
    if store is not None:
        from scheduler_ext.reserver import reservation_controller

        controller = reservation_controller(state, store, bind_api, binder, cfg, args.ledger_namespace,
                                            args.reservation_lease, args.identity,
                                            gc_after=args.reservation_gc_after)
        background.append(controller)
        liveness = all_of(watches.liveness, controller.liveness)  # its loop's death fails /healthz too
    app = create_app(state, binder, cfg, prefix=args.path_prefix, max_body=args.max_body_bytes, requeuer=requeuer,
                     liveness=liveness, background=background)
    log.info("serving", listen=args.listen, ha_ledger=bool(ledger), load_aware=state.load_args is not None,
             tls=bool(args.tls_cert), client_certificates=bool(args.tls_client_ca),
             health_listen=args.health_listen or None)
    ssl_kwargs: dict[str, Any] = {}
    if args.tls_cert:
        ssl_kwargs = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key}
        if args.tls_client_ca:
            ssl_kwargs.update(ssl_ca_certs=args.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval)
    import uvicorn

    main_server = uvicorn.Server(_uvicorn_config(app, host, port, **ssl_kwargs))
    health = None
    if health_listen is not None:
        health = _no_signal_server(
            _uvicorn_config(create_health_app(state, liveness), health_listen[0], health_listen[1],
                            lifespan="off")
        )
    try:
        # the loop uvicorn.run would make: uvloop when installed (about a third less CPU per verb)
        with asyncio.Runner(loop_factory=main_server.config.get_loop_factory()) as runner:
            runner.run(_serve_all(main_server, health))
    finally:
        watches.close()
    return EXIT_OK if main_server.started else EXIT_SERVE_FAILED


# long: one add_argument per flag, in the order --help lists them
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="scheduler-ext",
        description="kube-scheduler extender: exact CPU, NUMA and GPU allocation with Koordinator's formats.",
        epilog=EXIT_CODES,
    )
    add_version_flag(parser, "scheduler-ext")
    add_global_flags(parser, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def scoring(p: argparse.ArgumentParser) -> None:
        p.add_argument("--score-strategy", choices=STRATEGIES, default=DEFAULT_CONFIG.score_strategy,
                       help="node CPU score: LeastAllocated spreads, MostAllocated packs")
        p.add_argument("--gpu-strategy", choices=STRATEGIES, default=DEFAULT_CONFIG.gpu_strategy,
                       help="node GPU score and the GPU order inside a node")

    def public_keys(p: argparse.ArgumentParser) -> None:
        p.add_argument("--public-key-file", action="append", default=[], metavar="PATH",
                       help="a public-key list ('ed25519 BASE64' lines) whose keys verify allocation signatures "
                            "too (earlier keys after a rotation); repeatable")

    def trusted_schedulers(p: argparse.ArgumentParser) -> None:
        p.add_argument("--trusted-scheduler-names", default=",".join(DEFAULT_TRUSTED_SCHEDULERS), metavar="NAMES",
                       help="comma-separated spec.schedulerName values whose pods' allocation annotations count "
                            "unsigned (default %(default)s; empty for none): a trust assumption, see "
                            "scheduler_ext/README.md")

    serve = sub.add_parser("serve", help="run the HTTP extender", epilog=SERVE_EXIT_CODES,
                           description="Run the HTTP extender (filter, prioritize, bind) for kube-scheduler.")
    serve.add_argument("--listen", default="127.0.0.1:8888",
                       help="HOST:PORT (default %(default)s, kube-scheduler in the same pod or on the same "
                            "host); any address but loopback needs --tls-cert, --tls-key and --tls-client-ca, "
                            "or --insecure")
    serve.add_argument("--config", default="", metavar="FILE",
                       help="the extender's config file (JSON or YAML); its loadAware section turns on "
                            "load-aware scheduling with koord-scheduler's LoadAwareSchedulingArgs (off without it)")
    serve.add_argument("--path-prefix", default="", help="URL prefix of the verbs, e.g. /scheduler")
    serve.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, metavar="BYTES",
                       help="largest verb request body (default %(default)s); a larger one is refused "
                            "with the verb's error reply before it is read")
    credentials.add_flags(serve)
    serve.add_argument("--api-server", default="", help="plain API URL without credentials (tests)")
    serve.add_argument("--tls-cert", default="", help="serve HTTPS with this certificate")
    serve.add_argument("--tls-key", default="", help="private key of --tls-cert")
    serve.add_argument("--tls-client-ca", default="",
                       help="require and verify client certificates signed by this CA")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback --listen without --tls-cert, --tls-key and "
                            "--tls-client-ca (anyone who can connect can bind pods; logs a warning)")
    serve.add_argument("--health-listen", default="", metavar="HOST:PORT",
                       help="also serve GET /healthz, /readyz and /metrics (never the verbs) in plain "
                            "HTTP here, for kubelet probes and scrapers without client certificates")
    serve.add_argument("--ha-ledger", action=argparse.BooleanOptionalAction, default=True,
                       help="serialise binds per node across replicas through Leases (default on)")
    serve.add_argument("--ledger-namespace", default=os.environ.get("POD_NAMESPACE", "kube-system"))
    serve.add_argument("--ledger-ttl", type=float, default=120.0,
                       help="seconds a ledger entry lives at least (default %(default)s); past it, an entry stays "
                            "until this replica's watch has settled it (the pod seen bound, deleted, or the watch "
                            "alive after that time)")
    serve.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()))
    serve.add_argument("--place-reservations", action=argparse.BooleanOptionalAction, default=True,
                       help="place pending Koordinator Reservations, keep their owners and expire them (default "
                            "on; one replica at a time, by the Lease --reservation-lease in --ledger-namespace)")
    serve.add_argument("--reservation-lease", default="scheduler-ext.reservations", metavar="NAME",
                       help="the Lease the reservation controller's replicas elect a leader by (default "
                            "%(default)s: no node's HA-ledger Lease, scheduler-ext-<node>, can have that name)")
    serve.add_argument("--reservation-gc-after", type=float, default=RESERVATION_GC_AFTER, metavar="SECONDS",
                       help="delete a Failed (expired) or Succeeded Reservation this long after it became so, as "
                            "Koordinator's reservation GC does (default %(default)s, Koordinator's 24h; 0 never)")
    serve.add_argument("--watch-timeout", type=int, default=60,
                       help="seconds after which the API server ends each watch stream (timeoutSeconds; "
                            "default %(default)s)")
    serve.add_argument("--watch-idle-timeout", type=float, default=90.0, metavar="SECONDS",
                       help="a watch stream silent this long (no event, bookmark or end) is dropped and the "
                            "watch resumed (default %(default)s); 15 s later a kind still without a word "
                            "makes /readyz fail and binds refused")
    serve.add_argument("--watch-dead-after", type=float, default=DEAD_AFTER, metavar="SECONDS",
                       help="a watch without a word from the API server (no event, bookmark, end of stream or "
                            "list) for this long makes /healthz fail, so kubelet restarts the extender "
                            "(default %(default)s; at least --watch-idle-timeout + 30)")
    serve.add_argument("--signing-key-file", default="", metavar="PATH",
                       help="the Ed25519 private key (PKCS#8 PEM) binds sign their annotations with; the same on "
                            "every replica. This or --key-secret is required")
    serve.add_argument("--key-secret", default="", metavar="NAME",
                       help="keep the signing key in this Secret of --ledger-namespace: read it, or make a key and "
                            "create the Secret when it does not exist (the first replica wins, the others read "
                            "its key); publish the public key in --public-keys-configmap")
    serve.add_argument("--public-keys-configmap", default="", metavar="NAME",
                       help="with --key-secret: the ConfigMap (key 'public-keys') the public keys are published in "
                            "and read from, old ones kept (default: the Secret's name + '-public')")
    public_keys(serve)
    trusted_schedulers(serve)
    serve.add_argument("--topology-requeue-rate", type=float, default=20.0, metavar="PODS_PER_SECOND",
                       help="at most this many pods a second refused for a node's missing CPU topology (or while "
                            "the cache was stale) get the annotation that makes kube-scheduler retry them once "
                            "the topology appears (or the cache is fresh) (default %(default)s; 0 turns it off)")
    serve.add_argument("--api-timeout", type=float, default=5.0, metavar="SECONDS",
                       help="limit of each API call a bind makes (default %(default)s); a call that "
                            "runs out fails the bind, which is rolled back")
    serve.add_argument("--switch-interval", type=float, default=0.0005, metavar="SECONDS",
                       help="Python's thread switch interval (sys.setswitchinterval; default %(default)s): "
                            "short, so the verb loop is not kept waiting by the watch threads")
    add_global_flags(serve, subcommand=True, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    scoring(serve)
    serve.set_defaults(func=_cmd_serve)

    sim = sub.add_parser("simulate", help="dry-run one pod against objects from a JSON/YAML document",
                         description="Show where one pod would go and what bind would write, without a cluster.",
                         epilog=SIMULATE_EXIT_CODES)
    sim.add_argument("input", nargs="?", default="-", help="document path, '-' for stdin")
    add_output_flag(sim, default="json")
    sim.add_argument("--pretty", action="store_true", help="with --output json: indent the JSON")
    public_keys(sim)
    trusted_schedulers(sim)
    sim.add_argument("--trust-all", action="store_true",
                     help="count every placed pod's allocation annotations as written, signed or not (what-if "
                          "documents); without it they are judged as the live extender judges them")
    add_global_flags(sim, subcommand=True, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    scoring(sim)
    sim.set_defaults(func=_cmd_simulate)
    add_manager_parser(sub, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    add_cleanup_parser(sub, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(*resolve_log_flags(args, server=args.command in ("serve", "manager")))
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

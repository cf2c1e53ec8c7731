"""``runtime-proxy hook-server``: our plugins served over Koordinator's RuntimeHookService.

Any proxy that speaks ``runtime.v1alpha1`` (koord-runtime-proxy, or our own proxy in another
process) can then call the built-in plugins and the third-party plugins of the
``runtime_hook_proxy.plugins`` entry-point group. The parts (plugins, pipeline with the order,
policies and timeouts of ``--config``, node config, applier) come from
``runtime_proxy.compose.build``; each hook call is answered by
``runtime_proxy.hookserver.door.HookService`` (the hook server door), which says what a call gets.
``--no-apply`` logs the plans' file part and leaves it to the caller; ``--dry-run`` answers with
the unchanged request and applies nothing.

With ``--register-dir`` the server writes its registration (``<name>.json``, atomically, mode
0644 in a directory of mode 0755, as the proxy's registry requires) once it listens, and removes
it on a clean exit unless ``--keep-registration``.

With ``--metrics-addr HOST:PORT`` it serves ``/metrics``, ``/healthz`` and ``/readyz`` (ready
while the hook socket accepts connections), as ``serve`` and ``nri`` do.

The listen socket: a stale socket (nobody accepts on it) is replaced; a regular file, a
directory, anything else, or a socket another process serves is refused and left alone. The new
socket's mode is 0660 whatever the umask.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from hooks.spec import KOORD_HOOK_POINTS
from runtime_proxy import compose, metrics
from runtime_proxy.commands import HELP
from runtime_proxy.compose import Parts
from runtime_proxy.config import ProxyConfig, check_usable, load_config
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.hookclient.registration import strip_unix
from runtime_proxy.hookserver.door import HookService
from runtime_proxy.process import EXIT_CODES_EPILOG, EXIT_USAGE, run_main

log = structlog.get_logger(__name__)

__all__ = [
    "HookServerOptions",
    "add_parser",
    "build",
    "main_from_args",
    "prepare_listen_path",
    "registration_document",
    "serve",
    "write_registration",
]

DEFAULT_NAME = "runtime-hook-proxy"
SOCKET_MODE = 0o660


@dataclass
class HookServerOptions:
    listen: str
    config: ProxyConfig = field(default_factory=ProxyConfig)
    register_dir: str | None = None
    register_name: str = DEFAULT_NAME
    register_endpoint: str | None = None
    failure_policy: str = "Ignore"
    hooks: list[str] | None = None
    register_timeout: float | None = None
    keep_registration: bool = False
    builtins: tuple[str, ...] | None = None
    entry_points: bool = True
    plugins: tuple[str, ...] = ()
    apply: bool = True
    dry_run: bool = False
    metrics_addr: str | None = None


def served_hooks(pipeline: Pipeline, *, apply: bool) -> list[str]:
    """Koordinator hook points with at least one plugin implementing them (plus
    PreStartContainer with PreCreateContainer, to apply writes that need the container id)."""
    hooks = [h for h in KOORD_HOOK_POINTS if pipeline.has_work(h)]
    if apply and "PreCreateContainer" in hooks and "PreStartContainer" not in hooks:
        hooks.insert(hooks.index("PreCreateContainer") + 1, "PreStartContainer")
    return hooks


def registration_document(endpoint: str, policy: str, hooks: list[str], timeout: float | None) -> dict[str, object]:
    doc: dict[str, object] = {"remote-endpoint": endpoint, "failure-policy": policy, "runtime-hooks": hooks}
    if timeout is not None:
        doc["timeout-seconds"] = timeout
    return doc


def write_registration(directory: str, name: str, doc: dict[str, object]) -> Path:
    """Write ``<directory>/<name>.json`` atomically (a dot-file that does not end in .json, renamed)."""
    target_dir = Path(directory)
    if not target_dir.is_dir():
        target_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(target_dir, 0o755)
    target = target_dir / f"{name}.json"
    tmp = target_dir / f".{name}.json.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, target)
    return target


def build(opts: HookServerOptions) -> Parts:
    """The parts ``opts`` describes (``runtime_proxy.compose.build``). Raises
    ``PluginLoadError`` when a plugin cannot be imported, registered or configured, and
    ``ConfigError`` when the config names a missing node config file or needs a client that is
    not installed (``runtime_proxy.config.check_usable``)."""
    check_usable(opts.config)
    return compose.build(opts.config, dry_run=opts.dry_run, builtins=opts.builtins,
                         entry_points=opts.entry_points, specs=opts.plugins)


def prepare_listen_path(path: str) -> None:
    """Make ``path`` free for a new unix socket: create its directory, remove a stale socket.
    Raises ``FileExistsError`` for anything that is not a socket and ``OSError`` (EADDRINUSE)
    for a socket another process accepts on; neither is touched."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
        raise FileExistsError(errno.EEXIST, f"listen path exists and is a {kind}, not a socket; left alone", path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as exc:
        raise OSError(errno.EADDRINUSE, f"listen socket exists and cannot be probed ({exc}); left alone",
                      path) from exc
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, "another process serves this socket; left alone", path)


async def serve(opts: HookServerOptions, stop: asyncio.Event | None = None, parts: Parts | None = None) -> None:
    """Listen on ``opts.listen`` until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is None)."""
    if parts is None:
        parts = build(opts)
    pipeline, node_watch = parts.pipeline, parts.node_source
    applier = parts.applier if opts.apply or parts.dry_run else None
    service = HookService(pipeline, parts.node_source, applier, events=parts.events)
    listen = strip_unix(opts.listen)
    prepare_listen_path(listen)
    metrics_server = None
    if opts.metrics_addr:  # first: a port in use fails the start before anything is made
        # /readyz: the hook socket accepts a connection now (the gRPC server behind it answers).
        metrics_server = metrics.serve(opts.metrics_addr, lambda: metrics.socket_accepts(listen), parts.liveness)
    # gRPC is imported here, not with the module: ``runtime-proxy`` builds every sub-command's
    # parser from this module, and ``nri`` never needs the library.
    import grpc

    from cri_protos import hookserver_pb2_grpc

    server = grpc.aio.server()
    hookserver_pb2_grpc.add_RuntimeHookServiceServicer_to_server(service, server)
    old_umask = os.umask(0o117)
    try:
        bound = server.add_insecure_port(f"unix://{listen}")
    except RuntimeError as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot bind the listen socket: {exc}", listen) from exc
    finally:
        os.umask(old_umask)
    if not bound:
        raise OSError(errno.EADDRNOTAVAIL, "cannot bind the listen socket", listen)
    os.chmod(listen, SOCKET_MODE)
    if node_watch is not None:
        await node_watch.start()
    await server.start()
    hooks = opts.hooks if opts.hooks is not None else served_hooks(pipeline, apply=opts.apply and not parts.dry_run)
    registered: Path | None = None
    if opts.register_dir:
        doc = registration_document(
            opts.register_endpoint or listen, opts.failure_policy, hooks, opts.register_timeout
        )
        registered = write_registration(opts.register_dir, opts.register_name, doc)
    log.info("hook server listening", listen=listen, hooks=hooks, registration=str(registered or ""),
             plugins=[s.name for s in pipeline.steps], metrics=opts.metrics_addr or "")
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if registered is not None and not opts.keep_registration:
            with contextlib.suppress(FileNotFoundError):
                registered.unlink()
        await server.stop(2.0)
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.shutdown)
            metrics_server.server_close()
        parts.events.close()
        if node_watch is not None:
            with contextlib.suppress(Exception):
                await node_watch.stop()
        _remove_own_socket(listen)
        log.info("hook server stopped")


def _remove_own_socket(path: str) -> None:
    """Remove our listen socket on exit; anything else found there by now is left alone."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


DESCRIPTION = """\
Serve the built-in and installed plugins over Koordinator's RuntimeHookService on a unix socket,
for koord-runtime-proxy or another runtime-proxy. Writes a registration file with --register-dir.
The plans' cgroup and resctrl writes are applied here (--no-apply leaves them out)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("hook-server", help=HELP["hook-server"],
                       description=DESCRIPTION, epilog=EXIT_CODES_EPILOG)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``runtime-proxy hook-server``."""
    p.add_argument("--listen", required=True, help="unix socket to serve RuntimeHookService on")
    p.add_argument("--config", help="plugin config file (YAML or JSON), as for serve")
    p.add_argument("--register-dir", help="write a registration file here (e.g. /etc/runtime/hookserver.d)")
    p.add_argument("--register-name", default=DEFAULT_NAME, help="registration file name without .json")
    p.add_argument("--register-endpoint",
                   help="socket path written into the registration (default: --listen; differs in a container)")
    p.add_argument("--failure-policy", choices=("Fail", "Ignore"), default="Ignore",
                   help="failure-policy written into the registration (default %(default)s)")
    p.add_argument("--hooks", nargs="+", choices=list(KOORD_HOOK_POINTS), metavar="HOOK",
                   help="hook points to register (default: every one a plugin implements)")
    p.add_argument("--timeout-seconds", type=float, dest="register_timeout",
                   help="timeout-seconds written into the registration (our extension)")
    p.add_argument("--keep-registration", action="store_true", help="leave the registration file on exit")
    p.add_argument("--builtins", help="comma-separated built-in plugins to load ('' for none; default all)")
    p.add_argument("--no-entry-points", action="store_true", help="do not load third-party plugins")
    p.add_argument("--plugin-module", action="append", default=[], metavar="MODULE[:ATTR]",
                   help="register an importable plugin (a module, or a class/object in it); repeatable")
    p.add_argument("--node-config", help="node config file (NodeSLO spec, node labels and annotations)")
    p.add_argument("--cgroup-root", help="cgroup filesystem root (default /sys/fs/cgroup)")
    p.add_argument("--cgroup-driver", choices=("cgroupfs", "systemd"), help="kubelet's cgroup driver")
    p.add_argument("--resctrl-root", help="resctrl filesystem root (default /sys/fs/resctrl)")
    p.add_argument("--no-apply", action="store_true",
                   help="do not perform cgroup/resctrl writes (logged; the protocol cannot carry them)")
    p.add_argument("--dry-run", action="store_true", help="answer with the unchanged request, apply nothing")
    p.add_argument("--metrics-addr",
                   help="HOST:PORT to serve Prometheus metrics, /healthz and /readyz on (:PORT is loopback)")


def options_from_namespace(args: argparse.Namespace) -> HookServerOptions:
    """``HookServerOptions`` from parsed flags; raises ``ValueError`` for a bad value or config."""
    cfg = compose.with_flags(load_config(args.config), args)
    builtins = None if args.builtins is None else tuple(b.strip() for b in args.builtins.split(",") if b.strip())
    listen = strip_unix(args.listen)
    if not listen or "\x00" in listen:
        raise ValueError("--listen must be a unix socket path")
    if args.register_timeout is not None and not 0 < args.register_timeout <= 300:
        raise ValueError("--timeout-seconds must be in (0, 300]")
    if "/" in args.register_name or args.register_name in ("", ".", ".."):
        raise ValueError("--register-name must be a plain file name without .json")
    if args.metrics_addr:
        metrics.parse_addr(args.metrics_addr)
    return HookServerOptions(
        listen=listen,
        config=cfg,
        register_dir=args.register_dir,
        register_name=args.register_name,
        register_endpoint=strip_unix(args.register_endpoint) if args.register_endpoint else None,
        failure_policy=args.failure_policy,
        hooks=args.hooks,
        register_timeout=args.register_timeout,
        keep_registration=args.keep_registration,
        builtins=builtins,
        entry_points=not args.no_entry_points,
        plugins=tuple(args.plugin_module),
        apply=not args.no_apply,
        dry_run=args.dry_run,
        metrics_addr=args.metrics_addr,
    )


def main_from_args(args: argparse.Namespace) -> int:
    """Run the hook server with parsed flags; returns the exit code."""
    try:
        opts = options_from_namespace(args)
        parts = build(opts)  # fail early, with a clear message
    except ValueError as exc:  # ConfigError and PluginLoadError are ValueErrors
        print(f"runtime-proxy hook-server: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return run_main("hook-server", serve(opts, parts=parts))

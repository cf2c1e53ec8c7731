"""``runtime-proxy``: the command line. Sub-commands:

- ``serve``: run the proxy (``runtime_proxy.server``).
- ``plan``: print what the hooks would do for one JSON document (``runtime_proxy.engine.planner``).
- ``hook-server``: serve our plugins over Koordinator's RuntimeHookService (``runtime_proxy.engine.hook_service``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from runtime_proxy import logs
from runtime_proxy.server import DEFAULT_BACKEND, DEFAULT_LISTEN


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the CRI proxy")
    p.add_argument("--listen", "--koord-runtimeproxy-endpoint", dest="listen", default=DEFAULT_LISTEN,
                   help="unix socket to serve CRI on (default %(default)s)")
    p.add_argument("--backend", "--remote-runtime-service-endpoint", dest="backend", default=DEFAULT_BACKEND,
                   help="the runtime's CRI unix socket (default %(default)s)")
    p.add_argument("--config", help="plugin config file (YAML or JSON)")
    p.add_argument("--metrics-addr", help="HOST:PORT to serve Prometheus metrics on")
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


def _strip(s: str | None) -> str | None:
    if s is None:
        return None
    return s[len("unix://"):] if s.startswith("unix://") else s


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime_proxy.config import load_config
    from runtime_proxy.server import ProxyOptions, serve

    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"runtime-proxy: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    updates = {
        "hookServerDir": args.hook_server_dir,
        "nodeConfigFile": args.node_config,
        "cgroupRoot": args.cgroup_root,
        "cgroupDriver": args.cgroup_driver,
        "resctrlRoot": args.resctrl_root,
    }
    cfg = cfg.model_copy(update={k: v for k, v in updates.items() if v is not None})
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
    _run(serve(opts))
    return 0


def _run(coro: object) -> None:
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runtime-proxy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-format", choices=("json", "console"), default="json")
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    p = sub.add_parser("plan", help="print the plan for one JSON document (FILE or stdin)")
    p.add_argument("file", nargs="?")
    sub.add_parser("hook-server", help="serve the plugins over Koordinator's RuntimeHookService", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "hook-server":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logs.configure(args.log_format, args.log_level)
    if args.command == "serve":
        return _cmd_serve(args)
    if args.command == "plan":
        from runtime_proxy.engine import planner

        return planner.main([args.file] if args.file else [])
    if args.command == "hook-server":
        from runtime_proxy.engine import hook_service

        return hook_service.main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""``runtime-proxy``: the command line. Sub-commands:

- ``serve``: run the proxy (``runtime_proxy.server``).
- ``plan``: print what the hooks would do for one JSON document (``runtime_proxy.engine.planner``).
- ``hook-server``: serve our plugins over Koordinator's RuntimeHookService (``runtime_proxy.engine.hook_service``).
- ``nri``: run the plugins as a containerd NRI plugin (``runtime_proxy.nri.cli``).

Machine-readable output goes to stdout only; logs and error messages go to stderr.
"""

from __future__ import annotations

import argparse
import sys

from runtime_proxy import logs
from runtime_proxy.process import EXIT_CODES_EPILOG, EXIT_USAGE, fail, run_main
from runtime_proxy.server import DEFAULT_BACKEND, DEFAULT_LISTEN


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the CRI proxy", description="Run the CRI proxy in front of the runtime.",
                       epilog=EXIT_CODES_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
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


def _strip(s: str | None) -> str | None:
    if s is None:
        return None
    return s[len("unix://"):] if s.startswith("unix://") else s


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime_proxy import metrics
    from runtime_proxy.config import ConfigError, load_config
    from runtime_proxy.engine.hook_service import PluginLoadError, check_plugins
    from runtime_proxy.server import ProxyOptions, serve

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        return fail("serve", f"bad config {exc}", EXIT_USAGE)
    updates = {
        "hookServerDir": args.hook_server_dir,
        "nodeConfigFile": args.node_config,
        "cgroupRoot": args.cgroup_root,
        "cgroupDriver": args.cgroup_driver,
        "resctrlRoot": args.resctrl_root,
    }
    cfg = cfg.model_copy(update={k: v for k, v in updates.items() if v is not None})
    if args.metrics_addr is not None:
        try:
            metrics.parse_addr(args.metrics_addr)
        except ValueError as exc:
            return fail("serve", f"--metrics-addr: {exc}", EXIT_USAGE)
    if not args.grace >= 0:
        return fail("serve", "--grace must be a number of seconds >= 0", EXIT_USAGE)
    try:
        check_plugins(cfg, entry_points=not args.no_entry_points)
    except (PluginLoadError, ConfigError) as exc:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runtime-proxy", description=__doc__, epilog=EXIT_CODES_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-format", choices=("json", "console"), default="json")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                        type=str.lower)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("plan", help="print the plans for JSON documents (FILEs or stdin)", add_help=False)
    from runtime_proxy.nri import cli as nri_cli

    nri_cli.add_parser(sub)
    sub.add_parser("hook-server", help="serve the plugins over Koordinator's RuntimeHookService", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("hook-server", "plan"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logs.configure(args.log_format, args.log_level)
    if args.command == "serve":
        return _cmd_serve(args)
    if args.command == "plan":
        from runtime_proxy.engine import planner

        return planner.main(rest)
    if args.command == "nri":
        return nri_cli.main_from_args(args)
    if args.command == "hook-server":
        from runtime_proxy.engine import hook_service

        return hook_service.main(rest)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

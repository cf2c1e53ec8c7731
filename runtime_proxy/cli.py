"""``runtime-proxy``: the command line (reference: docs/cli.md). Sub-commands:

- ``serve``: run the proxy (``runtime_proxy.server``).
- ``plan``: print what the hooks would do for one JSON document (``runtime_proxy.engine.planner``).
- ``hook-server``: serve our plugins over Koordinator's RuntimeHookService (``runtime_proxy.engine.hook_service``).
- ``doctor``: check this node for what the proxy and its plugins need (``runtime_proxy.doctor``).
- ``kubelet-switch``: point kubelet at the proxy or back at containerd (``runtime_proxy.kubelet``).
- ``nri``: run the plugins as a containerd NRI plugin (``runtime_proxy.nri.cli``).

The conventions it shares with ``scheduler-ext`` (``--version``, ``--log-level`` and
``--log-format`` before or after the sub-command, one-line usage errors with exit code 2) are in
``rhp_ops.cli``. Data goes to stdout only; logs and error messages go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import cast

from rhp_ops.cli import FORMAT_HELP, LEVEL_HELP, Parser, add_global_flags, add_version_flag, resolve_log_flags
from runtime_proxy import logs
from runtime_proxy.config import DEFAULT_BACKEND, DEFAULT_LISTEN
from runtime_proxy.process import EXIT_CODES_EPILOG, EXIT_USAGE, fail, run_main

SERVERS = ("serve", "nri", "hook-server")
DESCRIPTION = "Run the CRI proxy in front of containerd, or plan, check and serve its plugins."



def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="run the CRI proxy", description="Run the CRI proxy in front of the runtime.",
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


def _plan_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from runtime_proxy.engine import planner

    p = sub.add_parser("plan", help="print the plans for JSON documents (FILEs or stdin)",
                       description="Print what the hooks would do for JSON documents (docs/planner.md).",
                       epilog=planner.EXIT_CODES)
    planner.add_arguments(p)
    return p


def _hook_server_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from runtime_proxy.engine import hook_service

    p = sub.add_parser("hook-server", help="serve the plugins over Koordinator's RuntimeHookService",
                       description=hook_service.DESCRIPTION, epilog=EXIT_CODES_EPILOG)
    hook_service.add_arguments(p)
    return p


def _doctor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from runtime_proxy import doctor

    p = sub.add_parser("doctor", help="check that this node has what the proxy and its plugins need",
                       description="Check this node before switching kubelet to the proxy: cgroups, kernel files "
                                   "the plugins use, resctrl, containerd, NRI, the listen path, config files and "
                                   "hook-server registrations.",
                       epilog=doctor.EXIT_CODES)
    doctor.add_arguments(p)
    return p


def _kubelet_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from runtime_proxy import kubelet

    p = sub.add_parser("kubelet-switch", help="point kubelet at the proxy (after doctor and /readyz) or back",
                       description="Switch kubelet's container runtime endpoint to the proxy when doctor passes and "
                                   "/readyz is ready, keeping a backup; --to containerd rolls back. See "
                                   "packaging/kubelet.md.",
                       epilog=kubelet.EXIT_CODES)
    kubelet.add_arguments(p)
    return p


def _strip(s: str | None) -> str | None:
    if s is None:
        return None
    return s[len("unix://"):] if s.startswith("unix://") else s


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime_proxy import metrics
    from runtime_proxy.config import ConfigError, check_usable, load_config
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


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each sub-command's parser also takes the global flags."""
    from runtime_proxy.nri import cli as nri_cli

    parser = Parser(prog="runtime-proxy", description=DESCRIPTION, epilog=EXIT_CODES_EPILOG)
    add_version_flag(parser, "runtime-proxy")
    add_global_flags(parser, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    # Sub-command parsers are ``Parser``s too (one-line usage errors).
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    subparsers = [_serve_parser(sub), _plan_parser(sub), _doctor_parser(sub), _kubelet_parser(sub),
                  nri_cli.add_parser(sub), _hook_server_parser(sub)]
    for p in subparsers:
        add_global_flags(p, subcommand=True, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level, fmt = resolve_log_flags(args, server=args.command in SERVERS)
    logs.configure(fmt, level)
    if args.command == "serve":
        return _cmd_serve(args)
    if args.command == "plan":
        from runtime_proxy.engine import planner

        return planner.run(args)
    if args.command == "doctor":
        from runtime_proxy import doctor

        return doctor.main_from_args(args)
    if args.command == "kubelet-switch":
        from runtime_proxy import kubelet

        return kubelet.main_from_args(args)
    if args.command == "nri":
        return nri_cli_main(args)
    if args.command == "hook-server":
        from runtime_proxy.engine import hook_service

        return hook_service.main_from_args(args)
    return EXIT_USAGE


def nri_cli_main(args: argparse.Namespace) -> int:
    from runtime_proxy.nri import cli as nri_cli

    return nri_cli.main_from_args(args)


if __name__ == "__main__":
    sys.exit(main())

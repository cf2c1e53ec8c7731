"""``runtime-proxy``: the command line (reference: docs/cli.md). One module per sub-command in
this folder, each with ``add_parser`` (its flags) and ``main_from_args`` (its run):

- ``serve``: run the CRI proxy (``runtime_proxy.commands.serve``).
- ``plan``: print what the hooks would do for JSON documents (``runtime_proxy.commands.plan``).
- ``doctor``: check this node for what the proxy and its plugins need (``runtime_proxy.commands.doctor``).
- ``kubelet-switch``: point kubelet at the proxy or back at containerd (``runtime_proxy.commands.kubelet_switch``).
- ``nri``: run the plugins as a containerd NRI plugin (``runtime_proxy.commands.nri``).
- ``hook-server``: serve the plugins over Koordinator's RuntimeHookService (``runtime_proxy.commands.hook_server``).

The commands that run parts build them with ``runtime_proxy.compose``. The conventions shared
with ``scheduler-ext`` (``--version``, ``--log-level`` and ``--log-format`` before or after the
sub-command, one-line usage errors with exit code 2) are in ``rhp_ops.cli``. Data goes to stdout
only; logs and error messages go to stderr. The console script is ``runtime_proxy.cli:main``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import ModuleType
from typing import cast

from rhp_ops.cli import FORMAT_HELP, LEVEL_HELP, Parser, add_global_flags, add_version_flag, resolve_log_flags
from runtime_proxy import logs
from runtime_proxy.commands import doctor, hook_server, kubelet_switch, nri, plan, serve
from runtime_proxy.process import EXIT_CODES_EPILOG

__all__ = ["COMMANDS", "build_parser", "main"]

SERVERS = ("serve", "nri", "hook-server")
DESCRIPTION = "Run the CRI proxy in front of containerd, or plan, check and serve its plugins."

# Sub-command -> its module, in the order ``--help`` lists them.
COMMANDS: dict[str, ModuleType] = {
    "serve": serve,
    "plan": plan,
    "doctor": doctor,
    "kubelet-switch": kubelet_switch,
    "nri": nri,
    "hook-server": hook_server,
}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each sub-command's parser also takes the global flags."""
    parser = Parser(prog="runtime-proxy", description=DESCRIPTION, epilog=EXIT_CODES_EPILOG)
    add_version_flag(parser, "runtime-proxy")
    add_global_flags(parser, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    # Sub-command parsers are ``Parser``s too (one-line usage errors).
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    for module in COMMANDS.values():
        add_global_flags(module.add_parser(sub), subcommand=True, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level, fmt = resolve_log_flags(args, server=args.command in SERVERS)
    logs.configure(fmt, level)
    run = cast(Callable[[argparse.Namespace], int], COMMANDS[args.command].main_from_args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

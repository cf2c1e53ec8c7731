"""``runtime-proxy``: the command line (reference: docs/cli.md). One module per sub-command in
this folder, each with ``add_parser`` (its flags) and ``main_from_args`` (its run):

- ``serve``: run the CRI proxy (``runtime_proxy.commands.serve``).
- ``plan``: print what the hooks would do for JSON documents (``runtime_proxy.commands.plan``).
- ``doctor``: check this node for what the proxy and its plugins need (``runtime_proxy.commands.doctor``).
- ``kubelet-switch``: point kubelet at the proxy or back at containerd (``runtime_proxy.commands.kubelet_switch``).
- ``nri``: run the plugins as a containerd NRI plugin (``runtime_proxy.commands.nri``).
- ``hook-server``: serve the plugins over Koordinator's RuntimeHookService (``runtime_proxy.commands.hook_server``).

A sub-command's module is imported only when that sub-command runs (``main`` builds its parser
and lists the others by their ``HELP`` line), so ``serve`` and ``nri`` do not load the other
commands' libraries; ``build_parser()`` without a command builds every sub-command's parser
(``--help`` and the tests). The commands that run parts build them with ``runtime_proxy.compose``.
The conventions shared with ``scheduler-ext`` (``--version``, ``--log-level`` and ``--log-format``
before or after the sub-command, one-line usage errors with exit code 2) are in ``rhp_ops.cli``. Data goes to stdout
only; logs and error messages go to stderr. The console script is ``runtime_proxy.cli:main``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import cast

from rhp_ops.cli import FORMAT_HELP, LEVEL_HELP, Parser, add_global_flags, add_version_flag, resolve_log_flags
from runtime_proxy import logs
from runtime_proxy.commands import HELP
from runtime_proxy.process import EXIT_CODES_EPILOG

__all__ = ["COMMANDS", "build_parser", "main"]

SERVERS = ("serve", "nri", "hook-server")
DESCRIPTION = "Run the CRI proxy in front of containerd, or plan, check and serve its plugins."

# Sub-command -> its module's name, in the order ``--help`` lists them (``HELP``'s order).
COMMANDS: dict[str, str] = {name: f"runtime_proxy.commands.{name.replace('-', '_')}" for name in HELP}


def command_module(name: str) -> ModuleType:
    """The module of sub-command ``name``, imported now if it was not."""
    return importlib.import_module(COMMANDS[name])


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` runs: its first word that names one (the global flags' values,
    a level or a format, never do), or None (``--help``, ``--version``, a usage error)."""
    return next((word for word in argv if word in COMMANDS), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; each sub-command's parser also takes the global flags. With
    ``only``, the other sub-commands are listed by name and ``HELP`` line without their flags
    (their modules are not imported); parsing a command line that runs ``only`` is the same."""
    parser = Parser(prog="runtime-proxy", description=DESCRIPTION, epilog=EXIT_CODES_EPILOG)
    add_version_flag(parser, "runtime-proxy")
    add_global_flags(parser, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
    # Sub-command parsers are ``Parser``s too (one-line usage errors).
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    for name in COMMANDS:
        if only is None or name == only:
            command = command_module(name).add_parser(sub)
            add_global_flags(command, subcommand=True, level_help=LEVEL_HELP, fmt_help=FORMAT_HELP)
        else:
            sub.add_parser(name, help=HELP[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(chosen_command(words)).parse_args(words)
    level, fmt = resolve_log_flags(args, server=args.command in SERVERS)
    logs.configure(fmt, level)
    run = cast(Callable[[argparse.Namespace], int], command_module(args.command).main_from_args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""The command-line convention of ``runtime-proxy`` and ``scheduler-ext``.

- ``--version`` prints one line (``rhp_ops.build.version_line``) on stdout and exits 0.
- The global flags ``--log-level`` and ``--log-format`` are accepted before or after the
  sub-command, on both commands, with the same choices; given twice, the one after the
  sub-command wins.
- A bad flag or value is one line ``PROG: error: ...`` on stderr and exit code 2 (``EXIT_USAGE``),
  with no usage block and no traceback.
- ``--output text|json`` is how sub-commands that print data choose their format.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from rhp_ops.build import version_line

__all__ = [
    "EXIT_USAGE",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "OUTPUTS",
    "Parser",
    "add_global_flags",
    "add_output_flag",
    "add_version_flag",
    "resolve_log_flags",
]

EXIT_USAGE = 2
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "console")
OUTPUTS = ("text", "json")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit code 2; help
    texts keep their line breaks (``RawDescriptionHelpFormatter``)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        first = " ".join(message.split())
        print(f"{self.prog}: error: {first} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)


def _level(text: str) -> str:
    return text.lower()


def add_global_flags(parser: argparse.ArgumentParser, *, level: str | None = None, fmt: str | None = None,
                     subcommand: bool = False, level_help: str = "", fmt_help: str = "") -> None:
    """Add ``--log-level`` and ``--log-format``. On a sub-command's parser (``subcommand=True``)
    they default to "not given", so a value given before the sub-command is kept. ``None``
    leaves the default to the sub-command (``resolve_log_flags``; ``*_help`` say which)."""
    default_level: object = argparse.SUPPRESS if subcommand else level
    default_fmt: object = argparse.SUPPRESS if subcommand else fmt
    group = parser.add_argument_group("logging (stderr)")
    group.add_argument("--log-level", type=_level, choices=LOG_LEVELS, default=default_level,
                       help=f"lowest level logged (default {level_help or level})")
    group.add_argument("--log-format", choices=LOG_FORMATS, default=default_fmt,
                       help=f"json lines or console text (default {fmt_help or fmt})")


SERVER_DEFAULTS = ("info", "json")
ONE_SHOT_DEFAULTS = ("warning", "console")
LEVEL_HELP = "info for servers, warning for one-shot commands"
FORMAT_HELP = "json for servers, console for one-shot commands"


def resolve_log_flags(args: argparse.Namespace, *, server: bool) -> tuple[str, str]:
    """(level, format) from the parsed global flags; what was not given follows the kind of
    command: servers log at info as JSON lines, one-shot commands at warning as console text."""
    level, fmt = SERVER_DEFAULTS if server else ONE_SHOT_DEFAULTS
    return (getattr(args, "log_level", None) or level, getattr(args, "log_format", None) or fmt)


def add_version_flag(parser: argparse.ArgumentParser, prog: str) -> None:
    parser.add_argument("--version", action="version", version=version_line(prog),
                        help="print the version, Python version and git commit, then exit")


def add_output_flag(parser: argparse.ArgumentParser, default: str = "text") -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default,
                        help=f"text for people or json for programs (default {default})")

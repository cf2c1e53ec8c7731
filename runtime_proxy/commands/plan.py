"""``runtime-proxy plan [FILE ...]``: show what the proxy would do, without doing it.

Reads JSON documents (FILEs, or stdin), each bounded (``MAX_DOCUMENT_CHARS``, depth
``MAX_DOCUMENT_DEPTH``) before it is parsed, loads the plugins the proxy would load
(``runtime_proxy.compose.plugin_manager``: built-ins, entry-point plugins, and with
``--config FILE`` the config's ``pluginModules``; the config's order, policies and timeouts
apply) and prints each plan from ``runtime_proxy.engine.planner.plan_document`` as text for
people or as JSON (``EXIT_CODES`` says the shapes and the exit codes).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping

import pluggy

from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from runtime_proxy import compose
from runtime_proxy.commands import HELP
from runtime_proxy.config import ConfigError, ProxyConfig, load_config
from runtime_proxy.engine.planner import PlanInputError, plan_document, shorten

__all__ = ["EXIT_CODES", "add_arguments", "add_parser", "format_text", "main", "main_from_args"]

# The input document's bounds: a few topologies and NodeSLOs fit many times over.
MAX_DOCUMENT_CHARS = 4 * 1024 * 1024
MAX_DOCUMENT_DEPTH = 32


EXIT_CODES = """\
output:
  --output text (default): the plan for people, one line per change; several FILEs: a
  "== FILE" header before each plan or error
  --output json: one FILE gives the plan as a JSON object; several give a JSON array with one
  object per FILE, in order, each {"file": FILE, "plan": {...}} or {"file": FILE, "error": "..."}

exit codes:
  0  every plan was printed on stdout
  1  the planner itself failed (the error is printed on stderr)
  2  an input is unreadable, not JSON, too large or too deep, or does not match the schema
     in docs/planner.md, or the --config file is bad (each error is one line on stderr)
"""


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read(MAX_DOCUMENT_CHARS + 1)
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_DOCUMENT_CHARS + 1)


def _plan_file(path: str, pm: pluggy.PluginManager, config: ProxyConfig) -> tuple[dict[str, object] | None, str, int]:
    """``(plan, "", 0)`` or ``(None, message, exit code)`` for one input file."""
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path}: {exc}", 2
    try:
        doc = load_json(text, "plan document", max_chars=MAX_DOCUMENT_CHARS, max_depth=MAX_DOCUMENT_DEPTH)
        return plan_document(doc, pm=pm, config=config), "", 0
    except (PlanInputError, FormatError) as exc:
        return None, str(exc), 2
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        return None, f"bad input: {type(exc).__name__}: {shorten(str(exc))}", 2
    except Exception as exc:  # no traceback for the user; the message says what failed
        return None, f"planner failed: {type(exc).__name__}: {shorten(str(exc))}", 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help=HELP["plan"],
                       description="Print what the hooks would do for JSON documents (docs/planner.md).",
                       epilog=EXIT_CODES)
    add_arguments(p)
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``runtime-proxy plan``."""
    parser.add_argument("files", nargs="*", metavar="FILE", help="input documents (default: stdin)")
    parser.add_argument("--config", help="the proxy's config file: plugin order, policies, timeouts, pluginModules")
    parser.add_argument("--no-entry-points", action="store_true", help="do not load third-party plugins")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="text for people (default) or json for programs")
    parser.add_argument("--compact", action="store_true", help="with --output json: one line")


def format_text(result: Mapping[str, object]) -> str:
    """One plan for people: one section per part, one line per change."""
    plugins = result.get("plugins", ())
    names = plugins if isinstance(plugins, Iterable) else (plugins,)
    lines = [f"stage:   {result.get('stage')}", f"plugins: {', '.join(map(str, names))}"]
    for key, value in result.items():
        if key in ("stage", "plugins"):
            continue
        if not value:
            lines.append(f"{key}: none")
            continue
        lines.append(f"{key}:")
        items: Iterable[object] = (
            value.items() if isinstance(value, Mapping) else value if isinstance(value, Iterable) else (value,)
        )
        for item in items:
            if isinstance(item, tuple):
                lines.append(f"  {item[0]} = {json.dumps(item[1], default=str)}")
            elif isinstance(item, Mapping):
                lines.append("  " + "  ".join(f"{k}={json.dumps(v, default=str)}" for k, v in item.items()))
            else:
                lines.append(f"  {json.dumps(item, default=str)}")
    return "\n".join(lines)


def main_from_args(args: argparse.Namespace) -> int:
    """Plan each of ``args.files`` (stdin when none or ``-``) and print the plans on stdout as
    ``args.output``: readable text (several files: a ``== FILE`` header before each), or JSON
    (``EXIT_CODES`` says the shape). An error is one line ``runtime-proxy plan: ...`` on stderr,
    never a traceback."""
    files: list[str] = args.files or ["-"]
    if files.count("-") > 1:
        return _fail("stdin (-) can be read once", 2)
    try:
        config = load_config(args.config)
        pm = compose.plugin_manager(config, entry_points=not args.no_entry_points)
    except (ConfigError, compose.PluginLoadError) as exc:
        return _fail(f"bad config {exc}" if args.config else str(exc), 2)
    as_json = args.output == "json"
    indent = None if args.compact else 2
    if len(files) == 1:
        plan, message, code = _plan_file(files[0], pm, config)
        if plan is None:
            return _fail(message, code)
        print(json.dumps(plan, indent=indent, default=str) if as_json else format_text(plan))
        return 0
    results: list[dict[str, object]] = []
    texts: list[str] = []
    worst = 0
    for path in files:
        plan, message, code = _plan_file(path, pm, config)
        if plan is None:
            _fail(f"{path}: {message}", code)
            results.append({"file": path, "error": message})
            texts.append(f"== {path}\nerror: {message}")
            worst = max(worst, code)
        else:
            results.append({"file": path, "plan": plan})
            if not as_json:
                texts.append(f"== {path}\n" + format_text(plan))
    if as_json:
        print(json.dumps(results, indent=indent, default=str))
    else:
        print("\n\n".join(texts))
    return worst


def main(argv: list[str]) -> int:
    """``runtime-proxy plan [FILE ...]`` with ``argv`` as its arguments (see ``main_from_args``)."""
    parser = argparse.ArgumentParser(
        prog="runtime-proxy plan",
        description=(__doc__ or "").splitlines()[0],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return main_from_args(parser.parse_args(argv))


def _fail(message: str, code: int) -> int:
    print(f"runtime-proxy plan: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))

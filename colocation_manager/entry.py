"""The ``colocation-manager`` console script: runs ``colocation_manager.cli.main``.

The manager needs the ``runtime-hook-proxy[scheduler]`` extra (the watches, the HTTP transport
and the webhook server). On a node install ``--version`` and ``--help`` still answer, and a run
prints one line on stderr naming the extra to install and exits with ``EXIT_MISSING_EXTRA``,
instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_MISSING_EXTRA", "main"]

EXIT_MISSING_EXTRA = 2


def main(argv: list[str] | None = None) -> int:
    from rhp_ops.build import SCHEDULER_EXTRA, extra_hint, missing_modules, version_line

    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:  # answers without the extra, as on a node install
        print(version_line("colocation-manager"))
        return 0
    from colocation_manager import cli

    if not {"-h", "--help"} & set(args) and (absent := missing_modules(SCHEDULER_EXTRA)):
        print(f"{cli.PROG}: needs the [scheduler] extra (missing: {', '.join(absent)}); install it: "
              f"{extra_hint('scheduler')}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    return cli.main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

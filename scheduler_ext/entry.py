"""The ``scheduler-ext`` console script: runs ``scheduler_ext.cli.main``; ``missing`` says which
of the extender's web and cluster dependencies (the ``runtime-hook-proxy[scheduler]`` extra) are
absent.

A node install (``pip install runtime-hook-proxy``) carries only what the node part needs; there
``--version``, every ``--help`` and ``simulate`` still work (``scheduler_ext.cli`` imports the
extra only where ``serve`` runs), and ``serve`` prints one line on stderr naming the extra to
install and exits with ``EXIT_MISSING_EXTRA``, instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXIT_MISSING_EXTRA", "REQUIRED", "main", "missing"]

# Import names of the [scheduler] extra's distributions (pyproject.toml).
REQUIRED = ("kubernetes", "starlette", "uvicorn", "orjson", "httptools", "aiohttp")
EXIT_MISSING_EXTRA = 2


def missing() -> list[str]:
    """The extra's modules that cannot be found."""
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:  # answers without the extra, as on a node install
        from rhp_ops.build import version_line

        print(version_line("scheduler-ext"))
        return 0
    from scheduler_ext.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

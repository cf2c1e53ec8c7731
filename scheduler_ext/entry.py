"""The ``scheduler-ext`` console script: runs ``scheduler_ext.cli.main``; ``missing`` (in
``scheduler_ext.extra``, re-exported here) says which of the extender's web and cluster
dependencies (the ``runtime-hook-proxy[scheduler]`` extra) are absent.

A node install (``pip install runtime-hook-proxy``) carries only what the node part needs; there
``--version``, every ``--help`` and ``simulate`` still work (``scheduler_ext.cli`` imports the
extra only where ``serve`` runs), and ``serve`` prints one line on stderr naming the extra to
install and exits with ``EXIT_MISSING_EXTRA``, instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import sys

from scheduler_ext.extra import EXIT_MISSING_EXTRA, REQUIRED, missing

__all__ = ["EXIT_MISSING_EXTRA", "REQUIRED", "main", "missing"]


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

"""The ``runtime-proxy`` console script (``pyproject.toml``) and ``python -m runtime_proxy.cli``:
the command line itself is ``runtime_proxy.commands.main``."""

from __future__ import annotations

import sys

from runtime_proxy.commands.main import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())

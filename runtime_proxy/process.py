"""One command as one process: the exit codes every ``runtime-proxy`` sub-command documents, and
the runner that turns what escapes its event loop into one of them. Used by the commands in
``runtime_proxy/commands/`` (``run_main`` by ``serve`` and ``hook-server``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine

import structlog

__all__ = ["EXIT_CODES_EPILOG", "EXIT_FAILED", "EXIT_OK", "EXIT_START", "EXIT_USAGE", "fail", "run_main"]

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_START = 3

EXIT_CODES_EPILOG = """\
exit codes:
  0  stopped cleanly (SIGTERM or SIGINT)
  1  failed while running (the error is logged on stderr)
  2  bad command line or config: unknown flag or value, unreadable or invalid config file,
     a plugin that is configured but not installed, a plugin module that cannot be imported
  3  cannot start: the listen socket path or the metrics address cannot be used
     (a file, a directory or a live socket is there, left alone; address in use; no permission)
"""


def fail(command: str, message: str, code: int) -> int:
    """Print ``runtime-proxy COMMAND: MESSAGE`` on stderr and return ``code``."""
    print(f"runtime-proxy {command}: {message}", file=sys.stderr, flush=True)
    return code


def run_main(command: str, coro: Coroutine[object, None, None]) -> int:
    """Run ``coro`` on uvloop (asyncio when uvloop is missing) and turn what escapes into an exit
    code: an ``OSError`` means the process could not take its socket or address (3), anything
    else is a failure while running (1, logged with its traceback on stderr)."""
    runner: Callable[[Coroutine[object, None, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(coro)
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as exc:
        return fail(command, f"cannot start: {exc}", EXIT_START)
    except Exception as exc:
        log.error("stopped by an error", command=command, exc_info=True)
        return fail(command, f"failed: {type(exc).__name__}: {exc}", EXIT_FAILED)
    return EXIT_OK

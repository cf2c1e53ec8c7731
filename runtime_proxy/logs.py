"""structlog set-up for every command: JSON lines in production, readable lines on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(fmt: str = "json", level: str = "info") -> None:
    """Route structlog (and stdlib logging) to stderr in ``fmt`` ("json" or "console")."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

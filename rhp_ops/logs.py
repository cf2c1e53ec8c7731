"""The one structlog set-up of both commands: every line on stderr, JSON lines (``json``) or
readable text (``console``), for structlog loggers and for the standard ``logging`` module alike
(urllib3, uvicorn, grpc, kubernetes), which goes through structlog's ``ProcessorFormatter`` and
the same processors.

Three processors keep the logs readable:

- ``shorten_rpc_errors`` turns a gRPC error (the object, or its multi-line ``str()``) into
  ``CODE: details``;
- ``shorten_api_errors`` turns a Kubernetes client error (``ApiException``: the object, its
  multi-line ``str()`` anywhere in a value, or the exception of ``exc_info``) into one line,
  ``STATUS REASON: message`` (the message from the API server's Status body), never its response
  headers and body;
- ``RepeatLimiter`` lets one line of a kind (level warning or above, same event and values)
  through per window; the repeats inside the window are dropped and counted, and the next line
  of that kind after the window carries ``repeated=K``.

Logging never raises into its caller. On the structlog side the limiter drops a repeat with
``structlog.DropEvent``, which structlog's bound loggers catch. The standard-library side does not
catch it (``ProcessorFormatter`` runs inside ``Handler.emit``, and ``DropEvent`` is a
``BaseException``), so there the same limiter sits in front of the formatter as a
``logging.Filter`` (``RepeatFilter``) that drops by returning false; a library's repeated warning
(urllib3's "Retrying", from inside the Kubernetes client's watch thread) is dropped there.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["RepeatFilter", "RepeatLimiter", "configure", "shorten_api_errors", "shorten_rpc_errors"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# Loggers of libraries that are chatty at INFO; they log at WARNING and above unless debug is asked.
_QUIET = ("urllib3", "kubernetes", "grpc", "asyncio", "hpack", "uvicorn.access")

_RPC_TEXT = re.compile(r"<\w*(?:RpcError|Rendezvous)\b[^>]{0,64}?terminated with:")
_RPC_STATUS = re.compile(r"status = StatusCode\.([A-Z_]{1,40})")
_RPC_DETAILS = re.compile(r'details = "([^"\n]{0,500})')
_MAX_RPC_TEXT = 64 * 1024


def _short_rpc(value: object) -> str | None:
    """``CODE: details`` for a gRPC error object or its ``str()``; ``None`` for anything else."""
    code = getattr(value, "code", None)
    details = getattr(value, "details", None)
    if isinstance(value, BaseException) and callable(code) and callable(details):
        try:
            name = getattr(code(), "name", str(code()))
            return f"{name}: {details() or ''}".rstrip(": ")
        except Exception:
            return None
    if isinstance(value, str) and len(value) <= _MAX_RPC_TEXT and _RPC_TEXT.match(value):
        status = _RPC_STATUS.search(value)
        found = _RPC_DETAILS.search(value)
        if status is None:
            return None
        return f"{status.group(1)}: {found.group(1)}" if found else status.group(1)
    return None


def shorten_rpc_errors(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    changed: dict[str, str] = {}
    for key, value in event_dict.items():
        # Only exceptions and texts that start like a gRPC error's repr are looked at closely.
        if (isinstance(value, BaseException) or (isinstance(value, str) and value[:1] == "<")) and key not in (
                "event", "exc_info"):
            short = _short_rpc(value)
            if short is not None:
                changed[key] = short
    if changed:
        event_dict.update(changed)
    return event_dict


# The kubernetes client's ApiException.__str__: "(404)\nReason: Not Found\nHTTP response headers: ...".
_API_TEXT = re.compile(r"\((\d{1,3})\)\nReason: ([^\n]{0,200})")
_API_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.){0,300})')
_MAX_API_TEXT = 1 << 20


def _api_line(status: int, reason: object, body: object) -> str:
    """``STATUS REASON: message`` on one line, the message from a Status body when there is one."""
    line = f"{status} {' '.join(str(reason or '').split())[:200]}".rstrip()
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if isinstance(text, str):
        found = _API_MESSAGE.search(text[:65536])
        if found:
            message = found.group(1).replace('\\"', '"').replace("\\n", " ")
            line += ": " + " ".join(message.split())[:300]
    return line


def _short_api(value: object) -> str | None:
    """The one line of a Kubernetes client error, or of a text holding its ``str()`` (what comes
    before it kept); ``None`` for anything else."""
    if isinstance(value, BaseException):
        status = getattr(value, "status", None)
        if isinstance(status, int) and hasattr(value, "reason") and hasattr(value, "headers"):
            return _api_line(status, getattr(value, "reason", ""), getattr(value, "body", None))
        return None
    if isinstance(value, str) and len(value) <= _MAX_API_TEXT and "\nReason: " in value:
        found = _API_TEXT.search(value)
        if found is None:
            return None
        rest = value[found.end():]
        body = rest.split("HTTP response body: ", 1)[1] if "HTTP response body: " in rest else None
        return value[: found.start()] + _api_line(int(found.group(1)), found.group(2), body)
    return None


def shorten_api_errors(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Every Kubernetes client error in the line as one ``STATUS REASON: message``; an ``exc_info``
    holding one becomes that line under ``error`` (its traceback would end in the header dump)."""
    changed: dict[str, str] = {}
    for key, value in event_dict.items():
        looks = isinstance(value, BaseException) or (isinstance(value, str) and "\nReason: " in value)
        if looks and key != "exc_info":
            short = _short_api(value)
            if short is not None:
                changed[key] = short
    exc_info = event_dict.get("exc_info")
    if exc_info:
        if exc_info is True:
            exc: object = sys.exc_info()[1]
        elif isinstance(exc_info, tuple):
            exc = exc_info[1] if len(exc_info) > 1 else None
        else:
            exc = exc_info
        short = _short_api(exc) if isinstance(exc, BaseException) else None
        if short is not None:
            del event_dict["exc_info"]
            changed["error" if "error" not in event_dict and "error" not in changed else "api_error"] = short
    if changed:
        event_dict.update(changed)
    return event_dict


_VOLATILE = frozenset({"timestamp", "repeated"})
_LIMITED = frozenset({"warning", "error", "critical", "exception"})


class RepeatLimiter:
    """Drop repeats of an identical warning or error within ``window`` seconds and count them.

    Lines are identical when their level, event and every other value but the timestamp are.
    At most ``max_kinds`` kinds are remembered (the least recent are forgotten), so a stream of
    distinct lines costs bounded memory. A kind is remembered by its hash, not its text: at 512
    kinds of per-pod warnings the text was about 0.4 MiB of a node agent's memory (issue 35); two
    kinds would be taken for one only on a collision of the process's randomized 64-bit string
    hashes.
    """

    def __init__(self, window: float = 30.0, *, max_kinds: int = 512,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.max_kinds = max_kinds
        self.clock = clock
        # hash of a kind -> [time the last line was let through, repeats dropped since]
        self._seen: OrderedDict[int, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _kind(event_dict: MutableMapping[str, Any]) -> tuple[str, ...]:
        return tuple(f"{k}={event_dict[k]!r}"[:512] for k in sorted(event_dict) if k not in _VOLATILE)

    def admit(self, kind: tuple[str, ...]) -> int | None:
        """``None`` when a line of ``kind`` is a repeat inside the window (count it, drop it);
        else how many repeats were dropped since the last one let through. Thread-safe: the
        standard-library side calls it from whichever thread logs."""
        key = hash(kind)
        with self._lock:
            now = self.clock()
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window:
                seen[1] += 1
                self._seen.move_to_end(key)
                return None
            repeats = int(seen[1]) if seen is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_kinds:
                self._seen.popitem(last=False)
            return repeats

    def __call__(self, _logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
        """The structlog processor: a repeat raises ``structlog.DropEvent``, which structlog's
        bound loggers catch. Never put it in a ``ProcessorFormatter`` chain (use ``RepeatFilter``)."""
        level = str(event_dict.get("level", "")).lower()
        if level not in _LIMITED:
            return event_dict
        repeats = self.admit(self._kind(event_dict))
        if repeats is None:
            raise structlog.DropEvent
        if repeats:
            event_dict["repeated"] = repeats
        return event_dict


class RepeatFilter(logging.Filter):
    """The limiter on the standard-library side: a ``logging.Filter`` that drops a repeated
    record by returning false (never by raising) and marks the next one let through with
    ``repeated=K`` (``ExtraAdder`` carries it into the line). A record it cannot read is let
    through; ``filter`` never raises."""

    def __init__(self, limiter: RepeatLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            level = record.levelname.lower()
            if level not in _LIMITED:
                return True
            kind = (f"level={level}", f"logger={record.name}"[:512], f"event={record.getMessage()!r}"[:512])
            repeats = self.limiter.admit(kind)
        except Exception:
            return True
        if repeats is None:
            return False
        if repeats:
            record.repeated = repeats
        return True


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write (tests replace it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _StderrLogger:
    """structlog's final logger: one line per call on the current ``sys.stderr``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def msg(self, message: str) -> None:
        out = self._stream if self._stream is not None else sys.stderr
        out.write(message + "\n")
        out.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure(fmt: str = "json", level: str = "info", *, repeat_window: float = 30.0,
              stream: TextIO | None = None) -> None:
    """Route structlog and the standard ``logging`` module to stderr (or ``stream``) in ``fmt``
    ("json" or "console") at ``level`` and above. Safe to call again (tests, sub-commands)."""
    lvl = _LEVELS.get(level.lower(), logging.INFO)
    renderer: Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    limiter = RepeatLimiter(repeat_window)
    head: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        shorten_rpc_errors,
        shorten_api_errors,
    ]
    tail: list[Processor] = [
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    structlog.configure(
        processors=[*head, limiter, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=lambda *_: _StderrLogger(stream),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # No limiter in this chain: it would raise DropEvent out of the caller's logger.warning().
        foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.ExtraAdder(), *head, *tail],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(stream if stream is not None else _CurrentStderr())
    handler.setFormatter(formatter)
    handler.addFilter(RepeatFilter(limiter))
    handler.set_name("rhp_ops")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "rhp_ops":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in _QUIET:
        logging.getLogger(name).setLevel(lvl if lvl == logging.DEBUG else max(lvl, logging.WARNING))
    for name in ("uvicorn", "uvicorn.error"):
        # uvicorn installs its own handlers when it starts; propagate to ours instead.
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True

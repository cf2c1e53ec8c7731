"""The bounded JSON loader every JSON annotation parser uses, the typed field readers that
check a decoded value, and a memo keyed by the raw annotation text.

Bounds are checked on the raw text before ``json.loads`` runs: its length, then its nesting
depth (a scan that skips string contents and costs a few C-level passes over the text). The
decoder itself refuses ``NaN``/``Infinity``, integers longer than ``MAX_INT_DIGITS`` digits and
floats that overflow, so no value can later raise ``OverflowError`` or expand without bound.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from koord_formats.errors import FormatError

__all__ = [
    "MAX_ANNOTATION_CHARS",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_NAME_CHARS",
    "check_text",
    "json_depth_exceeds",
    "load_json",
    "memo_by_text",
    "read_bool",
    "read_int",
    "read_list",
    "read_object",
    "read_str",
]

# The API server caps all annotations of one object at 256 KiB together; one value can't be larger.
MAX_ANNOTATION_CHARS = 256 * 1024
# Deepest nesting any Koordinator annotation needs is 5 (device-allocated extension); 16 leaves room.
MAX_JSON_DEPTH = 16
# Integers in our formats are ids, counts and percentages: 19 digits hold any int64.
MAX_INT_DIGITS = 19
# Resource names, device ids, pod names: Kubernetes names stay below 253 characters.
MAX_NAME_CHARS = 253

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_LONG_DIGITS = re.compile(rf"[0-9]{{{MAX_INT_DIGITS + 1},}}", re.ASCII)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check_text(text: object, what: str, max_chars: int) -> str:
    """``text`` itself when it is a string of at most ``max_chars`` characters, else
    ``FormatError``. Every parser calls this first, before any other work."""
    if not isinstance(text, str):
        raise FormatError(f"{what}: expected a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise FormatError(f"{what}: {len(text)} characters, more than the {max_chars} allowed")
    return text


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """True when JSON ``text`` nests arrays and objects more than ``max_depth`` deep (brackets
    inside strings do not count; unbalanced brackets count as too deep).

    Strings are cut out, everything but the four bracket bytes is deleted, and each pass then
    removes every innermost empty pair; after ``max_depth`` passes nothing is left unless the
    text is deeper (or unbalanced). All of it runs in C over the text."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    raw = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    structure = raw.translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not structure:
            return False
        shorter = structure.replace(b"[]", b"").replace(b"{}", b"")
        if len(shorter) == len(structure):
            return True
        structure = shorter
    return bool(structure)


def _refuse_constant(name: str) -> Any:
    raise FormatError(f"JSON constant {name} is not allowed")


def _parse_float(digits: str) -> float:
    if len(digits) > 64:
        raise FormatError(f"number with {len(digits)} characters is too long")
    value = float(digits)
    if not math.isfinite(value):
        raise FormatError(f"number {digits} is out of range")
    return value


# The decoder's own integer parsing stays (a Python hook per integer would double the cost of a
# large topology); long digit runs are refused before decoding instead.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_parse_float)


def load_json(
    text: object, what: str, *, max_chars: int = MAX_ANNOTATION_CHARS, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Decode JSON ``text`` after checking its size and depth; ``FormatError`` when it is not a
    string, too large, too deep or not valid JSON."""
    raw = check_text(text, what, max_chars)
    if _LONG_DIGITS.search(_STRING.sub("", raw)) is not None:
        raise FormatError(f"{what}: a number has more than {MAX_INT_DIGITS} digits")
    if json_depth_exceeds(raw, max_depth):
        raise FormatError(f"{what}: JSON nested more than {max_depth} deep (or unbalanced)")
    try:
        return _DECODER.decode(raw)
    except FormatError as exc:
        raise FormatError(f"{what}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        # ValueError covers json.JSONDecodeError and int()'s own digit limit.
        raise FormatError(f"{what}: not valid JSON: {exc}") from None


# ---- typed readers for decoded JSON ---------------------------------------------------------------


def read_object(value: object, what: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else ``FormatError``."""
    if not isinstance(value, dict):
        raise FormatError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def read_list(value: object, what: str, max_items: int) -> list[Any]:
    """``value`` when it is a JSON array of at most ``max_items`` items, else ``FormatError``."""
    if not isinstance(value, list):
        raise FormatError(f"{what}: expected a list, got {type(value).__name__}")
    if len(value) > max_items:
        raise FormatError(f"{what}: {len(value)} items, more than the {max_items} allowed")
    return value


def read_int(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` when it is an integer (not a bool, not a float) within ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{what}: expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise FormatError(f"{what}: {value} is outside {lo}..{hi}")
    return value


def read_str(value: object, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """``value`` when it is a string of at most ``max_chars`` characters."""
    if not isinstance(value, str):
        raise FormatError(f"{what}: expected a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise FormatError(f"{what}: {len(value)} characters, more than the {max_chars} allowed")
    return value


def read_bool(value: object, what: str) -> bool:
    """``value`` when it is a JSON boolean."""
    if not isinstance(value, bool):
        raise FormatError(f"{what}: expected true or false, got {type(value).__name__}")
    return value


# ---- memo by raw text -----------------------------------------------------------------------------

T = TypeVar("T")


def memo_by_text(
    maxsize: int,
    max_chars: int = 4096,
    weigh: Callable[[Any], int] | None = None,
    max_weight: int = 4096,
    large_chars: int = 0,
) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """Memoise a one-argument parser by its raw text, results and ``FormatError`` messages alike,
    so the same annotation string is parsed once.

    The memo holds at most ``maxsize`` entries, least recently used first out, and stays small
    whatever the input: texts longer than ``max_chars`` are parsed every time, and so are texts
    whose result ``weigh`` puts above ``max_weight`` (a short "0-16383" expands to 16384 CPUs).
    With ``large_chars`` the longer texts get a memo of their own that holds at most
    ``large_chars`` characters of text in all (a text above a quarter of that is parsed every
    time), least recently used first out: a node's long annotation that comes back unchanged
    with every update of its object is then parsed once. A key costs one hash of the text (kept
    by the string object) and, on a hit, one comparison. Non-string arguments bypass the memo.
    Safe to call from several threads."""

    def wrap(parse: Callable[[str], T]) -> Callable[[str], T]:
        memo: OrderedDict[str, tuple[bool, Any]] = OrderedDict()
        large: OrderedDict[str, tuple[bool, Any]] = OrderedDict()
        held = [0]  # characters of text in ``large``
        lock = threading.Lock()

        def remember(table: OrderedDict[str, tuple[bool, Any]], text: str, hit: tuple[bool, Any]) -> None:
            with lock:
                if text in table:
                    return
                table[text] = hit
                if table is memo:
                    if len(memo) > maxsize:
                        memo.popitem(last=False)
                    return
                held[0] += len(text)
                while held[0] > large_chars or len(large) > maxsize:
                    old, _ = large.popitem(last=False)
                    held[0] -= len(old)

        @functools.wraps(parse)
        def parse_memoised(text: str) -> T:
            if not isinstance(text, str):
                return parse(text)
            if len(text) <= max_chars:
                table = memo
            elif len(text) <= large_chars // 4:
                table = large
            else:
                return parse(text)
            hit: tuple[bool, Any] | None
            with lock:
                hit = table.get(text)
                if hit is not None:
                    table.move_to_end(text)
            if hit is None:
                try:
                    hit = (True, parse(text))
                except FormatError as exc:
                    hit = (False, str(exc))
                if not hit[0] or weigh is None or weigh(hit[1]) <= max_weight:
                    remember(table, text, hit)
            if hit[0]:
                return cast(T, hit[1])
            raise FormatError(str(hit[1]))

        def cache_clear() -> None:
            with lock:
                memo.clear()
                large.clear()
                held[0] = 0

        parse_memoised.cache_clear = cache_clear  # type: ignore[attr-defined]
        return parse_memoised

    return wrap

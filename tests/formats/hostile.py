"""Hostile inputs shared by the property tests of ``koord_formats``, and the one check they use.

``FRAGMENTS`` are raw JSON (or non-JSON) snippets that broke earlier parsers: deep nesting,
huge exponents, huge integers, non-finite floats, non-ASCII digits, huge CPU lists, wrong
types. ``fill`` puts one into a template at ``HOLE``; ``call_total`` runs a parser and fails
the test when anything but ``FormatError`` escapes or the call takes longer than the bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from koord_formats import FormatError

# A safety bound per call, far above what any call needs; it catches runaway work, not speed.
# Counted in this thread's CPU time, so a loaded machine that leaves the test waiting for a core
# does not count against the parser.
CALL_BOUND_SECONDS = 0.5

HOLE = "HOLE"

FRAGMENTS = [
    "[" * 3000,
    '{"a":' * 3000,
    "[" * 17 + "]" * 17,
    "1e400",
    "-1e400",
    "Infinity",
    "-Infinity",
    "NaN",
    "9" * 5000,
    "-" + "9" * 30,
    "2147483648",
    "-1",
    "1.5",
    "0.0",
    "true",
    "false",
    "null",
    "{}",
    "[]",
    "[5]",
    '[{"minor":1e400}]',
    '{"minor":1e400}',
    '""',
    '"x"',
    '"1e9999999"',
    '"1e500000"',
    '"1e-9999999"',
    '"9Ei"',
    '"-1"',
    '"\\u0661\\u0662"',
    '"\\u00b2"',
    '"0-16383,' + "0-16383," * 20000 + '0"',
    '"' + ",".join(str(i) for i in range(20000)) + '"',
    '"0-99999999"',
    '"3-1"',
    '"0--1"',
    '",,,"',
    '"\\ud800"',
    '"' + "a" * 300 + '"',
    "[" + "1," * 30000 + "1]",
    "{" + ",".join(f'"k{i}":1' for i in range(3000)) + "}",
    '"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["',
    "[{}]",
    '{"cpuset":5}',
    "'single'",
    "",
    "\x00",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

fragments = st.one_of(
    st.sampled_from(FRAGMENTS),
    json_values.map(lambda v: json.dumps(v)),
    st.text(max_size=40),
)


def fill(template: str, fragment: str) -> str:
    """``template`` with its ``HOLE`` replaced by ``fragment``."""
    return template.replace(HOLE, fragment)


def call_total(parse: Callable[..., Any], *args: Any) -> Any:
    """``parse(*args)``, or ``None`` when it raised ``FormatError``; anything else escaping, or a
    call using more than ``CALL_BOUND_SECONDS`` of CPU, fails the test."""
    start = time.thread_time()
    try:
        result = parse(*args)
    except FormatError:
        result = None
    elapsed = time.thread_time() - start
    assert elapsed < CALL_BOUND_SECONDS, f"{getattr(parse, '__name__', parse)} took {elapsed:.3f}s"
    return result

"""The kernel's CPU list format ("0-3,8,10-11"): the one parser and the one formatter.

Inside the code a CPU set is a ``frozenset[int]``; this text form appears only at the edges
(annotations, sysfs files, CRI ``cpuset_cpus``). The parser is bounded before it starts: the
text may hold at most ``MAX_CPU_LIST_CHARS`` characters, ids stay at or below ``MAX_CPU_ID``,
and the ranges together may name at most ``MAX_CPU_ID + 1`` CPUs, so overlapping ranges cannot
multiply the work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from koord_formats.errors import FormatError

__all__ = ["MAX_CPU_ID", "MAX_CPU_LIST_CHARS", "format_cpu_list", "parse_cpu_list"]

# Largest CPU id any input may name (Linux's NR_CPUS tops out at 8192 on common distributions).
MAX_CPU_ID = 16383
# Every CPU listed one by one, "0,1,...,16383", takes 88 KB; canonical lists are far shorter.
MAX_CPU_LIST_CHARS = 96 * 1024

_STRICT = re.compile(r"[0-9]{1,6}(?:-[0-9]{1,6})?(?:,[0-9]{1,6}(?:-[0-9]{1,6})?)*", re.ASCII)
_ELEMENT = re.compile(r"\s*([0-9]{1,6})\s*(?:-\s*([0-9]{1,6})\s*)?", re.ASCII)


def parse_cpu_list(text: object, *, limit: int = MAX_CPU_ID) -> frozenset[int]:
    """The CPU ids of a kernel CPU list. An empty or blank string is the empty set.

    ``FormatError`` names the offending part for anything else: a non-string, an empty element,
    a non-ASCII digit, a descending range ("3-1"), an id above ``limit``, or a list longer than
    ``MAX_CPU_LIST_CHARS`` characters or naming more than ``limit + 1`` CPUs in total.
    """
    if not isinstance(text, str):
        raise FormatError(f"CPU list: expected a string, got {type(text).__name__}")
    if len(text) > MAX_CPU_LIST_CHARS:
        raise FormatError(f"CPU list: {len(text)} characters, more than the {MAX_CPU_LIST_CHARS} allowed")
    text = text.strip()
    if not text:
        return frozenset()
    if _STRICT.fullmatch(text) is not None:
        # The common shape, checked in one C-level pass: plain ids and ranges, no spaces.
        parts = text.split(",")
        if "-" not in text:
            ids = set(map(int, parts))
            if max(ids) > limit:
                raise FormatError(f"CPU list: CPU id {max(ids)} is above the limit {limit}")
            return frozenset(ids)
    else:
        parts = text.split(",")
    out: set[int] = set()
    budget = limit + 1
    for part in parts:
        m = _ELEMENT.fullmatch(part)
        if m is None:
            raise FormatError(f"bad CPU list element {part[:32]!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise FormatError(f"CPU list: descending range {part.strip()!r}")
        if hi > limit:
            raise FormatError(f"CPU list: CPU id {hi} in {part.strip()!r} is above the limit {limit}")
        budget -= hi - lo + 1
        if budget < 0:
            raise FormatError(f"CPU list: names more than {limit + 1} CPUs")
        if lo == hi:
            out.add(lo)
        else:
            out.update(range(lo, hi + 1))
    return frozenset(out)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU ids in the kernel's list format, ascending, runs collapsed ("0-3,8")."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)

"""Kubernetes resource quantities ("500m", "4Gi", "1.5", "1e3") as exact ``Fraction`` values.

This is the one quantity parser: pod annotations (resource-status, device-allocated, the
batch extended-resource-spec), pod specs and Device objects all read quantities here. The
grammar is apimachinery's ``resource.ParseQuantity``: an optional sign, ASCII digits with an
optional fraction, then either a decimal exponent (``e3``/``E-2``) or one suffix (n u m k M G T P
E, Ki Mi Gi Ti Pi Ei). Before any arithmetic the text length, digit count and exponent are
bounded, so "1e9999999" is refused at once and no call allocates more than a few words.

Negative quantities are refused (no Koordinator format we read allows them), as are values
above ``MAX_QUANTITY`` (2^63, the int64 range Kubernetes stores values in).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from koord_formats.errors import FormatError

__all__ = [
    "MAX_QUANTITY",
    "format_bytes",
    "format_milli_cpu",
    "format_quantity",
    "parse_bytes",
    "parse_cpu_milli",
    "parse_quantity",
]

MAX_QUANTITY = 2**63
_MAX_CHARS = 64
_MAX_DIGITS = 40
_MAX_EXPONENT = 30

_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?",
    re.ASCII,
)
# Suffix -> (power of 2, power of 10).
_SUFFIXES: dict[str, tuple[int, int]] = {
    "": (0, 0),
    "n": (0, -9),
    "u": (0, -6),
    "m": (0, -3),
    "k": (0, 3),
    "M": (0, 6),
    "G": (0, 9),
    "T": (0, 12),
    "P": (0, 15),
    "E": (0, 18),
    "Ki": (10, 0),
    "Mi": (20, 0),
    "Gi": (30, 0),
    "Ti": (40, 0),
    "Pi": (50, 0),
    "Ei": (60, 0),
}
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def parse_quantity(value: object) -> Fraction:
    """A quantity (string, or a JSON integer or finite float) as an exact non-negative
    ``Fraction`` in base units (cores, bytes, percent...). ``FormatError`` for anything else."""
    if isinstance(value, bool):
        raise FormatError(f"quantity: expected a string or number, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_QUANTITY:
            raise FormatError("quantity: integer out of range")
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FormatError(f"quantity: {value!r} is not a finite number")
        value = repr(value)
    if not isinstance(value, str):
        raise FormatError(f"quantity: expected a string or number, got {type(value).__name__}")
    if len(value) > _MAX_CHARS:
        raise FormatError(f"quantity: {len(value)} characters, more than {_MAX_CHARS}")
    text = value.strip(" ")
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        raise FormatError(f"quantity: {value!r} is not a Kubernetes quantity")
    whole, frac = m.group("int"), m.group("frac") or ""
    if not whole and not frac:
        raise FormatError(f"quantity: {value!r} has no digits")
    if len(whole) + len(frac) > _MAX_DIGITS:
        raise FormatError(f"quantity: {value!r} has more than {_MAX_DIGITS} digits")
    exp_text = m.group("exp")
    exp10 = 0
    if exp_text:
        digits = exp_text[1:].lstrip("+-").lstrip("0")
        if len(digits) > 3:
            raise FormatError(f"quantity: exponent of {value!r} is out of range")
        exp10 = int(exp_text[1:])
    exp2, suffix10 = _SUFFIXES[m.group("suffix") or ""]
    exp10 += suffix10 - len(frac)
    if abs(exp10) > _MAX_EXPONENT + _MAX_DIGITS:
        raise FormatError(f"quantity: exponent of {value!r} is out of range")
    mantissa = int(whole + frac) if whole + frac else 0
    if mantissa == 0:
        return Fraction(0)
    if m.group("sign") == "-":
        raise FormatError(f"quantity: {value!r} is negative")
    # The value is mantissa * 2**exp2 * 10**exp10; check its size by digit counts before building it.
    magnitude = len(str(mantissa)) + exp10 + exp2 * 0.302
    if magnitude > 20:
        raise FormatError(f"quantity: {value!r} is above {MAX_QUANTITY}")
    if exp10 >= 0:
        number = Fraction(mantissa * 10**exp10 * 2**exp2)
    else:
        number = Fraction(mantissa * 2**exp2, 10**-exp10)
    if number > MAX_QUANTITY:
        raise FormatError(f"quantity: {value!r} is above {MAX_QUANTITY}")
    return number


def parse_cpu_milli(value: object) -> int:
    """A CPU quantity in milli-cores, rounded up as the API server rounds ("0.0001" -> 1)."""
    return math.ceil(parse_quantity(value) * 1000)


def parse_bytes(value: object) -> int:
    """A memory-like quantity as a whole number, rounded up (apimachinery's ``Value()``)."""
    return math.ceil(parse_quantity(value))


def format_milli_cpu(milli: int) -> str:
    """``4000`` -> ``"4"``, ``1500`` -> ``"1500m"`` (the API server's canonical CPU form)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_bytes(amount: int) -> str:
    """``8589934592`` -> ``"8Gi"``: the largest binary suffix that divides exactly, else digits."""
    if amount == 0:
        return "0"
    for suffix, size in _BINARY:
        if amount % size == 0:
            return f"{amount // size}{suffix}"
    return str(amount)


def format_quantity(value: Fraction | int, *, binary: bool = False) -> str:
    """A quantity in canonical form: whole numbers as digits (with a binary suffix when
    ``binary``), other values in milli units, rounded up."""
    if value == int(value):
        return format_bytes(int(value)) if binary else str(int(value))
    return format_milli_cpu(math.ceil(value * 1000))

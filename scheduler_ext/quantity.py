"""Kubernetes resource quantities ("1500m", "16Gi", "2", "1e3") in and out.

Who calls this: the pod and topology parsers read quantities here; the bind path formats
``numaNodeResources`` and ``device-allocated`` values here. Pure functions only.

Output follows the API server's canonical form for the two kinds we write: CPU in whole cores
or milli-cores ("4", "1500m") and bytes in the largest exact binary suffix ("8Gi", or plain
bytes when no suffix divides them).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

__all__ = ["format_bytes", "format_milli_cpu", "parse_cpu_milli", "parse_quantity"]

_SUFFIXES: dict[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity (string or number). Raises ``ValueError`` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"bad quantity {value!r}")
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"bad quantity {value!r}")
    text = value.strip()
    if not text:
        raise ValueError("empty quantity")
    number, suffix = text, ""
    if text[-2:] in _SUFFIXES and len(text) > 2 and text[-2:].endswith("i"):
        number, suffix = text[:-2], text[-2:]
    elif text[-1] in _SUFFIXES and not text[-1].isdigit():
        # "1e3" is an exponent, not a suffix "e"; only the listed suffix letters qualify
        number, suffix = text[:-1], text[-1]
    try:
        amount = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"bad quantity {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"bad quantity {value!r}")
    return amount * _SUFFIXES[suffix]


def parse_cpu_milli(value: object) -> int:
    """A CPU quantity in milli-cores, rounded up as the API server does."""
    milli = parse_quantity(value) * 1000
    return int(milli.to_integral_value(rounding="ROUND_CEILING"))


def format_milli_cpu(milli: int) -> str:
    """``4000`` -> ``"4"``, ``1500`` -> ``"1500m"``."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_bytes(amount: int) -> str:
    """``8589934592`` -> ``"8Gi"``; plain digits when no binary suffix divides exactly."""
    if amount == 0:
        return "0"
    for suffix, size in _BINARY:
        if amount % size == 0:
            return f"{amount // size}{suffix}"
    return str(amount)

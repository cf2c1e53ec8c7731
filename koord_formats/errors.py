"""The one error every parser in ``koord_formats`` raises, and its one-line text for logs.

Callers catch ``FormatError`` (or its base ``ValueError``) around any parse and treat the input
as malformed; nothing else escapes a parser, whatever the input. ``describe`` is the bounded
text the extender (``scheduler_ext.guard``) and the manager log and count for a skipped object.
"""

from __future__ import annotations

__all__ = ["FormatError", "describe"]


class FormatError(ValueError):
    """Input that is not a valid value of its Koordinator format, or is larger, deeper or more
    repetitive than the format allows. The message names the format and what was wrong."""


def describe(exc: BaseException) -> str:
    """A one-line error text of bounded length (a parser's message may quote the input)."""
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
    return text if len(text) <= 300 else text[:297] + "..."

"""The one error every parser in ``koord_formats`` raises.

Callers catch ``FormatError`` (or its base ``ValueError``) around any parse and treat the input
as malformed; nothing else escapes a parser, whatever the input.
"""

from __future__ import annotations

__all__ = ["FormatError"]


class FormatError(ValueError):
    """Input that is not a valid value of its Koordinator format, or is larger, deeper or more
    repetitive than the format allows. The message names the format and what was wrong."""

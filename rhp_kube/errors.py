"""API errors, independent of the client library.

``rhp_kube.http`` maps HTTP statuses and aiohttp's errors onto these; ``rhp_kube.watch``
answers them (410 relists, 404 of an optional kind marks it absent), and the extender's bind
logic (``scheduler_ext.binder``), its HA ledger (``scheduler_ext.ledger``) and the manager catch
them (``scheduler_ext.errors`` names the same classes).
"""

from __future__ import annotations

__all__ = ["APIError", "ConflictError", "GoneError", "NotFoundError", "SilentError", "TooLargeError"]


class APIError(Exception):
    """Any failed API call; ``status`` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


class ConflictError(APIError):
    """409: stale resourceVersion, object already exists, or pod already bound."""


class NotFoundError(APIError):
    """404."""


class GoneError(APIError):
    """410: the watch's resourceVersion is too old; relist."""


class SilentError(APIError):
    """A watch stream that sent nothing (no event, no bookmark, no end) for longer than its read
    deadline: the connection may be half-open. ``rhp_kube.watch`` drops it and watches again
    from the last resourceVersion (a 410 then makes it list again)."""


class TooLargeError(APIError):
    """A reply larger than the caller's bound; refused unread past the bound."""

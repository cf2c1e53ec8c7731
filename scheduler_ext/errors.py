"""API errors the extender reacts to, independent of the client library.

``scheduler_ext.kube`` maps the official client's ``ApiException`` onto these; the bind logic
in ``scheduler_ext.binder`` and the HA ledger in ``scheduler_ext.ledger`` catch them.
"""

from __future__ import annotations

__all__ = ["APIError", "ConflictError", "GoneError", "NotFoundError", "SilentError"]


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


class SilentError(GoneError):
    """A watch stream that sent nothing (no event, no bookmark, no end) for longer than its read
    timeout: the connection may be half-open. Handled like 410: list again."""

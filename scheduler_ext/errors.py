"""The API errors the extender reacts to: those of the Kubernetes access layer
(``rhp_kube.errors``), named here for the extender's modules (``scheduler_ext.binder``,
``scheduler_ext.ledger``, the manager)."""

from __future__ import annotations

from rhp_kube.errors import APIError, ConflictError, GoneError, NotFoundError, SilentError, TooLargeError

__all__ = ["APIError", "ConflictError", "GoneError", "NotFoundError", "SilentError", "TooLargeError"]

"""Logging of every ``runtime-proxy`` command: the shared set-up in ``rhp_ops.logs`` (JSON lines
or console text on stderr, standard ``logging`` included, gRPC errors shortened, repeats
counted)."""

from __future__ import annotations

from rhp_ops.logs import RepeatLimiter, configure, shorten_rpc_errors

__all__ = ["RepeatLimiter", "configure", "shorten_rpc_errors"]

"""The runtime client's errors, without the HTTP/2 library (``unary.py`` loads it only when a
``RuntimeClient`` is made): the gRPC status codes and ``RpcError``, what a failed call raises."""

from __future__ import annotations

import enum

__all__ = ["MAX_ANSWER", "RpcError", "StatusCode"]

MAX_ANSWER = 16 << 20
"""Default bound of one answer's message, in bytes."""

class StatusCode(enum.IntEnum):
    """The gRPC status codes (their numbers on the wire)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that did not end with status OK: the runtime's status (``code``, ``message``) or
    the one this client gives a broken, refused, oversized or late answer."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

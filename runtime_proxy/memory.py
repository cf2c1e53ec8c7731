"""Hand freed heap pages back to the kernel once start-up is over.

Importing the proxy's libraries and rebuilding the store from the runtime leave several MiB of
freed, but still resident, glibc heap behind. ``trim`` asks glibc to release it
(``malloc_trim(0)``); on a C library without that call it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["trim"]


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") else None


_LIBC = _libc()


def trim() -> bool:
    """Release free heap memory to the kernel; True when glibc did release some."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))

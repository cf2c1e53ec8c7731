"""Hand freed heap pages back to the kernel.

Importing the proxy's libraries and rebuilding the store from the runtime leave several MiB of
freed, but still resident, glibc heap behind. ``trim`` asks glibc to release it
(``malloc_trim(0)``). ``map_large_blocks`` keeps large blocks out of the heap for good: glibc
serves a block of 128 KiB or more with its own mapping, but raises that threshold to the size of
each such block freed (up to 32 MiB), after which the buffers of large messages (the NRI
plugin's Synchronize chunks) come from the heap and stay resident once freed. On a C library
without these calls both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["LARGE_BLOCK", "map_large_blocks", "trim"]

M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
LARGE_BLOCK = 1 << 20


def _libc() -> ctypes.CDLL | None:
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


def map_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Serve every block of ``threshold`` bytes or more with its own mapping, unmapped when freed,
    and keep glibc from raising that threshold; True when glibc took it."""
    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, threshold))

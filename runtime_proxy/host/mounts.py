"""The mount table (``/proc/self/mounts`` format), read under a bound and parsed in one place.

Each line is ``device mount-point fstype options dump pass``; the kernel writes a space, tab,
newline and backslash in a path as the octal escapes ``\\040``, ``\\011``, ``\\012`` and
``\\134``. A line with fewer than three fields is skipped. Used by the cgroup tree (is a
controller root a real cgroup filesystem?), resctrl and ``runtime-proxy doctor``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rhp_ops.files import FileRefused, read_regular_file

__all__ = ["MAX_MOUNTS_BYTES", "Mount", "fstype_at", "is_mount_of", "parse_mounts", "read_mounts"]

MAX_MOUNTS_BYTES = 4 << 20
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_mounts(text: str) -> list[Mount]:
    """The mounts of a mount table's text, in its order."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append(Mount(_unescape(fields[1]), fields[2]))
    return mounts


def read_mounts(path: str | os.PathLike[str] = "/proc/self/mounts") -> list[Mount] | None:
    """The mounts listed in the first ``MAX_MOUNTS_BYTES`` of ``path``, None when it cannot be
    read by the one reader of configured files (``rhp_ops.files.read_regular_file``;
    ``doctor --proc-root`` names it)."""
    try:
        raw = read_regular_file(path, limit=MAX_MOUNTS_BYTES, head=True)
        return parse_mounts(raw.decode("utf-8", "replace"))
    except FileRefused:
        return None


def fstype_at(path: str | os.PathLike[str], mounts: list[Mount]) -> str | None:
    """The filesystem type of the mount that holds ``path`` (an absolute path with symlinks
    resolved): the last-listed mount of the longest mount point that contains it."""
    target = Path(path)
    best: tuple[int, str] | None = None
    for mount in mounts:
        point = Path(mount.point)
        if (target == point or target.is_relative_to(point)) and (best is None or len(point.parts) >= best[0]):
            best = (len(point.parts), mount.fstype)
    return best[1] if best is not None else None


def is_mount_of(path: str | os.PathLike[str], fstype: str, mounts: list[Mount]) -> bool:
    """Whether ``path`` itself is a mount point of ``fstype``."""
    target = Path(path)
    return any(m.fstype == fstype and Path(m.point) == target for m in mounts)

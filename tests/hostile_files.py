"""Hostile things to plant where a configuration path points: ``plant(kind, path)`` for each of
``KINDS``. Used by ``tests/rhp_ops/test_files.py`` and ``tests/hostile/test_config_files_hostile.py``.

- ``fifo``: ``open`` blocks until a writer comes, ``read`` until it writes;
- ``socket``: a unix socket's file (``open`` fails with ENXIO);
- ``device``: a symlink to ``/dev/zero`` (endless; ``mknod`` needs privileges a test may lack);
- ``directory``: an empty directory;
- ``symlink-to-fifo``: a symlink to a FIFO next to it;
- ``sparse-5g``: a 5 GiB file of zeros that takes no disk space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

KINDS = ("fifo", "socket", "device", "directory", "symlink-to-fifo", "sparse-5g")
SPARSE_SIZE = 5 << 30


def plant(kind: str, path: Path) -> None:
    """Put a ``kind`` at ``path`` (whatever was there is removed first)."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(path))  # the socket file stays after close; nobody accepts on it
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-to-fifo":
        target = path.with_name(path.name + ".fifo")
        target.unlink(missing_ok=True)
        os.mkfifo(target)
        path.symlink_to(target)
    elif kind == "sparse-5g":
        with open(path, "wb") as fh:
            fh.truncate(SPARSE_SIZE)
    else:
        raise ValueError(f"unknown kind {kind!r}")


def release_fifo_readers(directory: Path) -> None:
    """Open and close every FIFO under ``directory`` for writing, so that a reader blocked in
    ``open`` or ``read`` (code that does not use the one reader) gets end of file and returns."""
    for entry in directory.rglob("*"):
        with contextlib.suppress(OSError):
            if entry.is_fifo():
                try:
                    fd = os.open(entry, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:  # ENXIO: nobody is reading
                        raise
                    continue
                os.close(fd)

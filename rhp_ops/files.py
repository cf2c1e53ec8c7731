"""The one reader of files named by configuration: config files, node config files, hook-server
registrations, kubelet's files, TLS and kubeconfig files, and the kernel files ``doctor`` probes
under a configured root.

A path in a config or on a command line is hostile input: whoever can write it can put a FIFO
there (``open`` blocks until a writer comes), a socket, ``/dev/zero`` (endless), a directory, a
symlink to any of these, or a huge sparse file. ``read_regular_file`` reads only a regular file,
never blocks and never reads more than its limit:

1. ``stat`` (``lstat`` with ``follow_symlinks=False``) first: anything but a regular file is
   refused without being opened (opening a device can have effects of its own);
2. a size from ``stat`` above the limit is refused before the file is opened;
3. ``open`` with ``O_NONBLOCK`` (and ``O_NOFOLLOW`` with ``follow_symlinks=False``), so a file
   swapped for a FIFO after step 1 cannot block the open;
4. ``fstat`` of what was opened: still a regular file, and the same one step 1 saw (``expect``,
   when the caller looked at the file itself, must match too);
5. read until end of file, refusing the file once it holds more than the limit (files in
   ``/proc`` and cgroupfs report size 0, and a file may grow while it is read); with
   ``head=True`` the first ``limit`` bytes are returned instead (the mount table).

A symlink to a regular file is followed by default (a config under ``/etc`` that links into a
ConfigMap mount is common); a symlink to a FIFO is refused at step 1 because the check follows
it. Callers that must not follow symlinks at all (hook-server registrations) pass
``follow_symlinks=False``.

Every refusal is a ``FileRefused`` with a short ``reason`` (a metric label) and a message that
says what was found; the message does not repeat the path, so each caller says which file it
meant. This module is plain blocking I/O that returns quickly; on an event loop, call it through
``asyncio.to_thread`` (``runtime_proxy.state.nodeconfig.NodeConfig`` and
``runtime_proxy.hookclient.registry.HookServerRegistry`` do).

Used by ``runtime_proxy`` and ``scheduler_ext``; imports nothing of ours.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Literal

__all__ = ["MAX_KUBECONFIG_BYTES", "FileRefused", "Reason", "check_kubeconfig", "describe_mode", "kubeconfig_files",
           "read_regular_file", "read_text_file"]

Reason = Literal["missing", "symlink", "not-regular-file", "too-large", "replaced", "unreadable", "not-utf8"]

_CHUNK = 64 * 1024
# A kubeconfig, certificates embedded in it included.
MAX_KUBECONFIG_BYTES = 4 << 20


class FileRefused(Exception):
    """A file that is not read: missing, not a regular file, larger than allowed, replaced while
    it was opened, unreadable or (``read_text_file``) not UTF-8."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


def describe_mode(mode: int) -> str:
    """What a file of this ``st_mode`` is, for a message: "a FIFO", "a directory", ..."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def _not_regular(st: os.stat_result) -> FileRefused | None:
    if stat.S_ISLNK(st.st_mode):
        return FileRefused("symlink", "a symlink (not followed)")
    if not stat.S_ISREG(st.st_mode):
        return FileRefused("not-regular-file", f"not a regular file: {describe_mode(st.st_mode)}")
    return None


def _too_large(limit: int) -> FileRefused:
    return FileRefused("too-large", f"larger than {limit} bytes")


def _os_error(exc: OSError) -> FileRefused:
    if isinstance(exc, FileNotFoundError):
        return FileRefused("missing", f"cannot read: {exc.strerror or 'no such file'}")
    if exc.errno == errno.ELOOP:
        return FileRefused("symlink", "a symlink (not followed)")
    if exc.errno == errno.ENXIO:  # a socket, or a device with no driver behind it
        return FileRefused("not-regular-file", "not a regular file")
    return FileRefused("unreadable", f"cannot read: {exc.strerror or exc}")


def read_regular_file(
    path: str | os.PathLike[str],
    *,
    limit: int,
    follow_symlinks: bool = True,
    expect: os.stat_result | None = None,
    head: bool = False,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; ``FileRefused``
    otherwise (see the module docstring for the steps). ``expect``: a ``stat`` the caller
    already took; the file opened must be that file (same device and inode). ``head``: a
    larger file is not refused; its first ``limit`` bytes are returned."""
    try:
        st = os.stat(path) if follow_symlinks else os.lstat(path)
    except OSError as exc:
        raise _os_error(exc) from None
    refused = _not_regular(st)
    if refused is not None:
        raise refused
    if st.st_size > limit and not head:
        raise _too_large(limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _os_error(exc) from None
    try:
        opened = os.fstat(fd)
        refused = _not_regular(opened)
        if refused is not None:
            raise refused
        for seen in (st, expect):
            if seen is not None and (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
                raise FileRefused("replaced", "replaced while it was being opened")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                if head:
                    return b"".join(chunks)[:limit]
                raise _too_large(limit)
        return b"".join(chunks)
    except OSError as exc:
        raise _os_error(exc) from None
    finally:
        os.close(fd)


def read_text_file(path: str | os.PathLike[str], *, limit: int, follow_symlinks: bool = True) -> str:
    """``read_regular_file`` decoded as UTF-8; ``FileRefused`` ("not-utf8") when it is not."""
    raw = read_regular_file(path, limit=limit, follow_symlinks=follow_symlinks)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused("not-utf8", f"not UTF-8 at byte {exc.start}") from None


def kubeconfig_files(explicit: str | None = None) -> list[str]:
    """The kubeconfig files the kubernetes client would read: ``explicit`` or else
    ``KUBECONFIG`` (each of a ``:``-separated list), else ``~/.kube/config``; only those that
    exist (the client reports a missing one in its own words)."""
    listed = explicit or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return [p for p in listed.split(os.pathsep) if p and os.path.lexists(p)]


def check_kubeconfig(explicit: str | None = None) -> None:
    """Read each of ``kubeconfig_files(explicit)`` once with ``read_regular_file``, so that a FIFO
    or a huge file there is a ``FileRefused`` (its message names the file) instead of a hang or
    a whole read in the kubernetes client's loader, which then reads the files again by path."""
    for path in kubeconfig_files(explicit):
        try:
            read_regular_file(path, limit=MAX_KUBECONFIG_BYTES)
        except FileRefused as exc:
            raise FileRefused(exc.reason, f"kubeconfig {path}: {exc.message}") from None

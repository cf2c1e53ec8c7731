"""Read container cgroup values on the host and clean up pod cgroup parents.

Used by the integration tests, the demo and the benchmarks to check what runc really wrote, and
by :class:`~rhp_devenv.containerd.PrivateContainerd` to remove the pod-level
``cgroup_parent`` directories that containerd and runc leave behind.

With the cgroupfs driver a container's cgroup is ``<cgroup_parent>/<container-id>`` inside every
hierarchy:

- cgroup v1: ``/sys/fs/cgroup/<controller>/<cgroup_parent>/<container-id>/<file>``;
- cgroup v2: ``/sys/fs/cgroup/<cgroup_parent>/<container-id>/<file>``.

``cgroup_parent`` strings are CRI input; :func:`relative_cgroup_path` refuses any that would
leave the cgroup root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

__all__ = [
    "CGROUP_ROOT",
    "cgroup_hierarchies",
    "cgroup_version",
    "container_cgroup_dir",
    "pod_cgroup_parent",
    "read_cgroup_file",
    "read_cgroup_int",
    "relative_cgroup_path",
    "remove_cgroup_tree",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup hierarchies are mounted on this kind of machine."""

_QOS_DIRS = {"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"}


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    """Return 2 when *root* is a unified (v2) mount, else 1 (v1 or hybrid)."""
    return 2 if (root / "cgroup.controllers").exists() else 1


def relative_cgroup_path(cgroup_parent: str) -> PurePosixPath:
    """Turn a CRI ``cgroup_parent`` into a path relative to a hierarchy's root.

    :raises ValueError: when the path is empty, uses ``..``, or is a systemd slice name.
    """
    if not cgroup_parent or cgroup_parent.strip("/") == "":
        raise ValueError(f"empty cgroup parent: {cgroup_parent!r}")
    if cgroup_parent.endswith(".slice"):
        raise ValueError(f"systemd slice {cgroup_parent!r}: only the cgroupfs driver is supported")
    rel = PurePosixPath(cgroup_parent.lstrip("/"))
    if any(part in ("..", ".") for part in rel.parts):
        raise ValueError(f"cgroup parent {cgroup_parent!r} must not contain '.' or '..'")
    return rel


def pod_cgroup_parent(top: str, qos: str, pod_uid: str) -> str:
    """Build a kubelet-style pod cgroup parent under *top* (cgroupfs driver).

    ``pod_cgroup_parent("/rhptest-ab12", "burstable", "u1")`` is
    ``/rhptest-ab12/kubepods/burstable/podu1``; guaranteed pods sit directly under ``kubepods``.

    :param top: a private top directory (``/`` for the real kubelet layout).
    :param qos: ``guaranteed``, ``burstable`` or ``besteffort``.
    :param pod_uid: the pod's UID.
    :raises ValueError: on an unknown QoS class.
    """
    try:
        qos_dir = _QOS_DIRS[qos.lower()]
    except KeyError:
        raise ValueError(f"unknown QoS class {qos!r}; expected one of {sorted(_QOS_DIRS)}") from None
    parts = [*top.strip("/").split("/"), "kubepods", qos_dir, f"pod{pod_uid}"]
    return "/" + "/".join(part for part in parts if part)


def cgroup_hierarchies(root: Path = CGROUP_ROOT) -> list[Path]:
    """Every hierarchy root under *root*: ``[root]`` on v2, the controller mounts on v1.

    On v1 this includes named and unified mounts (``systemd``, ``unified``) because runc creates
    the container cgroup in them too. Symlinked aliases (``cpu,cpuacct``) are skipped.
    """
    if cgroup_version(root) == 2:
        return [root]
    with contextlib.suppress(FileNotFoundError):
        return sorted(
            entry
            for entry in root.iterdir()
            if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists()
        )
    return []


def container_cgroup_dir(
    cgroup_parent: str, container_id: str, controller: str = "", *, root: Path = CGROUP_ROOT
) -> Path:
    """The host directory of a container's cgroup.

    :param cgroup_parent: the pod's ``linux.cgroup_parent`` as sent in RunPodSandbox.
    :param container_id: the container (or sandbox) ID.
    :param controller: v1 controller directory name (``cpu``, ``cpuset``, ``memory``, ...);
        ignored on v2.
    :param root: the cgroup mount root.
    """
    rel = relative_cgroup_path(cgroup_parent) / container_id
    if cgroup_version(root) == 2 or not controller:
        return root / rel
    return root / controller / rel


def read_cgroup_file(
    cgroup_parent: str, container_id: str, controller: str, filename: str, *, root: Path = CGROUP_ROOT
) -> str:
    """Read one cgroup file of a container, stripped (``cpuset.cpus`` gives ``"0"``).

    :param controller: the v1 controller (``cpu`` for ``cpu.shares``); ignored on v2.
    :raises FileNotFoundError: when the container's cgroup or the file does not exist.
    """
    path = container_cgroup_dir(cgroup_parent, container_id, controller, root=root) / filename
    return path.read_text().strip()


def read_cgroup_int(
    cgroup_parent: str, container_id: str, controller: str, filename: str, *, root: Path = CGROUP_ROOT
) -> int:
    """Like :func:`read_cgroup_file`, parsed as an integer (``cpu.cfs_quota_us`` gives ``50000``)."""
    return int(read_cgroup_file(cgroup_parent, container_id, controller, filename, root=root))


def _walk_bottom_up(top: Path) -> Iterator[Path]:
    """Directories under *top*, deepest first, then *top* itself (no symlinks followed)."""
    for dirpath, _dirnames, _files in os.walk(top, topdown=False, followlinks=False):
        yield Path(dirpath)


def _kill_cgroup_procs(directory: Path) -> int:
    """SIGKILL every process listed in *directory*/cgroup.procs; return how many were signalled."""
    killed = 0
    try:
        pids = (directory / "cgroup.procs").read_text().split()
    except OSError:
        return 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    return killed


def remove_cgroup_tree(
    cgroup_parent: str,
    *,
    root: Path = CGROUP_ROOT,
    kill: bool = False,
    timeout: float = 2.0,
) -> list[Path]:
    """Remove *cgroup_parent* and everything below it, depth-first, in every hierarchy.

    containerd and runc remove a container's own cgroup but never the pod-level parents; call
    this after the pods are gone. A directory that still holds processes cannot be removed: with
    ``kill=True`` those processes are SIGKILLed first (use only on trees you own), otherwise
    the directory is retried until *timeout* and then reported.

    :returns: the directories that could not be removed (empty on success).
    """
    rel = relative_cgroup_path(cgroup_parent)
    deadline = time.monotonic() + timeout
    left: list[Path] = []
    for hierarchy in cgroup_hierarchies(root):
        top = hierarchy / rel
        if not top.is_dir():
            continue
        for directory in _walk_bottom_up(top):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                        left.append(directory)
                        break
                    if kill:
                        _kill_cgroup_procs(directory)
                    time.sleep(0.02)
    return left

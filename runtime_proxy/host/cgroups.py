"""The cgroup filesystem: where a plan's file lives, what it holds, and writing it.

Called by ``runtime_proxy.host.apply`` (the single applier) and by the burst loop
(``runtime_proxy.loops.burst``) for reads. Plans name files with cgroup v1 names
(``cpu.cfs_quota_us``) and directories relative to the cgroup root (``kubepods/burstable/pod1``);
``Cgroups`` finds the controller directory (v1), translates names and values (v2), refuses any
path that would leave the root, skips writes that change nothing, and reports a file the kernel
lacks once as unsupported instead of failing every pod.

v1 -> v2 translation:
    ``cpu.shares`` -> ``cpu.weight`` (runc's formula), ``cpu.cfs_quota_us``/``cpu.cfs_period_us``
    -> the two fields of ``cpu.max`` (-1 -> ``max``), ``cpu.cfs_burst_us`` -> ``cpu.max.burst``,
    ``memory.limit_in_bytes`` -> ``memory.max`` (-1 -> ``max``), ``memory.swap.max`` likewise,
    ``tasks`` -> ``cgroup.threads``; ``cpuset.*``, ``cpu.idle``, ``cpu.bvt_warp_ns``,
    ``cgroup.procs`` and ``cpu.stat`` keep their names.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import Counter

from hooks.facts import CgroupInfo, kube_qos_cgroup_path
from koord_formats.cpulist import parse_cpu_list
from runtime_proxy.host.mounts import fstype_at, read_mounts

__all__ = [
    "CgroupError",
    "CgroupMissingError",
    "Cgroups",
    "UnsafePathError",
    "WriteResult",
    "detect_cgroup_driver",
    "detect_cgroup_version",
    "v1_controller",
]

log = structlog.get_logger("runtime_proxy.host.cgroups")

CGROUP_WRITES = Counter("rhp_cgroup_writes", "cgroup file writes performed", ["file"])
CGROUP_UNSUPPORTED = Counter(
    "rhp_cgroup_unsupported_writes", "writes skipped because the kernel lacks the file", ["file"]
)
CGROUP_ERRORS = Counter("rhp_cgroup_write_errors", "cgroup file writes that failed", ["file"])

DEFAULT_ROOT = "/sys/fs/cgroup"
CGROUP_FSTYPES = ("cgroup", "cgroup2")
# memory.limit_in_bytes reads back this (page-aligned LONG_MAX) when unlimited.
_UNLIMITED_FLOOR = 1 << 62
_PAGE = 4096
_V2_PAGE_ROUNDED = frozenset({"memory.max", "memory.swap.max", "memory.high", "memory.low", "memory.min"})
# Files (``(path, file)``) on a cgroup filesystem whose place ``Cgroups`` remembers, at most, and
# the characters of their names and places together; the memory starts over when either is
# reached (the loops name each pod's and container's files every second). A path longer than
# PATH_MAX is never remembered (the kernel refuses it anyway). A place not asked for within
# ``REMEMBER_SECONDS`` (at most twice that) is forgotten, so the memory follows the containers
# that live instead of filling with removed pods' files up to the bound (575-850 bytes a place:
# 4-7 MiB of a node agent at 8,192, issue 35).
MAX_REMEMBERED_FILES = 8192
MAX_REMEMBERED_CHARS = 4 << 20
REMEMBER_SECONDS = 60.0
_PATH_MAX = 4096
_READ_CHUNK = 64 * 1024


class CgroupError(Exception):
    """A cgroup operation failed; the message names the file."""


class UnsafePathError(CgroupError):
    """A path part would leave the cgroup root (``..``, absolute, NUL, symlink out)."""


class CgroupMissingError(CgroupError):
    """The cgroup directory does not exist (the pod or container is gone)."""


_V1_PREFIXES = (
    ("cpuset.", "cpuset"),
    ("cpuacct.", "cpuacct"),
    ("cpu.", "cpu"),
    ("memory.", "memory"),
    ("blkio.", "blkio"),
    ("pids.", "pids"),
    ("net_cls.", "net_cls"),
    ("net_prio.", "net_prio"),
    ("hugetlb.", "hugetlb"),
    ("devices.", "devices"),
    ("freezer.", "freezer"),
)


def v1_controller(file: str) -> str:
    """The v1 hierarchy a file lives in (``cpu.shares`` -> ``cpu``; ``tasks`` -> ``cpu``)."""
    for prefix, controller in _V1_PREFIXES:
        if file.startswith(prefix):
            return controller
    return "cpu"


def detect_cgroup_version(root: str | os.PathLike[str] = DEFAULT_ROOT) -> int:
    """2 when ``root`` is a unified (cgroup2) hierarchy, else 1."""
    return 2 if (Path(root) / "cgroup.controllers").exists() else 1


def detect_cgroup_driver(root: str | os.PathLike[str] = DEFAULT_ROOT, kubelet_root: str = "") -> str:
    """kubelet's cgroup driver as its cgroups show it: ``systemd`` when only its
    ``kubepods.slice`` exists below ``kubelet_root`` ("" is "/"; in the ``cpu`` hierarchy on
    v1), ``cgroupfs`` when only ``kubepods`` does, "" when neither or both (kubelet has not
    started yet, or it cannot be told). Used by ``runtime_proxy.wiring.cgroup_driver`` and
    ``runtime-proxy doctor``."""
    base = Path(root) if detect_cgroup_version(root) == 2 else Path(root) / "cpu"
    found = [driver for driver in ("systemd", "cgroupfs")
             if (base / kube_qos_cgroup_path("Guaranteed", CgroupInfo(driver=driver,
                                                                      kubelet_root=kubelet_root or "/"))).is_dir()]
    return found[0] if len(found) == 1 else ""


def _read_text(target: str) -> str:
    """The whole file at ``target`` (one open, reads until the end, one close; no buffering
    layers: the loops read hundreds of small cgroup files a second)."""
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _shares_to_weight(shares: int) -> int:
    # runc ConvertCPUSharesToCgroupV2Value: [2, 262144] -> [1, 10000].
    if shares <= 0:
        return 0
    return 1 + ((max(2, min(262144, shares)) - 2) * 9999) // 262142


@dataclass(frozen=True)
class WriteResult:
    """What one write did. ``status``: ``written``, ``unchanged``, ``would-write`` (dry run) or
    ``unsupported``. ``old_raw`` is the file's content before (for a rollback)."""

    status: str
    target: str
    file: str
    value: str
    old_raw: str | None = None
    new_raw: str | None = None


def _chars(key: tuple[str, str], found: tuple[Path, str, str]) -> int:
    """What ``Cgroups`` counts of a remembered place against ``MAX_REMEMBERED_CHARS``."""
    return len(key[0]) + len(key[1]) + 2 * len(found[2])


class Cgroups:
    """The cgroup tree under ``root``.

    :param root: the cgroup mount point (``/sys/fs/cgroup``); tests pass a temporary dir.
    :param version: 1 or 2; detected from ``root`` when ``None``.
    :param driver: ``cgroupfs`` or ``systemd`` (kubelet's); only used to lay out new paths.
    :param controller_dirs: v1 only, controller -> directory under ``root`` when it is not the
        controller's own name (found by scanning ``root`` for ``cpu,cpuacct`` style mounts).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        *,
        version: int | None = None,
        driver: str = "cgroupfs",
        controller_dirs: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.version = version or detect_cgroup_version(self.root)
        self.driver = driver
        self._controller_dirs = dict(controller_dirs or {})
        self._real_roots: dict[Path, Path] = {}
        # Controller roots (resolved) that are a cgroup filesystem: such a filesystem cannot hold
        # symlinks, so a path under it without ".." stays under it and is not resolved per call.
        self._cgroupfs_roots: set[Path] = set()
        # (path, file) -> (directory, file name, full path) for files under a cgroupfs root: the
        # place is a function of the two names there (no symlinks), so it is found once.
        # Those asked for in this period, and those of the previous one not asked for since.
        self._files: dict[tuple[str, str], tuple[Path, str, str]] = {}
        self._files_chars = 0
        self._files_before: dict[tuple[str, str], tuple[Path, str, str]] = {}
        self._before_chars = 0
        self._period_start = time.monotonic()
        self._unsupported: set[str] = set()

    # -- paths ---------------------------------------------------------------------------------

    def _controller_root(self, controller: str) -> Path:
        if self.version == 2:
            return self.root
        if controller in self._controller_dirs:
            return self.root / self._controller_dirs[controller]
        direct = self.root / controller
        if direct.exists():
            # Remembered like a comma-named one: every read and write of the loops asked the
            # file system again (a stat per cgroup file, 7 % of the burst loop on cgroup v1).
            self._controller_dirs[controller] = controller
            return direct
        if self.root.is_dir():
            for entry in sorted(self.root.iterdir()):
                if controller in entry.name.split(","):
                    self._controller_dirs[controller] = entry.name
                    return entry
        return direct

    @staticmethod
    def check_relative(path: str) -> list[str]:
        """Split a plan path into parts; ``UnsafePathError`` for "..", absolute paths and NUL."""
        if "\x00" in path:
            raise UnsafePathError(f"path {path!r} contains NUL")
        if path.startswith("/"):
            raise UnsafePathError(f"path {path!r} is absolute")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafePathError(f"path {path!r} contains '..'")
        return parts

    def directory(self, path: str, controller: str = "cpu") -> Path:
        """The directory of cgroup ``path`` in ``controller`` (v1) or the unified tree (v2),
        checked to resolve (symlinks followed) to a place under the root."""
        return self._directory(path, controller)[0]

    def _directory(self, path: str, controller: str) -> tuple[Path, bool]:
        """``directory`` and whether it lies on a cgroup filesystem (so it needs no check again)."""
        parts = self.check_relative(path)
        base = self._controller_root(controller)
        candidate = base.joinpath(*parts) if parts else base
        # A controller root is resolved once it exists; a root that moves later fails closed
        # (the candidate then resolves outside the remembered place and is refused; on a cgroup
        # filesystem the path is taken under the remembered place itself).
        real_base = self._real_roots.get(base)
        if real_base is None:
            real_base = base.resolve()
            if real_base.is_dir():
                self._real_roots[base] = real_base
                mounts = read_mounts()
                if mounts is not None and fstype_at(real_base, mounts) in CGROUP_FSTYPES:
                    self._cgroupfs_roots.add(real_base)
        if real_base in self._cgroupfs_roots:
            return (real_base.joinpath(*parts) if parts else real_base), True
        real = candidate.resolve()
        if real != real_base and not real.is_relative_to(real_base):
            raise UnsafePathError(f"path {path!r} resolves to {real}, outside {real_base}")
        return candidate, False

    def _locate(self, path: str, file: str) -> tuple[Path, str, str]:
        """(directory, translated file name, full path) of a plan's ``(path, file)``; found once
        on a cgroup filesystem and remembered while it is asked for (``MAX_REMEMBERED_FILES``,
        ``REMEMBER_SECONDS``), checked on every call elsewhere."""
        key = (path, file)
        found = self._files.get(key)
        if found is not None:
            return found
        now = time.monotonic()
        if now - self._period_start >= REMEMBER_SECONDS:
            self._files_before, self._before_chars = self._files, self._files_chars
            self._files, self._files_chars = {}, 0
            self._period_start = now
        kept = self._files_before.pop(key, None)
        if kept is not None:
            found = kept
            self._before_chars -= _chars(key, found)
        else:
            directory, name, trusted = self._find(path, file)
            found = (directory, name, os.path.join(directory, name))
            if not trusted or len(found[2]) > _PATH_MAX:
                return found
        chars = _chars(key, found)
        files = len(self._files) + len(self._files_before)
        if files >= MAX_REMEMBERED_FILES or self._files_chars + self._before_chars + chars > MAX_REMEMBERED_CHARS:
            self._files, self._files_before = {}, {}
            self._files_chars = self._before_chars = 0
        self._files[key] = found
        self._files_chars += chars
        return found

    def _target(self, path: str, file: str) -> tuple[Path, str]:
        directory, name, _ = self._locate(path, file)
        return directory, name

    def _find(self, path: str, file: str) -> tuple[Path, str, bool]:
        if not file or "/" in file or file in (".", "..") or "\x00" in file:
            raise UnsafePathError(f"bad cgroup file name {file!r}")
        if self.version == 1:
            directory, trusted = self._directory(path, v1_controller(file))
            return directory, file, trusted
        v2 = {
            "cpu.shares": "cpu.weight",
            "cpu.cfs_quota_us": "cpu.max",
            "cpu.cfs_period_us": "cpu.max",
            "cpu.cfs_burst_us": "cpu.max.burst",
            "memory.limit_in_bytes": "memory.max",
            "memory.memsw.limit_in_bytes": "memory.swap.max",
            "tasks": "cgroup.threads",
            "cpuacct.usage": "cpu.stat",
        }.get(file, file)
        directory, trusted = self._directory(path, "cpu")
        return directory, v2, trusted

    def file_path(self, path: str, file: str) -> Path:
        """The real file a plan's ``(path, file)`` names (after v1/v2 translation)."""
        directory, name, _ = self._locate(path, file)
        return directory / name

    # -- reading -------------------------------------------------------------------------------

    def read_raw(self, path: str, file: str) -> str | None:
        """The translated file's content, None when it does not exist."""
        target = self._locate(path, file)[2]
        try:
            return _read_text(target)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CgroupError(f"read {target}: {exc.strerror or exc}") from exc

    def read(self, path: str, file: str) -> str | None:
        """The value of ``file`` in v1 terms (v2 ``cpu.max`` "max 100000" reads as quota "-1"),
        None when the file does not exist."""
        raw = self.read_raw(path, file)
        if raw is None:
            return None
        text = raw.strip()
        if self.version == 2:
            if file in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
                fields = text.split()
                value = fields[0] if file == "cpu.cfs_quota_us" else (fields[1] if len(fields) > 1 else "100000")
                return "-1" if value == "max" else value
            if file in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
                return "-1" if text == "max" else text
            if file == "cpuacct.usage":
                for line in text.splitlines():
                    key, _, val = line.partition(" ")
                    if key == "usage_usec":
                        return str(int(val) * 1000)
                return None
        return text

    def read_int(self, path: str, file: str) -> int | None:
        value = self.read(path, file)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def read_stat(self, path: str, file: str = "cpu.stat") -> dict[str, int]:
        """A flat ``key value`` file (``cpu.stat``) as a dict; empty when missing."""
        raw = self.read_raw(path, file)
        out: dict[str, int] = {}
        for line in (raw or "").splitlines():
            key, _, val = line.partition(" ")
            try:
                out[key] = int(val)
            except ValueError:
                continue
        return out

    def tasks(self, path: str, *, threads: bool = True) -> list[int]:
        """Thread (or process) ids in cgroup ``path``."""
        raw = self.read_raw(path, "tasks" if threads else "cgroup.procs")
        return [int(x) for x in (raw or "").split() if x.isdigit()]

    # -- writing -------------------------------------------------------------------------------

    def _translate(self, file: str, value: str, current_raw: str | None) -> str:
        """The raw text to write for a v1 ``(file, value)``."""
        if self.version == 1:
            return value
        v = value.strip()
        if file == "cpu.shares":
            return str(_shares_to_weight(int(v)))
        if file in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
            fields = (current_raw or "max 100000").split()
            quota, period = [*fields, "100000"][:2]
            if file == "cpu.cfs_quota_us":
                quota = "max" if int(v) < 0 else v
            else:
                period = v
            return f"{quota} {period}"
        if file in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            return "max" if int(v) < 0 else v
        return v

    def _same(self, file: str, desired: str, current: str) -> bool:
        a, b = desired.strip(), current.strip()
        if a == b:
            return True
        try:
            if file.startswith("cpuset.") and file in ("cpuset.cpus", "cpuset.mems"):
                return parse_cpu_list(a) == parse_cpu_list(b)
            if file.endswith("limit_in_bytes") and self.version == 1:
                want, have = int(a), int(b)
                if want < 0 or want >= _UNLIMITED_FLOOR:
                    return have < 0 or have >= _UNLIMITED_FLOOR
                return have == want // _PAGE * _PAGE
            if self.version == 2 and file in _V2_PAGE_ROUNDED:
                # the kernel keeps these in pages: 100000001 written reads back as 99999744
                return a != "max" and b != "max" and int(b) == int(a) // _PAGE * _PAGE
            if self.version == 2 and " " in a:
                return a.split() == b.split()
            return int(a) == int(b)
        except ValueError:
            return False

    def matches(self, path: str, file: str, value: str | int) -> bool | None:
        """Whether ``file`` of cgroup ``path`` already holds ``value`` (v1 terms); None when it
        cannot be read (missing directory or file, unsafe path)."""
        try:
            _, name, target = self._locate(path, file)
            raw = _read_text(target)
            wanted = self._translate(file, str(value), raw)
        except (OSError, CgroupError, ValueError):
            return None
        return self._same(name if self.version == 2 else file, wanted, raw)

    def _report_unsupported(self, file: str, target: Path) -> None:
        CGROUP_UNSUPPORTED.labels(file).inc()
        if file not in self._unsupported:
            self._unsupported.add(file)
            log.warning("cgroup file unsupported by this kernel", file=file, example=str(target))

    def is_unsupported(self, file: str) -> bool:
        """True once a write found ``file`` missing in an existing cgroup directory."""
        return file in self._unsupported

    def write(self, path: str, file: str, value: str | int, *, compare_only: bool = False) -> WriteResult:
        """Write ``value`` (v1 terms) to ``file`` of cgroup ``path`` unless it already holds it.

        Raises ``UnsafePathError`` for paths leaving the root, ``CgroupMissingError`` when the
        directory is gone, ``CgroupError`` when the kernel refuses the value. A missing file in
        an existing directory is ``unsupported`` (logged once per file name, counted every time).
        """
        value = str(value)
        directory, name, where = self._locate(path, file)
        target = directory / name
        try:
            old_raw = _read_text(where)
        except FileNotFoundError:
            # The directory is looked at only now: a file read means it is there.
            if not directory.is_dir():
                raise CgroupMissingError(f"cgroup {directory} does not exist") from None
            self._report_unsupported(file, target)
            return WriteResult("unsupported", str(target), file, value)
        except OSError as exc:
            if not directory.is_dir():
                raise CgroupMissingError(f"cgroup {directory} does not exist") from None
            raise CgroupError(f"read {target}: {exc.strerror or exc}") from exc
        try:
            new_raw = self._translate(file, value, old_raw)
        except ValueError as exc:
            raise CgroupError(f"bad value {value!r} for {file}: {exc}") from exc
        if self._same(name if self.version == 2 else file, new_raw, old_raw):
            return WriteResult("unchanged", str(target), file, value, old_raw, old_raw)
        if compare_only:
            return WriteResult("would-write", str(target), file, value, old_raw, new_raw)
        self.write_raw(target, new_raw, file=file)
        log.info("cgroup write", target=str(target), value=new_raw, old=old_raw.strip())
        return WriteResult("written", str(target), file, value, old_raw, new_raw)

    def write_raw(self, target: Path, raw: str, *, file: str = "") -> None:
        """Write ``raw`` to an already resolved ``target`` (used for rollbacks)."""
        try:
            fd = os.open(target, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError as exc:
            raise CgroupMissingError(f"{target} does not exist") from exc
        except OSError as exc:
            CGROUP_ERRORS.labels(file or target.name).inc()
            raise CgroupError(f"open {target}: {exc.strerror or exc}") from exc
        try:
            os.write(fd, raw.strip().encode() or b"\n")
        except OSError as exc:
            CGROUP_ERRORS.labels(file or target.name).inc()
            name = errno.errorcode.get(exc.errno or 0, "error")
            raise CgroupError(f"write {raw.strip()!r} to {target}: {exc.strerror or exc} ({name})") from exc
        finally:
            os.close(fd)
        CGROUP_WRITES.labels(file or target.name).inc()

"""The resctrl filesystem: RDT groups, their schemata and their tasks.

Called by ``runtime_proxy.host.apply`` for plan writes at level ``resctrl`` (``path`` is the group,
``file`` is ``schemata``), task moves and group removals, and by ``runtime_proxy.loops.reconciler``
to list pod-level groups for garbage collection. The root is configurable so tests run on a
resctrl-shaped directory tree; ``runtime_proxy.state.sysfs.detect_rdt`` says whether the CPU and the
kernel really offer RDT.

Groups are single directory names under the root (``LSR``, ``LS``, ``BE``,
``koordlet-<podUID>``); anything else (``..``, ``/``, NUL, ``info``, a symlink) is refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import structlog
from prometheus_client import Counter, Gauge

from hooks.facts import ResctrlFacts
from runtime_proxy.host.cgroups import CgroupError, UnsafePathError, WriteResult
from runtime_proxy.host.mounts import is_mount_of, read_mounts

__all__ = ["DEFAULT_ROOT", "RESCTRL_PLUGINS", "Resctrl", "ResctrlError", "parse_schemata"]

log = structlog.get_logger("runtime_proxy.host.resctrl")

DEFAULT_ROOT = "/sys/fs/resctrl"
# The built-in plugins that need resctrl: left out at start where it is absent
# (``runtime_proxy.wiring.HARDWARE``), a warning in ``runtime-proxy doctor``.
RESCTRL_PLUGINS = ("rdt",)
RESCTRL_SUPPORTED = Gauge("rhp_resctrl_supported", "1 when the node offers resctrl (RDT) under the configured root")
RESCTRL_TASKS_MOVED = Counter("rhp_resctrl_tasks_moved", "thread ids moved into resctrl groups")
_RESERVED = {"info", "mon_groups", "mon_data", "tasks", "schemata", "cpus", "cpus_list", "mode", "size"}


class ResctrlError(CgroupError):
    """A resctrl operation failed."""


def parse_schemata(text: str) -> dict[tuple[str, str], str]:
    """``"L3:0=ff;1=ff;\\nMB:0=100"`` -> ``{("L3","0"): "ff", ...}`` (values lower-cased)."""
    out: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        res, _, rest = line.partition(":")
        for item in rest.split(";"):
            if "=" in item:
                cid, _, val = item.partition("=")
                out[(res.strip(), cid.strip())] = val.strip().lower()
    return out


def _same_value(resource: str, a: str, b: str) -> bool:
    try:
        if resource.startswith("L3") or resource.startswith("L2"):
            return int(a, 16) == int(b, 16)
        return int(a) == int(b)
    except ValueError:
        return a == b


def _is_resctrl_mount(root: Path) -> bool:
    mounts = read_mounts()
    return mounts is not None and is_mount_of(root.resolve(), "resctrl", mounts)


class Resctrl:
    """The resctrl tree under ``root``. ``vendor`` ("intel"/"amd") overrides the detection
    from ``/proc/cpuinfo`` (tests on a resctrl-shaped tree)."""

    def __init__(self, root: str | os.PathLike[str] = DEFAULT_ROOT, *, vendor: str | None = None) -> None:
        self.root = Path(root)
        self.real = _is_resctrl_mount(self.root)
        self.vendor = vendor

    @property
    def available(self) -> bool:
        """True when the tree has an L3 or MB resource (a mounted resctrl or a test tree)."""
        info = self.root / "info"
        return (info / "L3" / "cbm_mask").exists() or (info / "MB").is_dir()

    def facts(self) -> ResctrlFacts:
        """What the tree offers: root cbm mask, L3 cache ids, vendor (from /proc/cpuinfo)."""
        if not self.available:
            RESCTRL_SUPPORTED.set(0)
            return ResctrlFacts()
        cbm = ""
        with contextlib.suppress(OSError):
            cbm = (self.root / "info" / "L3" / "cbm_mask").read_text().strip()
        ids: set[int] = set()
        try:
            for (res, cid), _ in parse_schemata((self.root / "schemata").read_text()).items():
                if res in ("L3", "MB") and cid.isdigit():
                    ids.add(int(cid))
        except OSError:
            pass
        vendor = self.vendor or ""
        if not vendor:
            vendor = "intel"
            with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
                if "AuthenticAMD" in f.read(4096):
                    vendor = "amd"
        RESCTRL_SUPPORTED.set(1)
        return ResctrlFacts(cbm_mask=cbm, cache_ids=tuple(sorted(ids)), vendor=vendor, supported=True)

    def group_dir(self, group: str) -> Path:
        """The directory of ``group`` (validated: one plain name, not a resctrl file)."""
        if (
            not group
            or "/" in group
            or "\x00" in group
            or group in (".", "..")
            or group in _RESERVED
        ):
            raise UnsafePathError(f"bad resctrl group name {group!r}")
        path = self.root / group
        if path.is_symlink():
            raise UnsafePathError(f"resctrl group {group!r} is a symlink")
        return path

    def list_groups(self) -> list[str]:
        """Control groups directly under the root."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name not in _RESERVED)

    def ensure_group(self, group: str, *, compare_only: bool = False) -> bool:
        """Create ``group`` if needed; True when it was (or would be) created."""
        path = self.group_dir(group)
        if path.is_dir():
            return False
        if compare_only:
            return True
        if not self.available:
            raise ResctrlError(f"resctrl is not available under {self.root}")
        try:
            path.mkdir()
        except OSError as exc:
            raise ResctrlError(f"mkdir {path}: {exc.strerror or exc}") from exc
        if not self.real:
            # A test tree: give the group the files the kernel would.
            (path / "tasks").touch()
            (path / "schemata").touch()
        log.info("resctrl group created", group=group)
        return True

    def write(self, group: str, file: str, value: str, *, compare_only: bool = False) -> WriteResult:
        """Write ``value`` to ``file`` (``schemata``) of ``group``, creating the group; schemata
        entries already holding the value are not rewritten."""
        if file not in ("schemata", "mode", "cpus", "cpus_list"):
            raise UnsafePathError(f"bad resctrl file {file!r}")
        path = self.group_dir(group)
        target = path / file
        created = self.ensure_group(group, compare_only=compare_only)
        old = "" if created and compare_only else self._read(target)
        if file == "schemata":
            have = parse_schemata(old)
            want = parse_schemata(value)
            if want and all(k in have and _same_value(k[0], v, have[k]) for k, v in want.items()):
                return WriteResult("unchanged", str(target), file, value, old, old)
        elif old.strip() == value.strip():
            return WriteResult("unchanged", str(target), file, value, old, old)
        if compare_only:
            return WriteResult("would-write", str(target), file, value, old, value)
        self.write_raw(target, value)
        log.info("resctrl write", target=str(target), value=value.strip())
        return WriteResult("written", str(target), file, value, old, value)

    def _read(self, target: Path) -> str:
        try:
            return target.read_text()
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise ResctrlError(f"read {target}: {exc.strerror or exc}") from exc

    def write_raw(self, target: Path, raw: str) -> None:
        try:
            with open(target, "w") as f:
                f.write(raw)
        except OSError as exc:
            raise ResctrlError(f"write {raw.strip()!r} to {target}: {exc.strerror or exc}") from exc

    def tasks(self, group: str) -> set[int]:
        raw = self._read(self.group_dir(group) / "tasks")
        return {int(x) for x in raw.split() if x.isdigit()}

    def add_tasks(self, group: str, tids: Iterable[int], *, compare_only: bool = False) -> list[int]:
        """Move the thread ids that are not yet in ``group`` into it (one write per id, never
        cached: ids are reused). Threads that exited meanwhile are ignored."""
        path = self.group_dir(group)
        if not path.is_dir() and not compare_only:
            raise ResctrlError(f"resctrl group {group!r} does not exist")
        have = self.tasks(group) if path.is_dir() else set()
        new = [t for t in tids if t not in have]
        if compare_only or not new:
            return new
        moved: list[int] = []
        fd = os.open(path / "tasks", os.O_WRONLY | os.O_APPEND)
        try:
            for tid in new:
                try:
                    os.write(fd, f"{tid}\n".encode())
                    moved.append(tid)
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    raise ResctrlError(f"move task {tid} to {group}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        RESCTRL_TASKS_MOVED.inc(len(moved))
        return moved

    def remove_group(self, group: str, *, compare_only: bool = False) -> bool:
        """Remove ``group``; False when it did not exist."""
        path = self.group_dir(group)
        if not path.is_dir():
            return False
        if compare_only:
            return True
        try:
            if self.real:
                path.rmdir()
            else:
                shutil.rmtree(path)
        except OSError as exc:
            raise ResctrlError(f"remove {path}: {exc.strerror or exc}") from exc
        log.info("resctrl group removed", group=group)
        return True

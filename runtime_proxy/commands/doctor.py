"""``runtime-proxy doctor``: is this node ready for the proxy?

Pure checks over injectable roots (the cgroup, resctrl and proc trees, sockets and files named in
``DoctorOptions``), so tests run them on prepared trees; ``run`` gathers them and ``main`` prints
them. What is checked:

- the cgroup version (v1 or v2) and driver (kubelet's ``kubepods`` or ``kubepods.slice``, looked
  for below kubelet's cgroup root: ``kubeletCgroupRoot``, or "/" when that is unset);
- each kernel interface a built-in plugin uses (``INTERFACES``), with the plugins that need it:
  cpuset files, CFS quota and shares, CFS burst (``cpu.cfs_burst_us`` or ``cpu.max.burst``),
  group identity (``cpu.bvt_warp_ns``, written under NodeSLO ``cpuPolicy`` ``groupIdentity``, the
  default) and ``cpu.idle`` (written under ``cpuPolicy: coreSched``), memory limits, and resctrl
  with its L3 and MB resources;
- the runtime's CRI endpoint (it answers ``Version`` over CRI v1), the NRI socket, the listen
  path's directory and what is at the listen path;
- the config file and the node config file (exist and validate), and every hook-server
  registration (valid, safe to read, its socket accepts connections).

Each check is ``ok``, ``warn`` (missing, but nothing configured needs it, or an alternative is
there) or ``fail`` (something the configured plugins or the proxy itself need is missing or
broken). ``main`` exits 0 without a ``fail`` and 1 with one; a bad command line is 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hooks.facts import CgroupInfo, kube_qos_cgroup_path
from hooks.plugins import BUILTIN_PLUGINS
from rhp_ops.files import FileRefused, describe_mode, read_regular_file, read_text_file
from rhp_ops.logs import shorten_rpc_errors
from runtime_proxy.commands import HELP
from runtime_proxy.config import (
    DEFAULT_BACKEND,
    DEFAULT_LISTEN,
    ConfigError,
    ProxyConfig,
    check_usable,
    load_config,
)
from runtime_proxy.host.cgroups import detect_cgroup_driver
from runtime_proxy.host.mounts import is_mount_of, read_mounts
from runtime_proxy.host.resctrl import RESCTRL_PLUGINS

if TYPE_CHECKING:
    from cri_protos import api_pb2

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "INTERFACES",
    "Check",
    "DoctorOptions",
    "add_arguments",
    "add_parser",
    "format_json",
    "format_text",
    "main_from_args",
    "run",
]

Status = Literal["ok", "warn", "fail"]
EXIT_OK = 0
EXIT_FAILED = 1

DEFAULT_NRI = "/var/run/nri/nri.sock"
# A kernel file doctor reads under a configured root (cgroup.subtree_control, cbm_mask) is a line.
KERNEL_FILE_BYTES = 4096
EXIT_CODES = """\
exit codes:
  0  every check passed or only warned: nothing the configured plugins or the proxy need is missing
  1  at least one check failed (status "fail"); the table says which and why
  2  bad command line
"""


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str
    needed_by: tuple[str, ...] = ()

    def to_json(self) -> dict[str, str | list[str]]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "neededBy": list(self.needed_by)}


@dataclass(frozen=True)
class DoctorOptions:
    cgroup_root: str = "/sys/fs/cgroup"
    # kubelet's cgroup driver as configured; "" when the proxy detects it (``cgroupDriver`` unset).
    cgroup_driver: str = ""
    # kubelet's cgroup root (``kubeletCgroupRoot``); "" when the proxy learns it (looked for at "/").
    kubelet_cgroup_root: str = ""
    resctrl_root: str = "/sys/fs/resctrl"
    proc_root: str = "/proc"
    backend: str = DEFAULT_BACKEND
    nri_socket: str = DEFAULT_NRI
    listen: str = DEFAULT_LISTEN
    config_path: str | None = None
    node_config: str | None = None
    hook_server_dir: str = "/etc/runtime/hookserver.d"
    plugins: tuple[str, ...] = tuple(BUILTIN_PLUGINS)
    mode: Literal["serve", "nri"] = "serve"
    runtime_timeout: float = 3.0
    config_error: str = ""
    skip: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Interface:
    """A kernel file a plugin writes or reads, by its v1 and v2 names."""

    name: str
    v1: str
    v2: str
    plugins: tuple[str, ...]


# What the built-in plugins (hooks/plugins/*.py) and the loops write or read. Group identity
# (cpu.bvt_warp_ns) and cpu.idle are alternatives chosen by the NodeSLO, not by the kernel:
# group_identity and host_app_qos write bvt under cpuPolicy groupIdentity (the default) and
# cpu.idle under cpuPolicy coreSched; ``_group_identity`` checks the pair and says which policy
# this kernel can serve.
INTERFACES: tuple[Interface, ...] = (
    Interface("cpuset cpus", "cpuset.cpus", "cpuset.cpus", ("cpuset", "numa")),
    Interface("cpuset mems", "cpuset.mems", "cpuset.mems", ("numa",)),
    Interface("cfs quota", "cpu.cfs_quota_us", "cpu.max", ("cpuset", "batch_resource", "cpu_burst")),
    Interface("cpu shares", "cpu.shares", "cpu.weight", ("batch_resource",)),
    Interface("cfs burst", "cpu.cfs_burst_us", "cpu.max.burst", ("cpu_burst",)),
    Interface("cpu stat", "cpu.stat", "cpu.stat", ("cpu_burst",)),
    Interface("memory limit", "memory.limit_in_bytes", "memory.max", ("batch_resource",)),
)
GROUP_IDENTITY_PLUGINS = ("group_identity", "host_app_qos")


def _v1_controller(file: str) -> str:
    return file.split(".", 1)[0]


def cgroup_version(root: Path) -> int:
    return 2 if (root / "cgroup.controllers").exists() else 1


def _kubepods(kubelet_root: str, driver: str) -> str:
    """kubelet's kubepods directory under ``kubelet_root`` ("" is "/") for ``driver``."""
    return kube_qos_cgroup_path("Guaranteed", CgroupInfo(driver=driver, kubelet_root=kubelet_root or "/"))


def _probe_dirs(base: Path, limit: int = 64, kubelet_root: str = "") -> list[Path]:
    """Where a file of a controller is looked for: the hierarchy's root, kubelet's top cgroups
    (below ``kubelet_root``), then the first ``limit`` children (v2's root lacks most ``cpu.*``
    files)."""
    out = [base, base / _kubepods(kubelet_root, "systemd"), base / _kubepods(kubelet_root, "cgroupfs")]
    try:
        children = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        children = []
    return out + children[:limit]


def _find(base: Path, file: str, kubelet_root: str = "") -> Path | None:
    for directory in _probe_dirs(base, kubelet_root=kubelet_root):
        candidate = directory / file
        if candidate.is_file():
            return candidate
    return None


def _needs(plugins: Iterable[str], wanted: Sequence[str]) -> tuple[str, ...]:
    configured = set(plugins)
    return tuple(p for p in wanted if p in configured)


def _missing(name: str, what: str, needed: tuple[str, ...]) -> Check:
    if needed:
        return Check(name, "fail", f"{what}; needed by {', '.join(needed)}", needed)
    return Check(name, "warn", f"{what}; no configured plugin needs it")


def check_cgroup(opts: DoctorOptions) -> list[Check]:
    root = Path(opts.cgroup_root)
    if not root.is_dir():
        return [Check("cgroup", "fail", f"{root} is not a directory: no cgroup filesystem")]
    version = cgroup_version(root)
    checks = [Check("cgroup version", "ok", f"v{version} at {root}")]
    kroot = opts.kubelet_cgroup_root
    seen = detect_cgroup_driver(root, kroot)
    where = f" under kubelet cgroup root {kroot}" if kroot else ""
    if not opts.cgroup_driver:
        if seen:
            checks.append(Check("cgroup driver", "ok", f"{seen}, detected from kubelet's cgroups{where} "
                                                       "(cgroupDriver unset)"))
        else:
            hint = "" if kroot else "; if kubelet runs with --cgroup-root, set kubeletCgroupRoot"
            checks.append(Check("cgroup driver", "warn", f"cgroupDriver unset and no kubepods cgroup{where} yet "
                                                         "to detect it from: the proxy will use cgroupfs; set "
                                                         f"cgroupDriver: systemd if kubelet uses systemd{hint}"))
    elif not seen:
        hint = "" if kroot else " (if kubelet runs with --cgroup-root, set kubeletCgroupRoot)"
        checks.append(Check("cgroup driver", "ok", f"{opts.cgroup_driver} configured; no kubepods cgroup{where} "
                                                   f"yet to compare with kubelet's{hint}"))
    elif seen == opts.cgroup_driver:
        checks.append(Check("cgroup driver", "ok", f"{seen}, as kubelet's cgroups{where} show"))
    else:
        checks.append(Check("cgroup driver", "fail", f"{opts.cgroup_driver} configured, but kubelet's cgroups "
                                                     f"look like {seen}: set cgroupDriver: {seen}"))
    if version == 2:
        try:
            enabled = set(read_text_file(root / "cgroup.subtree_control", limit=KERNEL_FILE_BYTES).split())
        except FileRefused:
            enabled = set()
        for controller, users in (("cpu", ("cpuset", "batch_resource", "cpu_burst", *GROUP_IDENTITY_PLUGINS)),
                                  ("cpuset", ("cpuset", "numa")), ("memory", ("batch_resource", "memory_qos"))):
            name = f"controller {controller}"
            if controller in enabled:
                checks.append(Check(name, "ok", "enabled in cgroup.subtree_control"))
            else:
                checks.append(_missing(name, "not enabled in cgroup.subtree_control", _needs(opts.plugins, users)))
    return checks


def check_interfaces(opts: DoctorOptions) -> list[Check]:
    root = Path(opts.cgroup_root)
    if not root.is_dir():
        return []
    version = cgroup_version(root)
    checks: list[Check] = []
    for iface in INTERFACES:
        file = iface.v2 if version == 2 else iface.v1
        base = root if version == 2 else root / _v1_controller(file)
        needed = _needs(opts.plugins, iface.plugins)
        found = _find(base, file, opts.kubelet_cgroup_root)
        name = f"{iface.name} ({file})"
        checks.append(Check(name, "ok", str(found), needed) if found else
                      _missing(name, f"no {file} under {base}", needed))
    checks += _group_identity(opts, root, version)
    checks += _memory_qos(opts, root, version)
    return checks


MEMORY_QOS_FILES = ("memory.min", "memory.low", "memory.high")


def _memory_qos(opts: DoctorOptions, root: Path, version: int) -> list[Check]:
    """memory_qos writes memory.min/low/high on cgroup v2 only (hooks/plugins/memory_qos.py)."""
    needed = _needs(opts.plugins, ("memory_qos",))
    name = "memory qos (memory.min/low/high)"
    if version != 2:
        what = ("cgroup v1: memory_qos writes nothing here (memory.min, memory.low and memory.high are "
                "cgroup v2 files; only Anolis kernels add them to v1, and the plugin does not use them)")
        return [Check(name, "warn", what, needed)] if needed else [_missing(name, what, needed)]
    missing = [f for f in MEMORY_QOS_FILES if _find(root, f, opts.kubelet_cgroup_root) is None]
    if missing:
        return [_missing(name, f"no {', '.join(missing)} under {root}", needed)]
    return [Check(name, "ok", f"found under {root}", needed)]


def _group_identity(opts: DoctorOptions, root: Path, version: int) -> list[Check]:
    base = root if version == 2 else root / "cpu"
    kroot = opts.kubelet_cgroup_root
    bvt, idle = _find(base, "cpu.bvt_warp_ns", kroot), _find(base, "cpu.idle", kroot)
    needed = _needs(opts.plugins, GROUP_IDENTITY_PLUGINS)
    checks = []
    if bvt:
        checks.append(Check("group identity (cpu.bvt_warp_ns)", "ok", str(bvt), needed))
    elif idle:
        checks.append(Check("group identity (cpu.bvt_warp_ns)", "warn",
                            "not in this kernel (no Alibaba Cloud Linux group identity): under NodeSLO "
                            "cpuPolicy groupIdentity (the default) the cpu.bvt_warp_ns writes are skipped as "
                            "unsupported; set resourceQOSStrategy.policies.cpuPolicy: coreSched to have "
                            "cpu.idle written instead"))
    else:
        checks.append(_missing("group identity (cpu.bvt_warp_ns)", f"no cpu.bvt_warp_ns under {base}", needed))
    if idle:
        checks.append(Check("cpu idle (cpu.idle)", "ok", str(idle), needed))
    elif bvt:
        checks.append(Check("cpu idle (cpu.idle)", "warn", "not in this kernel (before 5.15): under NodeSLO "
                            "cpuPolicy coreSched the cpu.idle writes are skipped as unsupported; keep "
                            "cpuPolicy groupIdentity (cpu.bvt_warp_ns)"))
    else:
        checks.append(_missing("cpu idle (cpu.idle)", f"no cpu.idle under {base} (kernel >= 5.15)", needed))
    return checks


def _mounted(proc_root: Path, fstype: str, path: Path) -> bool | None:
    """Whether ``path`` is a mount of ``fstype`` per ``/proc/mounts`` (None when unreadable)."""
    mounts = read_mounts(proc_root / "mounts")
    return None if mounts is None else is_mount_of(path, fstype, mounts)


def check_resctrl(opts: DoctorOptions) -> list[Check]:
    root = Path(opts.resctrl_root)
    needed = _needs(opts.plugins, RESCTRL_PLUGINS)
    info = root / "info"
    if not info.is_dir():
        mounted = _mounted(Path(opts.proc_root), "resctrl", root)
        why = "not mounted" if mounted is False else "no info directory"
        what = f"{why} at {root} (mount -t resctrl resctrl {root}, on a CPU with RDT)"
        if needed:  # the proxy leaves these plugins out at start (runtime_proxy.wiring.HARDWARE)
            return [Check("resctrl", "warn", f"{what}; {', '.join(needed)} will be skipped", needed)]
        return [_missing("resctrl", what, needed)]
    checks = [Check("resctrl", "ok", f"mounted at {root}", needed)]
    try:
        cbm_mask: str | None = read_text_file(info / "L3" / "cbm_mask", limit=KERNEL_FILE_BYTES).strip()
    except FileRefused:
        cbm_mask = None
    if cbm_mask is not None:
        checks.append(Check("resctrl L3 (cache ways)", "ok", f"cbm_mask {cbm_mask[:32]}", needed))
    else:
        checks.append(_missing("resctrl L3 (cache ways)", "no info/L3: the CPU offers no cache allocation", needed))
    if (info / "MB").is_dir():
        checks.append(Check("resctrl MB (memory bandwidth)", "ok", "info/MB present", needed))
    else:
        checks.append(_missing("resctrl MB (memory bandwidth)", "no info/MB: the CPU offers no bandwidth allocation",
                               needed))
    return checks


def _socket_state(path: str, timeout: float = 1.0) -> tuple[str, str]:
    """("absent" | "live" | "stale" | "other", detail) for what is at ``path``."""
    import socket

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent", "nothing there"
    except OSError as exc:
        return "other", exc.strerror or str(exc)
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a symlink" if stat.S_ISLNK(st.st_mode) else "a file"
        return "other", f"{kind}, not a socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        return "live", "a process accepts connections"
    except OSError as exc:
        return "stale", f"a socket nobody accepts on ({exc.strerror or exc})"
    finally:
        sock.close()


async def _runtime_version(backend: str, timeout: float) -> api_pb2.VersionResponse:
    from runtime_proxy.runtime.client import RuntimeClient

    client = RuntimeClient(backend, timeout=timeout)
    try:
        return await client.version()
    finally:
        await client.close()


def check_runtime(opts: DoctorOptions) -> list[Check]:
    name = "containerd (CRI)"
    state, detail = _socket_state(opts.backend)
    if state != "live":
        return [Check(name, "fail", f"{opts.backend} not reachable: {detail}")]
    try:
        resp = asyncio.run(_runtime_version(opts.backend, opts.runtime_timeout))
    except Exception as exc:
        short = shorten_rpc_errors(None, "", {"error": exc})["error"]
        short = short if isinstance(short, str) else f"{type(exc).__name__}: {exc}"
        return [Check(name, "fail", f"{opts.backend} does not answer CRI v1 Version: {short}")]
    api = resp.runtime_api_version or "?"
    status: Status = "ok" if api.startswith("v1") and not api.startswith("v1alpha") else "fail"
    return [Check(name, status, f"{resp.runtime_name} {resp.runtime_version}, CRI {api} at {opts.backend}")]


def check_nri(opts: DoctorOptions) -> list[Check]:
    state, detail = _socket_state(opts.nri_socket)
    name = "NRI socket"
    if state == "live":
        return [Check(name, "ok", f"{opts.nri_socket}: {detail}")]
    what = f"{opts.nri_socket}: {detail}; enable NRI in containerd's config (docs/nri.md)"
    if opts.mode == "nri":
        return [Check(name, "fail", what, ("runtime-proxy nri",))]
    return [Check(name, "warn", f"{what}; only runtime-proxy nri needs it")]


def check_listen(opts: DoctorOptions) -> list[Check]:
    directory = Path(opts.listen).parent
    checks: list[Check] = []
    try:
        st = directory.stat()
    except OSError:
        checks.append(Check("listen directory", "warn",
                            f"{directory} does not exist yet; the unit's RuntimeDirectory= creates it"))
    else:
        if not stat.S_ISDIR(st.st_mode):
            checks.append(Check("listen directory", "fail", f"{directory} is not a directory"))
        elif st.st_mode & stat.S_IWOTH:
            checks.append(Check("listen directory", "fail",
                                f"{directory} is world-writable (mode {stat.S_IMODE(st.st_mode):04o})"))
        elif not os.access(directory, os.W_OK | os.X_OK):
            checks.append(Check("listen directory", "fail", f"this user cannot create sockets in {directory}"))
        else:
            checks.append(Check("listen directory", "ok",
                                f"{directory}: mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"))
    state, detail = _socket_state(opts.listen)
    name = "listen path"
    if state == "other":
        checks.append(Check(name, "fail", f"{opts.listen}: {detail}; the proxy refuses to start over it"))
    elif state == "live":
        checks.append(Check(name, "ok", f"{opts.listen}: a proxy (or another process) serves it"))
    elif state == "stale":
        checks.append(Check(name, "ok", f"{opts.listen}: {detail}; the proxy replaces it at start"))
    else:
        checks.append(Check(name, "ok", f"{opts.listen}: free"))
    return checks


def check_files(opts: DoctorOptions) -> list[Check]:
    checks: list[Check] = []
    if opts.config_error:
        checks.append(Check("config", "fail", opts.config_error))
    elif opts.config_path:
        checks.append(Check("config", "ok", f"{opts.config_path} is valid; plugins: {', '.join(opts.plugins)}"))
    else:
        checks.append(Check("config", "ok", f"none given; checked for plugins: {', '.join(opts.plugins)}"))
    if opts.node_config is None:
        checks.append(Check("node config", "ok", "none configured: NodeSLO defaults (or fromCluster)"))
    else:
        from runtime_proxy.state.nodeconfig import load_document, read_document_text

        name = "node config"
        try:
            load_document(read_document_text(Path(opts.node_config)))
            checks.append(Check(name, "ok", f"{opts.node_config} is valid"))
        except FileRefused as exc:
            checks.append(Check(name, "fail", f"{opts.node_config}: {exc.message}"))
        except Exception as exc:  # pydantic's ValidationError is a ValueError; any other is a bad file too
            checks.append(Check(name, "fail", f"{opts.node_config}: invalid: {' '.join(str(exc).split())[:300]}"))
    return checks


def _unsafe(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def check_hook_servers(opts: DoctorOptions) -> list[Check]:
    from runtime_proxy.hookclient.registration import (
        MAX_REGISTRATION_BYTES,
        RegistrationError,
        parse_registration,
    )

    directory = Path(opts.hook_server_dir)
    try:
        dst = directory.lstat()
    except OSError:
        return [Check("hook servers", "ok", f"no {directory}: no hook servers registered")]
    why = _unsafe(dst) or ("" if stat.S_ISDIR(dst.st_mode) else "not a directory")
    if why:
        return [Check("hook servers", "fail", f"{directory} is {why}: the proxy reads no registration there")]
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".json"))[:256]
    except OSError as exc:
        return [Check("hook servers", "fail", f"cannot list: {exc.strerror or exc}")]
    if not files:
        return [Check("hook servers", "ok", f"no registrations in {directory}")]
    checks = []
    for path in files:
        name = f"hook server {path.name}"
        try:
            st = path.lstat()
            kind = "" if stat.S_ISREG(st.st_mode) else f"not a regular file: {describe_mode(st.st_mode)}"
            why = _unsafe(st) or kind
            if why:
                checks.append(Check(name, "fail", f"{why}: refused by the proxy"))
                continue
            raw = read_regular_file(path, limit=MAX_REGISTRATION_BYTES, follow_symlinks=False, expect=st)
            reg = parse_registration(path.name, raw, 2.0)
        except RegistrationError as exc:
            checks.append(Check(name, "fail", f"invalid: {exc}"))
            continue
        except FileRefused as exc:
            checks.append(Check(name, "fail", exc.message))
            continue
        except OSError as exc:
            checks.append(Check(name, "fail", f"cannot read: {exc.strerror or exc}"))
            continue
        state, detail = _socket_state(reg.endpoint)
        hooks = ", ".join(reg.hooks) or "no known hooks"
        if state == "live":
            checks.append(Check(name, "ok", f"{reg.endpoint} answers; {reg.policy}; {hooks}"))
        else:
            status: Status = "fail" if reg.policy == "Fail" else "warn"
            checks.append(Check(name, status, f"{reg.endpoint}: {detail} (failure-policy {reg.policy})"))
    return checks


CHECKS = {
    "cgroup": check_cgroup,
    "interfaces": check_interfaces,
    "resctrl": check_resctrl,
    "runtime": check_runtime,
    "nri": check_nri,
    "listen": check_listen,
    "files": check_files,
    "hook-servers": check_hook_servers,
}


def run(opts: DoctorOptions) -> list[Check]:
    """Every check group not in ``opts.skip``, in ``CHECKS`` order."""
    out: list[Check] = []
    for name, check in CHECKS.items():
        if name not in opts.skip:
            out += check(opts)
    return out


def passed(checks: Sequence[Check]) -> bool:
    return all(c.status != "fail" for c in checks)


def format_text(checks: Sequence[Check]) -> str:
    width = max([5, *(len(c.name) for c in checks)])
    lines = [f"{'CHECK':<{width}}  STATUS  DETAIL"]
    lines += [f"{c.name:<{width}}  {c.status:<6}  {c.detail}" for c in checks]
    failed = sum(c.status == "fail" for c in checks)
    lines.append("")
    lines.append("ready for runtime-proxy" if not failed else f"NOT ready: {failed} check(s) failed")
    return "\n".join(lines)


def format_json(checks: Sequence[Check]) -> str:
    return json.dumps({"ready": passed(checks), "checks": [c.to_json() for c in checks]}, indent=2)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("doctor", help=HELP["doctor"],
                       description="Check this node before switching kubelet to the proxy: cgroups, kernel files "
                                   "the plugins use, resctrl, containerd, NRI, the listen path, config files and "
                                   "hook-server registrations.",
                       epilog=EXIT_CODES)
    add_arguments(p)
    return p


def add_arguments(p: argparse._ActionsContainer) -> None:
    """The flags of ``runtime-proxy doctor`` (``add_parser``; ``kubelet-switch`` takes them too)."""
    p.add_argument("--config", help="the proxy's config file: which plugins are configured, roots, directories")
    p.add_argument("--node-config", help="node config file to validate (default: the config's nodeConfigFile)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="the proxy's listen socket (default %(default)s)")
    p.add_argument("--backend", default=DEFAULT_BACKEND, help="the runtime's CRI socket (default %(default)s)")
    p.add_argument("--nri-socket", default=DEFAULT_NRI, help="the runtime's NRI socket (default %(default)s)")
    p.add_argument("--mode", choices=("serve", "nri"), default="serve",
                   help="check for runtime-proxy serve (default) or runtime-proxy nri")
    p.add_argument("--plugins", help="comma-separated plugins to check for (default: the config's, or all built-ins)")
    p.add_argument("--cgroup-root", help="cgroup filesystem root (default: the config's, /sys/fs/cgroup)")
    p.add_argument("--cgroup-driver", choices=("cgroupfs", "systemd"), help="kubelet's cgroup driver")
    p.add_argument("--resctrl-root", help="resctrl filesystem root (default: the config's, /sys/fs/resctrl)")
    p.add_argument("--proc-root", default="/proc", help="proc filesystem root (default %(default)s)")
    p.add_argument("--hook-server-dir", help="hook-server registrations (default: the config's)")
    p.add_argument("--skip", action="append", default=[], choices=sorted(CHECKS), metavar="GROUP",
                   help=f"leave out a group of checks ({', '.join(CHECKS)}); repeatable")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text",
                   help="a table for people (default) or json for programs")


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    config_error = ""
    cfg = ProxyConfig()
    try:
        cfg = load_config(args.config)
        check_usable(cfg)
    except ConfigError as exc:
        config_error = str(exc)
    if args.plugins is not None:
        plugins = tuple(p.strip() for p in args.plugins.split(",") if p.strip())
    elif cfg.plugins:
        plugins = tuple(p.name for p in cfg.plugins if p.enabled)
    else:
        plugins = tuple(BUILTIN_PLUGINS)
    opts = DoctorOptions(
        cgroup_root=args.cgroup_root or cfg.cgroupRoot,
        cgroup_driver=args.cgroup_driver or cfg.cgroupDriver or "",
        kubelet_cgroup_root=cfg.kubeletCgroupRoot,
        resctrl_root=args.resctrl_root or cfg.resctrlRoot,
        proc_root=args.proc_root,
        backend=args.backend.removeprefix("unix://"),
        nri_socket=args.nri_socket.removeprefix("unix://"),
        listen=args.listen.removeprefix("unix://"),
        config_path=args.config,
        node_config=args.node_config or cfg.nodeConfigFile,
        hook_server_dir=args.hook_server_dir or cfg.hookServerDir,
        plugins=plugins,
        mode=args.mode,
        config_error=config_error,
        skip=frozenset(args.skip),
    )
    return opts


def main_from_args(args: argparse.Namespace) -> int:
    """Run the checks, print the report on stdout; exit code per ``EXIT_CODES``."""
    checks = run(options_from_args(args))
    print(format_json(checks) if args.output == "json" else format_text(checks))
    sys.stdout.flush()
    return EXIT_OK if passed(checks) else EXIT_FAILED

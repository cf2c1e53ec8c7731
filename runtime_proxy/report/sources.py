"""What the reports read from the machine: NUMA memory and GPUs from sysfs and the NVIDIA
driver's files, and kubelet's CPU and topology manager settings from its config file.

Roots are parameters (``report.sysRoot``, ``report.procRoot``), so tests use a prepared tree.
Every file is read bounded (``runtime_proxy.loops.usage.read_bounded``, ``MAX_FILE_BYTES``;
kubelet's config with ``rhp_ops.files``, ``MAX_KUBELET_CONFIG_BYTES``) and parsed totally: what
cannot be read or parsed leaves out that one NUMA node or GPU (logged once while it fails),
never the report.

- NUMA memory: ``devices/system/node/node<N>/meminfo`` ``MemTotal`` (bytes).
- GPUs: each ``bus/pci/devices/<bus id>`` with ``vendor`` 0x10de (NVIDIA) and a display
  ``class`` (0x03xxxx), joined with the driver's ``driver/nvidia/gpus/<bus id>/information``
  (``Device Minor``, ``GPU UUID``, ``Model``) below the proc root. A GPU the driver does not
  list is left out (its minor and UUID are what pods are given), as koordlet sees only what
  NVML, the driver's library, lists. Its NUMA node is the device's ``numa_node`` (-1 read as 0,
  as koordlet does) and its PCIe root the ``pciDDDD:BB`` part of the device's resolved sysfs
  path. The driver's files carry no memory size; ``report.gpuMemoryBytes`` gives it.
- kubelet: ``cpuManagerPolicy``, ``cpuManagerPolicyOptions``, ``reservedSystemCPUs``,
  ``kubeReserved.cpu`` + ``systemReserved.cpu``, ``topologyManagerPolicy`` and
  ``topologyManagerScope`` of its ``KubeletConfiguration`` file; a missing file reads as
  kubelet's defaults (policy ``none``).
- kubelet's CPU manager checkpoint (``cpu_manager_state``): ``entries`` pod uid -> container ->
  cpuset, the CPUs its static policy pinned; a missing or malformed file reads as none.
- CPU basic info (``node.koordinator.sh/cpu-basic-info``, ``read_cpu_basic_info``): ``model
  name`` and ``vendor_id`` of the first processor in ``cpuinfo`` below the proc root (its first
  64 KiB); hyper-threading from ``devices/system/cpu/smt/active`` as koordlet reads it, else
  from the CPU topology's siblings (a core with more than one CPU); turbo from
  ``devices/system/cpu/intel_pstate/no_turbo`` ("0": on), else ``devices/system/cpu/cpufreq/boost``
  ("1": on), else off (a VM without either exposes no turbo); ``catL3CbmMask`` from
  ``fs/resctrl/info/L3/cbm_mask`` when resctrl is mounted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import structlog

from koord_formats.bounded import load_json, read_object, read_str
from koord_formats.cpulist import MAX_CPU_LIST_CHARS, parse_cpu_list
from koord_formats.cpunormalization import CPUBasicInfo
from koord_formats.device import MAX_DEVICES, GPUInfo
from koord_formats.errors import FormatError
from koord_formats.quantity import parse_cpu_milli
from koord_formats.topology import CPUTopology
from rhp_ops.files import FileRefused, read_text_file
from rhp_ops.yamlsafe import DocumentError, load_yaml
from runtime_proxy.loops.usage import SampleError, read_bounded

__all__ = [
    "MAX_KUBELET_CONFIG_BYTES",
    "KubeletConfig",
    "discover_gpus",
    "parse_cpu_manager_state",
    "read_cpu_basic_info",
    "read_cpu_manager_state",
    "read_kubelet_config",
    "read_numa_memory",
]

log = structlog.get_logger("runtime_proxy.report.sources")

NVIDIA_VENDOR = "0x10de"
MAX_KUBELET_CONFIG_BYTES = 256 * 1024
_SMALL = 4096
_MAX_PCI_DEVICES = 4096
_MAX_NUMA_NODES = 1024
_PCIE_ROOT = re.compile(r"pci[0-9]{4}:[0-9a-fA-F]{2}")
_BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,100}")
_warned: set[str] = set()


def _warn_once(key: str, message: str, **fields: object) -> None:
    if key not in _warned and len(_warned) < 4096:
        _warned.add(key)
        log.warning(message, **fields)


def _text(path: Path) -> str | None:
    """The file's text (at most 4 KiB, ASCII/UTF-8), ``None`` when it is absent or unusable."""
    try:
        return read_bounded(path, _SMALL).decode("utf-8").strip()
    except FileNotFoundError:
        return None
    except (SampleError, UnicodeDecodeError) as exc:
        _warn_once(str(path), "report source unreadable; left out", path=str(path), error=str(exc))
        return None


def read_numa_memory(sys_root: str | os.PathLike[str] = "/sys") -> dict[int, int]:
    """NUMA node id -> its ``MemTotal`` in bytes; a node whose meminfo cannot be read or parsed
    is left out."""
    base = Path(sys_root) / "devices" / "system" / "node"
    out: dict[int, int] = {}
    try:
        names = sorted(os.listdir(base))[: _MAX_NUMA_NODES * 2]
    except OSError:
        return out
    for name in names:
        if not (name.startswith("node") and name[4:].isdigit() and len(name) <= 9):
            continue
        text = _text(base / name / "meminfo")
        if text is None:
            continue
        for line in text.splitlines():
            parts = line.split()
            # "Node 0 MemTotal:       16318412 kB"
            if len(parts) == 5 and parts[2] == "MemTotal:" and parts[4] == "kB" and parts[3].isdigit() \
                    and len(parts[3]) <= 15:
                out[int(name[4:])] = int(parts[3]) * 1024
                break
        else:
            _warn_once(f"meminfo:{name}", "NUMA meminfo without MemTotal; node left out", node=name)
    return out


def _driver_info(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines()[:64]:
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def discover_gpus(
    sys_root: str | os.PathLike[str] = "/sys",
    proc_root: str | os.PathLike[str] = "/proc",
    *,
    memory_bytes: int | None = None,
) -> tuple[GPUInfo, ...]:
    """The node's NVIDIA GPUs (see the module docstring), by minor; ``()`` when it has none."""
    pci = Path(sys_root) / "bus" / "pci" / "devices"
    driver = Path(proc_root) / "driver" / "nvidia" / "gpus"
    try:
        entries = sorted(os.listdir(pci))[:_MAX_PCI_DEVICES]
    except OSError:
        return ()
    found: dict[int, GPUInfo] = {}
    for name in entries:
        if _BUS_ID.fullmatch(name) is None:
            continue
        dev = pci / name
        if _text(dev / "vendor") != NVIDIA_VENDOR or not (_text(dev / "class") or "").startswith("0x03"):
            continue
        bus_id = name.lower()
        info_text = _text(driver / name / "information") or _text(driver / bus_id / "information")
        if info_text is None:
            _warn_once(f"gpu:{bus_id}", "NVIDIA GPU without the driver's information file; not reported",
                       bus_id=bus_id)
            continue
        info = _driver_info(info_text)
        minor_text, uuid = info.get("Device Minor", ""), info.get("GPU UUID", "")
        if not (minor_text.isdigit() and len(minor_text) <= 5 and _UUID.fullmatch(uuid)):
            _warn_once(f"gpu-info:{bus_id}", "NVIDIA GPU information without a usable minor and UUID; not reported",
                       bus_id=bus_id)
            continue
        numa_text = _text(dev / "numa_node") or "-1"
        numa = int(numa_text) if numa_text.lstrip("-").isdigit() and len(numa_text) <= 5 else -1
        try:
            resolved = os.path.realpath(dev)
        except (OSError, ValueError):
            resolved = ""
        root = _PCIE_ROOT.search(resolved)
        minor = int(minor_text)
        if minor in found or len(found) >= MAX_DEVICES:
            continue
        found[minor] = GPUInfo(
            minor=minor,
            uuid=uuid,
            bus_id=bus_id,
            numa_node=max(numa, 0),
            pcie_root=root.group(0) if root else "",
            memory_bytes=memory_bytes,
            model=info.get("Model", "")[:128],
        )
    return tuple(found[m] for m in sorted(found))


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """What the NRT reports of kubelet's config (kubelet's defaults when a field is absent)."""

    cpu_manager_policy: str = "none"
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    reserved_system_cpus: frozenset[int] | None = None
    reserved_cpu_milli: int = 0  # kubeReserved.cpu + systemReserved.cpu
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"


def _str(doc: Mapping[str, object], key: str, default: str) -> str:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or len(value) > 64:
        raise FormatError(f"kubelet config {key}: expected a short string")
    return value


def _reserved_cpu(doc: Mapping[str, object], key: str) -> int:
    section = doc.get(key)
    if section is None:
        return 0
    if not isinstance(section, dict):
        raise FormatError(f"kubelet config {key}: expected a map")
    value = section.get("cpu")
    return 0 if value is None else parse_cpu_milli(value if isinstance(value, int | str) else str(value))


def parse_kubelet_config(text: str) -> KubeletConfig:
    """A ``KubeletConfiguration`` YAML text (at most ``MAX_KUBELET_CONFIG_BYTES``) as a
    ``KubeletConfig``; ``FormatError`` when a field it reads is malformed."""
    if len(text) > MAX_KUBELET_CONFIG_BYTES:
        raise FormatError("kubelet config: too large")
    try:  # the one YAML reader: bounded, no anchors or aliases
        doc = load_yaml(text, max_bytes=4 * MAX_KUBELET_CONFIG_BYTES)
    except DocumentError as exc:
        raise FormatError(f"kubelet config: not YAML: {str(exc)[:200]}") from None
    if doc is None:
        return KubeletConfig()
    if not isinstance(doc, dict):
        raise FormatError("kubelet config: expected a map")
    raw_options = doc.get("cpuManagerPolicyOptions") or {}
    if not isinstance(raw_options, dict) or len(raw_options) > 64:
        raise FormatError("kubelet config cpuManagerPolicyOptions: expected a small map")
    options = {str(k)[:64]: str(v)[:64] for k, v in raw_options.items()}
    reserved = doc.get("reservedSystemCPUs")
    return KubeletConfig(
        cpu_manager_policy=_str(doc, "cpuManagerPolicy", "none") or "none",
        options=MappingProxyType(options),
        reserved_system_cpus=parse_cpu_list(reserved) if isinstance(reserved, str) and reserved.strip() else None,
        reserved_cpu_milli=_reserved_cpu(doc, "kubeReserved") + _reserved_cpu(doc, "systemReserved"),
        topology_manager_policy=_str(doc, "topologyManagerPolicy", "none"),
        topology_manager_scope=_str(doc, "topologyManagerScope", "container"),
    )


def read_kubelet_config(path: str | None) -> KubeletConfig:
    """kubelet's config from ``path`` (``report.kubeletConfigFile``); its defaults when the path
    is empty or the file is absent, unreadable or malformed (logged once)."""
    if not path:
        return KubeletConfig()
    try:
        return parse_kubelet_config(read_text_file(path, limit=MAX_KUBELET_CONFIG_BYTES))
    except FileRefused as exc:
        if exc.reason != "missing":
            _warn_once(f"kubelet:{path}", "kubelet config unusable; reporting kubelet's defaults", path=path,
                       error=exc.message)
        return KubeletConfig()
    except (OSError, FormatError, ValueError) as exc:
        _warn_once(f"kubelet:{path}", "kubelet config unusable; reporting kubelet's defaults", path=path,
                   error=str(exc))
        return KubeletConfig()


_MAX_STATE_PODS = 4096
_MAX_STATE_CONTAINERS = 64


def parse_cpu_manager_state(text: str) -> dict[str, frozenset[int]]:
    """kubelet's ``cpu_manager_state`` checkpoint: pod uid -> the CPUs its containers were
    pinned to (pods with none left out); ``FormatError`` when it is malformed or over its bounds
    (``MAX_KUBELET_CONFIG_BYTES``, 4096 pods, 64 containers each)."""
    doc = read_object(load_json(text, "cpu_manager_state", max_chars=MAX_KUBELET_CONFIG_BYTES), "cpu_manager_state")
    raw = doc.get("entries")
    entries = {} if raw is None else read_object(raw, "cpu_manager_state entries")
    if len(entries) > _MAX_STATE_PODS:
        raise FormatError(f"cpu_manager_state: more than {_MAX_STATE_PODS} pods")
    out: dict[str, frozenset[int]] = {}
    for uid, containers in entries.items():
        per_pod = read_object(containers, "cpu_manager_state pod")
        if len(per_pod) > _MAX_STATE_CONTAINERS:
            raise FormatError(f"cpu_manager_state: more than {_MAX_STATE_CONTAINERS} containers in a pod")
        cpus: frozenset[int] = frozenset()
        for value in per_pod.values():
            cpus |= parse_cpu_list(read_str(value, "cpu_manager_state cpuset", MAX_CPU_LIST_CHARS))
        if cpus:
            out[read_str(uid, "cpu_manager_state pod uid")] = cpus
    return out


def read_cpu_manager_state(path: str | None) -> dict[str, frozenset[int]]:
    """``parse_cpu_manager_state`` of the file at ``path``; ``{}`` when the path is empty or the
    file absent, unreadable or malformed (logged once)."""
    if not path:
        return {}
    try:
        return parse_cpu_manager_state(read_text_file(path, limit=MAX_KUBELET_CONFIG_BYTES))
    except FileRefused as exc:
        if exc.reason != "missing":
            _warn_once(f"state:{path}", "kubelet's cpu_manager_state unusable; no kubelet-pinned CPUs reported",
                       path=path, error=exc.message)
        return {}
    except (OSError, FormatError, ValueError) as exc:
        _warn_once(f"state:{path}", "kubelet's cpu_manager_state unusable; no kubelet-pinned CPUs reported",
                   path=path, error=str(exc))
        return {}


_CPUINFO_HEAD = 64 * 1024
_CPUINFO_FIELDS = {"model name": "model", "vendor_id": "vendor"}
_PRINTABLE = re.compile(r"[\x20-\x7e]{1,256}", re.ASCII)


def _cpuinfo_fields(text: str) -> dict[str, str]:
    """``model name`` and ``vendor_id`` of the first processor block (printable ASCII, at most
    256 characters each; anything else is left out)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break  # the end of the first processor's block
            continue
        key, sep, value = line.partition(":")
        name = _CPUINFO_FIELDS.get(key.strip())
        value = value.strip()
        if sep and name is not None and name not in out and _PRINTABLE.fullmatch(value):
            out[name] = value
    return out


def _flag(path: Path, on: str, off: str) -> bool | None:
    text = _text(path)
    if text == on:
        return True
    if text == off:
        return False
    return None


def read_cpu_basic_info(topology: CPUTopology, sys_root: str | os.PathLike[str] = "/sys",
                        proc_root: str | os.PathLike[str] = "/proc") -> CPUBasicInfo:
    """The node's CPU basic info (the module docstring says from where); what cannot be read
    is left empty or off, never an error."""
    fields: dict[str, str] = {}
    try:
        raw = read_bounded(Path(proc_root) / "cpuinfo", _CPUINFO_HEAD, head=True)
        fields = _cpuinfo_fields(raw.decode("utf-8", "replace"))
    except FileNotFoundError:
        _warn_once("cpuinfo", "no cpuinfo below the proc root; CPU model left out", proc_root=str(proc_root))
    except SampleError as exc:
        _warn_once("cpuinfo", "cpuinfo unreadable; CPU model left out", error=str(exc))
    cpu = Path(sys_root) / "devices" / "system" / "cpu"
    smt = _flag(cpu / "smt" / "active", "1", "0")
    hyper_threads = smt if smt is not None else any(len(c) > 1 for c in topology.core_cpus)
    turbo = _flag(cpu / "intel_pstate" / "no_turbo", "0", "1")
    if turbo is None:
        turbo = bool(_flag(cpu / "cpufreq" / "boost", "1", "0"))
    mask = _text(Path(sys_root) / "fs" / "resctrl" / "info" / "L3" / "cbm_mask") or ""
    return CPUBasicInfo(
        cpu_model=fields.get("model", ""),
        hyper_thread_enabled=hyper_threads,
        turbo_enabled=turbo,
        cat_l3_cbm_mask=mask if re.fullmatch(r"[0-9a-fA-F]{1,64}", mask) else "",
        vendor_id=fields.get("vendor", ""),
    )

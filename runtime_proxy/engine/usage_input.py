"""The planner's ``usage`` input: a JSON object in the shape of ``hooks.usage.Usage``, decoded
totally into that value (``runtime-proxy plan``, ``runtime_proxy.engine.planner``; the schema is
in ``docs/planner.md``).

Keys are accepted in camelCase (``nodeCpuMilli``) or in the dataclass field's snake_case
(``node_cpu_milli``), never both for one field. The input is hostile: it arrives inside the
planner document, already bounded in size and depth by ``koord_formats.bounded.load_json``, and
this parser further bounds every count (samples, pods, containers, host applications,
evictions) and every number, refuses unknown keys and wrong types, and raises only
``UsageInputError`` (a ``ValueError``) with the path of the first problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

from hooks.usage import MAX_SAMPLES, BEState, EvictionRecord, ResourceUsage, Usage, UsageSample
from koord_formats.cpulist import parse_cpu_list
from koord_formats.errors import FormatError

__all__ = [
    "MAX_ENTRIES",
    "MAX_EVICTIONS",
    "MAX_HOST_APPS",
    "MAX_TOTAL_ENTRIES",
    "UsageInputError",
    "usage_from_json",
]

# Pods or containers in one sample (a node runs at most a few hundred pods).
MAX_ENTRIES = 4096
MAX_HOST_APPS = 256
MAX_EVICTIONS = 1024
# Pod, container and host-application entries over all samples together.
MAX_TOTAL_ENTRIES = 200_000
MAX_KEY_CHARS = 253
MAX_INT = (1 << 63) - 1
# Seconds: any monotonic or wall clock reading fits.
MAX_TIME = 1e12

T = TypeVar("T")


class UsageInputError(ValueError):
    """The ``usage`` input is malformed; the message names the path."""


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _fields(value: object, where: str, names: tuple[str, ...]) -> dict[str, object]:
    """The object's values by camelCase name; unknown keys, and a field given in both
    spellings, are errors."""
    if not isinstance(value, Mapping):
        raise UsageInputError(f"{where} must be an object")
    spellings = {n: n for n in names} | {_snake(n): n for n in names}
    out: dict[str, object] = {}
    for key, item in value.items():
        name = spellings.get(key) if isinstance(key, str) else None
        if name is None:
            shown = key[:40] if isinstance(key, str) else repr(key)[:40]
            raise UsageInputError(f"{where}.{shown}: unknown key (known: {', '.join(names)})")
        if name in out:
            raise UsageInputError(f"{where}.{name}: given twice (camelCase and snake_case)")
        if item is not None:
            out[name] = item
    return out


def _int(value: object, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageInputError(f"{where} must be an integer")
    if not lo <= value <= hi:
        raise UsageInputError(f"{where} must be in {lo}..{hi}")
    return value


def _number(value: object, where: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageInputError(f"{where} must be a number")
    number = float(value)
    if not math.isfinite(number) or not lo <= number <= hi:
        raise UsageInputError(f"{where} must be a finite number in {lo:g}..{hi:g}")
    return number


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS:
        raise UsageInputError(f"{where} must be a non-empty string of at most {MAX_KEY_CHARS} characters")
    return value


def _list(value: object, where: str, limit: int) -> list[object]:
    if not isinstance(value, list):
        raise UsageInputError(f"{where} must be a list")
    if len(value) > limit:
        raise UsageInputError(f"{where} holds {len(value)} entries, more than the {limit} allowed")
    return value


def _entries(value: object, where: str, limit: int, budget: list[int],
             read: Callable[[object, str], T]) -> Mapping[str, T]:
    """A map of id -> entry, each decoded by ``read``; ``budget`` counts entries overall."""
    if not isinstance(value, Mapping):
        raise UsageInputError(f"{where} must be an object (id -> usage)")
    if len(value) > limit:
        raise UsageInputError(f"{where} holds {len(value)} entries, more than the {limit} allowed")
    budget[0] -= len(value)
    if budget[0] < 0:
        raise UsageInputError(f"usage holds more than {MAX_TOTAL_ENTRIES} pod, container and host-app entries")
    out: dict[str, T] = {}
    for key, item in value.items():
        name = _text(key, f"{where} key")
        out[name] = read(item, f"{where}.{name[:40]}")
    return MappingProxyType(out)


def _resource(value: object, where: str) -> ResourceUsage:
    f = _fields(value, where, ("cpuMilli", "memoryBytes"))
    return ResourceUsage(
        cpu_milli=_int(f.get("cpuMilli", 0), f"{where}.cpuMilli"),
        memory_bytes=_int(f.get("memoryBytes", 0), f"{where}.memoryBytes"),
    )


def _be(value: object, where: str) -> BEState:
    f = _fields(value, where, ("cfsQuotaUs", "cfsPeriodUs", "cpuset"))
    cpuset = f.get("cpuset", "")
    if not isinstance(cpuset, str):
        raise UsageInputError(f"{where}.cpuset must be a CPU list string (\"0-3,8\")")
    try:
        cpus = parse_cpu_list(cpuset)
    except FormatError as exc:
        raise UsageInputError(f"{where}.cpuset: {exc}") from exc
    return BEState(
        cfs_quota_us=_int(f.get("cfsQuotaUs", -1), f"{where}.cfsQuotaUs", -1),
        cfs_period_us=_int(f.get("cfsPeriodUs", 100000), f"{where}.cfsPeriodUs", 1000, 1_000_000),
        cpuset=cpus,
    )


_SAMPLE_KEYS = (
    "at",
    "nodeCpuMilli",
    "nodeMemoryUsedBytes",
    "nodeMemoryTotalBytes",
    "beCpuMilli",
    "pods",
    "containers",
    "hostApps",
    "be",
)


def _sample(value: object, where: str, budget: list[int]) -> UsageSample:
    f = _fields(value, where, _SAMPLE_KEYS)
    if "at" not in f:
        raise UsageInputError(f"{where}.at is required (seconds)")
    return UsageSample(
        at=_number(f["at"], f"{where}.at", -MAX_TIME, MAX_TIME),
        node_cpu_milli=_int(f.get("nodeCpuMilli", 0), f"{where}.nodeCpuMilli"),
        node_memory_used_bytes=_int(f.get("nodeMemoryUsedBytes", 0), f"{where}.nodeMemoryUsedBytes"),
        node_memory_total_bytes=_int(f.get("nodeMemoryTotalBytes", 0), f"{where}.nodeMemoryTotalBytes"),
        be_cpu_milli=_int(f.get("beCpuMilli", 0), f"{where}.beCpuMilli"),
        pods=_entries(f.get("pods", {}), f"{where}.pods", MAX_ENTRIES, budget, _resource),
        containers=_entries(f.get("containers", {}), f"{where}.containers", MAX_ENTRIES, budget, _resource),
        host_apps=_entries(f.get("hostApps", {}), f"{where}.hostApps", MAX_HOST_APPS, budget, _resource),
        be=_be(f.get("be", {}), f"{where}.be"),
    )


def _eviction(value: object, where: str) -> EvictionRecord:
    f = _fields(value, where, ("uid", "feature", "at"))
    if "at" not in f:
        raise UsageInputError(f"{where}.at is required (seconds)")
    return EvictionRecord(
        uid=_text(f.get("uid"), f"{where}.uid"),
        feature=_text(f.get("feature"), f"{where}.feature"),
        at=_number(f["at"], f"{where}.at", -MAX_TIME, MAX_TIME),
    )


def usage_from_json(value: object, where: str = "usage") -> Usage:
    """``{"samples": [...], "interval": 1, "recentEvictions": [...]}`` -> ``hooks.usage.Usage``
    (see the module docstring). Samples must be in time order, oldest first."""
    f = _fields(value, where, ("samples", "interval", "recentEvictions"))
    raw_samples = _list(f.get("samples", []), f"{where}.samples", MAX_SAMPLES)
    budget = [MAX_TOTAL_ENTRIES]
    samples = tuple(_sample(s, f"{where}.samples[{i}]", budget) for i, s in enumerate(raw_samples))
    for i in range(1, len(samples)):
        if samples[i].at < samples[i - 1].at:
            raise UsageInputError(f"{where}.samples[{i}].at is older than the sample before it (oldest first)")
    raw_evictions = _list(f.get("recentEvictions", []), f"{where}.recentEvictions", MAX_EVICTIONS)
    evictions = tuple(_eviction(e, f"{where}.recentEvictions[{i}]") for i, e in enumerate(raw_evictions))
    interval = _number(f.get("interval", 1.0), f"{where}.interval", 0.001, 3600.0)
    return Usage(samples, interval=interval, recent_evictions=evictions)

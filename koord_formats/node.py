"""Node and NodeResourceTopology annotations about CPUs: system-QoS, reservation, kubelet's CPU
manager state, share pools, kubelet-managed pod CPUs, and the CPU normalization ratio.

Each parser takes the raw annotation text and returns a frozen value or raises ``FormatError``;
callers decide what an absent annotation means (usually: the value's defaults). Defaults
follow Koordinator and are written next to their field with the file they come from.

Formats (koordinator-sh/koordinator ``apis/extension``):

- ``node.koordinator.sh/system-qos-resource``: ``{"cpuset":"0-1","cpusetExclusive":true}``
- ``node.koordinator.sh/reservation``: ``{"resources":{...},"reservedCPUs":"0-5","applyPolicy":"Default"}``
- ``kubelet.koordinator.sh/cpu-manager-policy``: ``{"policy":"static","options":{...},"reservedCPUs":"0-1"}``
- ``node.koordinator.sh/cpu-shared-pools`` / ``be-cpu-shared-pools``: ``[{"socket":0,"node":0,"cpuset":"1-5"}]``
- ``node.koordinator.sh/pod-cpu-allocs``: ``[{"uid":..,"cpuset":"..","managedByKubelet":true}]``
- ``node.koordinator.sh/cpu-normalization-ratio``: a decimal number such as ``"1.20"``
- ``runtimeproxy.koordinator.sh/cpu-quota-normalization`` (a container annotation of this
  project, not Koordinator's): ``"<kubelet's quota>/<quota given to the runtime>"``
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from koord_formats.bounded import (
    MAX_NAME_CHARS,
    load_json,
    memo_by_text,
    read_bool,
    read_int,
    read_list,
    read_object,
    read_str,
)
from koord_formats.cpulist import MAX_CPU_ID, MAX_CPU_LIST_CHARS, format_cpu_list, parse_cpu_list
from koord_formats.errors import FormatError
from koord_formats.quantity import parse_quantity

__all__ = [
    "CPUSharePool",
    "KubeletCPUManagerPolicy",
    "NodeReservation",
    "PodCPUAlloc",
    "SystemQOSResource",
    "format_cpu_quota_record",
    "format_kubelet_cpu_manager_policy",
    "format_pod_cpu_allocs",
    "format_share_pools",
    "parse_cpu_normalization_ratio",
    "parse_cpu_quota_record",
    "parse_kubelet_cpu_manager_policy",
    "parse_node_reservation",
    "parse_pod_cpu_allocs",
    "parse_share_pools",
    "parse_system_qos_resource",
]

_MAX_CHARS = MAX_CPU_LIST_CHARS + 4096
_MAX_POOLS = 1024
_MAX_ALLOCS = 4096
_MAX_MAP_ITEMS = 64
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _cpus(doc: Mapping[str, Any], key: str, what: str) -> frozenset[int]:
    value = doc.get(key)
    if value is None:
        return frozenset()
    return parse_cpu_list(read_str(value, f"{what} {key}", MAX_CPU_LIST_CHARS))


def _str_map(value: object, what: str) -> Mapping[str, str]:
    if value is None:
        return _EMPTY
    doc = read_object(value, what)
    if len(doc) > _MAX_MAP_ITEMS:
        raise FormatError(f"{what}: more than {_MAX_MAP_ITEMS} entries")
    return MappingProxyType({read_str(k, what): read_str(v, f"{what} {k}", 4096) for k, v in doc.items()})


@dataclass(frozen=True, slots=True)
class SystemQOSResource:
    """``node.koordinator.sh/system-qos-resource``: CPUs for SYSTEM-QoS pods."""

    cpuset: frozenset[int] = frozenset()
    # apis/extension/system_qos.go ``IsCPUSetExclusive``: exclusive unless explicitly false, so
    # the CPUs leave every other pool (LS, LSR, BE) when the field is absent.
    cpuset_exclusive: bool = True

    @property
    def exclusive_cpus(self) -> frozenset[int]:
        """The CPUs no other pod may use: ``cpuset`` when exclusive, else none."""
        return self.cpuset if self.cpuset_exclusive else frozenset()


@memo_by_text(maxsize=64)
def parse_system_qos_resource(text: str) -> SystemQOSResource:
    """Parse ``node.koordinator.sh/system-qos-resource``."""
    doc = read_object(load_json(text, "system-qos-resource", max_chars=_MAX_CHARS), "system-qos-resource")
    exclusive = doc.get("cpusetExclusive")
    return SystemQOSResource(
        cpuset=_cpus(doc, "cpuset", "system-qos-resource"),
        cpuset_exclusive=True if exclusive is None else read_bool(exclusive, "system-qos-resource cpusetExclusive"),
    )


@dataclass(frozen=True, slots=True)
class NodeReservation:
    """``node.koordinator.sh/reservation``: resources and CPUs kept from pods."""

    reserved_cpus: frozenset[int] = frozenset()
    # Resource name -> quantity, as in a pod's requests.
    resources: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    # apis/extension/node_reservation.go: "" and "Default" mean the same.
    apply_policy: str = "Default"


@memo_by_text(maxsize=64)
def parse_node_reservation(text: str) -> NodeReservation:
    """Parse ``node.koordinator.sh/reservation``."""
    doc = read_object(load_json(text, "reservation", max_chars=_MAX_CHARS), "reservation")
    raw = doc.get("resources")
    resources: dict[str, Fraction] = {}
    if raw is not None:
        res = read_object(raw, "reservation resources")
        if len(res) > _MAX_MAP_ITEMS:
            raise FormatError(f"reservation resources: more than {_MAX_MAP_ITEMS} entries")
        resources = {read_str(k, "reservation resource name"): parse_quantity(v) for k, v in res.items()}
    policy = doc.get("applyPolicy")
    return NodeReservation(
        reserved_cpus=_cpus(doc, "reservedCPUs", "reservation"),
        resources=MappingProxyType(resources),
        apply_policy=read_str(policy, "reservation applyPolicy") or "Default" if policy is not None else "Default",
    )


@dataclass(frozen=True, slots=True)
class KubeletCPUManagerPolicy:
    """``kubelet.koordinator.sh/cpu-manager-policy``: kubelet's CPU manager as koordlet saw it."""

    # kubelet's --cpu-manager-policy; "none" is kubelet's own default.
    policy: str = "none"
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    reserved_cpus: frozenset[int] = frozenset()


@memo_by_text(maxsize=64)
def parse_kubelet_cpu_manager_policy(text: str) -> KubeletCPUManagerPolicy:
    """Parse ``kubelet.koordinator.sh/cpu-manager-policy`` (an empty policy reads as "none")."""
    what = "cpu-manager-policy"
    doc = read_object(load_json(text, what, max_chars=_MAX_CHARS), what)
    policy = doc.get("policy")
    return KubeletCPUManagerPolicy(
        policy=(read_str(policy, f"{what} policy") if policy is not None else "") or "none",
        options=_str_map(doc.get("options"), f"{what} options"),
        reserved_cpus=_cpus(doc, "reservedCPUs", what),
    )


def format_kubelet_cpu_manager_policy(value: KubeletCPUManagerPolicy) -> str:
    """The ``kubelet.koordinator.sh/cpu-manager-policy`` JSON for ``value`` (empty options and
    reserved CPUs left out, as Koordinator's ``omitempty`` does)."""
    doc: dict[str, Any] = {"policy": value.policy}
    if value.options:
        doc["options"] = dict(sorted(value.options.items()))
    if value.reserved_cpus:
        doc["reservedCPUs"] = format_cpu_list(value.reserved_cpus)
    return json.dumps(doc, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class CPUSharePool:
    """One entry of ``cpu-shared-pools``: the shared CPUs of one NUMA node."""

    socket: int
    node: int
    cpus: frozenset[int]

    def to_json(self) -> dict[str, Any]:
        return {"socket": self.socket, "node": self.node, "cpuset": format_cpu_list(self.cpus)}


@memo_by_text(maxsize=64, weigh=lambda pools: sum(len(p.cpus) for p in pools), large_chars=4 * _MAX_CHARS)
def parse_share_pools(text: str) -> tuple[CPUSharePool, ...]:
    """Parse ``node.koordinator.sh/cpu-shared-pools`` or ``be-cpu-shared-pools``."""
    what = "cpu-shared-pools"
    pools: list[CPUSharePool] = []
    budget = MAX_CPU_ID + 1
    for entry in read_list(load_json(text, what, max_chars=_MAX_CHARS), what, _MAX_POOLS):
        item = read_object(entry, f"{what} entry")
        cpus = _cpus(item, "cpuset", what)
        budget -= len(cpus)
        if budget < 0:
            raise FormatError(f"{what}: names more than {MAX_CPU_ID + 1} CPUs")
        pools.append(
            CPUSharePool(
                socket=read_int(item.get("socket", 0), f"{what} socket", 0, 1023),
                node=read_int(item.get("node", 0), f"{what} node", 0, 1023),
                cpus=cpus,
            )
        )
    return tuple(pools)


def format_share_pools(pools: Iterable[CPUSharePool]) -> str:
    """The ``cpu-shared-pools`` JSON for ``pools``, in the given order."""
    return json.dumps([p.to_json() for p in pools], separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class PodCPUAlloc:
    """One entry of ``node.koordinator.sh/pod-cpu-allocs``."""

    namespace: str = ""
    name: str = ""
    uid: str = ""
    cpus: frozenset[int] = frozenset()
    # True when kubelet's static policy, not Koordinator, chose these CPUs.
    managed_by_kubelet: bool = False


@memo_by_text(maxsize=64, weigh=lambda allocs: sum(len(a.cpus) for a in allocs), large_chars=4 * _MAX_CHARS)
def parse_pod_cpu_allocs(text: str) -> tuple[PodCPUAlloc, ...]:
    """Parse ``node.koordinator.sh/pod-cpu-allocs``."""
    what = "pod-cpu-allocs"
    out: list[PodCPUAlloc] = []
    for entry in read_list(load_json(text, what, max_chars=_MAX_CHARS), what, _MAX_ALLOCS):
        item = read_object(entry, f"{what} entry")
        managed = item.get("managedByKubelet")
        out.append(
            PodCPUAlloc(
                namespace=read_str(item.get("namespace", ""), f"{what} namespace", MAX_NAME_CHARS),
                name=read_str(item.get("name", ""), f"{what} name", MAX_NAME_CHARS),
                uid=read_str(item.get("uid", ""), f"{what} uid", MAX_NAME_CHARS),
                cpus=_cpus(item, "cpuset", what),
                managed_by_kubelet=False if managed is None else read_bool(managed, f"{what} managedByKubelet"),
            )
        )
    return tuple(out)


def format_pod_cpu_allocs(allocs: Iterable[PodCPUAlloc]) -> str:
    """The ``node.koordinator.sh/pod-cpu-allocs`` JSON for ``allocs`` in the given order (empty
    fields left out, as Koordinator's ``omitempty`` does; ``[]`` for none, never ``null``, which
    its parser refuses)."""
    out: list[dict[str, Any]] = []
    for a in allocs:
        item: dict[str, Any] = {}
        if a.namespace:
            item["namespace"] = a.namespace
        if a.name:
            item["name"] = a.name
        if a.uid:
            item["uid"] = a.uid
        if a.cpus:
            item["cpuset"] = format_cpu_list(a.cpus)
        if a.managed_by_kubelet:
            item["managedByKubelet"] = True
        out.append(item)
    return json.dumps(out, separators=(",", ":"))


_RATIO = re.compile(r"[0-9](?:\.[0-9]{1,2})?", re.ASCII)
# apis/configuration/slo_controller_config.go: the manager keeps ratios in [1.0, 5.0] and writes
# them with two decimals (apis/extension/cpu_normalization.go ``SetCPUNormalizationRatio``).
MIN_CPU_NORMALIZATION_RATIO = Fraction(1)
MAX_CPU_NORMALIZATION_RATIO = Fraction(5)


def parse_cpu_normalization_ratio(text: object) -> Fraction:
    """Parse ``node.koordinator.sh/cpu-normalization-ratio``: a decimal from ``"1.00"`` to
    ``"5.00"`` with at most two decimals (``"1.2"`` and ``"2"`` too), as an exact fraction.

    Anything else (zero or less, above 5, a third decimal, an exponent, ``nan``, non-ASCII
    digits, more than 32 characters) raises ``FormatError``. Two valid ratios differ by at
    least 0.01, so Koordinator's rule "changes below 0.01 are ignored" holds by construction.
    """
    raw = read_str(text, "cpu-normalization-ratio", 32).strip()
    if _RATIO.fullmatch(raw) is None:
        raise FormatError(f"cpu-normalization-ratio: {raw!r} is not a decimal with at most two decimals")
    ratio = Fraction(raw)
    if not MIN_CPU_NORMALIZATION_RATIO <= ratio <= MAX_CPU_NORMALIZATION_RATIO:
        raise FormatError(f"cpu-normalization-ratio: {raw!r} is outside 1.00 to 5.00")
    return ratio


_RECORD = re.compile(r"([0-9]{1,12})/([0-9]{1,12})", re.ASCII)


def parse_cpu_quota_record(text: object) -> tuple[int, int]:
    """Parse ``runtimeproxy.koordinator.sh/cpu-quota-normalization``: ``(original, applied)``,
    kubelet's CFS quota and the normalized quota the proxy gave the runtime, both positive
    integers of at most 12 digits."""
    raw = read_str(text, "cpu-quota-normalization", 32)
    m = _RECORD.fullmatch(raw)
    if m is None:
        raise FormatError(f"cpu-quota-normalization: {raw!r} is not <quota>/<quota>")
    original, applied = int(m.group(1)), int(m.group(2))
    if original <= 0 or applied <= 0:
        raise FormatError(f"cpu-quota-normalization: {raw!r} names a quota of 0")
    return original, applied


def format_cpu_quota_record(original: int, applied: int) -> str:
    """The ``cpu-quota-normalization`` text for two positive quotas."""
    return f"{original}/{applied}"

"""NodeSLO strategies as typed rules, parsed once per NodeSLO update (Koordinator's koordlet does
the same in each runtimehooks plugin's ``rule.go``: ``parseRule`` when the NodeSLO changes, the
hook reads the rule).

``NodeFacts.rules`` holds the ``NodeSLORules`` of ``NodeFacts.node_slo``: made when the facts
are made (``parse_rules``, through ``koord_formats.nodeslo``'s accessors, which fill Koordinator's
defaults and never raise), and kept by ``NodeFacts.replace`` unless ``node_slo`` changes. A
plugin reads ``node.rules.eviction.read(problems)`` or ``node.rules.cpu_qos(SLO.BE_CLASS)``
instead of parsing the raw mapping on every call; the values are the ones the accessors give,
and a strategy's problems (wrong types, values out of range: what the accessor would report)
are handed to the caller's ``problems`` list each time it reads the rule, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from koord_formats import keys, nodeslo
from koord_formats.keys import SLO
from koord_formats.nodeslo import (
    CPUQOS,
    CPUBurstConfig,
    CPUSuppress,
    Eviction,
    HostApplication,
    MemoryQOS,
    ResctrlQOS,
)

__all__ = ["SLO_CLASSES", "NodeSLORules", "Rule", "parse_rules"]

T = TypeVar("T")

# The NodeSLO classes whose cpuQOS, resctrlQOS and memoryQOS are parsed up front (every class a pod or a
# host application maps to, ``koord_formats.keys.SLO_CLASS_KEYS``).
SLO_CLASSES = (SLO.LSR_CLASS, SLO.LS_CLASS, SLO.BE_CLASS, SLO.SYSTEM_CLASS)


@dataclass(frozen=True, slots=True)
class Rule(Generic[T]):
    """One strategy after defaults, and what was wrong in the spec while reading it."""

    value: T
    problems: tuple[str, ...] = ()

    def read(self, problems: list[str] | None = None) -> T:
        """The value; its problems are added to ``problems`` when given."""
        if problems is not None:
            problems.extend(self.problems)
        return self.value


def _rule(read: Any, *args: Any) -> Rule[Any]:  # Any: each accessor of koord_formats.nodeslo
    found: list[str] = []
    value = read(*args, found)
    return Rule(value, tuple(found))


@dataclass(frozen=True)
class NodeSLORules:
    """Every NodeSLO strategy a plugin or a loop reads, typed, with Koordinator's defaults."""

    spec: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # Any: JSON
    cpu_policy: str = ""
    group_identity_enabled: bool = False
    cpu_qos_by_class: Mapping[str, Rule[CPUQOS]] = field(default_factory=lambda: MappingProxyType({}))
    resctrl_by_class: Mapping[str, Rule[ResctrlQOS]] = field(default_factory=lambda: MappingProxyType({}))
    memory_qos_by_class: Mapping[str, Rule[MemoryQOS]] = field(default_factory=lambda: MappingProxyType({}))
    # some class of resourceQOSStrategy has a memoryQOS section (``nodeslo.memory_qos_configured``)
    memory_qos_configured: bool = False
    cpu_suppress: Rule[CPUSuppress] = field(default_factory=lambda: Rule(CPUSuppress()))
    cpu_burst: Rule[CPUBurstConfig] = field(default_factory=lambda: Rule(nodeslo.DEFAULT_CPU_BURST))
    host_applications: Rule[tuple[HostApplication, ...]] = field(default_factory=lambda: Rule(()))
    eviction: Rule[Eviction] = field(default_factory=lambda: Rule(Eviction()))

    def cpu_qos(self, class_key: str, problems: list[str] | None = None) -> CPUQOS:
        """cpuQOS of ``class_key`` (``koord_formats.nodeslo.cpu_qos``)."""
        rule = self.cpu_qos_by_class.get(class_key)
        if rule is None:  # a class outside SLO_CLASSES: read as the accessor reads it
            return nodeslo.cpu_qos(self.spec, class_key, problems)
        return rule.read(problems)

    def class_bvt_value(self, class_key: str) -> int:
        """A class's ``cpu.bvt_warp_ns`` (``koord_formats.nodeslo.class_bvt_value``)."""
        q = self.cpu_qos(class_key)
        return q.group_identity if q.enable else 0

    def resctrl_qos(self, class_key: str, problems: list[str] | None = None) -> ResctrlQOS:
        """resctrlQOS of ``class_key`` (``koord_formats.nodeslo.resctrl_qos``)."""
        rule = self.resctrl_by_class.get(class_key)
        if rule is None:
            return nodeslo.resctrl_qos(self.spec, class_key, problems)
        return rule.read(problems)

    def memory_qos(self, class_key: str, problems: list[str] | None = None) -> MemoryQOS:
        """memoryQOS of ``class_key`` (``koord_formats.nodeslo.memory_qos``)."""
        rule = self.memory_qos_by_class.get(class_key)
        if rule is None:
            return nodeslo.memory_qos(self.spec, class_key, problems)
        return rule.read(problems)


def parse_rules(spec: Mapping[str, Any]) -> NodeSLORules:  # Any: the NodeSLO spec as JSON
    """The rules of a NodeSLO ``spec``; never raises (the accessors fill defaults)."""
    policy = nodeslo.cpu_policy(spec)
    cpu_qos = {k: _rule(nodeslo.cpu_qos, spec, k) for k in SLO_CLASSES}
    gi = policy in ("", keys.CPU_POLICY_GROUP_IDENTITY) and any(
        cpu_qos[k].value.enable for k in nodeslo.DEFAULT_GROUP_IDENTITY)
    return NodeSLORules(
        spec=spec,
        cpu_policy=policy,
        group_identity_enabled=gi,
        cpu_qos_by_class=MappingProxyType(cpu_qos),
        resctrl_by_class=MappingProxyType({k: _rule(nodeslo.resctrl_qos, spec, k) for k in SLO_CLASSES}),
        memory_qos_by_class=MappingProxyType({k: _rule(nodeslo.memory_qos, spec, k) for k in SLO_CLASSES}),
        memory_qos_configured=nodeslo.memory_qos_configured(spec),
        cpu_suppress=_rule(nodeslo.cpu_suppress, spec),
        cpu_burst=_rule(nodeslo.cpu_burst, spec),
        host_applications=_rule(nodeslo.host_applications, spec),
        eviction=_rule(nodeslo.eviction, spec),
    )


EMPTY_RULES = parse_rules(MappingProxyType({}))

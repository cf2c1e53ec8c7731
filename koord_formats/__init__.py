"""Koordinator's formats, in one place: every key, and one parser (and formatter, where we write
the format) per format, shared by ``hooks``, ``runtime_proxy`` and ``scheduler_ext``.

This package is pure and uses only the standard library; it imports nothing of ours.

Every parser is total and bounded: it returns a typed, frozen value or raises ``FormatError``
(a ``ValueError``), never anything else, and it checks size, nesting depth, exponents and
repetition before doing work that could grow with them. Parsers of annotation text are memoised
by the raw string, so re-reading an unchanged annotation costs a dictionary lookup.

Modules (imported as modules, e.g. ``from koord_formats import keys``):

- ``keys``: label, annotation, resource and NodeSLO field names; QoS, priority and policy names.
- ``errors``: ``FormatError``.
- ``bounded``: the bounded JSON loader and typed readers every JSON parser uses.
- ``quantity``: Kubernetes quantities as exact ``Fraction`` values, and their canonical forms.
- ``cpulist``: the kernel CPU list format ("0-3,8") <-> ``frozenset[int]``.
- ``topology``: ``CPUTopology`` and ``node.koordinator.sh/cpu-topology``.
- ``node``: system-QoS, reservation, kubelet CPU manager, share pools, pod CPU allocations,
  CPU normalization ratio.
- ``pod``: resource-status, resource-spec, numa-topology-spec, device-allocated,
  extended-resource-spec.
- ``nodeslo``: NodeSLO strategies with Koordinator's defaults.
- ``reservation``: the Reservation object's scheduling parts, reservation-affinity and
  reservation-allocated.
- ``qos``: QoS class and priority class resolution.
- ``nrt``: the NodeResourceTopology object's zones and topology policy.
- ``device``: the Device object's GPU entries.
- ``nodemetric``: the NodeMetric object's collect policy and status.
- ``cpunormalization``: ``node.koordinator.sh/cpu-basic-info``, slo-controller-config's
  ``cpu-normalization-config`` and the CPU normalization ratio chosen from them.
"""

from __future__ import annotations

from koord_formats import bounded, cpulist, keys, node, nodeslo, pod, qos, quantity, reservation, topology
from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from koord_formats.errors import FormatError
from koord_formats.quantity import parse_quantity
from koord_formats.topology import CPUInfo, CPUTopology, parse_cpu_topology

__all__ = [
    "CPUInfo",
    "CPUTopology",
    "FormatError",
    "bounded",
    "cpulist",
    "format_cpu_list",
    "keys",
    "node",
    "nodeslo",
    "parse_cpu_list",
    "parse_cpu_topology",
    "parse_quantity",
    "pod",
    "qos",
    "quantity",
    "reservation",
    "topology",
]

"""Kubernetes label selectors (``metav1.LabelSelector``), parsed once into a frozen value and
matched against a label map.

The manager's configuration (slo-controller-config ``nodeConfigs`` and ``nodeStrategies``) and
ClusterColocationProfile (``selector``, ``namespaceSelector``) select objects this way. The
shape is apimachinery's: ``{"matchLabels": {k: v}, "matchExpressions": [{"key", "operator",
"values"}]}`` with the operators In, NotIn, Exists and DoesNotExist. Every requirement must hold;
an empty selector matches every object. What an absent selector means differs by caller (a
NodeSLO node strategy without one matches no node, a profile without one matches every pod),
so callers decide that before calling ``parse_label_selector``.

Validity follows ``metav1.LabelSelectorAsSelector``: In and NotIn need at least one value,
Exists and DoesNotExist none, and an unknown operator is an error. Sizes are bounded here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from koord_formats.bounded import read_list, read_object, read_str
from koord_formats.errors import FormatError

__all__ = [
    "MATCH_EXPRESSIONS",
    "MATCH_LABELS",
    "OPERATORS",
    "LabelSelector",
    "Requirement",
    "parse_label_selector",
]

MATCH_LABELS = "matchLabels"
MATCH_EXPRESSIONS = "matchExpressions"
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# A label key is at most 253 + 1 + 63 characters, a value at most 63; a little room either way.
_MAX_KEY = 320
_MAX_VALUE = 320
_MAX_ITEMS = 64


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str  # one of OPERATORS
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        present = self.key in labels and labels[self.key] in self.values
        return present if self.operator == "In" else not present


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed selector; ``matches`` is True when every label and requirement holds."""

    match_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(r.matches(labels) for r in self.requirements)


def _requirement(value: object, what: str) -> Requirement:
    doc = read_object(value, what)
    key = read_str(doc.get("key"), f"{what} key", _MAX_KEY)
    if not key:
        raise FormatError(f"{what}: key is empty")
    operator = read_str(doc.get("operator"), f"{what} operator", 32)
    if operator not in OPERATORS:
        raise FormatError(f"{what}: unknown operator {operator[:32]!r}")
    raw = doc.get("values")
    values = frozenset(
        read_str(v, f"{what} value", _MAX_VALUE) for v in read_list([] if raw is None else raw, what, _MAX_ITEMS)
    )
    if operator in ("In", "NotIn") and not values:
        raise FormatError(f"{what}: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise FormatError(f"{what}: operator {operator} takes no values")
    return Requirement(key, operator, values)


def parse_label_selector(value: object, what: str = "label selector") -> LabelSelector:
    """A decoded ``LabelSelector`` object as a ``LabelSelector``; ``FormatError`` when it is not
    an object, is larger than the bounds or has an invalid requirement."""
    doc = read_object(value, what)
    raw_labels = doc.get(MATCH_LABELS)
    labels: dict[str, str] = {}
    if raw_labels is not None:
        items = read_object(raw_labels, f"{what} {MATCH_LABELS}")
        if len(items) > _MAX_ITEMS:
            raise FormatError(f"{what}: more than {_MAX_ITEMS} {MATCH_LABELS}")
        for k, v in items.items():
            labels[read_str(k, f"{what} label key", _MAX_KEY)] = read_str(v, f"{what} label {k[:64]}", _MAX_VALUE)
    raw_exprs = doc.get(MATCH_EXPRESSIONS)
    exprs = read_list([] if raw_exprs is None else raw_exprs, f"{what} {MATCH_EXPRESSIONS}", _MAX_ITEMS)
    return LabelSelector(
        MappingProxyType(labels), tuple(_requirement(e, f"{what} {MATCH_EXPRESSIONS}") for e in exprs)
    )

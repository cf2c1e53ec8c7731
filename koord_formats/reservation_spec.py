"""What placing a Reservation reads of it and of the Node it may go to: its pod template's
scheduling constraints, its lifetime, and the parts of its status its controller keeps.

Formats (koordinator-sh/koordinator ``apis/scheduling/v1alpha1/reservation_types.go``, the
Kubernetes ``PodSpec`` and ``Node``):

- ``spec.template.spec``: ``nodeName``; ``nodeSelector``;
  ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``
  (terms ORed; ``matchExpressions`` over the node's labels with In, NotIn, Exists,
  DoesNotExist, Gt, Lt and ``matchFields`` over ``metadata.name`` ANDed inside a term);
  ``tolerations``; each container's ``ports[].hostPort`` (with ``protocol`` and ``hostIP``);
  ``resources.requests`` (limits default requests) of containers and init containers, and
  ``overhead``: the pod's request is the sum of the containers, at least each init container,
  plus the overhead (``PodRequests``).
- ``spec.ttl`` (a Go duration, ``"0s"`` never expires; Koordinator's CRD defaults it to 24h),
  ``spec.expires`` (RFC 3339, checked first), ``metadata.creationTimestamp``.
- ``status.conditions[]`` (``type``, ``status``, ``reason``, ``message``, ``lastProbeTime`` and
  ``lastTransitionTime``: what garbage collection reads, ``read_conditions``),
  ``status.currentOwners[]`` (``namespace``, ``name``, ``uid``).
- A Node's ``spec.taints[]`` (``key``, ``value``, ``effect``) and ``status.allocatable``.

Every reader bounds what it reads and raises only ``FormatError``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from koord_formats.bounded import MAX_NAME_CHARS, read_int, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.nodemetric import parse_go_duration
from koord_formats.pod import read_resource_list
from koord_formats.reservation import (
    SelectorTerm,
    Taint,
    Toleration,
    read_labels,
    read_selector_term,
    read_taints,
    read_tolerations,
)

__all__ = [
    "MAX_TTL_SECONDS",
    "Condition",
    "HostPort",
    "Lifetime",
    "NodeFacts",
    "PodConstraints",
    "Taint",
    "Toleration",
    "parse_lifetime",
    "parse_node",
    "parse_pod_constraints",
    "parse_pod_requests",
    "parse_rfc3339",
    "parse_ttl",
    "read_conditions",
    "read_current_owners",
]

MAX_TTL_SECONDS = 100 * 365 * 86400  # a century: longer is refused as nonsense
_MAX_LABELS = 256
_MAX_LABEL_CHARS = 1024
_MAX_TERMS = 32
_MAX_TOLERATIONS = 128
_MAX_TAINTS = 128
_MAX_CONTAINERS = 64
_MAX_PORTS = 256
_MAX_OWNERS = 1024
_MAX_CONDITIONS = 64
_MAX_TIME_CHARS = 64
_MAX_DURATION_CHARS = 64


def _object(value: object, what: str) -> Mapping[str, Any]:
    return MappingProxyType({}) if value is None else read_object(value, what)


def _text(doc: Mapping[str, Any], key: str, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    value = doc.get(key)
    return "" if value is None else read_str(value, f"{what} {key}", max_chars)


# ---- times --------------------------------------------------------------------------------------


def parse_ttl(value: object) -> float:
    """``spec.ttl``: a Go duration (``"24h"``, ``"1h30m"``, ``"90s"``, ``"0s"``) in seconds."""
    return parse_go_duration(value, "ttl", max_seconds=MAX_TTL_SECONDS, max_chars=_MAX_DURATION_CHARS, max_digits=12)


def parse_rfc3339(value: object, what: str) -> float:
    """An RFC 3339 time (``metav1.Time``: ``2026-01-02T03:04:05Z``) as a Unix time."""
    raw = read_str(value, what, _MAX_TIME_CHARS)
    text = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise FormatError(f"{what}: {raw[:64]!r} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise FormatError(f"{what}: {raw[:64]!r} has no time zone")
    return parsed.timestamp()


@dataclass(frozen=True, slots=True)
class Lifetime:
    """When a Reservation expires (``isReservationNeedExpiration``)."""

    created: float | None  # metadata.creationTimestamp
    ttl: float | None  # spec.ttl in seconds (None: not given; 0: never expires)
    expires: float | None  # spec.expires

    def deadline(self) -> float | None:
        """The time it expires at; ``None`` when it never does. A ttl of 0 turns expiry off,
        ``expires`` is checked first, then creation plus ttl."""
        if self.ttl is not None and self.ttl == 0:
            return None
        if self.expires is not None:
            return self.expires
        if self.ttl is not None and self.created is not None:
            return self.created + self.ttl
        return None

    def expired(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now > deadline


def parse_lifetime(obj: object) -> Lifetime:
    """A Reservation's lifetime (``metadata.creationTimestamp``, ``spec.ttl``, ``spec.expires``)."""
    doc = read_object(obj, "Reservation")
    meta = _object(doc.get("metadata"), "Reservation metadata")
    spec = _object(doc.get("spec"), "Reservation spec")
    created = meta.get("creationTimestamp")
    ttl = spec.get("ttl")
    expires = spec.get("expires")
    return Lifetime(
        created=None if created is None else parse_rfc3339(created, "creationTimestamp"),
        ttl=None if ttl is None else parse_ttl(ttl),
        expires=None if expires is None else parse_rfc3339(expires, "expires"),
    )


# ---- the template's constraints ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class HostPort:
    port: int
    protocol: str = "TCP"
    host_ip: str = ""

    def conflicts(self, other: HostPort) -> bool:
        """Two host ports conflict on one protocol and port when either binds every address."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        wild = ("", "0.0.0.0", "::")
        return self.host_ip in wild or other.host_ip in wild or self.host_ip == other.host_ip


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """What kube-scheduler's default plugins read of a pod spec (NodeName, NodeAffinity,
    TaintToleration, NodePorts, NodeResourcesFit)."""

    node_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    terms: tuple[SelectorTerm, ...] | None = None  # None: no required node affinity
    tolerations: tuple[Toleration, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    requests: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))


def _terms(affinity: Mapping[str, Any]) -> tuple[SelectorTerm, ...] | None:
    node_aff = _object(affinity.get("nodeAffinity"), "nodeAffinity")
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    raw = read_object(required, "nodeAffinity required").get("nodeSelectorTerms")
    terms: list[SelectorTerm] = []
    for t in [] if raw is None else read_list(raw, "nodeSelectorTerms", _MAX_TERMS):
        terms.append(read_selector_term(t, "nodeSelectorTerm", _MAX_LABEL_CHARS))
    return tuple(terms)


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, Fraction(0)) + v


def _container_requests(c: Mapping[str, Any], what: str) -> dict[str, Fraction]:
    resources = _object(c.get("resources"), f"{what} resources")
    requests = dict(read_resource_list(resources.get("requests"), f"{what} requests"))
    for k, v in read_resource_list(resources.get("limits"), f"{what} limits").items():
        requests.setdefault(k, v)  # the API server defaults requests from limits
    return requests


def parse_pod_requests(spec_value: object) -> Mapping[str, Fraction]:
    """A pod spec's requests as kube-scheduler counts them (``PodRequests``: the containers'
    sum, at least each init container, plus the overhead; limits default requests)."""
    spec = _object(spec_value, "pod spec")
    total: dict[str, Fraction] = {}
    for c in read_list(spec.get("containers") or [], "containers", _MAX_CONTAINERS):
        _add(total, _container_requests(read_object(c, "container"), "container"))
    for c in read_list(spec.get("initContainers") or [], "initContainers", _MAX_CONTAINERS):
        for k, v in _container_requests(read_object(c, "init container"), "init container").items():
            total[k] = max(total.get(k, Fraction(0)), v)
    _add(total, read_resource_list(spec.get("overhead"), "overhead"))
    return MappingProxyType(total)


def parse_pod_constraints(spec_value: object) -> PodConstraints:
    """The scheduling constraints of a pod spec (a Reservation's ``spec.template.spec``)."""
    spec = _object(spec_value, "pod spec")
    ports: list[HostPort] = []
    for c in read_list(spec.get("containers") or [], "containers", _MAX_CONTAINERS):
        doc = read_object(c, "container")
        for p in read_list(doc.get("ports") or [], "container ports", _MAX_PORTS):
            port = read_object(p, "container port")
            host = port.get("hostPort")
            if host is None or host == 0:
                continue
            ports.append(
                HostPort(
                    read_int(host, "hostPort", 1, 65535),
                    _text(port, "protocol", "container port", 16) or "TCP",
                    _text(port, "hostIP", "container port", 64),
                )
            )
    return PodConstraints(
        node_name=_text(spec, "nodeName", "pod spec"),
        node_selector=read_labels(spec.get("nodeSelector"), "nodeSelector", _MAX_LABELS, _MAX_LABEL_CHARS),
        terms=_terms(_object(spec.get("affinity"), "affinity")),
        tolerations=read_tolerations(spec.get("tolerations"), "tolerations", _MAX_TOLERATIONS, _MAX_LABEL_CHARS),
        host_ports=tuple(sorted(set(ports))),
        requests=parse_pod_requests(spec),
    )


# ---- the node -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What placing a reservation reads of a Node besides the extender's cache."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    unschedulable: bool = False


def parse_node(obj: object) -> NodeFacts:
    """A Node's name, labels, taints, allocatable and ``spec.unschedulable``."""
    doc = read_object(obj, "Node")
    meta = _object(doc.get("metadata"), "Node metadata")
    spec = _object(doc.get("spec"), "Node spec")
    status = _object(doc.get("status"), "Node status")
    flag = spec.get("unschedulable")
    return NodeFacts(
        name=_text(meta, "name", "Node"),
        labels=read_labels(meta.get("labels"), "Node labels", _MAX_LABELS, _MAX_LABEL_CHARS),
        # `or None`: a falsy non-list (``""``, ``{}``) reads as no taints, as it always has here
        taints=read_taints(spec.get("taints") or None, "taints", _MAX_TAINTS, _MAX_LABEL_CHARS),
        allocatable=read_resource_list(status.get("allocatable"), "Node allocatable"),
        unschedulable=flag is True,
    )


def read_current_owners(status_value: object) -> tuple[tuple[str, str, str], ...]:
    """``status.currentOwners`` as sorted (uid, namespace, name)."""
    status = _object(status_value, "Reservation status")
    out: list[tuple[str, str, str]] = []
    for item in read_list(status.get("currentOwners") or [], "currentOwners", _MAX_OWNERS):
        doc = read_object(item, "currentOwner")
        out.append((_text(doc, "uid", "currentOwner"), _text(doc, "namespace", "currentOwner"),
                    _text(doc, "name", "currentOwner")))  # fmt: skip
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class Condition:
    """One ``status.conditions`` entry as garbage collection reads it (times as Unix times,
    ``None`` when absent)."""

    type: str
    status: str = ""
    reason: str = ""
    last_probe: float | None = None
    last_transition: float | None = None


def read_conditions(status_value: object) -> tuple[Condition, ...]:
    """``status.conditions`` (at most 64 entries; the message is not read)."""
    status = _object(status_value, "Reservation status")
    out: list[Condition] = []
    for item in read_list(status.get("conditions") or [], "conditions", _MAX_CONDITIONS):
        doc = read_object(item, "condition")
        probe, moved = doc.get("lastProbeTime"), doc.get("lastTransitionTime")
        out.append(Condition(
            type=_text(doc, "type", "condition", 64),
            status=_text(doc, "status", "condition", 16),
            reason=_text(doc, "reason", "condition", 128),
            last_probe=None if probe is None else parse_rfc3339(probe, "condition lastProbeTime"),
            last_transition=None if moved is None else parse_rfc3339(moved, "condition lastTransitionTime"),
        ))  # fmt: skip
    return tuple(out)

"""Koordinator Reservations: the parts of a ``Reservation`` object the scheduler reads, and the
two pod annotations that point at reservations.

Formats (koordinator-sh/koordinator ``apis/scheduling/v1alpha1/reservation_types.go``,
``apis/extension/reservation.go``):

- A ``Reservation`` (``scheduling.koordinator.sh/v1alpha1``, cluster-scoped): ``metadata``
  (``name``, ``uid``, ``labels``, ``annotations``; its ``resource-status`` annotation is the
  cpuset and NUMA amounts the scheduler reserved for it; its ``device-allocated`` annotation the
  devices, as on a pod), ``spec.template`` (a pod template; its
  ``metadata.annotations`` lie under the reservation's own), ``spec.owners`` (a list of
  ``{object, controller, labelSelector}``, each part optional, the parts of one owner ANDed and
  the owners ORed), ``spec.ttl`` / ``spec.expires``, ``spec.allocateOnce`` (true when absent),
  ``spec.allocatePolicy`` ("", ``Aligned``, ``Restricted``), ``spec.unschedulable``,
  ``spec.taints``, ``status.phase``, ``status.nodeName``, ``status.allocatable`` and
  ``status.allocated`` (resource lists).
- ``scheduling.koordinator.sh/reservation-affinity`` (pod):
  ``{"requiredDuringSchedulingIgnoredDuringExecution":{"reservationSelectorTerms":[{"matchExpressions":
  [{"key":"k","operator":"In","values":["v"]}],"matchFields":[...]}]},"reservationSelector":{"k":"v"},
  "name":"r1","tolerations":[{"key":"k","operator":"Exists","effect":"NoSchedule"}]}``
- ``scheduling.koordinator.sh/reservation-allocated`` (pod): ``{"name":"r1","uid":"..."}``.

``parse_reservation`` takes the decoded object (the watch decodes JSON with its own depth
limit) and bounds every list, map and string it reads before using it; the annotation parsers
take the raw text and bound it first, like every parser of this package. All raise only
``FormatError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from koord_formats import keys
from koord_formats.bounded import (
    MAX_NAME_CHARS,
    load_json,
    memo_by_text,
    read_bool,
    read_list,
    read_object,
    read_str,
)
from koord_formats.errors import FormatError
from koord_formats.pod import (
    DeviceAllocation,
    ResourceSpec,
    ResourceStatus,
    parse_device_allocated,
    parse_resource_spec,
    parse_resource_status,
    read_resource_list,
)

__all__ = [
    "MAX_LABELS",
    "MAX_OWNERS",
    "OPERATORS",
    "LabelRequirement",
    "LabelSelector",
    "ObjectRef",
    "OwnerRef",
    "Reservation",
    "ReservationAffinity",
    "ReservationAllocated",
    "ReservationOwner",
    "SelectorTerm",
    "Taint",
    "Toleration",
    "format_reservation_allocated",
    "parse_reservation",
    "parse_reservation_affinity",
    "parse_reservation_allocated",
    "read_labels",
    "read_owner_references",
    "read_selector_term",
    "read_taints",
    "read_tolerations",
]

# A label key is at most 253 + 1 + 63 characters, a value at most 63; a little room beyond.
MAX_LABEL_CHARS = 320
MAX_LABELS = 1024
MAX_OWNERS = 64
MAX_REQUIREMENTS = 64
MAX_VALUES = 256
MAX_TERMS = 64
MAX_TAINTS = 64
MAX_OWNER_REFERENCES = 64
_MAX_AFFINITY_CHARS = 64 * 1024
_MAX_ALLOCATED_CHARS = 1024
# NodeSelectorRequirement / LabelSelectorRequirement operators (k8s.io/api core and meta v1).
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NAME_FIELD = "metadata.name"  # the one field a reservation selector term may name


def _text(doc: Mapping[str, Any], key: str, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    value = doc.get(key)
    return "" if value is None else read_str(value, f"{what} {key}", max_chars)


def _opt_object(value: object, what: str) -> Mapping[str, Any]:
    return {} if value is None else read_object(value, what)


def read_labels(
    value: object, what: str, max_entries: int = MAX_LABELS, max_chars: int = MAX_LABEL_CHARS
) -> Mapping[str, str]:
    """A labels (or selector) map of strings, bounded in entries and lengths; ``{}`` for null."""
    doc = _opt_object(value, what)
    if len(doc) > max_entries:
        raise FormatError(f"{what}: {len(doc)} entries, more than the {max_entries} allowed")
    for k, v in doc.items():
        read_str(k, f"{what} key", max_chars)
        read_str(v, f"{what} value", max_chars)
    return MappingProxyType(dict(doc))


# ---- selectors ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One ``matchExpressions`` (or ``matchFields``) entry: ``key`` ``operator`` ``values``."""

    key: str
    operator: str  # one of OPERATORS
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """The requirement holds on ``labels`` (Gt and Lt compare integers; a label that is
        not one fails them)."""
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or not self.values:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want


def _requirement(
    value: object, what: str, operators: tuple[str, ...], max_chars: int = MAX_LABEL_CHARS
) -> LabelRequirement:
    doc = read_object(value, what)
    key = read_str(doc.get("key"), f"{what} key", max_chars)
    operator = read_str(doc.get("operator"), f"{what} operator", 32)
    if operator not in operators:
        raise FormatError(f"{what}: unknown operator {operator[:32]!r}")
    raw = doc.get("values")
    values = tuple(
        read_str(v, f"{what} value", max_chars)
        for v in ([] if raw is None else read_list(raw, f"{what} values", MAX_VALUES))
    )
    if operator in ("In", "NotIn") and not values:
        raise FormatError(f"{what}: operator {operator} needs values")
    if operator in ("Exists", "DoesNotExist") and values:
        raise FormatError(f"{what}: operator {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit() or len(values[0]) > 19):
        raise FormatError(f"{what}: operator {operator} needs one integer value")
    return LabelRequirement(key, operator, values)


def _requirements(
    value: object, what: str, operators: tuple[str, ...], max_chars: int = MAX_LABEL_CHARS
) -> tuple[LabelRequirement, ...]:
    if value is None:
        return ()
    return tuple(_requirement(v, what, operators, max_chars) for v in read_list(value, what, MAX_REQUIREMENTS))


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions``, ANDed."""

    match_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    match_expressions: tuple[LabelRequirement, ...] = ()


def _label_selector(value: object, what: str) -> LabelSelector:
    doc = read_object(value, what)
    return LabelSelector(
        match_labels=read_labels(doc.get("matchLabels"), f"{what} matchLabels"),
        match_expressions=_requirements(doc.get("matchExpressions"), f"{what} matchExpressions", _SELECTOR_OPERATORS),
    )


# ---- owners --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """``spec.owners[].object``: every non-empty field must equal the pod's."""

    uid: str = ""
    name: str = ""
    namespace: str = ""
    api_version: str = ""


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """An owner reference: of a pod (``metadata.ownerReferences``) or, with ``namespace``, the
    ``controller`` part of a reservation owner, whose non-empty fields must equal one of the
    pod's owner references (``controller``: ``None`` when not given)."""

    uid: str = ""
    name: str = ""
    kind: str = ""
    api_version: str = ""
    controller: bool | None = None
    namespace: str = ""


def _owner_ref(value: object, what: str) -> OwnerRef:
    doc = read_object(value, what)
    flag = doc.get("controller")
    return OwnerRef(
        uid=_text(doc, "uid", what),
        name=_text(doc, "name", what),
        kind=_text(doc, "kind", what),
        api_version=_text(doc, "apiVersion", what),
        controller=None if flag is None else read_bool(flag, f"{what} controller"),
        namespace=_text(doc, "namespace", what),
    )


def read_owner_references(value: object, what: str) -> tuple[OwnerRef, ...]:
    """A pod's ``metadata.ownerReferences``; ``()`` for null."""
    if value is None:
        return ()
    return tuple(_owner_ref(v, what) for v in read_list(value, what, MAX_OWNER_REFERENCES))


@dataclass(frozen=True, slots=True)
class ReservationOwner:
    """One entry of ``spec.owners``; a part that is ``None`` matches every pod."""

    object: ObjectRef | None = None
    controller: OwnerRef | None = None
    label_selector: LabelSelector | None = None


def _owner(value: object, what: str) -> ReservationOwner:
    doc = read_object(value, what)
    obj, ctl, sel = doc.get("object"), doc.get("controller"), doc.get("labelSelector")
    ref: ObjectRef | None = None
    if obj is not None:
        o = read_object(obj, f"{what} object")
        ref = ObjectRef(
            uid=_text(o, "uid", what),
            name=_text(o, "name", what),
            namespace=_text(o, "namespace", what),
            api_version=_text(o, "apiVersion", what),
        )
    return ReservationOwner(
        object=ref,
        controller=None if ctl is None else _owner_ref(ctl, f"{what} controller"),
        label_selector=None if sel is None else _label_selector(sel, f"{what} labelSelector"),
    )


# ---- taints and tolerations ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        """The toleration covers ``taint`` (an empty key with Exists covers every key)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def read_taints(
    value: object, what: str, max_items: int = MAX_TAINTS, max_chars: int = MAX_LABEL_CHARS
) -> tuple[Taint, ...]:
    """A list of taints (a Reservation's ``spec.taints``, a Node's ``spec.taints``); ``()`` for null."""
    if value is None:
        return ()
    out: list[Taint] = []
    for item in read_list(value, what, max_items):
        doc = read_object(item, f"{what} entry")
        out.append(
            Taint(
                key=read_str(doc.get("key"), f"{what} key", max_chars),
                value=_text(doc, "value", what, max_chars),
                effect=_text(doc, "effect", what, 32),
            )
        )
    return tuple(out)


def read_tolerations(
    value: object, what: str, max_items: int = MAX_TAINTS, max_chars: int = MAX_LABEL_CHARS
) -> tuple[Toleration, ...]:
    """A list of tolerations (a pod's ``reservation-affinity``, a pod spec's ``tolerations``);
    ``()`` for null."""
    if value is None:
        return ()
    out: list[Toleration] = []
    for item in read_list(value, what, max_items):
        doc = read_object(item, f"{what} entry")
        operator = _text(doc, "operator", what, 32) or "Equal"
        if operator not in ("Equal", "Exists"):
            raise FormatError(f"{what}: unknown operator {operator[:32]!r}")
        out.append(
            Toleration(
                key=_text(doc, "key", what, max_chars),
                operator=operator,
                value=_text(doc, "value", what, max_chars),
                effect=_text(doc, "effect", what, 32),
            )
        )
    return tuple(out)


# ---- the Reservation object ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reservation:
    """What the scheduler reads of one Reservation object."""

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    phase: str = ""  # status.phase as written ("" when absent)
    node_name: str = ""  # status.nodeName
    valid: bool = True  # has a template, at least one owner and a ttl or expires
    owners: tuple[ReservationOwner, ...] = ()
    allocate_once: bool = True
    allocate_policy: str = keys.RESERVATION_ALLOCATE_POLICY_DEFAULT
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    # the reservation's own resource-status (what the scheduler reserved: cpuset, NUMA amounts)
    status: ResourceStatus = field(default_factory=ResourceStatus)
    # the reservation's own device-allocated (the devices the scheduler reserved for it, in the
    # format of a pod's: Koordinator's deviceshare PreBindReservation writes it on the Reservation)
    devices: Mapping[str, tuple[DeviceAllocation, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # preferredCPUExclusivePolicy of the resource-spec the reserve pod carries ("None" when none)
    exclusive_policy: str = keys.EXCLUSIVE_POLICY_NONE
    allocatable: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    allocated: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def available(self) -> bool:
        """Scheduled on a node and Available (``IsReservationAvailable``)."""
        return bool(self.node_name) and self.phase == keys.RESERVATION_PHASE_AVAILABLE

    @property
    def active(self) -> bool:
        """Valid, scheduled and Available or Waiting: the scheduler counts what it reserved
        (``IsObjValidActiveReservation``)."""
        return (
            self.valid
            and bool(self.node_name)
            and self.phase in (keys.RESERVATION_PHASE_AVAILABLE, keys.RESERVATION_PHASE_WAITING)
        )


def _annotations(value: object, what: str) -> Mapping[str, Any]:
    doc = _opt_object(value, what)
    if len(doc) > MAX_LABELS:
        raise FormatError(f"{what}: {len(doc)} entries, more than the {MAX_LABELS} allowed")
    return doc


def parse_reservation(obj: object) -> Reservation:
    """Read one decoded Reservation object; ``FormatError`` when a part the scheduler uses has
    the wrong type, is over a bound, or an annotation it reads cannot be parsed. Unknown
    fields and parts the scheduler does not use (the template's pod spec) are not read."""
    what = "Reservation"
    doc = read_object(obj, what)
    meta = _opt_object(doc.get("metadata"), f"{what} metadata")
    spec = _opt_object(doc.get("spec"), f"{what} spec")
    status = _opt_object(doc.get("status"), f"{what} status")
    name = _text(meta, "name", what)
    uid = _text(meta, "uid", what)
    if not name or not uid:
        raise FormatError(f"{what}: metadata.name and metadata.uid are required")
    labels = read_labels(meta.get("labels"), f"{what} labels")
    template = spec.get("template")
    template_meta = _opt_object(_opt_object(template, f"{what} template").get("metadata"), f"{what} template metadata")
    # the reserve pod: the template's annotations, overwritten by the reservation's own
    annotations = dict(_annotations(template_meta.get("annotations"), f"{what} template annotations"))
    annotations.update(_annotations(meta.get("annotations"), f"{what} annotations"))
    res_status = ResourceStatus()
    raw = annotations.get(keys.ANNOTATION_RESOURCE_STATUS)
    if raw is not None:
        res_status = parse_resource_status(read_str(raw, f"{what} resource-status", 1 << 20))
    devices: Mapping[str, tuple[DeviceAllocation, ...]] = MappingProxyType({})
    raw = annotations.get(keys.ANNOTATION_DEVICE_ALLOCATED)
    if raw is not None:
        devices = parse_device_allocated(read_str(raw, f"{what} device-allocated", 1 << 20))
    res_spec = ResourceSpec()
    raw = annotations.get(keys.ANNOTATION_RESOURCE_SPEC)
    if raw is not None:
        res_spec = parse_resource_spec(read_str(raw, f"{what} resource-spec", 1 << 20))
    raw_owners = spec.get("owners")
    owners = tuple(
        _owner(o, f"{what} owner")
        for o in ([] if raw_owners is None else read_list(raw_owners, f"{what} owners", MAX_OWNERS))
    )
    once = spec.get("allocateOnce")
    policy = _text(spec, "allocatePolicy", what, 32)
    if policy not in keys.RESERVATION_ALLOCATE_POLICIES:
        raise FormatError(f"{what}: unknown allocatePolicy {policy!r}")
    unschedulable = spec.get("unschedulable")
    phase = _text(status, "phase", what, 32)
    return Reservation(
        name=name,
        uid=uid,
        labels=labels,
        phase=phase,
        node_name=_text(status, "nodeName", what),
        valid=isinstance(template, dict)
        and bool(owners)
        and (spec.get("ttl") is not None or spec.get("expires") is not None),
        owners=owners,
        allocate_once=True if once is None else read_bool(once, f"{what} allocateOnce"),
        allocate_policy=policy,
        unschedulable=False if unschedulable is None else read_bool(unschedulable, f"{what} unschedulable"),
        taints=read_taints(spec.get("taints"), f"{what} taints"),
        status=res_status,
        devices=devices,
        exclusive_policy=res_spec.preferred_cpu_exclusive_policy or keys.EXCLUSIVE_POLICY_NONE,
        allocatable=read_resource_list(status.get("allocatable"), f"{what} allocatable"),
        allocated=read_resource_list(status.get("allocated"), f"{what} allocated"),
    )


# ---- pod annotations ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """A ``NodeSelectorTerm``: one ``reservationSelectorTerms`` entry (over the reservation) or
    one ``nodeSelectorTerms`` entry of a pod's node affinity (over the node)."""

    match_expressions: tuple[LabelRequirement, ...] = ()
    match_fields: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """Every expression holds on ``labels`` and every field on ``metadata.name`` = ``name``;
        an empty term selects nothing."""
        if not self.match_expressions and not self.match_fields:
            return False
        fields = {_NAME_FIELD: name}
        return all(e.matches(labels) for e in self.match_expressions) and all(
            f.matches(fields) for f in self.match_fields
        )


def read_selector_term(value: object, what: str, max_chars: int = MAX_LABEL_CHARS) -> SelectorTerm:
    """One decoded ``NodeSelectorTerm``: ``matchExpressions`` with every operator, and
    ``matchFields`` naming only ``metadata.name`` with In or NotIn; strings up to ``max_chars``."""
    term = read_object(value, what)
    fields = _requirements(term.get("matchFields"), f"{what} matchFields", OPERATORS, max_chars)
    for f in fields:
        if f.key != _NAME_FIELD or f.operator not in ("In", "NotIn"):
            raise FormatError(f"{what}: matchFields supports only {_NAME_FIELD} In/NotIn")
    exprs = _requirements(term.get("matchExpressions"), f"{what} matchExpressions", OPERATORS, max_chars)
    return SelectorTerm(match_expressions=exprs, match_fields=fields)


@dataclass(frozen=True, slots=True)
class ReservationAffinity:
    """``scheduling.koordinator.sh/reservation-affinity``: the pod must be allocated from a
    reservation that satisfies all of this."""

    terms: tuple[SelectorTerm, ...] | None = None  # None: no required terms
    selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    name: str = ""
    tolerations: tuple[Toleration, ...] = ()


@memo_by_text(maxsize=256)
def parse_reservation_affinity(text: str) -> ReservationAffinity:
    """Parse ``scheduling.koordinator.sh/reservation-affinity``; "" is an affinity with no
    constraint (the pod still requires a reservation), as in Koordinator."""
    what = "reservation-affinity"
    if text == "":
        return ReservationAffinity()
    doc = read_object(load_json(text, what, max_chars=_MAX_AFFINITY_CHARS), what)
    required = doc.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[SelectorTerm, ...] | None = None
    if required is not None:
        req = read_object(required, f"{what} required")
        raw_terms = req.get("reservationSelectorTerms")
        collected: list[SelectorTerm] = []
        for t in [] if raw_terms is None else read_list(raw_terms, f"{what} terms", MAX_TERMS):
            collected.append(read_selector_term(t, f"{what} term"))
        terms = tuple(collected)
    return ReservationAffinity(
        terms=terms,
        selector=read_labels(doc.get("reservationSelector"), f"{what} reservationSelector"),
        name=_text(doc, "name", what),
        tolerations=read_tolerations(doc.get("tolerations"), f"{what} tolerations"),
    )


@dataclass(frozen=True, slots=True)
class ReservationAllocated:
    """``scheduling.koordinator.sh/reservation-allocated``."""

    name: str = ""
    uid: str = ""


@memo_by_text(maxsize=1024)
def parse_reservation_allocated(text: str) -> ReservationAllocated:
    """Parse ``scheduling.koordinator.sh/reservation-allocated``."""
    what = "reservation-allocated"
    doc = read_object(load_json(text, what, max_chars=_MAX_ALLOCATED_CHARS, max_depth=2), what)
    return ReservationAllocated(name=_text(doc, "name", what), uid=_text(doc, "uid", what))


def format_reservation_allocated(name: str, uid: str) -> str:
    """The reservation-allocated JSON the scheduler writes on a pod allocated from a reservation."""
    return json.dumps({"name": name, "uid": uid}, separators=(",", ":"))

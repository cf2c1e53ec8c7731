"""ClusterColocationProfile (``config.koordinator.sh/v1alpha1``, cluster-scoped): which pods the
mutating webhook turns into co-located pods, and what it sets on them.

Source: koordinator-sh/koordinator ``apis/config/v1alpha1/cluster_colocation_profile_types.go``
and ``pkg/webhook/pod/mutating/cluster_colocation_profile.go``.

``parse_profile`` reads one object (decoded JSON) into a frozen ``ColocationProfile``, bounded,
or raises ``FormatError``: the webhook then leaves that profile out (and logs it), so a bad
profile costs only itself. Differences from Koordinator, by choice:

- a selector that does not parse counts as matching every pod, as Koordinator's webhook treats
  a selector error (we report it too);
- ``spec.patch`` (a strategic-merge patch applied to the pod) is not supported: a profile with
  a non-empty patch is refused whole, rather than applied without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats import keys
from koord_formats.bounded import read_int, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.selector import LabelSelector, parse_label_selector

__all__ = [
    "ANNOTATION_SKIP_UPDATE_RESOURCES",
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "ColocationProfile",
    "parse_profile",
]

API_GROUP = "config.koordinator.sh"
API_VERSION = "v1alpha1"
KIND = "ClusterColocationProfile"
PLURAL = "clustercolocationprofiles"
# On the profile: keep the pod's cpu and memory as they are (no batch or mid resources).
ANNOTATION_SKIP_UPDATE_RESOURCES = "config.koordinator.sh/skip-update-resources"

_MAX_ENTRIES = 64
_MAX_KEY = 320
_MAX_VALUE = 64 * 1024
_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ColocationProfile:
    """One profile's spec (and the skip annotation of its metadata)."""

    name: str
    namespace_selector: LabelSelector | None = None  # None: every namespace
    selector: LabelSelector | None = None  # None: every pod
    probability_percent: int = 100  # a pod is changed when a roll of 0..99 is below or at it
    qos_class: str = ""  # "" leaves the pod's QoS label alone
    priority_class_name: str = ""
    koordinator_priority: int | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    label_keys_mapping: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotation_keys_mapping: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    label_suffixes: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    scheduler_name: str = ""
    skip_update_resources: bool = False
    problems: tuple[str, ...] = ()  # selectors that did not parse (and so match everything)


def _map(value: object, what: str) -> Mapping[str, str]:
    if value is None:
        return _EMPTY
    doc = read_object(value, what)
    if len(doc) > _MAX_ENTRIES:
        raise FormatError(f"{what}: more than {_MAX_ENTRIES} entries")
    return MappingProxyType({read_str(k, f"{what} key", _MAX_KEY): read_str(v, f"{what} {k[:64]}", _MAX_VALUE)
                             for k, v in doc.items()})


def _selector(value: object, what: str, problems: list[str]) -> LabelSelector | None:
    if value is None:
        return None
    try:
        return parse_label_selector(value, what)
    except FormatError as exc:
        problems.append(f"{exc}; it matches every pod")
        return None


def _probability(value: object) -> int:
    """``spec.probability`` (IntOrString): an integer, or "N%"; default 100."""
    if value is None:
        return 100
    if isinstance(value, str):
        text = read_str(value, "probability", 16).strip()
        if not text.endswith("%") or not text[:-1].isdigit():
            raise FormatError(f"probability: {text!r} is not an integer or a percentage such as '50%'")
        return int(text[:-1])
    return read_int(value, "probability", -(2**31), 2**31 - 1)


def _text(doc: Mapping[str, Any], key: str, what: str) -> str:
    value = doc.get(key)
    return "" if value is None else read_str(value, f"{what} {key}")


def parse_profile(obj: object) -> ColocationProfile:
    """A ClusterColocationProfile object as a ``ColocationProfile``; ``FormatError`` when a
    field has the wrong type or is over its bound, the QoS class is unknown, or it has a patch."""
    doc = read_object(obj, KIND)
    meta = read_object(doc.get("metadata") or {}, f"{KIND} metadata")
    name = read_str(meta.get("name"), f"{KIND} name")
    annotations = _map(meta.get("annotations"), f"{KIND} {name[:64]} annotations")
    spec = read_object(doc.get("spec") or {}, f"{KIND} {name[:64]} spec")
    what = f"{KIND} {name[:64]}"
    if spec.get("patch"):
        raise FormatError(f"{what}: spec.patch is not supported; the profile is left out")
    qos_class = _text(spec, "qosClass", what)
    if qos_class and qos_class not in keys.KOORD_QOS_CLASSES:
        raise FormatError(f"{what}: unknown qosClass {qos_class[:32]!r}")
    priority = spec.get("koordinatorPriority")
    problems: list[str] = []
    return ColocationProfile(
        name=name,
        namespace_selector=_selector(spec.get("namespaceSelector"), f"{what} namespaceSelector", problems),
        selector=_selector(spec.get("selector"), f"{what} selector", problems),
        probability_percent=_probability(spec.get("probability")),
        qos_class=qos_class,
        priority_class_name=_text(spec, "priorityClassName", what),
        koordinator_priority=None if priority is None else read_int(priority, f"{what} koordinatorPriority",
                                                                    -(2**31), 2**31 - 1),
        labels=_map(spec.get("labels"), f"{what} labels"),
        annotations=_map(spec.get("annotations"), f"{what} annotations"),
        label_keys_mapping=_map(spec.get("labelKeysMapping"), f"{what} labelKeysMapping"),
        annotation_keys_mapping=_map(spec.get("annotationKeysMapping"), f"{what} annotationKeysMapping"),
        label_suffixes=_map(spec.get("labelSuffixes"), f"{what} labelSuffixes"),
        scheduler_name=_text(spec, "schedulerName", what),
        skip_update_resources=ANNOTATION_SKIP_UPDATE_RESOURCES in annotations,
        problems=tuple(problems),
    )

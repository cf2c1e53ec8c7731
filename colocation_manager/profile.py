"""The pod webhook's decisions, as pure functions: ClusterColocationProfile mutation and the
co-location validation rules.

Who calls this: ``colocation_manager.webhook`` for every AdmissionReview it is sent (pod
CREATE for the mutation; CREATE and UPDATE for the validation). Sources: koordinator-sh/koordinator
``pkg/webhook/pod/mutating/cluster_colocation_profile.go`` and
``pkg/webhook/pod/validating/cluster_colocation_profile.go``; fact sheet
``koordinator-manager.md`` section 6.

``mutate_pod``: profiles in ascending name order, each one that matches (namespace selector on
the namespace's labels, selector on the pod's labels as changed so far) and passes its
probability roll applies, in order: labels, annotations, label and annotation key mappings,
label suffixes, schedulerName, the QoS label, priorityClassName (with the PriorityClass's
value as ``spec.priority`` and its preemption policy), the ``koordinator.sh/priority`` label.
When at least one profile applied and none asks to skip it, the pod's resources are rewritten
for its derived priority class: koord-batch to ``kubernetes.io/batch-cpu`` (integer
milli-cores: "500m" -> "500", "2" -> "2000") and ``batch-memory`` (the quantity as given),
koord-mid to the mid pair; cpu and memory are removed from requests and limits of every
container, init container and the overhead; a limit without a request gets the request; the
annotation ``node.koordinator.sh/extended-resource-spec`` records each container's new
requests and limits. That annotation is written for every pod created whose containers request
or limit batch or mid resources, with or without a profile (Koordinator's
``extended_resource_spec.go`` mutation): the node agent reads batch limits from it. The result
is a JSON patch of the fields that changed.

``validate_pod``: batch resources need the QoS label BE; BE goes with neither no priority class
nor koord-prod; LSR with neither no priority class nor mid, batch or free; LSR and LSE pods
request a whole, non-zero number of CPUs; on UPDATE the QoS label, the raw priority class and
the ``koordinator.sh/priority`` label cannot change.

Every input is hostile: any malformed part of the pod (or a quantity that does not parse) gives
``Mutation.error`` or a validation message about that pod only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from colocation_manager.objects import MAX_CONTAINERS, kube_qos_of_spec, string_map
from koord_formats import keys, qos
from koord_formats.bounded import read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.pod import format_extended_resource_spec, read_resource_list
from koord_formats.profile import ColocationProfile
from koord_formats.quantity import parse_cpu_milli, parse_quantity

__all__ = ["Mutation", "PriorityClassInfo", "mutate_pod", "validate_pod"]

_CPU, _MEMORY = "cpu", "memory"
_REWRITE = {
    keys.PRIORITY_BATCH: (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY),
    keys.PRIORITY_MID: (keys.RESOURCE_MID_CPU, keys.RESOURCE_MID_MEMORY),
}
_BATCH = (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY)


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    """What the mutation reads of a ``scheduling.k8s.io/v1`` PriorityClass."""

    value: int
    preemption_policy: str = ""  # "" when the class does not set one


@dataclass(frozen=True, slots=True)
class Mutation:
    """The JSON patch to return (empty: allow unchanged), the profiles that applied, and an
    error that refuses the pod instead ("" when there is none)."""

    patch: tuple[dict[str, Any], ...] = ()
    profiles: tuple[str, ...] = ()
    error: str = ""


def _pointer(*parts: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _convert(resources: Mapping[str, Any], names: tuple[str, str], what: str) -> dict[str, Any]:
    """cpu -> the CPU name as integer milli-cores, memory -> the memory name as given."""
    out = dict(resources)
    cpu, memory = out.pop(_CPU, None), out.pop(_MEMORY, None)
    if cpu is not None:
        out[names[0]] = str(parse_cpu_milli(cpu))
    if memory is not None:
        parse_quantity(memory)  # refuse what the API server would not have stored
        out[names[1]] = memory if isinstance(memory, str) else str(memory)
    return out


def _rewrite_container(container: Mapping[str, Any], names: tuple[str, str], what: str) -> dict[str, Any]:
    out = dict(container)
    resources = dict(read_object(out.get("resources") or {}, f"{what} resources"))
    requests = _convert(read_object(resources.get("requests") or {}, f"{what} requests"), names, what)
    limits = _convert(read_object(resources.get("limits") or {}, f"{what} limits"), names, what)
    for name in names:
        if name in limits and name not in requests:
            requests[name] = limits[name]
    resources["requests"], resources["limits"] = requests, limits
    out["resources"] = resources
    return out


_EXTENDED = (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY, keys.RESOURCE_MID_CPU, keys.RESOURCE_MID_MEMORY)


def _extended_resources(raw: Any) -> dict[str, dict[str, dict[str, str]]]:
    """Container name -> {"requests": {...}, "limits": {...}} of its batch and mid resources
    (quantities checked, kept as written); containers without any are left out."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for c in read_list(raw or [], "pod containers", MAX_CONTAINERS):
        container = read_object(c, "container")
        res = read_object(container.get("resources") or {}, "container resources")
        parts: dict[str, dict[str, str]] = {}
        for part in ("requests", "limits"):
            values = read_object(res.get(part) or {}, f"container {part}")
            parts[part] = {}
            for name in _EXTENDED:
                if name in values:
                    value = values[name]
                    parse_quantity(value)  # refuse what the API server would not have stored
                    parts[part][name] = value if isinstance(value, str) else str(value)
        if parts["requests"] or parts["limits"]:
            out[read_str(container.get("name") or "", "container name")] = parts
    return out


def _roll_passes(profile: ColocationProfile, roll: Callable[[], int]) -> bool:
    if profile.probability_percent <= 0:
        return False
    return profile.probability_percent >= 100 or roll() <= profile.probability_percent


def _matches(profile: ColocationProfile, namespace_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    if profile.namespace_selector is not None and not profile.namespace_selector.matches(namespace_labels):
        return False
    return profile.selector is None or profile.selector.matches(labels)


def mutate_pod(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    profiles: Sequence[ColocationProfile],
    priority_classes: Mapping[str, PriorityClassInfo],
    roll: Callable[[], int],
) -> Mutation:
    """The mutation of a pod being created (see the module docstring). ``roll`` returns an
    integer in 0..99 for each profile with a probability below 100."""
    try:
        return _mutate(pod, namespace_labels, profiles, priority_classes, roll)
    except FormatError as exc:
        return Mutation(error=f"pod cannot be read: {exc}")


def _mutate(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    profiles: Sequence[ColocationProfile],
    priority_classes: Mapping[str, PriorityClassInfo],
    roll: Callable[[], int],
) -> Mutation:
    meta = read_object(pod.get("metadata") or {}, "pod metadata")
    spec = read_object(pod.get("spec") or {}, "pod spec")
    labels = string_map(meta.get("labels"), "pod labels")
    annotations = string_map(meta.get("annotations"), "pod annotations")
    new_labels, new_annotations = dict(labels), dict(annotations)
    new_spec: dict[str, Any] = {}
    applied: list[str] = []
    skip_resources = False
    for profile in sorted(profiles, key=lambda p: p.name):
        if not _matches(profile, namespace_labels, new_labels) or not _roll_passes(profile, roll):
            continue
        applied.append(profile.name)
        skip_resources = skip_resources or profile.skip_update_resources
        new_labels.update(profile.labels)
        new_annotations.update(profile.annotations)
        for src, dst in profile.label_keys_mapping.items():
            if src in new_labels:
                new_labels[dst] = new_labels[src]
        for src, dst in profile.annotation_keys_mapping.items():
            if src in new_annotations:
                new_annotations[dst] = new_annotations[src]
        for key, suffix in profile.label_suffixes.items():
            if key in new_labels:
                new_labels[key] = new_labels[key] + suffix
        if profile.scheduler_name:
            new_spec["schedulerName"] = profile.scheduler_name
        if profile.qos_class:
            new_labels[keys.LABEL_QOS_CLASS] = profile.qos_class
        if profile.priority_class_name:
            info = priority_classes.get(profile.priority_class_name)
            if info is None:
                return Mutation(error=f"profile {profile.name}: PriorityClass {profile.priority_class_name!r} "
                                      "not found")
            new_spec["priorityClassName"] = profile.priority_class_name
            new_spec["priority"] = info.value
            if info.preemption_policy:
                new_spec["preemptionPolicy"] = info.preemption_policy
        if profile.koordinator_priority is not None:
            new_labels[keys.LABEL_PRIORITY] = str(profile.koordinator_priority)
    if applied and not skip_resources:
        merged_spec = {**spec, **new_spec}
        pod_qos = qos.qos_class(new_labels, kube_qos_of_spec(merged_spec))
        priority_class = qos.priority_class(new_labels, merged_spec.get("priority"), pod_qos)
        names = _REWRITE.get(priority_class)
        if names is not None:
            for field_name in ("containers", "initContainers"):
                raw = spec.get(field_name)
                if raw is None:
                    continue
                new_spec[field_name] = [_rewrite_container(read_object(c, "container"), names, "container")
                                        for c in read_list(raw, f"pod {field_name}", MAX_CONTAINERS)]
            overhead = spec.get("overhead")
            if overhead is not None:
                new_spec["overhead"] = _convert(read_object(overhead, "pod overhead"), names, "pod overhead")
    # Koordinator's extended-resource-spec mutation, for every pod created (a profile or not):
    # each container's batch and mid requests and limits, as the pod (rewritten above) has them,
    # so the node side, which sees no extended resources through CRI, can enforce them.
    extended = _extended_resources(new_spec.get("containers", spec.get("containers")))
    if extended:
        new_annotations[keys.ANNOTATION_EXTENDED_RESOURCE_SPEC] = format_extended_resource_spec(extended)
    patch: list[dict[str, Any]] = []
    if new_labels != labels:
        patch.append({"op": "add", "path": _pointer("metadata", "labels"), "value": new_labels})
    if new_annotations != annotations:
        patch.append({"op": "add", "path": _pointer("metadata", "annotations"), "value": new_annotations})
    for key, value in new_spec.items():
        if spec.get(key) != value:
            patch.append({"op": "add", "path": _pointer("spec", key), "value": copy.deepcopy(value)})
    return Mutation(tuple(patch), tuple(applied))


# ---- validation ------------------------------------------------------------------------------------


def _raw_priority_class(labels: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    """Koordinator's ``GetPodPriorityClassRaw``: the priority-class label, else the class of
    ``spec.priority``; "" (none) when neither names one."""
    label = labels.get(keys.LABEL_PRIORITY_CLASS, "")
    if label in keys.PRIORITY_CLASSES:
        return label
    return qos.priority_class_of_value(spec.get("priority"))


def _pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """Effective pod requests (requests default to limits): max(sum of containers, init)."""
    total: dict[str, Fraction] = {}
    for field_name, combine in (("containers", "sum"), ("initContainers", "max")):
        for c in read_list(spec.get(field_name) or [], f"pod {field_name}", MAX_CONTAINERS):
            res = read_object(read_object(c, "container").get("resources") or {}, "container resources")
            requests = dict(read_resource_list(res.get("requests"), "container requests"))
            for name, value in read_resource_list(res.get("limits"), "container limits").items():
                requests.setdefault(name, value)
            for name, value in requests.items():
                old = total.get(name, Fraction(0))
                total[name] = old + value if combine == "sum" else max(old, value)
    return total


def validate_pod(pod: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Why the pod (being created, or updated from ``old``) is refused; [] when it is allowed."""
    try:
        return _validate(pod, old)
    except FormatError as exc:
        return [f"pod cannot be read: {exc}"]


def _labels_spec(pod: Mapping[str, Any]) -> tuple[dict[str, str], Mapping[str, Any]]:
    meta = read_object(pod.get("metadata") or {}, "pod metadata")
    return string_map(meta.get("labels"), "pod labels"), read_object(pod.get("spec") or {}, "pod spec")


def _validate(pod: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    labels, spec = _labels_spec(pod)
    errors: list[str] = []
    qos_label = qos.qos_label(labels)
    priority = _raw_priority_class(labels, spec)
    if old is not None:
        old_labels, old_spec = _labels_spec(old)
        if qos.qos_label(old_labels) != qos_label:
            errors.append(f"labels.{keys.LABEL_QOS_CLASS}: field is immutable")
        if _raw_priority_class(old_labels, old_spec) != priority:
            errors.append("spec.priority: the priority class is immutable")
        if old_labels.get(keys.LABEL_PRIORITY) != labels.get(keys.LABEL_PRIORITY):
            errors.append(f"labels.{keys.LABEL_PRIORITY}: field is immutable")
    requests = _pod_requests(spec)
    if any(requests.get(name, 0) for name in _BATCH) and qos_label != keys.QOS_BE:
        errors.append(f"labels.{keys.LABEL_QOS_CLASS}: must specify koordinator QoS BE with koordinator "
                      "colocation resources")
    forbidden = {keys.QOS_BE: ("", keys.PRIORITY_PROD),
                 keys.QOS_LSR: ("", keys.PRIORITY_MID, keys.PRIORITY_BATCH, keys.PRIORITY_FREE)}
    if priority in forbidden.get(qos_label, ()):
        errors.append(f"Pod: {keys.LABEL_QOS_CLASS}={qos_label} and priorityClass={priority or 'none'} cannot be "
                      "used in combination")
    if qos_label in (keys.QOS_LSR, keys.QOS_LSE):
        cpu = requests.get(_CPU, Fraction(0))
        if not cpu:
            errors.append(f"{qos_label} pod must declare the requested CPUs")
        elif cpu.denominator != 1:
            errors.append(f"the requested CPUs of a {qos_label} pod must be an integer, not {float(cpu):g}")
    return errors

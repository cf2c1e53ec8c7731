"""Nodes and pods as the manager's formulas read them, decoded from their JSON once.

Who calls this: ``colocation_manager.controller`` on every Node and Pod event it caches;
``benchmarks/manager_update.py``. Total: any malformed object raises ``FormatError`` (from
``koord_formats``), which the caller turns into a logged skip of that object (a pod: its node's
batch resources are reset, since its usage is unknown).

- ``node_info``: ``status.capacity`` and ``status.allocatable`` (cpu, memory), the reservation
  annotation ``node.koordinator.sh/reservation`` (its ``reservedCPUs`` count when set, else
  its ``resources``) and the CPU normalization ratio annotation.
- ``pod_info``: namespace, name, phase, node; Koordinator's priority class
  (``koord_formats.qos.priority_class``) and QoS class (label, else from the Kubernetes QoS
  class in ``status.qosClass``, computed from the containers when absent); the effective request
  as Kubernetes computes it: max(sum over containers, largest init container) + overhead.
- ``pod_view``: what the controller uses; ``pod_info``, or, for a pod that cannot be decoded in
  full (more labels, resources or containers than the bounds, a malformed field: the API server
  accepts 4,097 labels or 65 extended resources), an estimate from what can be read, as the
  extender estimates what it cannot decode (``scheduler_ext.loadaware``): its phase (so a
  Succeeded or Failed pod holds nothing, as any terminal pod), its priority and QoS labels and
  ``spec.priority`` when readable, and the cpu and memory of at most ``MAX_CONTAINERS``
  containers, each container that cannot be read (and each beyond the bound) counted at the
  estimator's default of 250m CPU and 200 MiB. Such a pod costs its own estimate, never its
  node's batch resources; ``PodInfo.estimated`` says why it was estimated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from colocation_manager.resources import Amount, NodeInfo, PodInfo
from koord_formats import keys, qos
from koord_formats.bounded import MAX_NAME_CHARS, read_list, read_object, read_str
from koord_formats.errors import FormatError, describe
from koord_formats.loadaware import DEFAULT_CPU_MILLI, DEFAULT_MEMORY_BYTES
from koord_formats.node import parse_cpu_normalization_ratio, parse_node_reservation
from koord_formats.pod import parse_resource_status, read_resource_list
from koord_formats.quantity import parse_quantity

__all__ = [
    "MAX_CONTAINERS",
    "PodKey",
    "kube_qos_of_spec",
    "node_info",
    "node_labels",
    "pod_info",
    "pod_node_name",
    "pod_view",
    "string_map",
]

MAX_CONTAINERS = 1024
# what one container that cannot be read is estimated at (koord-scheduler's estimator defaults)
_DEFAULT_CONTAINER = Amount(DEFAULT_CPU_MILLI, DEFAULT_MEMORY_BYTES)
_TERMINAL = frozenset({"Succeeded", "Failed"})
_CPU = "cpu"
_MEMORY = "memory"
_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True, slots=True)
class PodKey:
    namespace: str
    name: str


def _object(value: object, what: str) -> Mapping[str, Any]:
    return _EMPTY if value is None else read_object(value, what)


def string_map(value: object, what: str) -> dict[str, str]:
    """A labels or annotations map (absent: empty); ``FormatError`` unless strings to strings."""
    doc = _object(value, what)
    if len(doc) > 4096:
        raise FormatError(f"{what}: more than 4096 entries")
    out: dict[str, str] = {}
    for k, v in doc.items():
        out[read_str(k, f"{what} key", 1024)] = read_str(v, f"{what} {k[:64]}", 256 * 1024)
    return out


def _amount(resources: Mapping[str, Fraction]) -> Amount:
    """cpu in milli-cores and memory in bytes, rounded up as the API server rounds."""
    cpu, memory = resources.get(_CPU), resources.get(_MEMORY)
    return Amount(
        0 if cpu is None else math.ceil(cpu * 1000),
        0 if memory is None else math.ceil(memory),
    )


def node_labels(node: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The node's labels and annotations; ``FormatError`` when they are not string maps."""
    meta = _object(node.get("metadata"), "node metadata")
    return string_map(meta.get("labels"), "node labels"), string_map(meta.get("annotations"), "node annotations")


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """A Node object (decoded JSON) as ``NodeInfo``; ``FormatError`` when malformed."""
    meta = _object(node.get("metadata"), "node metadata")
    name = read_str(meta.get("name"), "node name", MAX_NAME_CHARS)
    _, annotations = node_labels(node)
    status = _object(node.get("status"), "node status")
    capacity = _amount(read_resource_list(status.get("capacity"), "node capacity"))
    allocatable = _amount(read_resource_list(status.get("allocatable"), "node allocatable"))
    reservation = Amount()
    text = annotations.get(keys.NODE_ANNOTATION_RESERVATION)
    if text:
        parsed = parse_node_reservation(text)
        reserved = _amount(parsed.resources)
        cpu = len(parsed.reserved_cpus) * 1000 if parsed.reserved_cpus else reserved.cpu
        reservation = Amount(cpu, reserved.memory)
    ratio_text = annotations.get(keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO)
    ratio = parse_cpu_normalization_ratio(ratio_text) if ratio_text is not None else None
    return NodeInfo(name, capacity, allocatable, reservation, ratio)


@dataclass(frozen=True, slots=True)
class _Container:
    requests: Amount  # a request missing beside a limit defaults to the limit (API server)
    limits: Amount
    names_any: bool  # requests or limits name cpu or memory
    limits_both: bool  # limits name both cpu and memory


def _container(container: object, what: str) -> _Container:
    resources = _object(read_object(container, what).get("resources"), f"{what} resources")
    requests = dict(read_resource_list(resources.get("requests"), f"{what} requests"))
    limits = read_resource_list(resources.get("limits"), f"{what} limits")
    for name, value in limits.items():
        requests.setdefault(name, value)
    return _Container(
        _amount(requests),
        _amount(limits),
        any(n in requests for n in (_CPU, _MEMORY)),
        _CPU in limits and _MEMORY in limits,
    )


def _kube_qos(containers: list[_Container]) -> str:
    """Kubernetes' QoS class from the containers (used when ``status.qosClass`` is absent)."""
    if not any(c.names_any for c in containers):
        return "BestEffort"
    if all(c.limits_both and c.requests == c.limits for c in containers):
        return "Guaranteed"
    return "Burstable"


def kube_qos_of_spec(spec: Mapping[str, Any]) -> str:
    """Kubernetes' QoS class of a pod spec (what ``status.qosClass`` will say)."""
    return _kube_qos([_container(c, "container") for c in
                      read_list(spec.get("containers") or [], "pod containers", MAX_CONTAINERS)])


def pod_node_name(pod: Mapping[str, Any]) -> str:
    """``spec.nodeName`` ("" when unbound); ``FormatError`` when malformed."""
    spec = _object(pod.get("spec"), "pod spec")
    value = spec.get("nodeName")
    return "" if value is None else read_str(value, "pod nodeName", MAX_NAME_CHARS)


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """A Pod object (decoded JSON) as ``PodInfo``; ``FormatError`` when malformed."""
    meta = _object(pod.get("metadata"), "pod metadata")
    namespace = read_str(meta.get("namespace") or "", "pod namespace", MAX_NAME_CHARS)
    name = read_str(meta.get("name"), "pod name", MAX_NAME_CHARS)
    labels = string_map(meta.get("labels"), "pod labels")
    spec = _object(pod.get("spec"), "pod spec")
    status = _object(pod.get("status"), "pod status")
    phase = read_str(status.get("phase") or "", "pod phase", 64)
    total = Amount()
    decoded = [_container(c, "container") for c in read_list(spec.get("containers") or [], "pod containers",
                                                            MAX_CONTAINERS)]
    for c in decoded:
        total = total + c.requests
    for raw in read_list(spec.get("initContainers") or [], "pod initContainers", MAX_CONTAINERS):
        total = total.max(_container(raw, "init container").requests)
    total = total + _amount(read_resource_list(spec.get("overhead"), "pod overhead"))
    kube_qos = status.get("qosClass")
    kube_qos = read_str(kube_qos, "pod qosClass", 32) if kube_qos is not None else _kube_qos(decoded)
    pod_qos = qos.qos_class(labels, kube_qos)
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise FormatError("pod priority: expected an integer")
    return PodInfo(
        namespace=namespace,
        name=name,
        phase=phase,
        priority_class=qos.priority_class(labels, priority, pod_qos),
        qos=pod_qos,
        request=total,
        numa_nodes=_numa_nodes(string_map(meta.get("annotations"), "pod annotations")),
    )


def _numa_nodes(annotations: Mapping[str, str]) -> tuple[int, ...]:
    """The NUMA nodes of the pod's resource-status; () when it has none or it does not parse
    (Koordinator then splits the pod evenly over the zones too)."""
    text = annotations.get(keys.ANNOTATION_RESOURCE_STATUS)
    if not text:
        return ()
    try:
        status = parse_resource_status(text)
    except FormatError:
        return ()
    return tuple(sorted({r.node for r in status.numa_node_resources}))


def pod_view(pod: Mapping[str, Any]) -> PodInfo:
    """The pod as the formulas count it (see the module docstring); never raises."""
    try:
        return pod_info(pod)
    except FormatError as exc:
        return _estimate(pod, describe(exc))


def _get(doc: object, key: str) -> object:
    """``doc[key]`` when ``doc`` is an object, else None."""
    return doc.get(key) if isinstance(doc, Mapping) else None


def _short(value: object, max_chars: int) -> str:
    """``value`` when it is a string of at most ``max_chars``, else ""."""
    return value if isinstance(value, str) and len(value) <= max_chars else ""


def _quantity(value: object, scale: int) -> int | None:
    """A quantity in milli-units (``scale`` 1000) or units (1), rounded up; None: unreadable."""
    try:
        return math.ceil(parse_quantity(value) * scale)
    except FormatError:
        return None


def _estimate_container(container: object) -> Amount:
    """cpu and memory of one container (a missing request defaults to its limit), read alone;
    the estimator's default for a container whose cpu or memory cannot be read."""
    resources = _get(container, "resources")
    if not isinstance(container, Mapping) or not isinstance(resources or {}, Mapping):
        return _DEFAULT_CONTAINER
    requests, limits = _get(resources, "requests"), _get(resources, "limits")
    out = []
    for name, scale in ((_CPU, 1000), (_MEMORY, 1)):
        value = _get(requests, name)
        value = _get(limits, name) if value is None else value
        amount = 0 if value is None else _quantity(value, scale)
        if amount is None:
            return _DEFAULT_CONTAINER
        out.append(amount)
    return Amount(out[0], out[1])


def _estimate_all(containers: object) -> list[Amount]:
    """The estimate of each of at most ``MAX_CONTAINERS`` containers; the rest (and a list that
    is no list) at the default each, counted without reading them."""
    if containers is None:
        return []
    if not isinstance(containers, list):
        return [_DEFAULT_CONTAINER]
    out = [_estimate_container(c) for c in containers[:MAX_CONTAINERS]]
    beyond = len(containers) - MAX_CONTAINERS
    if beyond > 0:
        out.append(Amount(_DEFAULT_CONTAINER.cpu * beyond, _DEFAULT_CONTAINER.memory * beyond))
    return out


def _estimate(pod: Mapping[str, Any], problem: str) -> PodInfo:
    """A pod ``pod_info`` refused, estimated from what can be read (the module docstring)."""
    meta, spec, status = _get(pod, "metadata"), _get(pod, "spec"), _get(pod, "status")
    phase = _short(_get(status, "phase"), 64)
    if phase not in _TERMINAL:
        phase = phase if phase == "Pending" else "Running"  # unreadable: it may run
    labels = _get(meta, "labels")
    readable = {k: v for k in (keys.LABEL_QOS_CLASS, keys.LABEL_PRIORITY_CLASS)
                if (v := _short(_get(labels, k), MAX_NAME_CHARS))}  # fmt: skip
    total = Amount()
    for amount in _estimate_all(_get(spec, "containers")):
        total = total + amount
    for amount in _estimate_all(_get(spec, "initContainers")):
        total = total.max(amount)
    overhead = _estimate_container({"resources": {"requests": _get(spec, "overhead")}})
    total = total + overhead
    kube_qos = _short(_get(status, "qosClass"), 32)
    pod_qos = qos.qos_class(readable, kube_qos)
    priority = _get(spec, "priority")
    annotations = _get(meta, "annotations")
    status_text = _short(_get(annotations, keys.ANNOTATION_RESOURCE_STATUS), 16 * 1024)
    return PodInfo(
        namespace=_short(_get(meta, "namespace"), MAX_NAME_CHARS),
        name=_short(_get(meta, "name"), MAX_NAME_CHARS),
        phase=phase,
        priority_class=qos.priority_class(readable, priority, pod_qos),
        qos=pod_qos,
        request=total,
        numa_nodes=_numa_nodes({keys.ANNOTATION_RESOURCE_STATUS: status_text} if status_text else {}),
        estimated=problem,
    )

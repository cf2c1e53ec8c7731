"""Placing a Reservation like a pod, and the status its controller writes: pure functions.

Who calls this: ``scheduler_ext.reserver`` (the controller: the shell that reads the cluster,
asks these functions and writes). Koordinator's semantics (koordinator-sh/koordinator
``pkg/util/reservation``, the reservation controller ``syncStatus`` and its proposal
``docs/proposals/scheduling/20220609-resource-reservation.md``):

- The *reserve pod*: the template's metadata and spec, the reservation's own labels and
  annotations laid over the template's, its UID, namespace ``default``
  (``NewReservePod``). It is placed by the extender's one feasibility function for pods
  (``scheduler_ext.decide``: exact cpusets of LSE/LSR templates, NUMA, GPUs), with what
  kube-scheduler's default plugins check for a pod (``node_fit``: ``spec.nodeName``, node
  selector and required node affinity, taints of effect NoSchedule and NoExecute, host ports,
  requests against the node's allocatable minus its pods' and its active reservations'). A
  reserve pod is never placed into another reservation, and scheduler-owned annotations a
  template carries (``scheduler_ext.trust.OWNED``) are not read.
- Scheduled: ``status.nodeName``, phase ``Available``, ``allocatable`` the template's requests,
  ``allocated`` empty, ``currentOwners`` empty, conditions ``Scheduled`` True (reason
  ``Scheduled``) and ``Ready`` True (reason ``Available``); the reserved cpuset and NUMA amounts
  go into the reservation's ``scheduling.koordinator.sh/resource-status`` annotation.
- Not schedulable: phase stays ``Pending``, condition ``Scheduled`` False, reason
  ``Unschedulable`` with the nodes' reasons as its message.
- Expired (``spec.expires`` passed, else creation plus ``spec.ttl``; a ttl of 0 never expires;
  Failed and Succeeded ones are left alone), or its node gone: phase ``Failed``, condition
  ``Ready`` False, reason ``Expired``. The extender stops counting it: what it held is free.
- Garbage collection (``isReservationNeedCleanup``): a ``Failed`` one whose condition of reason
  ``Expired`` moved (``lastTransitionTime``) more than ``GC_AFTER`` ago, or a ``Succeeded`` one
  whose condition of reason ``Succeeded`` was last probed (``lastProbeTime``) that long ago, is
  deleted. Koordinator's default is 24 hours (``defaultGCDuration``, and
  ``defaultGCDurationSeconds`` 86400 in its scheduler's config); here ``--reservation-gc-after``.
  One without such a condition (or with unreadable conditions) stays until deleted.
- Owners: ``currentOwners`` the pods whose ``reservation-allocated`` names its UID,
  ``allocated`` the sum of their requests over the names of ``allocatable``; an
  ``allocateOnce`` reservation with an owner becomes ``Succeeded`` (``Ready`` False, reason
  ``Succeeded``) and is then no longer counted or matched.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from koord_formats import keys
from koord_formats.quantity import format_quantity
from koord_formats.reservation_spec import HostPort, NodeFacts, PodConstraints, Taint, read_conditions
from scheduler_ext.pods import PodRequest, parse_pod
from scheduler_ext.trust import LEGACY_SEAL_ANNOTATION, OWNED, SIGNATURE_ANNOTATION

__all__ = [
    "GC_AFTER",
    "PHASE_FAILED",
    "PHASE_PENDING",
    "PHASE_SUCCEEDED",
    "available_status",
    "collectable",
    "expired_status",
    "node_fit",
    "owners_status",
    "pending",
    "reserve_pod",
    "reserve_request",
    "rfc3339",
    "unschedulable_status",
]

PHASE_PENDING = "Pending"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"
COND_SCHEDULED, COND_READY = "Scheduled", "Ready"
REASON_SCHEDULED, REASON_UNSCHEDULABLE = "Scheduled", "Unschedulable"
REASON_AVAILABLE, REASON_SUCCEEDED, REASON_EXPIRED = "Available", "Succeeded", "Expired"
_HARD_EFFECTS = ("NoSchedule", "NoExecute")
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
MAX_MESSAGE_CHARS = 1024  # Kubernetes' note length limit for a condition message
GC_AFTER = 86400.0  # seconds: Koordinator's reservation GC duration (24h)
# never taken from a template: the extender decides them, and the reserve pod is not placed
# into another reservation
_DROPPED = (*OWNED, SIGNATURE_ANNOTATION, LEGACY_SEAL_ANNOTATION, keys.ANNOTATION_RESERVATION_AFFINITY)
# the PriorityClasses the chart installs (koord-manager's values): a template names its class
# by name and no admission resolves it into ``spec.priority`` as it would for a pod
_PRIORITY_VALUES = {keys.PRIORITY_PROD: 9000, keys.PRIORITY_MID: 7000, keys.PRIORITY_BATCH: 5000,
                    keys.PRIORITY_FREE: 3000}  # fmt: skip


def rfc3339(now: float) -> str:
    """``metav1.Time`` as the API server writes it (seconds, UTC)."""
    return datetime.datetime.fromtimestamp(int(now), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dict(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def reserve_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The reserve pod of a Reservation (``NewReservePod``), as a plain pod object."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    template = _dict(spec.get("template"))
    t_meta = _dict(template.get("metadata"))
    pod_spec = _dict(template.get("spec"))
    labels = _dict(t_meta.get("labels"))
    labels.update(_dict(meta.get("labels")))
    annotations = _dict(t_meta.get("annotations"))
    annotations.update(_dict(meta.get("annotations")))
    for key in _DROPPED:
        annotations.pop(key, None)
    pod_spec.pop("nodeName", None)  # where it goes is decided here (``node_fit`` reads it)
    name = pod_spec.get("priorityClassName")
    if pod_spec.get("priority") is None and isinstance(name, str) and name in _PRIORITY_VALUES:
        pod_spec["priority"] = _PRIORITY_VALUES[name]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.get("name"),
            "namespace": "default",
            "uid": meta.get("uid"),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def reserve_request(obj: Mapping[str, Any]) -> PodRequest:
    """What the extender's feasibility function reads of the reserve pod (never raises: a bad
    template is a request whose ``error`` says why)."""
    return dataclasses.replace(parse_pod(reserve_pod(obj)), reserve=True)


def pending(obj: Mapping[str, Any]) -> bool:
    """Not scheduled yet: no ``status.nodeName`` and phase "" or Pending."""
    status = _dict(obj.get("status"))
    return not status.get("nodeName") and status.get("phase") in (None, "", PHASE_PENDING)


# ---- kube-scheduler's default checks -------------------------------------------------------------


def node_fit(
    c: PodConstraints,
    node: NodeFacts,
    used: Mapping[str, Fraction],
    ports: Iterable[HostPort],
) -> str:
    """"" when the reserve pod passes what kube-scheduler's default filters check of a pod on
    ``node`` (``used``: what its pods and active reservations request; ``ports``: the host ports
    they hold), else the reason, in kube-scheduler's words."""
    if c.node_name and c.node_name != node.name:
        return "node(s) didn't match the requested node name"
    if node.unschedulable and not any(t.tolerates(_UNSCHEDULABLE_TAINT) for t in c.tolerations):
        return "node(s) were unschedulable"
    if any(node.labels.get(k) != v for k, v in c.node_selector.items()) or (
        c.terms is not None and not any(t.matches(node.labels, node.name) for t in c.terms)
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.taints:
        if taint.effect in _HARD_EFFECTS and not any(t.tolerates(taint) for t in c.tolerations):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    held = tuple(ports)
    if any(p.conflicts(q) for p in c.host_ports for q in held):
        return "node(s) didn't have free ports for the requested pod ports"
    short = [
        name
        for name, want in sorted(c.requests.items())
        if want > 0 and want > node.allocatable.get(name, Fraction(0)) - used.get(name, Fraction(0))
    ]
    if short:
        return ", ".join(f"Insufficient {name}" for name in short)
    return ""


# ---- status ------------------------------------------------------------------------------------


def _quantities(amounts: Mapping[str, Fraction]) -> dict[str, str]:
    return {k: format_quantity(v, binary=k == "memory" or "memory" in k) for k, v in sorted(amounts.items())}


def _condition(
    conditions: Sequence[Mapping[str, Any]], kind: str, status: str, reason: str, message: str, now: float
) -> list[dict[str, Any]]:
    """``conditions`` with the one of ``kind`` set; its transition time moves only when its
    status or reason changes."""
    out: list[dict[str, Any]] = []
    stamp = rfc3339(now)
    found = False
    for cond in conditions:
        c = dict(cond) if isinstance(cond, Mapping) else {}
        if c.get("type") == kind:
            found = True
            same = c.get("status") == status and c.get("reason") == reason
            c = {"type": kind, "status": status, "reason": reason, "message": message, "lastProbeTime": stamp,
                 "lastTransitionTime": c.get("lastTransitionTime", stamp) if same else stamp}  # fmt: skip
        out.append(c)
    if not found:
        out.append({"type": kind, "status": status, "reason": reason, "message": message,
                    "lastProbeTime": stamp, "lastTransitionTime": stamp})  # fmt: skip
    return out


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = status.get("conditions")
    return [c for c in raw[:64] if isinstance(c, Mapping)] if isinstance(raw, list) else []


def available_status(
    status: Mapping[str, Any], node: str, allocatable: Mapping[str, Fraction], now: float
) -> dict[str, Any]:
    """The status of a reservation just placed on ``node``."""
    conditions = _condition(_conditions(status), COND_SCHEDULED, "True", REASON_SCHEDULED, "", now)
    conditions = _condition(conditions, COND_READY, "True", REASON_AVAILABLE, "", now)
    return {
        "phase": keys.RESERVATION_PHASE_AVAILABLE,
        "nodeName": node,
        "allocatable": _quantities(allocatable),
        "allocated": {},
        "currentOwners": [],
        "conditions": conditions,
    }


def unschedulable_status(status: Mapping[str, Any], message: str, now: float) -> dict[str, Any]:
    """The status of a reservation no node can take now: Pending, with the reasons."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 4] + " ..."
    out = {k: v for k, v in status.items() if k not in ("phase", "conditions")}
    out["phase"] = PHASE_PENDING
    out["conditions"] = _condition(_conditions(status), COND_SCHEDULED, "False", REASON_UNSCHEDULABLE, message, now)
    return out


def expired_status(status: Mapping[str, Any], now: float, message: str = "") -> dict[str, Any]:
    """The status of an expired reservation (or one whose node is gone): Failed, Ready False."""
    out = dict(status)
    out["phase"] = PHASE_FAILED
    out["conditions"] = _condition(_conditions(status), COND_READY, "False", REASON_EXPIRED, message, now)
    return out


def owners_status(
    status: Mapping[str, Any],
    current: Sequence[tuple[str, str, str]],
    owners: Sequence[tuple[str, str, str, Mapping[str, Fraction]]],
    allocatable: Mapping[str, Fraction],
    allocated_now: Mapping[str, Fraction],
    allocate_once: bool,
    now: float,
) -> dict[str, Any] | None:
    """The status with ``currentOwners`` and ``allocated`` following ``owners`` ((uid,
    namespace, name, requests) of each pod allocated from it); ``None`` when nothing changed.
    ``current`` is what the status says now (``read_current_owners``)."""
    ids = tuple(sorted((uid, ns, name) for uid, ns, name, _ in owners))
    total: dict[str, Fraction] = {}
    for *_, requests in owners:
        for k, v in requests.items():
            if k in allocatable:
                total[k] = total.get(k, Fraction(0)) + v
    if ids == tuple(current) and {k: v for k, v in total.items() if v} == {
        k: v for k, v in allocated_now.items() if v
    }:
        return None
    out = dict(status)
    out["currentOwners"] = [{"namespace": ns, "name": name, "uid": uid} for uid, ns, name in ids]
    out["allocated"] = _quantities(total)
    if allocate_once and ids:
        out["phase"] = PHASE_SUCCEEDED
        out["conditions"] = _condition(_conditions(status), COND_READY, "False", REASON_SUCCEEDED, "", now)
    return out


def collectable(obj: Mapping[str, Any], now: float, after: float) -> bool:
    """Garbage collection deletes it now (see the module docstring); ``after`` <= 0 never.
    Raises ``FormatError`` when its conditions cannot be read."""
    if after <= 0:
        return False
    status = _dict(obj.get("status"))
    phase = status.get("phase")
    if phase == PHASE_FAILED:
        reason, since = REASON_EXPIRED, "transition"
    elif phase == PHASE_SUCCEEDED:
        reason, since = REASON_SUCCEEDED, "probe"
    else:
        return False
    for cond in read_conditions(status):
        if cond.reason == reason:  # the first of that reason decides, as Koordinator's loop does
            at = cond.last_transition if since == "transition" else cond.last_probe
            return at is not None and now - at > after
    return False

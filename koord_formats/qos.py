"""Koordinator's QoS classes and priority classes, and how a pod's are resolved.

Sources: koordinator-sh/koordinator ``apis/extension/qos.go`` and ``qos_utils.go`` (QoS label,
default by Kubernetes QoS), ``priority.go`` and ``priority_utils.go`` (priority ranges).
"""

from __future__ import annotations

from collections.abc import Mapping

from koord_formats import keys

__all__ = [
    "DEFAULT_PRIORITY",
    "PRIORITY_RANGES",
    "QOS_FOR_KUBE_QOS",
    "default_priority_class",
    "priority_class",
    "priority_class_of_value",
    "qos_class",
    "qos_label",
]

# Priority value ranges of each class, inclusive (apis/extension/priority.go).
PRIORITY_RANGES: tuple[tuple[str, int, int], ...] = (
    (keys.PRIORITY_PROD, 9000, 9999),
    (keys.PRIORITY_MID, 7000, 7999),
    (keys.PRIORITY_BATCH, 5000, 5999),
    (keys.PRIORITY_FREE, 3000, 3999),
)
# The value a pod of a class gets when only its class is known (the middle of each range).
DEFAULT_PRIORITY = {
    keys.PRIORITY_PROD: 9500,
    keys.PRIORITY_MID: 7500,
    keys.PRIORITY_BATCH: 5500,
    keys.PRIORITY_FREE: 3500,
}
# GetPodQoSClassWithKubeQoS (apis/extension/qos_utils.go): Guaranteed pods without the label are
# LSR (the package variable QoSClassForGuaranteed), Burstable LS, BestEffort BE.
QOS_FOR_KUBE_QOS = {"Guaranteed": keys.QOS_LSR, "Burstable": keys.QOS_LS, "BestEffort": keys.QOS_BE}


def qos_label(labels: Mapping[str, str]) -> str:
    """The pod's ``koordinator.sh/qosClass`` label when it names a class, else "" (no fallback;
    Koordinator's hooks and scheduler read the raw label)."""
    value = labels.get(keys.LABEL_QOS_CLASS, "")
    return value if value in keys.KOORD_QOS_CLASSES else ""


def qos_class(labels: Mapping[str, str], kube_qos: str) -> str:
    """The pod's QoS class: its label, else derived from its Kubernetes QoS class
    ("Guaranteed", "Burstable", "BestEffort"); "" when neither is known."""
    return qos_label(labels) or QOS_FOR_KUBE_QOS.get(kube_qos, "")


def priority_class_of_value(priority: object) -> str:
    """The class whose range holds ``priority`` (an int), "" when none does."""
    if isinstance(priority, int) and not isinstance(priority, bool):
        for name, lo, hi in PRIORITY_RANGES:
            if lo <= priority <= hi:
                return name
    return ""


def default_priority_class(qos: str) -> str:
    """The class of a pod whose priority says nothing: koord-batch for BE, else koord-prod."""
    return keys.PRIORITY_BATCH if qos == keys.QOS_BE else keys.PRIORITY_PROD


def priority_class(labels: Mapping[str, str], priority: object, qos: str) -> str:
    """The pod's priority class: the ``koordinator.sh/priority-class`` label when it names a
    class, else the class of ``spec.priority``, else the default for its QoS class."""
    override = labels.get(keys.LABEL_PRIORITY_CLASS, "")
    if override in keys.PRIORITY_CLASSES:
        return override
    return priority_class_of_value(priority) or default_priority_class(qos)

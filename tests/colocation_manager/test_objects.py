"""Nodes and pods as the manager's formulas read them (``colocation_manager.objects``)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from colocation_manager.objects import node_info, pod_info
from colocation_manager.resources import Amount
from koord_formats import FormatError, keys


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    return {"name": "c", "resources": res}


def pod(containers: list[dict[str, Any]], *, init: list[dict[str, Any]] | None = None, labels: dict[str, str] | None
        = None, priority: int | None = None, status: dict[str, Any] | None = None,
        overhead: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, "nodeName": "n1"}
    if init is not None:
        spec["initContainers"] = init
    if priority is not None:
        spec["priority"] = priority
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"namespace": "ns", "name": "p", "labels": labels or {}}, "spec": spec,
            "status": status or {"phase": "Running"}}


@pytest.mark.parametrize(
    ("description", "obj", "wanted", "qos", "priority"),
    [
        ("requests add up over containers",
         pod([container({"cpu": "500m", "memory": "1Gi"}), container({"cpu": "1", "memory": "1Gi"})]),
         Amount(1500, 2 * 2**30), keys.QOS_LS, keys.PRIORITY_PROD),
        ("a limit without a request counts as the request",
         pod([container(limits={"cpu": "2", "memory": "1Gi"})]), Amount(2000, 2**30), keys.QOS_LSR,
         keys.PRIORITY_PROD),
        ("the largest init container wins when larger than the containers",
         pod([container({"cpu": "1"})], init=[container({"cpu": "3", "memory": "10"})]), Amount(3000, 10),
         keys.QOS_LS, keys.PRIORITY_PROD),
        ("overhead is added", pod([container({"cpu": "1"})], overhead={"cpu": "250m"}), Amount(1250, 0),
         keys.QOS_LS, keys.PRIORITY_PROD),
        ("no requests: BestEffort, so BE and koord-batch", pod([container()]), Amount(0, 0), keys.QOS_BE,
         keys.PRIORITY_BATCH),
        ("the QoS label wins over the Kubernetes QoS class",
         pod([container({"cpu": "1"})], labels={keys.LABEL_QOS_CLASS: keys.QOS_BE}), Amount(1000, 0), keys.QOS_BE,
         keys.PRIORITY_BATCH),
        ("status.qosClass is read when present",
         pod([container({"cpu": "1"})], status={"phase": "Running", "qosClass": "Guaranteed"}), Amount(1000, 0),
         keys.QOS_LSR, keys.PRIORITY_PROD),
        ("spec.priority in the mid range", pod([container({"cpu": "1"})], priority=7100), Amount(1000, 0),
         keys.QOS_LS, keys.PRIORITY_MID),
        ("the priority-class label wins", pod([container({"cpu": "1"})], priority=7100,
                                              labels={keys.LABEL_PRIORITY_CLASS: keys.PRIORITY_FREE}),
         Amount(1000, 0), keys.QOS_LS, keys.PRIORITY_FREE),
        ("batch resources are not cpu or memory", pod([container({keys.RESOURCE_BATCH_CPU: "1000"})]),
         Amount(0, 0), keys.QOS_BE, keys.PRIORITY_BATCH),
    ],
)
def test_pod_info(description: str, obj: dict[str, Any], wanted: Amount, qos: str, priority: str) -> None:
    info = pod_info(obj)
    assert (info.request, info.qos, info.priority_class) == (wanted, qos, priority), description
    assert (info.namespace, info.name, info.phase) == ("ns", "p", "Running")


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod([container({"cpu": "lots"})]), id="a quantity that is not one"),
        pytest.param(pod([container({"cpu": "1e999"})]), id="a quantity out of range"),
        pytest.param(pod([{"resources": []}]), id="resources that are a list"),
        pytest.param(pod([container()] * 2000), id="more containers than the bound"),
        pytest.param(pod([container()], priority=True), id="a priority that is a boolean"),
        pytest.param({"metadata": {"name": 5}}, id="a name that is a number"),
        pytest.param({"metadata": {"name": "p", "labels": {"a": 1}}}, id="a label value that is a number"),
    ],
)
def test_pod_info_refuses(obj: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        pod_info(obj)


def node(capacity: dict[str, str], allocatable: dict[str, str], annotations: dict[str, str] | None = None
         ) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": annotations or {}},
            "status": {"capacity": capacity, "allocatable": allocatable}}


def test_node_info() -> None:
    info = node_info(node({"cpu": "8", "memory": "16Gi", "pods": "110"}, {"cpu": "7500m", "memory": "15Gi"}, {
        keys.NODE_ANNOTATION_RESERVATION: '{"resources":{"cpu":"1","memory":"1Gi"}}',
        keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO: "1.20",
    }))
    assert info.capacity == Amount(8000, 16 * 2**30)
    assert info.allocatable == Amount(7500, 15 * 2**30)
    assert info.reservation == Amount(1000, 2**30)
    assert info.cpu_normalization_ratio == Fraction(6, 5)


def test_node_reservation_of_reserved_cpus_counts_the_cpus() -> None:
    info = node_info(node({"cpu": "8"}, {"cpu": "8"}, {keys.NODE_ANNOTATION_RESERVATION:
                                                      '{"reservedCPUs":"0-2","resources":{"cpu":"1"}}'}))
    assert info.reservation.cpu == 3000


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(node({"cpu": "x"}, {}), id="capacity that is not a quantity"),
        pytest.param(node({}, {}, {keys.NODE_ANNOTATION_RESERVATION: "{"}), id="a reservation that is not JSON"),
        pytest.param(node({}, {}, {keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO: "9"}), id="a ratio above 5"),
        pytest.param({"metadata": {}}, id="no name"),
    ],
)
def test_node_info_refuses(obj: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        node_info(obj)

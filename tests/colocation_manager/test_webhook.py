"""The pod admission webhook's HTTP side (``colocation_manager.webhook``): AdmissionReview in,
AdmissionReview out, the watched state it reads, and hostile bodies and objects."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from colocation_manager.webhook import MAX_REVIEW_BYTES, WebhookState, create_app
from koord_formats import keys

PROFILE = {"metadata": {"name": "spark-be"},
           "spec": {"selector": {"matchLabels": {"app": "spark"}}, "qosClass": "BE",
                    "priorityClassName": "koord-batch"}}


def state() -> WebhookState:
    s = WebhookState()
    s.replace("namespaces", [{"metadata": {"name": "ns", "labels": {"team": "a"}}}])
    s.replace("priorityclasses", [{"metadata": {"name": "koord-batch"}, "value": 5000}])
    s.replace("clustercolocationprofiles", [PROFILE, {"metadata": {"name": "bad"}, "spec": {"qosClass": 5}}])
    return s


def admission(pod: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                               "namespace": "ns", "operation": operation, "object": pod}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def spark(cpu: str = "500m") -> dict[str, Any]:
    return {"metadata": {"generateName": "spark-", "labels": {"app": "spark"}},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]}}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app(state(), roll=lambda: 0))


def test_mutate_returns_a_json_patch(client: TestClient) -> None:
    reply = client.post("/mutate-pod", json=admission(spark())).json()
    response = reply["response"]
    assert (reply["kind"], response["uid"], response["allowed"], response["patchType"]) == \
        ("AdmissionReview", "u-1", True, "JSONPatch")
    ops = json.loads(base64.b64decode(response["patch"]))
    containers = next(op["value"] for op in ops if op["path"] == "/spec/containers")
    assert containers[0]["resources"] == {"requests": {keys.RESOURCE_BATCH_CPU: "500"},
                                          "limits": {keys.RESOURCE_BATCH_CPU: "500"}}
    labels = next(op["value"] for op in ops if op["path"] == "/metadata/labels")
    assert labels[keys.LABEL_QOS_CLASS] == "BE"


def test_a_pod_no_profile_matches_is_allowed_unchanged(client: TestClient) -> None:
    pod = spark()
    pod["metadata"]["labels"] = {"app": "web"}
    response = client.post("/mutate-pod", json=admission(pod)).json()["response"]
    assert response == {"uid": "u-1", "allowed": True}


def test_a_be_pod_with_batch_requests_gets_the_extended_resource_spec_without_a_profile(client: TestClient) -> None:
    """Issue 36's pod (no profile matches it): the annotation the node agent reads its limits
    from, as koord-manager's webhook writes it. The old webhook let it through unchanged."""
    batch = {keys.RESOURCE_BATCH_CPU: "500", keys.RESOURCE_BATCH_MEMORY: "64Mi"}
    pod = {"metadata": {"name": "be", "labels": {keys.LABEL_QOS_CLASS: "BE"}},
           "spec": {"containers": [{"name": "app", "resources": {"requests": dict(batch), "limits": dict(batch)}},
                                   {"name": "sidecar", "resources": {"requests": {"cpu": "10m"}}}]}}
    response = client.post("/mutate-pod", json=admission(pod)).json()["response"]
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["path"] for op in ops] == ["/metadata/annotations"]
    spec = json.loads(ops[0]["value"][keys.ANNOTATION_EXTENDED_RESOURCE_SPEC])
    assert spec == {"containers": {"app": {"requests": batch, "limits": batch}}}


def test_mutate_only_on_create(client: TestClient) -> None:
    response = client.post("/mutate-pod", json=admission(spark(), "UPDATE", spark())).json()["response"]
    assert "patch" not in response and response["allowed"]


def test_validate_refuses_batch_resources_without_be(client: TestClient) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {keys.RESOURCE_BATCH_CPU: "500"}}}]}}
    response = client.post("/validate-pod", json=admission(pod)).json()["response"]
    assert response["allowed"] is False
    assert "must specify koordinator QoS BE" in response["status"]["message"]


def test_an_unknown_priority_class_refuses_the_pod_with_the_reason() -> None:
    s = state()
    s.apply("priorityclasses", "DELETED", {"metadata": {"name": "koord-batch"}})
    client = TestClient(create_app(s, roll=lambda: 0))
    response = client.post("/mutate-pod", json=admission(spark())).json()["response"]
    assert response["allowed"] is False and "koord-batch" in response["status"]["message"]


def test_a_bad_profile_is_left_out_and_the_others_apply() -> None:
    s = state()
    assert set(s.profiles) == {"spark-be"}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{", id="not JSON"),
        pytest.param(b"[]", id="not an object"),
        pytest.param(b'{"request":{}}', id="no uid"),
        pytest.param(b'{"request":{"uid":5}}', id="a uid that is a number"),
        pytest.param(b"[" * 100_000, id="deep nesting"),
    ],
)
def test_bad_bodies_get_400(client: TestClient, body: bytes) -> None:
    assert client.post("/mutate-pod", content=body).status_code == 400
    assert client.post("/validate-pod", content=body).status_code == 400


def test_an_oversized_body_is_refused_unread(client: TestClient) -> None:
    body = b" " * (MAX_REVIEW_BYTES + 1)
    assert client.post("/mutate-pod", content=body).status_code == 400


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param({"metadata": {"labels": {"app": "spark"}}, "spec": {"containers": [
            {"name": "app", "resources": {"requests": {"cpu": "1e999"}}}]}}, id="a quantity out of range"),
        pytest.param({"metadata": {"labels": {"app": 5}}, "spec": {}}, id="a label that is a number"),
        pytest.param({"metadata": {"labels": {"app": "spark"}}, "spec": {"containers": "x"}},
                     id="containers that are a string"),
    ],
)
def test_a_hostile_pod_costs_only_itself(client: TestClient, pod: dict[str, Any]) -> None:
    response = client.post("/mutate-pod", json=admission(pod)).json()["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is False or "patch" not in response
    good = client.post("/mutate-pod", json=admission(spark())).json()["response"]
    assert good["allowed"] and good["patch"], "the next pod is served as before"

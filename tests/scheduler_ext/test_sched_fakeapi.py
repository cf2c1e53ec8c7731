# mypy: disable-error-code="union-attr,arg-type,no-untyped-call,attr-defined,index"
"""The fake API server follows real REST semantics, checked with the official client only."""

from __future__ import annotations

import json
import threading
from typing import Any

import kubernetes
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import device, node, nrt, pod


def _pod_on_server(api: FakeAPIServer, name: str = "p") -> dict[str, Any]:
    return api.create(pod(name, namespace="ns"))


@pytest.mark.parametrize(
    ("content_type", "patch"),
    [
        ("application/merge-patch+json", {"metadata": {"annotations": {"a": "1"}}}),
        ("application/strategic-merge-patch+json", {"metadata": {"annotations": {"a": "1"}}}),
        ("application/json-patch+json", [{"op": "add", "path": "/metadata/annotations/a", "value": "1"}]),
    ],
    ids=["merge-patch", "strategic-merge-patch", "json-patch"],
)
def test_patch_content_types_set_annotations(
    api: FakeAPIServer, official: kubernetes.client.ApiClient, content_type: str, patch: Any
) -> None:
    _pod_on_server(api)
    v1 = kubernetes.client.CoreV1Api(official)
    got = v1.patch_namespaced_pod("p", "ns", patch, _content_type=content_type)
    assert got.metadata.annotations["a"] == "1"


@pytest.mark.parametrize(
    "verb",
    ["patch", "replace"],
    ids=["patch-with-stale-resourceVersion-conflicts", "put-with-stale-resourceVersion-conflicts"],
)
def test_stale_resource_version_is_409(
    api: FakeAPIServer, official: kubernetes.client.ApiClient, verb: str
) -> None:
    created = _pod_on_server(api)
    stale = created["metadata"]["resourceVersion"]
    api.patch_direct("pods", "p", {"metadata": {"labels": {"x": "1"}}}, "ns")
    v1 = kubernetes.client.CoreV1Api(official)
    with pytest.raises(ApiException) as err:
        if verb == "patch":
            v1.patch_namespaced_pod(
                "p", "ns", {"metadata": {"resourceVersion": stale, "annotations": {"a": "1"}}},
                _content_type="application/merge-patch+json",
            )
        else:
            body = api.get("pods", "p", "ns")
            assert body is not None
            body["metadata"]["resourceVersion"] = stale
            v1.replace_namespaced_pod("p", "ns", body)
    assert err.value.status == 409


def test_binding_subresource_binds_once(api: FakeAPIServer, official: kubernetes.client.ApiClient) -> None:
    created = _pod_on_server(api)
    v1 = kubernetes.client.CoreV1Api(official)
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "uid": created["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    v1.create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    assert v1.read_namespaced_pod("p", "ns").spec.node_name == "n1"
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    assert err.value.status == 409


def test_binding_with_wrong_uid_is_refused(api: FakeAPIServer, official: kubernetes.client.ApiClient) -> None:
    _pod_on_server(api)
    v1 = kubernetes.client.CoreV1Api(official)
    body = {"metadata": {"name": "p", "uid": "not-the-uid"}, "target": {"kind": "Node", "name": "n1"}}
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    assert err.value.status == 409


def test_binding_copies_its_annotations_onto_the_pod_in_the_same_write(
    api: FakeAPIServer, official: kubernetes.client.ApiClient
) -> None:
    created = _pod_on_server(api)
    v1 = kubernetes.client.CoreV1Api(official)
    body = {"metadata": {"name": "p", "uid": created["metadata"]["uid"],
                         "resourceVersion": created["metadata"]["resourceVersion"],
                         "annotations": {"a": "from-binding"}},
            "target": {"kind": "Node", "name": "n1"}}
    before = api.store.rv
    v1.create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    got = api.get("pods", "p", "ns")
    assert got is not None and got["spec"]["nodeName"] == "n1" and got["metadata"]["annotations"]["a"] == "from-binding"
    assert api.store.rv == before + 1  # one write: node and annotations together


def test_binding_with_a_stale_resource_version_is_refused(
    api: FakeAPIServer, official: kubernetes.client.ApiClient
) -> None:
    created = _pod_on_server(api)
    api.patch_direct("pods", "p", {"metadata": {"annotations": {"late": "1"}}}, "ns")
    v1 = kubernetes.client.CoreV1Api(official)
    body = {"metadata": {"name": "p", "resourceVersion": created["metadata"]["resourceVersion"],
                         "annotations": {"a": "x"}}, "target": {"kind": "Node", "name": "n1"}}
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    assert err.value.status == 409
    got = api.get("pods", "p", "ns")
    assert got is not None and "nodeName" not in got["spec"] and "a" not in got["metadata"]["annotations"]


def test_a_frozen_watch_sends_nothing_and_never_ends(api: FakeAPIServer, official: kubernetes.client.ApiClient) -> None:
    v1 = kubernetes.client.CoreV1Api(official)
    _pod_on_server(api)
    rv = v1.list_pod_for_all_namespaces(_preload_content=False).json()["metadata"]["resourceVersion"]

    def stream() -> Any:
        return v1.list_pod_for_all_namespaces(watch=True, resource_version=rv, timeout_seconds=1,
                                              _preload_content=False, _request_timeout=(5, 0.5))

    resp = stream()
    api.create({"kind": "Pod", "metadata": {"name": "q", "namespace": "ns"}, "spec": {}})
    assert json.loads(next(resp.stream(None)).splitlines()[0])["object"]["metadata"]["name"] == "q"
    resp.close()
    api.freeze_watches("pods")  # streams open now stay silent; this one opens before
    frozen = stream()
    api.freeze_watches("pods")
    api.create({"kind": "Pod", "metadata": {"name": "r", "namespace": "ns"}, "spec": {}})
    with pytest.raises((urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError)):
        frozen.read()  # neither the event nor the end at timeoutSeconds comes
    frozen.close()


def test_list_pages_and_watch_from_resource_version(
    api: FakeAPIServer, official: kubernetes.client.ApiClient
) -> None:
    for i in range(5):
        api.create(node(f"n{i}"))
    v1 = kubernetes.client.CoreV1Api(official)
    first = v1.list_node(limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    rest = v1.list_node(limit=10, _continue=first.metadata._continue)
    assert [n.metadata.name for n in first.items + rest.items] == [f"n{i}" for i in range(5)]
    rv = first.metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = kubernetes.watch.Watch()

    def consume() -> None:
        for ev in w.stream(v1.list_node, resource_version=rv, timeout_seconds=5):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 2:
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    api.create(node("n9"))
    api.delete("nodes", "n0")
    t.join(10)
    assert seen == [("ADDED", "n9"), ("DELETED", "n0")]


def test_watch_from_expired_version_gets_410(official: kubernetes.client.ApiClient) -> None:
    server = FakeAPIServer(history=4).start()
    try:
        for i in range(20):
            server.create(node(f"n{i}"))
        conf = kubernetes.client.Configuration()
        conf.host = server.url
        v1 = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
        resp = v1.list_node(watch=True, resource_version="2", _preload_content=False)
        event = json.loads(resp.read())
        assert (event["type"], event["object"]["code"], event["object"]["reason"]) == ("ERROR", 410, "Expired")
    finally:
        server.stop()


def test_cluster_scoped_custom_objects(api: FakeAPIServer, official: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(official)
    custom.create_cluster_custom_object(
        "topology.node.k8s.io", "v1alpha1", "noderesourcetopologies", nrt("n1", '{"detail":[]}')
    )
    custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "devices", device("n1", 2))
    custom.create_cluster_custom_object(
        "slo.koordinator.sh", "v1alpha1", "nodeslos",
        {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"}, "spec": {}},
    )
    got = custom.get_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "devices", "n1")
    assert len(got["spec"]["devices"]) == 2
    listed = custom.list_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["n1"]
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "devices", device("n1", 2))
    assert err.value.status == 409


def test_field_selector_on_node_name(api: FakeAPIServer, official: kubernetes.client.ApiClient) -> None:
    api.create(pod("a", node_name="n1"))
    api.create(pod("b", node_name="n2"))
    v1 = kubernetes.client.CoreV1Api(official)
    got = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2")
    assert [p.metadata.name for p in got.items] == ["b"]


def test_injected_faults_fail_only_matching_requests(
    api: FakeAPIServer, official: kubernetes.client.ApiClient
) -> None:
    _pod_on_server(api)
    api.inject("GET", r"/pods/p$", 503)
    v1 = kubernetes.client.CoreV1Api(official)
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("p", "ns")
    assert err.value.status == 503
    assert v1.read_namespaced_pod("p", "ns").metadata.name == "p"

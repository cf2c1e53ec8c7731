"""Hostile pods on the node agent's pod watch (``runtime_proxy.state.podspecs``, issue 36): a pod
of 1,025 containers, huge batch quantities, malformed resource lists, a repeated container name,
a missing uid and an event over the watch's bound each cost only that pod: it is refused (counted,
logged) and its calls get no limits from this source, while the healthy pods beside it keep theirs
through the doors. The same pods' annotations, and each parser call, stay within their bounds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from hooks.facts import PodFacts
from hooks.plugins import batch_resource
from koord_formats.pod import MAX_POD_CONTAINERS, parse_pod_batch_resources
from runtime_proxy.state import podspecs
from runtime_proxy.state.podspecs import ClusterPods
from tests.formats.hostile import call_total
from tests.hooks.plugins.factories import call, container, node
from tests.runtime_proxy.state.test_podspecs import EXPECTED, ISSUE_36, UID, added, pod_object, via_cri, via_nri

CPU, MEM = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"


def _with(obj: dict[str, Any], **spec_changes: Any) -> dict[str, Any]:
    return {**obj, "spec": {**obj["spec"], **spec_changes}}


POISONED = [
    pytest.param(pod_object(containers=MAX_POD_CONTAINERS + 1), id="1025 containers"),
    pytest.param(pod_object(resources={"limits": {CPU: "9223372036854775807"}}), id="batch-cpu near int64"),
    pytest.param(pod_object(resources={"limits": {MEM: "1e400"}}), id="batch-memory with a huge exponent"),
    pytest.param(pod_object(resources={"limits": {CPU: "1" * 5000}}), id="a 5000-digit quantity"),
    pytest.param(pod_object(resources={"limits": {CPU: {"nested": [1, 2]}}}), id="a quantity that is an object"),
    pytest.param(pod_object(resources={"limits": {f"r{i}": "1" for i in range(10_000)}}), id="10,000 resources"),
    pytest.param(pod_object(resources={"limits": "lots"}), id="limits a string"),
    pytest.param(_with(pod_object(), containers=[{"name": "app"}, {"name": "app"}]), id="a container name twice"),
    pytest.param(_with(pod_object(), containers=[{"name": ["app"]}]), id="a container name that is a list"),
    pytest.param(_with(pod_object(), containers={"app": {}}), id="containers an object"),
    pytest.param({"metadata": {"name": "be"}, "spec": pod_object()["spec"]}, id="no uid"),
]


@pytest.mark.parametrize("poisoned", POISONED)
def test_each_hostile_pod_is_refused_within_its_bound(poisoned: dict[str, Any]) -> None:
    assert call_total(parse_pod_batch_resources, poisoned) is None


@pytest.mark.parametrize("door", [pytest.param(via_cri, id="CRI proxy"), pytest.param(via_nri, id="NRI")])
async def test_hostile_pods_cost_only_themselves_at_both_doors(door: Any) -> None:
    pods = ClusterPods("n1", api_client=object())
    before = REGISTRY.get_sample_value("rhp_pod_specs_rejected_total", {"reason": "malformed"}) or 0.0
    for i, param in enumerate(POISONED):
        poisoned = param.values[0]
        meta = {**poisoned["metadata"]}
        if "uid" in meta:
            meta["uid"] = f"poisoned-{i}"
        pods.handle_event(added({**poisoned, "metadata": meta}))
        pods.handle_event(added(pod_object(f"healthy-{i}")))
    pods.handle_event(added(pod_object()))
    refused = (REGISTRY.get_sample_value("rhp_pod_specs_rejected_total", {"reason": "malformed"}) or 0.0) - before
    assert refused == len(POISONED)
    assert all(pods.known(f"poisoned-{i}") is None for i in range(len(POISONED)))
    assert all(pods.known(f"healthy-{i}") is not None for i in range(len(POISONED)))
    assert await door(pods) == EXPECTED


async def test_a_pod_that_turns_hostile_loses_its_limits_from_the_spec() -> None:
    pods = ClusterPods("n1", api_client=object())
    pods.handle_event(added(pod_object()))
    assert await via_cri(pods) == EXPECTED
    pods.handle_event(added(pod_object(containers=MAX_POD_CONTAINERS + 1), "MODIFIED"))
    assert pods.known(UID) is None
    assert await via_cri(pods) == {"cpu_quota": 0, "cpu_shares": 2, "memory_limit_in_bytes": 0}


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param('{"containers":{"app":{"limits":{"kubernetes.io/batch-cpu":"100000001"}}}}', id="huge cpu"),
        pytest.param('{"containers":{"app":{"limits":{"kubernetes.io/batch-memory":"8Ei"}}}}', id="huge memory"),
        pytest.param('{"containers":{' + ",".join(f'"c{i}":{{}}' for i in range(257)) + "}}", id="257 containers"),
    ],
)
def test_a_hostile_annotation_wins_and_is_skipped_even_over_a_good_pod_spec(annotation: str) -> None:
    spec = parse_pod_batch_resources(pod_object()).containers
    the_pod = PodFacts(name="be", namespace="default", uid=UID, labels={"koordinator.sh/qosClass": "BE"},
                       annotations={"node.koordinator.sh/extended-resource-spec": annotation},
                       cgroup_parent=f"/kubepods/besteffort/pod{UID}", batch_resources=spec)
    plan = call(batch_resource, "rhp_pre_create_container", pod=the_pod, container=container("app"), node=node())
    assert plan.resources == {} and plan.skipped


async def test_a_watch_event_over_the_bound_is_refused_unparsed(monkeypatch: pytest.MonkeyPatch) -> None:
    import kubernetes

    from tests.fakeapi import FakeAPIServer

    monkeypatch.setattr(podspecs, "MAX_POD_EVENT_CHARS", 64 * 1024)
    before = REGISTRY.get_sample_value("rhp_pod_specs_rejected_total", {"reason": "too-large"}) or 0.0
    with FakeAPIServer() as api:
        huge = pod_object("huge", name="huge")
        huge["metadata"]["annotations"] = {"filler": "x" * (128 * 1024)}
        api.create(huge)
        api.create(pod_object())
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        pods = ClusterPods("n1", api_client=kubernetes.client.ApiClient(conf), watch_timeout=30)
        await pods.start()
        try:
            deadline = time.monotonic() + 60
            while pods.known(UID) is None or (REGISTRY.get_sample_value(
                    "rhp_pod_specs_rejected_total", {"reason": "too-large"}) or 0.0) <= before:
                assert time.monotonic() < deadline, "the watch did not deliver both pods"
                await asyncio.sleep(0.05)
            assert pods.known("huge") is None
            assert dict(pods.known(UID) or {})["app"].limits[CPU] == 500
            assert await via_cri(pods) == EXPECTED
        finally:
            await pods.stop()


def test_the_issue_36_pod_is_well_within_every_bound() -> None:
    assert call_total(parse_pod_batch_resources, pod_object(resources=ISSUE_36)) is not None

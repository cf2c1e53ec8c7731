"""The one Event recorder's limits (``rhp_kube.events``, issue 32 items 1 and 5): client-go's
spam filter per pod (a bucket of 25 writes refilled at one per 300 s) and a node-wide cap on
Event writes (a bucket of 20 refilled at 2 per second), whatever the number of pods. The probe
measured 9.2 Event writes per second per node, sustained, under a failure storm over many pods;
here the storm runs on a hand-moved clock (no wall time), and the writes the API gets are
counted. The recorder's other behaviour (aggregation, the bounded queue, no cluster access) is
tests/runtime_proxy/engine/test_events.py."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, cast

from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from rhp_kube.events import NODE_BURST, NODE_QPS, OBJECT_BURST, OBJECT_QPS, EventRecorder, EventsApi, PodEvent

WAIT = 60.0  # seconds the sender thread may take under load; never a speed assertion
REASON = "RuntimeHookFailed"


class CountingApi:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[tuple[str, str]] = []  # (verb, pod)

    def create(self, namespace: str, body: Mapping[str, object]) -> None:
        with self.lock:
            self.writes.append(("create", str(cast(dict[str, Any], body["involvedObject"])["name"])))

    def patch(self, namespace: str, name: str, body: Mapping[str, object]) -> None:
        with self.lock:
            self.writes.append(("patch", name.rsplit(".", 1)[0]))


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("rhp_pod_events_total", {"reason": REASON, "outcome": outcome}) or 0.0


def _idle(recorder: EventRecorder) -> None:
    done = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if recorder.idle():
            return
        done.wait(0.01)
    raise AssertionError("the recorder did not send its queue")


def _event(pod: int, message: str = "hook failed") -> PodEvent:
    return PodEvent(namespace="default", name=f"p{pod}", uid=f"uid-{pod}", reason=REASON, message=message)


def test_the_defaults_are_client_gos_spam_filter_and_a_few_writes_per_second() -> None:
    assert (OBJECT_BURST, OBJECT_QPS) == (25, 1.0 / 300.0)
    assert NODE_QPS <= 5 and NODE_BURST <= 50


def test_a_failure_storm_over_many_pods_stays_under_the_node_wide_cap() -> None:
    """200 pods whose hooks fail every second for 300 s (of the hand-moved clock), each with a
    new message: every pod alone is within its own budget for a while, together they would be
    thousands of writes. The API gets at most the node's burst plus 2 writes per second."""
    clock = Clock()
    api = CountingApi()
    recorder = EventRecorder(lambda: cast(EventsApi, api), host="node-1", clock=clock, log_every=60.0)
    capped = _count("node_capped")
    seconds, pods = 300, 200
    with capture_logs() as logs:
        for second in range(seconds):
            clock.now += 1.0
            for pod in range(pods):
                recorder.record(_event(pod, f"failure {second}"))
            if second % 10 == 0:
                _idle(recorder)  # let the sender make its writes, so repeats become new writes
        _idle(recorder)
    cap = NODE_BURST + NODE_QPS * seconds
    assert len(api.writes) <= cap, f"{len(api.writes)} Event writes in {seconds} s, the cap is {cap}"
    assert len(api.writes) >= cap * 0.9, "the cap is used, not starved"
    dropped = _count("node_capped") - capped
    assert dropped > seconds * pods * 0.5, "the drops are counted"
    lines = [line for line in logs if line["event"] == "pod Events over the node-wide cap dropped"]
    assert 1 <= len(lines) <= seconds / 60 + 1, "logged, at most once a minute"
    assert sum(int(line["dropped"]) for line in lines) <= dropped
    recorder.close()


def test_one_pods_repeats_follow_client_gos_spam_filter() -> None:
    """One pod failing every 10 s for 3000 s: its first 25 writes go, then one per 300 s."""
    clock = Clock()
    api = CountingApi()
    recorder = EventRecorder(lambda: cast(EventsApi, api), host="node-1", clock=clock)
    limited = _count("rate_limited")
    for n in range(300):
        clock.now += 10.0
        recorder.record(_event(1, f"failure {n}"))
        _idle(recorder)
    assert 25 + 9 <= len(api.writes) <= 25 + 10
    assert api.writes[0][0] == "create" and {verb for verb, _ in api.writes[1:]} == {"patch"}, "counts patched"
    assert _count("rate_limited") - limited == 300 - len(api.writes)
    recorder.close()


def test_after_a_storm_the_node_writes_again_once_its_bucket_refills() -> None:
    clock = Clock()
    api = CountingApi()
    recorder = EventRecorder(lambda: cast(EventsApi, api), host="node-1", clock=clock)
    for pod in range(100):
        recorder.record(_event(pod))
    _idle(recorder)
    assert len(api.writes) == NODE_BURST
    recorder.record(_event(1000))
    _idle(recorder)
    assert len(api.writes) == NODE_BURST, "still capped"
    clock.now += 1.0 / NODE_QPS
    recorder.record(_event(1001))
    _idle(recorder)
    assert api.writes[-1] == ("create", "p1001")
    recorder.close()


# -- the transport: rhp_kube.http, the one client family (issue 32) --------------------------------


def test_events_go_through_the_one_transport_and_a_repeat_patches_the_count(monkeypatch: Any) -> None:
    """The recorder's calls are POST and JSON merge patch through ``rhp_kube.http.KubeHTTP``, on
    the fake API server: an Event is created, and a repeat patches its count. The generated
    client's CoreV1Api is made unusable: on the old main every Event went through it, and
    none was written."""
    import kubernetes

    from rhp_kube.events import KubeEventsApi
    from tests.fakeapi import FakeAPIServer

    def no_generated_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("an Event went through the generated client")

    monkeypatch.setattr(kubernetes.client, "CoreV1Api", no_generated_client)
    with FakeAPIServer() as api:
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        apis: list[KubeEventsApi] = []

        def transport() -> KubeEventsApi:
            apis.append(KubeEventsApi(kubernetes.client.ApiClient(conf)))
            return apis[-1]

        recorder = EventRecorder(transport, host="node-1")
        try:
            recorder.record(_event(1, "first"))
            _idle(recorder)
            (created,) = api.objects("Event")
            assert created["involvedObject"]["name"] == "p1" and created["count"] == 1
            assert created["source"] == {"component": "runtime-hook-proxy", "host": "node-1"}
            recorder.record(_event(1, "again"))
            _idle(recorder)
            (patched,) = api.objects("Event")
            assert patched["metadata"]["name"] == created["metadata"]["name"]
            assert (patched["count"], patched["message"]) == (2, "again")
        finally:
            recorder.close()
        assert len(apis) == 1

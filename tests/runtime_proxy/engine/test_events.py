"""Events on pods for hook failures and refusals (issue 27 item 5; the recorder is
``rhp_kube.events``, its caps are tests/rhp_kube/test_events_caps.py): the recorder aggregates and
rate-limits, keeps its queue bounded, only counts without cluster access, and never blocks its
caller on a slow or hostile API server; every door's call records them through ``Lifecycle``,
whose log lines name the call's pod and container."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import structlog
from prometheus_client import REGISTRY
from structlog.testing import LogCapture

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.spec import hookimpl
from rhp_kube.events import EventRecorder, EventsApi, PodEvent, event_body
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.cri.transport import HookRejected
from runtime_proxy.engine.events import REASON_FAILED, REASON_REFUSED
from runtime_proxy.engine.lifecycle import IDENTITY_KEYS, call_scope
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import FileApplier
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.runtime_proxy.fake_cri import FakeCri

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
WAIT = 30.0  # seconds a condition may take under load; never a speed assertion


def _count(reason: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("rhp_pod_events_total", {"reason": reason, "outcome": outcome}) or 0.0


def _event(pod: str = "web", reason: str = REASON_FAILED, message: str = "hook x failed") -> PodEvent:
    return PodEvent(namespace="default", name=pod, uid=f"uid-{pod}", reason=reason, message=message)


class FakeApi:
    """Records the calls; ``gate`` (when set) holds every call until it is set."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.gate = gate
        self.fail = fail
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def _call(self, verb: str, namespace: str, body: Mapping[str, object]) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        with self.lock:
            self.calls.append((verb, namespace, dict(body)))
        if self.fail:
            raise OSError("API server says no")

    def create(self, namespace: str, body: Mapping[str, object]) -> None:
        self._call("create", namespace, body)

    def patch(self, namespace: str, name: str, body: Mapping[str, object]) -> None:
        self._call("patch", namespace, {"name": name, **body})


def _recorder(api: FakeApi | None, **kwargs: Any) -> EventRecorder:
    factory = (lambda: cast(EventsApi, api)) if api is not None else None
    return EventRecorder(factory, host="node-1", **kwargs)


def _wait(what: str, condition: Any) -> None:
    done = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_event_names_the_pod_the_reason_and_the_node() -> None:
    api = FakeApi()
    recorder = _recorder(api)
    sent = _count(REASON_FAILED, "sent")
    recorder.record(_event())
    _wait("the event sent", recorder.idle)
    ((verb, namespace, body),) = api.calls
    assert (verb, namespace) == ("create", "default")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "web",
                                      "uid": "uid-web"}
    assert body["reason"] == REASON_FAILED and body["type"] == "Warning" and body["count"] == 1
    assert body["source"] == {"component": "runtime-hook-proxy", "host": "node-1"}
    assert body["reportingComponent"] == "runtime-hook-proxy" and body["reportingInstance"] == "node-1"
    assert str(cast(dict[str, Any], body["metadata"])["name"]).startswith("web.")
    assert _count(REASON_FAILED, "sent") - sent == 1
    recorder.close()


def test_repeats_fold_into_the_queued_event_then_patch_the_sent_one() -> None:
    gate = threading.Event()
    api = FakeApi(gate)
    recorder = _recorder(api)
    aggregated = _count(REASON_FAILED, "aggregated")
    recorder.record(_event("first"))
    _wait("the sender in the API", api.entered.is_set)
    for _ in range(3):  # the sender is held: these wait in the queue as one Event
        recorder.record(_event("web", message="again"))
    assert _count(REASON_FAILED, "aggregated") - aggregated == 2
    gate.set()
    _wait("both sent", recorder.idle)
    create = [body for verb, _, body in api.calls if cast(dict[str, Any], body["involvedObject"])["name"] == "web"]
    assert [b["count"] for b in create] == [3]
    name = cast(dict[str, Any], create[0]["metadata"])["name"]
    recorder.record(_event("web", message="later"))
    _wait("the patch", lambda: recorder.idle() and len(api.calls) == 3)
    verb, _, patch = api.calls[-1]
    assert verb == "patch" and patch["name"] == name and patch["count"] == 4 and patch["message"] == "later"
    recorder.close()


def test_sends_per_pod_are_rate_limited_by_its_token_bucket() -> None:
    now = [1000.0]
    api = FakeApi()
    recorder = _recorder(api, object_burst=2, object_qps=1 / 60, clock=lambda: now[0])
    limited = _count(REASON_REFUSED, "rate_limited")
    for n in range(5):
        recorder.record(_event("web", reason=REASON_REFUSED, message=f"n{n}"))
        _wait("idle", recorder.idle)
    assert len(api.calls) == 2  # a create and one patch; the other three were over the budget
    assert _count(REASON_REFUSED, "rate_limited") - limited == 3
    recorder.record(_event("other", reason=REASON_REFUSED))  # another pod has its own budget
    _wait("other sent", lambda: recorder.idle() and len(api.calls) == 3)
    now[0] += 61.0  # one token back
    recorder.record(_event("web", reason=REASON_REFUSED, message="next minute"))
    _wait("sent after the window", lambda: recorder.idle() and len(api.calls) == 4)
    recorder.close()


def test_the_queue_is_bounded_and_drops_with_a_counter() -> None:
    gate = threading.Event()
    api = FakeApi(gate)
    recorder = _recorder(api, queue_size=2)
    dropped = _count(REASON_FAILED, "dropped")
    recorder.record(_event("p0"))
    _wait("the sender in the API", api.entered.is_set)
    for n in range(1, 6):
        recorder.record(_event(f"p{n}"))
    assert _count(REASON_FAILED, "dropped") - dropped == 3
    gate.set()
    _wait("the queue sent", lambda: recorder.idle() and len(api.calls) == 3)
    assert [cast(dict[str, Any], b["involvedObject"])["name"] for _, _, b in api.calls] == ["p0", "p1", "p2"]
    recorder.close()


def test_without_cluster_access_events_are_only_counted() -> None:
    none = _count(REASON_FAILED, "no_access")
    recorder = _recorder(None)
    recorder.record(_event())
    assert _count(REASON_FAILED, "no_access") - none == 1
    assert recorder._thread is None  # nothing started, nothing sent

    def no_credentials() -> EventsApi:
        raise FileNotFoundError("no kubeconfig")

    failing = EventRecorder(no_credentials, host="n")
    failing.record(_event("a"))
    _wait("counted", lambda: _count(REASON_FAILED, "no_access") - none == 2)
    failing.record(_event("b"))  # no second try at loading credentials
    assert _count(REASON_FAILED, "no_access") - none == 3
    failing.close()


def test_an_api_that_fails_is_counted_and_the_next_event_still_goes() -> None:
    api = FakeApi(fail=True)
    recorder = _recorder(api)
    failed = _count(REASON_FAILED, "failed")
    recorder.record(_event("a"))
    recorder.record(_event("b"))
    _wait("both tried", lambda: recorder.idle() and len(api.calls) == 2)
    assert _count(REASON_FAILED, "failed") - failed == 2
    recorder.close()


def test_a_hostile_body_is_bounded() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    body = event_body(_event(message="x" * 100_000), name="n", host="", count=1, first=now, last=now)
    assert len(str(body["message"])) == 1024
    assert body["source"] == {"component": "runtime-hook-proxy"} and body["firstTimestamp"] == "2026-01-01T00:00:00Z"


# -- through the doors -------------------------------------------------------------------------


class Fails:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        raise RuntimeError("the plugin broke")


class Shares:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        return Plan().set_resource("cpu_shares", 7)


class ListSink:
    def __init__(self) -> None:
        self.events: list[PodEvent] = []

    def record(self, event: PodEvent) -> None:
        self.events.append(event)


def _pipeline(*plugins: object, policy: str = "Ignore") -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=list(plugins))
    return Pipeline(plugin_steps(pm, [(name, policy, 2.0) for name in plugin_order(pm)]))  # type: ignore[misc]


def _request() -> bytes:
    req = api_pb2.CreateContainerRequest(pod_sandbox_id="sb1")
    req.config.metadata.name = "app"
    req.sandbox_config.metadata.name, req.sandbox_config.metadata.uid = "web", "u1"
    req.sandbox_config.metadata.namespace = "shop"
    req.sandbox_config.linux.cgroup_parent = "/kubepods/podu1"
    return req.SerializeToString()


def _door(pipeline: Pipeline, events: Any, applier: Any = None) -> CriInterceptor:
    return CriInterceptor(store=Store(), pipeline=pipeline, client=cast(RuntimeClient, FakeCri()), applier=applier,
                          events=events)


@pytest.mark.parametrize(("policy", "reason"), [("Ignore", REASON_FAILED), ("Fail", REASON_REFUSED)])
async def test_a_failed_hook_records_an_event_on_its_pod_under_either_policy(policy: str, reason: str) -> None:
    sink = ListSink()
    door = _door(_pipeline(Fails(), policy=policy), sink)
    if policy == "Fail":
        with pytest.raises(HookRejected):
            await door.before(CREATE, _request())
    else:
        await door.before(CREATE, _request())
    ((event,),) = [sink.events]
    assert (event.namespace, event.name, event.uid, event.reason) == ("shop", "web", "u1", reason)
    assert "the plugin broke" in event.message and "container app" in event.message


async def test_a_hostile_api_never_holds_the_call() -> None:
    gate = threading.Event()  # the API never answers while the calls run
    api = FakeApi(gate)
    recorder = _recorder(api, queue_size=4)
    door = _door(_pipeline(Fails()), recorder)
    try:
        aggregated = _count(REASON_FAILED, "aggregated")
        for _ in range(20):  # every call answers while the first Event is stuck in the API
            call = await door.before(CREATE, _request())
            assert call.result is not None and call.result.failures and not call.result.plan.resources
        _wait("the sender in the API", api.entered.is_set)
        # One Event in the API, one queued with the other calls' failures in its count.
        assert _count(REASON_FAILED, "aggregated") - aggregated >= 18
    finally:
        gate.set()
        recorder.close()


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    capture = LogCapture()
    old = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture], cache_logger_on_first_use=False)
    try:
        yield capture.entries
    finally:
        structlog.configure(**old)
        structlog.contextvars.clear_contextvars()


async def test_every_line_of_a_call_names_its_pod_and_the_plan_is_logged_once(
    logged: list[dict[str, Any]], tmp_path: Any
) -> None:
    applier = FileApplier(cgroups=Cgroups(str(tmp_path)))
    door = _door(_pipeline(Shares(), Fails()), ListSink(), applier)
    with call_scope():
        await door.before(CREATE, _request())
        assert all(structlog.contextvars.get_contextvars().get(k) for k in IDENTITY_KEYS)
    assert not any(k in structlog.contextvars.get_contextvars() for k in IDENTITY_KEYS)
    assert logged, "the failure and the plan are logged"
    # Before the facts are built the door knows a sandbox id only (and says so).
    for line in (line for line in logged if "sandbox_id" not in line):
        assert (line.get("namespace"), line.get("pod"), line.get("pod_uid"), line.get("container")) == (
            "shop", "web", "u1", "app"), line
    plans = [line for line in logged if line["event"] == "plan"]
    assert len(plans) == 1 and plans[0]["log_level"] == "info"
    assert plans[0]["stage"] == "PreCreateContainer" and plans[0]["plan"]["cri"]["resources"] == {"cpu_shares": 7}
    assert any(line["event"].startswith("hook failed") for line in logged)


class FailsToReconcile:
    @hookimpl
    def rhp_reconcile_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        raise RuntimeError("reconcile broke")


async def test_the_reconciler_names_the_container_and_records_its_failures(
    logged: list[dict[str, Any]], tmp_path: Any
) -> None:
    from tests.runtime_proxy.loops.test_reconciler import FakeBackend, make_pod, reconciler

    pod = make_pod("u9", "LS")
    backend = FakeBackend(NodeFacts(), [pod], [(pod, ContainerFacts(name="app", id="c9"))])
    sink = ListSink()
    report = await reconciler(backend, tmp_path, pipeline=_pipeline(FailsToReconcile()), events=sink).reconcile_once()
    assert report is not None
    ((event,),) = [sink.events]
    assert (event.namespace, event.name, event.uid, event.reason) == ("ns", "u9", "u9", REASON_FAILED)
    assert "ReconcileContainer" in event.message and "reconcile broke" in event.message
    failed = [line for line in logged if line["event"].startswith("hook failed")]
    assert failed and all((line["namespace"], line["pod"], line["pod_uid"], line["container"]) == (
        "ns", "u9", "u9", "app") for line in failed)
    assert not any(k in structlog.contextvars.get_contextvars() for k in IDENTITY_KEYS), "forgotten after the round"

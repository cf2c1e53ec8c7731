"""The call object across the transport seam (``runtime_proxy.cri.transport.InterceptedCall``):
``before`` decodes a request once and returns the call; the transport hands that call, not the
request bytes, to ``after``. Two calls with the same request bytes keep their own results."""

from __future__ import annotations

from typing import cast

from cri_protos import api_pb2
from hooks.facts import NodeFacts, PodFacts
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.spec import hookimpl
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store

RUN = "/runtime.v1.RuntimeService/RunPodSandbox"


class Counter:
    """Labels each pod it plans with the number of its call."""

    def __init__(self) -> None:
        self.n = 0

    @hookimpl
    def rhp_pre_run_pod_sandbox(self, pod: PodFacts, node: NodeFacts) -> Plan:
        self.n += 1
        return Plan(labels={"call": str(self.n)})


def _interceptor() -> CriInterceptor:
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=[Counter()])
    pipeline = Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))  # type: ignore[misc]
    return CriInterceptor(store=Store(), pipeline=pipeline, client=cast(RuntimeClient, None))


def _request() -> bytes:
    config = api_pb2.PodSandboxConfig()
    config.metadata.name, config.metadata.namespace, config.metadata.uid = "web", "ns", "u1"
    return api_pb2.RunPodSandboxRequest(config=config).SerializeToString()


async def test_identical_requests_in_flight_keep_their_own_calls() -> None:
    icpt = _interceptor()
    first, second = await icpt.before(RUN, _request()), await icpt.before(RUN, _request())
    assert [api_pb2.RunPodSandboxRequest.FromString(c.request).config.labels["call"] for c in (first, second)] \
        == ["1", "2"]
    # Answered in the other order: each call records its own sandbox with its own plan.
    await second.after(api_pb2.RunPodSandboxResponse(pod_sandbox_id="sb2").SerializeToString())
    await first.after(api_pb2.RunPodSandboxResponse(pod_sandbox_id="sb1").SerializeToString())
    assert {sid: icpt.store.pod(sid).labels["call"] for sid in ("sb1", "sb2")} == {"sb1": "1", "sb2": "2"}  # type: ignore[union-attr]
    assert not hasattr(icpt, "_pending")


async def test_a_call_the_runtime_never_answered_leaves_nothing_behind() -> None:
    icpt = _interceptor()
    for _ in range(1000):
        await icpt.before(RUN, _request())  # the runtime failed each: no ``after``
    assert icpt.store.pods() == []
    assert not [name for name, value in vars(icpt).items() if isinstance(value, dict) and len(value) >= 1000]

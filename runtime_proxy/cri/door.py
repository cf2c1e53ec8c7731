"""The CRI door: the eight intercepted lifecycle calls of kubelet's CRI traffic as facts for the
lifecycle core (``runtime_proxy.engine.lifecycle``), and stage results as rewritten requests.

Called by either transport (``runtime_proxy.cri.relay``, ``runtime_proxy.cri.grpc_transport``)
through the ``runtime_proxy.cri.transport.CallInterceptor`` seam. For each call:

1. ``before`` decodes the request once (unknown fields are kept), builds ``PodFacts`` and
   ``ContainerFacts`` from it and from the store, has the core run the ``Pre*`` stage, and
   rewrites the request with the merged plan's CRI changes when the applier carries them (not
   in dry-run). A ``Fail``-policy failure raises ``HookRejected`` and the runtime is never
   called. It returns the call (``CriCall``): the request to send, the decoded message and the
   stage's result, which the transport hands to ``after``.
2. The transport forwards the (rewritten) request.
3. ``CriCall.after`` (only when the runtime answered OK) decodes the answer and hands the
   facts to ``runtime_proxy.engine.walk.finish``, which does what the lifecycle table
   (``runtime_proxy.engine.table``) says: records the pod or container in the store, has the
   core apply the plan's file part (so a rejected call writes nothing), then runs the ``Post*``
   stage, whose failures are logged and never fail the call. UpdateContainerResources follows
   the table's ``UPDATES[Door.CRI]``: its ``Pre*`` stage sees the stored container under the
   request's resources (``update_facts``), and the store records the stored container under
   the resources sent (the request as the plan rewrote it) with the plan's annotations.

Calls for pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` skip every hook but
are still recorded in the store.

Bound CPUs follow the store's rule (``runtime_proxy.state.store``, released pods): StopPodSandbox
and the StopContainer of a pod's last running container release the CPUs of its resource-status
cpuset, a new container takes them back. A release changes the node facts hooks see at once (a
new LSR pod given those CPUs is bound to them), and ``on_store_change`` hears that the share
pools moved, so the reconciler gives the running LS containers the CPUs back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from google.protobuf.message import Message

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, PodFacts
from hooks.plan import Plan
from rhp_kube.events import EventSink
from runtime_proxy import metrics
from runtime_proxy.codecs.cri import (
    container_facts_from_config,
    pod_facts_from_config,
    rewrite_create_container,
    rewrite_run_pod_sandbox,
    rewrite_update_container_resources,
    update_resources,
)
from runtime_proxy.cri.methods import INTERCEPTED
from runtime_proxy.cri.transport import HookRejected
from runtime_proxy.engine.lifecycle import Lifecycle, LifecycleDoor, NodeSource, StageRejected
from runtime_proxy.engine.pipeline import Pipeline, StageResult
from runtime_proxy.engine.table import BY_CRI, UPDATES, Door, update_facts
from runtime_proxy.engine.walk import finish
from runtime_proxy.host.apply import Applier
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.podspecs import PodSpecSource
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = ["CriCall", "CriInterceptor"]


_M = TypeVar("_M", bound=Message)


@dataclass(frozen=True)
class CallHandlers(Generic[_M]):
    """The codec of one CRI call: the request type, the facts and ``Pre*`` stage before the
    call is forwarded, how a carried plan rewrites the request, and the bookkeeping and
    ``Post*`` stage after the runtime answered OK (given the result only when it was carried)."""

    request: type[_M]
    before: Callable[[_M], Awaitable[StageResult | None]]
    rewrite: Callable[[_M, Plan], None]
    after: Callable[[_M, bytes, StageResult | None], Awaitable[None]]


def _no_rewrite(msg: Message, plan: Plan) -> None:
    """Calls whose request carries nothing a plan may change."""


class CriCall:
    """One intercepted CRI call between ``before`` and ``after`` (``InterceptedCall``): the
    request to send, the message it was decoded into (rewritten by the plan; None when the
    request goes as kubelet sent it after its hooks failed) and the ``Pre*`` stage's result
    when its effects go ahead."""

    __slots__ = ("_door", "call", "msg", "request", "result")

    def __init__(
        self, door: CriInterceptor, call: str, request: bytes, msg: Message | None, result: StageResult | None
    ) -> None:
        self._door = door
        self.call = call
        self.request = request
        self.msg = msg
        self.result = result

    async def after(self, response: bytes) -> None:
        await self._door._after(self, response)


class CriInterceptor(LifecycleDoor):
    """Implements ``CallInterceptor`` for the CRI lifecycle calls over the lifecycle core."""

    def __init__(
        self,
        *,
        store: Store,
        pipeline: Pipeline,
        client: RuntimeClient,
        node_source: NodeSource | None = None,
        applier: Applier | None = None,
        on_store_change: Callable[[bool], None] | None = None,
        kubelet_root: KubeletRoot | None = None,
        events: EventSink | None = None,
        pod_specs: PodSpecSource | None = None,
    ) -> None:
        self.core = Lifecycle(pipeline, store=store, node_source=node_source, applier=applier,
                              kubelet_root=kubelet_root, where="interceptor", events=events, pod_specs=pod_specs)
        self.client = client
        # Called after every intercepted call with "did the bound cpusets (the share pools'
        # input) change?", so the reconciler can push new pools to running containers at once.
        self.on_store_change = on_store_change
        # The intercepted calls (``runtime_proxy.cri.methods.INTERCEPTED``) and their codecs;
        # Any: each entry has its own request type, which only its own handlers see.
        self._handlers: dict[str, CallHandlers[Any]] = {
            "RunPodSandbox": CallHandlers(
                api_pb2.RunPodSandboxRequest, self._before_run_pod_sandbox, rewrite_run_pod_sandbox,
                self._after_run_pod_sandbox,
            ),
            "StopPodSandbox": CallHandlers(
                api_pb2.StopPodSandboxRequest, self._before_stop_pod_sandbox, _no_rewrite,
                self._after_stop_pod_sandbox,
            ),
            "RemovePodSandbox": CallHandlers(
                api_pb2.RemovePodSandboxRequest, self._before_remove_pod_sandbox, _no_rewrite,
                self._after_remove_pod_sandbox,
            ),
            "CreateContainer": CallHandlers(
                api_pb2.CreateContainerRequest, self._before_create_container, rewrite_create_container,
                self._after_create_container,
            ),
            "StartContainer": CallHandlers(
                api_pb2.StartContainerRequest, self._before_start_container, _no_rewrite,
                self._after_start_container,
            ),
            "UpdateContainerResources": CallHandlers(
                api_pb2.UpdateContainerResourcesRequest,
                self._before_update_container_resources,
                rewrite_update_container_resources,
                self._after_update_container_resources,
            ),
            "StopContainer": CallHandlers(
                api_pb2.StopContainerRequest, self._before_stop_container, _no_rewrite,
                self._after_stop_container,
            ),
            "RemoveContainer": CallHandlers(
                api_pb2.RemoveContainerRequest, self._before_remove_container, _no_rewrite,
                self._after_remove_container,
            ),
        }

    # -- CallInterceptor -----------------------------------------------------------------------

    def intercepts(self, method: str) -> bool:
        return method in INTERCEPTED

    async def undecodable(self, method: str, reason: str) -> None:
        call = INTERCEPTED.get(method, method)
        refused = self.core.refusal(f"Pre{call}", reason)
        if refused is not None:
            raise HookRejected(refused.code, refused.message())
        metrics.HOOKS_SKIPPED.labels("undecodable").inc()
        log.warning("request not decodable; forwarded without hooks", call=call, reason=reason)

    async def before(self, method: str, request: bytes) -> CriCall:
        call = INTERCEPTED[method]
        stage = f"Pre{call}"
        handlers = self._handlers[call]
        try:
            msg = handlers.request.FromString(request)
        except Exception as exc:  # protobuf's DecodeError and friends
            await self.undecodable(method, f"cannot decode request: {exc}")
            return CriCall(self, call, request, None, None)
        try:
            result = self.core.carries(await handlers.before(msg), stage)
            if result is None:
                return CriCall(self, call, request, msg, None)
            handlers.rewrite(msg, result.plan)
        except StageRejected as rejected:
            raise HookRejected(rejected.code, rejected.message()) from None
        except Exception as exc:  # this pod's input or a bug: costs this call, never the others
            refused = self.core.hooks_failed(stage, exc)
            if refused is not None:
                raise HookRejected(refused.code, refused.message()) from None
            return CriCall(self, call, request, None, None)
        return CriCall(self, call, msg.SerializeToString(), msg, result)

    async def _after(self, call: CriCall, response: bytes) -> None:
        """``CriCall.after``: the bookkeeping and ``Post*`` stage of one call the runtime
        answered OK, then the share pools' check."""
        try:
            handlers = self._handlers[call.call]
            # The message sent: decoded once in ``before`` (again only when its hooks failed
            # and the request went as kubelet sent it).
            msg = call.msg if call.msg is not None else handlers.request.FromString(call.request)
            await handlers.after(msg, response, call.result)
        except Exception:  # post processing must never fail a call the runtime accepted
            log.exception("post-call processing failed", call=call.call)
        if self.on_store_change is not None:
            self.on_store_change(await self.core.pools_moved())

    async def _pod_for(self, sandbox_id: str) -> PodFacts | None:
        return await self.store.ensure_pod(self.client, sandbox_id)

    async def _container_for(self, container_id: str) -> tuple[PodFacts | None, ContainerFacts | None]:
        found = await self.store.ensure_container(self.client, container_id)
        if found is None:
            return None, None
        return found

    # -- pod sandbox calls -----------------------------------------------------------------------

    async def _before_run_pod_sandbox(self, msg: api_pb2.RunPodSandboxRequest) -> StageResult | None:
        pod = pod_facts_from_config(msg.config, runtime_handler=msg.runtime_handler)
        return await self.core.run("PreRunPodSandbox", pod, None)

    async def _after_run_pod_sandbox(
        self, msg: api_pb2.RunPodSandboxRequest, response: bytes, result: StageResult | None
    ) -> None:
        sandbox_id = api_pb2.RunPodSandboxResponse.FromString(response).pod_sandbox_id
        pod = pod_facts_from_config(msg.config, runtime_handler=msg.runtime_handler, sandbox_id=sandbox_id)
        await finish(self.core, BY_CRI["RunPodSandbox"], result, sandbox_id=sandbox_id, pod=pod)

    async def _before_stop_pod_sandbox(self, msg: api_pb2.StopPodSandboxRequest) -> StageResult | None:
        pod = await self._pod_for(msg.pod_sandbox_id)
        return None if pod is None else await self.core.run("PreStopPodSandbox", pod, None)

    async def _after_stop_pod_sandbox(
        self, msg: api_pb2.StopPodSandboxRequest, response: bytes, result: StageResult | None
    ) -> None:
        await finish(self.core, BY_CRI["StopPodSandbox"], result, sandbox_id=msg.pod_sandbox_id)

    async def _before_remove_pod_sandbox(self, msg: api_pb2.RemovePodSandboxRequest) -> StageResult | None:
        pod = await self._pod_for(msg.pod_sandbox_id)
        return None if pod is None else await self.core.run("PreRemovePodSandbox", pod, None)

    async def _after_remove_pod_sandbox(
        self, msg: api_pb2.RemovePodSandboxRequest, response: bytes, result: StageResult | None
    ) -> None:
        await finish(self.core, BY_CRI["RemovePodSandbox"], result, sandbox_id=msg.pod_sandbox_id)

    # -- container calls -----------------------------------------------------------------------

    async def _before_create_container(self, msg: api_pb2.CreateContainerRequest) -> StageResult | None:
        pod = await self._pod_for(msg.pod_sandbox_id)
        if pod is None:
            pod = pod_facts_from_config(msg.sandbox_config, sandbox_id=msg.pod_sandbox_id)
        container = container_facts_from_config(msg.config)
        return await self.core.run("PreCreateContainer", pod, container)

    async def _after_create_container(
        self, msg: api_pb2.CreateContainerRequest, response: bytes, result: StageResult | None
    ) -> None:
        container_id = api_pb2.CreateContainerResponse.FromString(response).container_id
        container = container_facts_from_config(msg.config, container_id=container_id)
        await finish(self.core, BY_CRI["CreateContainer"], result, sandbox_id=msg.pod_sandbox_id,
                     container_id=container_id, container=container)

    async def _container_stage(self, stage: str, container_id: str) -> StageResult | None:
        pod, container = await self._container_for(container_id)
        if pod is None or container is None:
            return None
        return await self.core.run(stage, pod, container)

    async def _before_start_container(self, msg: api_pb2.StartContainerRequest) -> StageResult | None:
        return await self._container_stage("PreStartContainer", msg.container_id)

    async def _after_start_container(
        self, msg: api_pb2.StartContainerRequest, response: bytes, result: StageResult | None
    ) -> None:
        await finish(self.core, BY_CRI["StartContainer"], result, container_id=msg.container_id)

    async def _before_update_container_resources(
        self, msg: api_pb2.UpdateContainerResourcesRequest
    ) -> StageResult | None:
        pod, container = await self._container_for(msg.container_id)
        if pod is None or container is None:
            return None
        container = update_facts(UPDATES[Door.CRI], container, update_resources(msg))
        return await self.core.run("PreUpdateContainerResources", pod, container)

    async def _after_update_container_resources(
        self, msg: api_pb2.UpdateContainerResourcesRequest, response: bytes, result: StageResult | None
    ) -> None:
        # ``msg`` is the request as sent: rewritten by the plan when it was carried.
        await finish(self.core, BY_CRI["UpdateContainerResources"], result, container_id=msg.container_id,
                     sent=update_resources(msg))

    async def _before_stop_container(self, msg: api_pb2.StopContainerRequest) -> StageResult | None:
        return await self._container_stage("PreStopContainer", msg.container_id)

    async def _after_stop_container(
        self, msg: api_pb2.StopContainerRequest, response: bytes, result: StageResult | None
    ) -> None:
        await finish(self.core, BY_CRI["StopContainer"], result, container_id=msg.container_id)

    async def _before_remove_container(self, msg: api_pb2.RemoveContainerRequest) -> StageResult | None:
        return await self._container_stage("PreRemoveContainer", msg.container_id)

    async def _after_remove_container(
        self, msg: api_pb2.RemoveContainerRequest, response: bytes, result: StageResult | None
    ) -> None:
        await finish(self.core, BY_CRI["RemoveContainer"], result, container_id=msg.container_id)

"""The hook server door: each RuntimeHookService call as facts for the lifecycle core
(``runtime_proxy.engine.lifecycle``), and its stage result as the hook response.

Served by ``runtime_proxy.commands.hook_server`` (``runtime-proxy hook-server``). For each hook
call: the request becomes facts (``runtime_proxy.codecs.hook``; the sandbox id is
not part of the protocol and stays empty), the core runs the stage through the same pipeline as
the proxy's (order, policies, timeouts, conflicts), and the answer carries the CRI-expressible
part of the merged plan on top of an echo of the request. A ``Fail``-policy failure at a
``Pre*`` hook answers ``FAILED_PRECONDITION`` naming the plugin; the calling proxy's
registration policy then decides. When the applier does not carry the plan (the recording
applier of dry-run) the answer is the unchanged request and nothing is applied.

The plan's file part (cgroup and resctrl writes, task moves, removals) is applied here through
the core (``runtime_proxy.engine.walk.before_answer``), because the calling proxy only applies
what the protocol carries. Writes with a complete path are applied before answering.
Container-level writes of ``PreCreateContainer`` whose path still lacks the container id are
kept and applied at the ``PreStartContainer`` hook of the same container (pod uid, name,
attempt), which Koordinator's proxy sends with the id, under the one rule of
``runtime_proxy.engine.pending``. Without an applier (``--no-apply``) the file part is logged and
left to the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from cri_protos import hookserver_pb2 as hs
from hooks.facts import ContainerFacts, PodFacts
from hooks.plan import Plan
from rhp_kube.events import EventSink
from runtime_proxy.codecs.hook import (
    POD_HOOKS,
    container_facts_from_request,
    container_response,
    pod_facts_from_request,
    pod_response,
)
from runtime_proxy.engine.lifecycle import Lifecycle, NodeSource, StageRejected
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.engine.table import BY_HOOK
from runtime_proxy.engine.walk import before_answer
from runtime_proxy.host.apply import Applier

if TYPE_CHECKING:
    import grpc

log = structlog.get_logger(__name__)

__all__ = ["HookService"]

HookRequest = hs.PodSandboxHookRequest | hs.ContainerResourceHookRequest
HookResponse = hs.PodSandboxHookResponse | hs.ContainerResourceHookResponse


class HookService:
    """The ``RuntimeHookService`` servicer: thin methods over ``handle``."""

    def __init__(self, pipeline: Pipeline, node_source: NodeSource, applier: Applier | None, *,
                 events: EventSink | None = None) -> None:
        self.core = Lifecycle(pipeline, node_source=node_source, applier=applier, where="hook-server",
                              stateless=True, events=events)

    async def handle(
        self, stage: str, request: HookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        pod = pod_facts_from_request(request)
        container = None
        if stage not in POD_HOOKS and isinstance(request, hs.ContainerResourceHookRequest):
            container = container_facts_from_request(request)
        try:
            result = await before_answer(self.core, stage, pod, container)
        except StageRejected as refused:
            import grpc  # loaded by ``serve`` (the CLI builds its parser without the library)

            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused.message("runtime-hook-proxy hook server"))
            raise AssertionError("unreachable") from None
        if result is None:
            return self._answer(pod, container, Plan())
        return self._answer(result.pod, result.container, result.plan)

    def _answer(self, pod: PodFacts, container: ContainerFacts | None, plan: Plan) -> HookResponse:
        if container is None:
            answer: HookResponse = pod_response(pod, plan)
        else:
            answer = container_response(pod, container, plan)
        return answer

    # -- RuntimeHookService ---------------------------------------------------------------------

    async def PreRunPodSandboxHook(
        self, request: hs.PodSandboxHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PreRunPodSandboxHook"][1], request, context)

    async def PostStopPodSandboxHook(
        self, request: hs.PodSandboxHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PostStopPodSandboxHook"][1], request, context)

    async def PreCreateContainerHook(
        self, request: hs.ContainerResourceHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PreCreateContainerHook"][1], request, context)

    async def PreStartContainerHook(
        self, request: hs.ContainerResourceHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PreStartContainerHook"][1], request, context)

    async def PostStartContainerHook(
        self, request: hs.ContainerResourceHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PostStartContainerHook"][1], request, context)

    async def PostStopContainerHook(
        self, request: hs.ContainerResourceHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PostStopContainerHook"][1], request, context)

    async def PreUpdateContainerResourcesHook(
        self, request: hs.ContainerResourceHookRequest, context: grpc.aio.ServicerContext[HookRequest, HookResponse]
    ) -> HookResponse:
        return await self.handle(BY_HOOK["PreUpdateContainerResourcesHook"][1], request, context)

"""Koordinator's RuntimeHookService answered by our plugins (``HookService``); the command that
serves it is ``runtime-proxy hook-server`` (``runtime_proxy.commands.hook_server``).

For each hook call: the request becomes facts (``runtime_proxy.engine.remote`` conversions; the
sandbox id is not part of the protocol and stays empty), the plugins run through the same
``runtime_proxy.engine.pipeline.Pipeline`` as in the proxy (order, policies, timeouts, conflicts from
``--config``), and the answer carries the CRI-expressible part of the merged plan on top of an
echo of the request: full resources (Koordinator copies the cpuset even when empty), full
annotations and labels, envs only when a plugin set one, the cgroup parent only when changed.
A plugin failing under policy ``Fail`` at a ``Pre*`` hook answers ``FAILED_PRECONDITION``
naming the plugin; the calling proxy's registration policy then decides.

The plan's file part (cgroup and resctrl writes, task moves, removals) is performed here with
the applier it is given, because the calling proxy only applies what the protocol carries.
Writes with a complete path are applied before answering. Container-level writes of
``PreCreateContainer`` whose path still lacks the container id are kept and applied at the
``PreStartContainer`` hook of the same container (pod uid, name, attempt), which Koordinator's
proxy sends with the id; ``PreStartContainer`` is therefore registered with
``PreCreateContainer``. Without an applier (``--no-apply``) the file part is logged and left to
the caller; in a dry run the answer is the unchanged request and nothing is applied.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import structlog

from hooks.facts import ContainerFacts, PodFacts
from hooks.plan import CgroupWrite, Plan
from runtime_proxy.engine.intercept import NodeSource
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.engine.remote import (
    POD_HOOKS,
    container_facts_from_request,
    container_response,
    pod_facts_from_request,
    pod_response,
)
from runtime_proxy.host.apply import Applier

if TYPE_CHECKING:
    import grpc

log = structlog.get_logger(__name__)

__all__ = ["HookService"]

_PENDING_LIMIT = 1024


def _bind_container_id(writes: list[CgroupWrite], container_id: str) -> list[CgroupWrite]:
    return [CgroupWrite(w.level, w.path + container_id, w.file, w.value) for w in writes]


def _needs_id(w: CgroupWrite) -> bool:
    return w.level in ("container", "sandbox") and (not w.path or w.path.endswith("/"))


class HookService:
    """The ``RuntimeHookService`` servicer: thin methods over ``handle``."""

    def __init__(self, pipeline: Pipeline, node_source: NodeSource, applier: Applier | None, *, dry_run: bool) -> None:
        self.pipeline = pipeline
        self.node_source = node_source
        self.applier = applier
        self.dry_run = dry_run
        # Container-level writes waiting for the container id: (pod uid, name, attempt) -> writes.
        self._pending: OrderedDict[tuple[str, str, int], list[CgroupWrite]] = OrderedDict()

    async def handle(self, stage: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        pod = pod_facts_from_request(request)
        container = None if stage in POD_HOOKS else container_facts_from_request(request)
        if pod.skips_hooks:
            return self._answer(stage, pod, container, Plan())
        result = await self.pipeline.run(stage, pod, container, self.node_source.current())
        if result.rejected is not None:
            import grpc  # loaded by runtime_proxy.commands.hook_server.serve before any call

            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"runtime-hook-proxy hook server: {result.rejected} (policy Fail)",
            )
        if self.dry_run:
            if not result.plan.is_empty():
                log.info("dry-run plan", stage=stage, plan=result.plan.to_json())
            return self._answer(stage, pod, container, Plan())
        await self._files(stage, pod, container, result.plan)
        return self._answer(stage, result.pod, result.container, result.plan)

    def _answer(self, stage: str, pod: PodFacts, container: ContainerFacts | None, plan: Plan) -> Any:
        if container is None:
            return pod_response(pod, plan)
        return container_response(pod, container, plan)

    async def _files(self, stage: str, pod: PodFacts, container: ContainerFacts | None, plan: Plan) -> None:
        writes = list(plan.writes)
        if container is not None:
            key = (pod.uid, container.name, container.attempt)
            if stage == "PreCreateContainer":
                later = [w for w in writes if _needs_id(w)]
                if later:
                    self._pending[key] = later
                    while len(self._pending) > _PENDING_LIMIT:
                        self._pending.popitem(last=False)
                    writes = [w for w in writes if not _needs_id(w)]
            elif container.id and key in self._pending and stage in ("PreStartContainer", "PostStartContainer"):
                writes = _bind_container_id(self._pending.pop(key), container.id) + writes
        incomplete = [w for w in writes if _needs_id(w)]
        if incomplete:
            log.info("writes without a container or sandbox id dropped", stage=stage,
                     writes=[w.to_json() for w in incomplete])
            writes = [w for w in writes if not _needs_id(w)]
        files = Plan(writes=writes, moves=plan.moves, removals=plan.removals)
        if files.is_empty():
            return
        if self.applier is None:
            log.info("file part of the plan left to the caller (--no-apply)", stage=stage, plan=files.to_json())
            return
        try:
            await self.applier.apply(files, stage=stage)
        except Exception:
            log.exception("applying plan failed", stage=stage)

    # -- RuntimeHookService ---------------------------------------------------------------------

    async def PreRunPodSandboxHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PreRunPodSandbox", request, context)

    async def PostStopPodSandboxHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PostStopPodSandbox", request, context)

    async def PreCreateContainerHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PreCreateContainer", request, context)

    async def PreStartContainerHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PreStartContainer", request, context)

    async def PostStartContainerHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PostStartContainer", request, context)

    async def PostStopContainerHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PostStopContainer", request, context)

    async def PreUpdateContainerResourcesHook(self, request: Any, context: Any) -> Any:
        return await self.handle("PreUpdateContainerResources", request, context)

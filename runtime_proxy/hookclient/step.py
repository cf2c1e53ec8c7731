"""One registered hook server as a pipeline step: the proxy side's gRPC call of Koordinator's
``RuntimeHookService`` (requests and answers through ``runtime_proxy.codecs.hook``, the merge
rules of ``runtime_proxy.hookclient``'s docstring). Built by the registry
(``runtime_proxy.hookclient.registry``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from cri_protos import hookserver_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import Plan
from runtime_proxy import metrics
from runtime_proxy.codecs.hook import (
    POD_HOOKS,
    container_plan_from_response,
    container_request,
    pod_plan_from_response,
    pod_request,
)
from runtime_proxy.engine.pipeline import StepError
from runtime_proxy.hookclient.registration import Policy, Registration

log = structlog.get_logger(__name__)

__all__ = ["RemoteStep"]

# Hook points whose response may change the CRI request (the others only report failures).
_MERGED_HOOKS = frozenset({"PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"})


class RemoteStep:
    """One registered hook server as a pipeline step (``runtime_proxy.engine.pipeline.Step``)."""

    def __init__(self, registration: Registration, stub: Any) -> None:  # Any: untyped generated gRPC stub
        self.registration = registration
        self.name = f"hookserver:{registration.name}"
        self.policy: Policy = registration.policy
        # The gRPC deadline is the real timeout; the pipeline's wait_for is a backstop.
        self.timeout = registration.timeout + 0.5
        self._stub = stub
        self._hooks = frozenset(registration.hooks)

    def handles(self, stage: str) -> bool:
        return stage in self._hooks

    async def call(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        extra: Mapping[str, object] | None = None,
    ) -> Plan | None:
        if pod.skips_hooks:
            return None
        reg = self.registration
        request: hookserver_pb2.PodSandboxHookRequest | hookserver_pb2.ContainerResourceHookRequest
        if stage in POD_HOOKS:
            request = pod_request(pod)
        elif container is not None:
            request = container_request(pod, container)
        else:
            return None
        import grpc  # loaded by the registry with the first channel (see ``_rebuild``)

        method = getattr(self._stub, f"{stage}Hook")
        try:
            resp = await method(request, timeout=reg.timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                metrics.PLUGIN_TIMEOUTS.labels(self.name, stage).inc()
                raise StepError(
                    "timeout", f"hook server {reg.endpoint} gave no answer within {reg.timeout:g}s"
                ) from exc
            raise StepError("error", f"hook server {reg.endpoint}: {code.name}: {exc.details()}") from exc
        if stage not in _MERGED_HOOKS:
            return None
        if stage in POD_HOOKS:
            return pod_plan_from_response(pod, resp)
        assert container is not None
        return container_plan_from_response(stage, pod, container, resp, server=self.name)

"""The lifecycle core every door shares: facts in -> the one hook runner -> a stage result ->
effects carried out by one applier.

The doors (``runtime_proxy.cri.door`` for the CRI proxy, ``runtime_proxy.nri.adapter`` for the
NRI plugin, ``runtime_proxy.hookserver.door`` for the hook server) turn wire messages into
facts and stage results into wire replies; everything else happens here, once:

- the node facts hooks see (``node``): the node config (``NodeSource``) with kubelet's cgroup
  root (``runtime_proxy.state.kubelet_root``) plus the CPUs bound to the stored pods that hold
  them (``runtime_proxy.engine.bound``, parsed off the event loop by ``refresh``), cached per
  store version;
- running a stage (``run``): pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true``
  and stages no plugin implements are skipped; the pod's facts get what only the cluster knows
  of it (its batch resources: ``runtime_proxy.state.podspecs``, the ``PodSpecSource`` the
  composition root gave; a ``Pre*`` stage of a BE pod the pod watch has not seen yet waits a
  little for it); a ``Fail``-policy failure raises
  ``StageRejected`` (gRPC and ttrpc code 9, FAILED_PRECONDITION), which each door turns into its
  own error reply;
- whether a stage's effects go ahead (``carries``) and applying its file part (``apply``), both
  asked of the ``runtime_proxy.host.apply.Applier`` the composition root chose (the recording
  applier in dry-run: plans are logged there, replies carry no changes, no file is touched);
- whether the share pools' input moved (``pools_moved``), for the reconciler;
- what happened to a pod: ``run`` binds the call's pod and container (``identity``: namespace,
  pod, pod_uid, container) to structlog's context variables, so every line logged for the rest
  of the call (the pipeline's, the applier's, the door's) names them; ``call_scope`` forgets
  them when a task that serves many calls (the NRI worker) ends one; every hook failure or
  refusal of a stage about a pod is recorded as a Kubernetes Event on it through the
  ``EventSink`` the composition root gave (``rhp_kube.events``; the reasons are
  ``runtime_proxy.engine.events``).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

import structlog

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import Plan
from rhp_kube.events import EventSink, PodEvent
from runtime_proxy import metrics
from runtime_proxy.engine.bound import POD_INPUT_REJECTED, BoundCpusets
from runtime_proxy.engine.events import REASON_FAILED, REASON_REFUSED
from runtime_proxy.engine.pending import Pending
from runtime_proxy.engine.pipeline import Pipeline, StageResult
from runtime_proxy.host.apply import Applier
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.podspecs import NoPodSpecs, PodSpecSource
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = [
    "FAILED_PRECONDITION",
    "IDENTITY_KEYS",
    "Lifecycle",
    "LifecycleDoor",
    "NodeSource",
    "Pools",
    "StageRejected",
    "StaticNode",
    "bind_identity",
    "call_scope",
    "forget_identity",
    "identity",
    "record_failures",
]

# The status code of a refused call (gRPC's and ttrpc's FAILED_PRECONDITION).
FAILED_PRECONDITION = 9

# The share pools' input: the CPUs bound to each pod (by uid) and the LSE pods.
Pools = tuple[Mapping[str, frozenset[int]], frozenset[str]]
NO_POOLS: Pools = ({}, frozenset())


# The keys every log line about a pod or container carries (bound by ``Lifecycle.run``).
IDENTITY_KEYS = ("namespace", "pod", "pod_uid", "container")


def identity(pod: PodFacts, container: ContainerFacts | None) -> dict[str, str]:
    """The log fields naming ``pod`` (and ``container``); empty values are left out."""
    fields = {"namespace": pod.namespace, "pod": pod.name, "pod_uid": pod.uid,
              "container": container.name if container is not None else ""}
    return {key: value for key, value in fields.items() if value}


def bind_identity(pod: PodFacts, container: ContainerFacts | None) -> None:
    """Name ``pod`` and ``container`` on every line the current task logs from now on (the keys
    of a previous call that this one lacks are forgotten)."""
    fields = identity(pod, container)
    structlog.contextvars.unbind_contextvars(*(key for key in IDENTITY_KEYS if key not in fields))
    structlog.contextvars.bind_contextvars(**fields)


def forget_identity() -> None:
    """Name no pod on the current task's lines any more (``bind_identity`` undone)."""
    structlog.contextvars.unbind_contextvars(*IDENTITY_KEYS)


@contextmanager
def call_scope() -> Iterator[None]:
    """One call of a task that serves many: the identity it binds is forgotten at the end."""
    try:
        yield
    finally:
        forget_identity()


def record_failures(events: EventSink | None, result: StageResult, pod: PodFacts,
                    container: ContainerFacts | None) -> None:
    """An Event on ``pod`` for each failure of ``result`` (``RuntimeHookRefused`` for the one
    that refused the call, ``RuntimeHookFailed`` for the others); none without a sink or for a
    stage about no pod (``ReconcileUsage``). The doors' calls (``Lifecycle.run``) and the
    reconciler's rounds record them alike."""
    if events is None or not result.failures or not (pod.name and pod.namespace):
        return
    where = f"container {container.name}" if container is not None and container.name else "pod"
    for failure in result.failures:
        refused = failure is result.rejected
        outcome = "call refused" if refused else "went on without it"
        events.record(PodEvent(
            namespace=pod.namespace, name=pod.name, uid=pod.uid,
            reason=REASON_REFUSED if refused else REASON_FAILED,
            message=f"hook {failure.step} ({failure.policy}) at {failure.stage} of {where}: {failure.kind}: "
                    f"{failure.message[:400]}; {outcome}",
        ))


class NodeSource(Protocol):
    """Where the current ``NodeFacts`` come from (``runtime_proxy.state.nodeconfig`` in production)."""

    def current(self) -> NodeFacts: ...


class StaticNode:
    """A fixed node config (tests, and a proxy started without node config)."""

    def __init__(self, node: NodeFacts | None = None) -> None:
        self.node = node or NodeFacts()

    def current(self) -> NodeFacts:
        return self.node


class StageRejected(Exception):
    """A ``Fail``-policy failure: the call is refused with ``code`` and ``message(who)``."""

    def __init__(self, text: str, *, code: int = FAILED_PRECONDITION) -> None:
        super().__init__(text)
        self.code = code
        self.text = text

    def message(self, who: str = "runtime-hook-proxy") -> str:
        return f"{who}: {self.text}"


class Lifecycle:
    """One door's state (its store, bound cpusets, node facts cache) over the shared pipeline
    and applier. ``where`` names the door in metrics (``rhp_pod_input_rejected_total``); a
    ``stateless`` door keeps no pods."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        store: Store | None = None,
        node_source: NodeSource | None = None,
        applier: Applier | None = None,
        kubelet_root: KubeletRoot | None = None,
        where: str = "interceptor",
        stateless: bool = False,
        events: EventSink | None = None,
        pod_specs: PodSpecSource | None = None,
    ) -> None:
        self.pipeline = pipeline
        # What the cluster knows of a pod that the runtime does not carry (its batch resources).
        self.pod_specs: PodSpecSource = pod_specs or NoPodSpecs()
        self.store = store if store is not None else Store()
        self.node_source = node_source or StaticNode()
        # kubelet's cgroup root in the node facts: configured, or learned from the stored pods.
        self.kubelet_root = kubelet_root or KubeletRoot()
        self.applier = applier
        self.where = where
        # A door that keeps no pods (the hook server: its caller keeps them) sees the node config
        # as it is, with neither a learned kubelet root nor bound cpusets.
        self.stateless = stateless
        # Where hook failures and refusals become Events on their pod (None: nowhere).
        self.events = events
        self._bound = BoundCpusets(where=where)
        self._refreshed_version = -1
        self._node_cache: tuple[int, int, NodeFacts] | None = None
        # The share pools' input as ``pools_moved`` last saw it (None: never looked).
        self.pools: Pools | None = None
        # File parts of ``PreCreateContainer`` plans waiting for their container, at a door that
        # sees CreateContainer before the container's cgroup exists (``runtime_proxy.engine.pending``;
        # held and taken where the lifecycle table says, ``runtime_proxy.engine.table``).
        self.held: Pending[Hashable] = Pending()

    def replace_store(self, store: Store) -> None:
        """Start over from ``store`` (the NRI door's Synchronize rebuilds it from the runtime)."""
        self.store = store
        self._refreshed_version = -1
        self._node_cache = None

    # -- facts ---------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Parse, off the event loop and under a deadline, the resource-status of the pods that
        hold bound CPUs and arrived or changed since the last call (``runtime_proxy.engine.bound``);
        a pod whose value does not parse is left out of the bound cpusets."""
        version = self.store.version
        if version != self._refreshed_version:
            await self._bound.refresh(self.store.holding_pods())
            self._refreshed_version = version

    def node(self) -> NodeFacts:
        """The node facts hooks see: the node config with kubelet's cgroup root (chosen over every
        stored pod) plus the CPUs bound to the stored pods that hold them (``Store.holding_pods``)
        under the node's trust rules, in the store's order (oldest first; cached per store
        version and node config; a pod whose annotation does not parse is left out)."""
        base = self.node_source.current()
        if self.stateless:
            return base
        version = self.store.version
        cache = self._node_cache
        if cache is not None and cache[0] == version and cache[1] == id(base):
            return cache[2]
        node = self.kubelet_root.node(base, self.store.pods(), version)
        bound, lse = self._bound.bound(self.store.holding_pods(), node)
        node = node.replace(bound_cpusets=bound, lse_pods=lse) if (bound or node.bound_cpusets) else node
        self._node_cache = (version, id(base), node)
        return node

    def bound_pods(self) -> Mapping[str, frozenset[int]]:
        """The CPUs bound to each pod (by uid) as ``pools_moved`` last saw them."""
        return (self.pools or NO_POOLS)[0]

    async def pools_moved(self) -> bool:
        """Whether the share pools' input (bound cpusets and LSE pods) changed since the last
        call; True when it cannot be recomputed (the reconciler then looks for itself)."""
        try:
            await self.refresh()
            node = self.node()
            pools: Pools = (node.bound_cpusets, node.lse_pods)
        except Exception:
            log.exception("bound cpusets not recomputed")
            return True
        changed = pools != self.pools
        self.pools = pools
        return changed

    # -- stages --------------------------------------------------------------------------------

    async def run(self, stage: str, pod: PodFacts, container: ContainerFacts | None) -> StageResult | None:
        """The one place a door runs a stage: None when the pod skips hooks or no plugin
        implements ``stage``; raises ``StageRejected`` when a ``Fail``-policy step failed. Binds
        the call's identity to the log context (``bind_identity``) and records each hook
        failure as an Event on the pod (``record_failures``)."""
        if pod.uid or pod.name:
            bind_identity(pod, container)
        if pod.skips_hooks:
            metrics.HOOKS_SKIPPED.labels("skip-label").inc()
            return None
        if not self.pipeline.has_work(stage):
            return None
        pod = await self.pod_specs.wait(pod) if stage.startswith("Pre") else self.pod_specs.facts(pod)
        await self.refresh()
        result = await self.pipeline.run(stage, pod, container, self.node())
        self.record_failures(result, pod, container)
        if result.rejected is not None:
            raise StageRejected(f"{result.rejected} (policy Fail)")
        return result

    def record_failures(self, result: StageResult, pod: PodFacts, container: ContainerFacts | None) -> None:
        """``record_failures`` with this core's sink."""
        record_failures(self.events, result, pod, container)

    def refusal(self, stage: str, reason: str) -> StageRejected | None:
        """A stage whose hooks could not run (an undecodable request, a pod's bad input, a bug):
        the refusal when a ``Fail``-policy step handles ``stage``, else None (counted and
        logged by the caller as skipped)."""
        if any(step.policy == "Fail" and step.handles(stage) for step in self.pipeline.steps):
            return StageRejected(f"cannot run Fail-policy hooks for {stage.removeprefix('Pre')}: {reason}")
        return None

    def hooks_failed(self, stage: str, exc: Exception) -> StageRejected | None:
        """The hooks of one call could not run (its pod's input, or a bug): counted, logged, and
        the refusal when a ``Fail``-policy step handles ``stage``."""
        POD_INPUT_REJECTED.labels(self.where, type(exc).__name__).inc()
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        refused = self.refusal(stage, reason)
        call = stage.removeprefix("Pre")
        if refused is not None:
            log.warning("hooks failed under policy Fail; rejecting call", call=call, reason=reason)
            return refused
        metrics.HOOKS_SKIPPED.labels("hook-error").inc()
        log.warning("hooks failed; request forwarded as sent", call=call, reason=reason)
        return None

    # -- effects -------------------------------------------------------------------------------

    def allows(self, plan: Plan, stage: str) -> bool:
        """Whether ``plan``'s effects go ahead: the applier says so (always without one)."""
        return self.applier is None or self.applier.carries(plan, stage=stage)

    def carries(self, result: StageResult | None, stage: str) -> StageResult | None:
        """``result`` when its effects go ahead (``allows``), else None: the door then replies
        with no changes and nothing is applied. A plan that goes ahead with changes is logged
        here, once, at info with what it changes (the call's pod is in the log context; the
        loops log their own rounds, and the dry-run applier logs the plans it records)."""
        if result is None or not self.allows(result.plan, stage):
            return None
        if not result.plan.is_empty() and _logs_info():
            log.info("plan", stage=stage, plan=result.plan.to_json())
        return result

    async def apply(self, plan: Plan, stage: str) -> None:
        """The file part of ``plan`` (writes, task moves, removals) through the applier; a
        failure is logged and costs only this plan (the applier restored what it changed)."""
        if self.applier is None:
            return
        files = plan.files()
        if files.is_empty():
            return
        try:
            await self.applier.apply(files, stage=stage)
        except Exception:
            log.exception("applying plan failed", stage=stage)

    async def stage_and_apply(self, stage: str, pod: PodFacts | None, container: ContainerFacts | None) -> None:
        """Run a stage whose plan has no reply to ride on (``Post*``, ``Reconcile*``) and apply it."""
        if pod is None:
            return
        result = self.carries(await self.run(stage, pod, container), stage)
        if result is not None:
            await self.apply(result.plan, stage)


def _logs_info() -> bool:
    """Whether this module's info lines are written (the plan's JSON is built only for them)."""
    enabled = getattr(log, "is_enabled_for", None)
    return enabled is None or bool(enabled(logging.INFO))


class LifecycleDoor:
    """What a door that keeps pods (the CRI interceptor, the NRI engine) shows of its lifecycle
    core ``core``: the store, the pipeline and the node facts hooks see."""

    core: Lifecycle

    @property
    def store(self) -> Store:
        return self.core.store

    @property
    def pipeline(self) -> Pipeline:
        return self.core.pipeline

    def node(self) -> NodeFacts:
        """The node facts hooks see (``Lifecycle.node``)."""
        return self.core.node()

    @property
    def stopped(self) -> frozenset[str]:
        """Ids of the stored containers the runtime stopped (``Store.stopped``)."""
        return self.store.stopped

    @property
    def released(self) -> frozenset[str]:
        """Sandbox ids of the stored pods that do not hold their CPUs (``Store.released``)."""
        return self.store.released

    def holding_pods(self) -> list[PodFacts]:
        """The stored pods that hold their bound CPUs (``Store.holding_pods``)."""
        return self.store.holding_pods()

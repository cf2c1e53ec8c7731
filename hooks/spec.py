"""The hook specifications: the contract between the proxy and its plugins.

Every CRI lifecycle call the proxy intercepts has a ``pre`` hook, called before the call is
forwarded to the runtime, and a ``post`` hook, called after the runtime answered with success.
The ``reconcile`` hooks are called by the proxy's periodic loops: ``reconcile_node``, ``_pod``,
``_container`` and ``_resctrl_groups`` by the reconciler at proxy start, on every node config
change, after pods come and go, and periodically; ``reconcile_usage`` by the usage loop and
``reconcile_cpu_burst`` by the CPU burst loop after each of their sampling rounds. The loops run
them through the same hook runner as the CRI calls (plugin order, timeouts, failure policies)
and hand the plans to the same applier. A hook is named ``rhp_<stage in snake case>``; its
stage name (``PreCreateContainer``, ``ReconcileContainer``...) is the same words in CamelCase.

Rules shared by every hook
    - Hooks are called with keyword arguments. An implementation may accept fewer arguments than
      its spec (only the ones it needs), so a spec can gain an argument later without breaking
      plugins. Asking for an argument the spec does not have fails at registration.
    - An implementation returns a ``hooks.Plan`` or ``None`` ("no opinion"), and does no I/O:
      the proxy's applier performs the plan. Its arguments are frozen facts.
    - Each implementation is called on its own, in the configured plugin order, each in a worker
      thread with its own timeout and failure policy (``Ignore``, the default: the failure is
      logged and counted and the plugin's plan is left out; ``Fail``: at a ``pre`` hook the CRI
      call is refused and nothing is applied). ``post`` and ``reconcile`` hooks never fail a call.
      pluggy's ``tryfirst``, ``trylast``, ``wrapper`` and ``hookwrapper`` are refused at
      registration (``hooks.manager.REFUSED_OPTIONS``): the config's order is the only order.
    - Each implementation sees the facts as changed by the plans of the plugins before it
      (resources, envs, annotations, labels, cgroup parent). Plans are merged in order; a field
      that two plugins set to different values is a conflict, and the later plugin's whole plan
      is left out (see ``hooks.plan``).
    - A plan may change the CRI fields its hook names under "May change" (``CRI_FIELDS`` holds
      the same, per stage, read by the proxy, the planner and ``docs/planner.md``); other CRI
      changes are dropped and recorded as skipped. Every hook may plan writes, task moves and
      removals. Writes of a ``pre`` hook happen once the runtime accepted the call.
    - Pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` call no hook at all.

.. versionadded:: 0.1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import pluggy

if TYPE_CHECKING:
    from hooks.facts import ContainerFacts, NodeFacts, PodFacts
    from hooks.plan import Plan
    from hooks.usage import BurstRound, Usage

__all__ = ["CRI_FIELDS", "KOORD_HOOK_POINTS", "PROJECT", "STAGES", "hookimpl", "hookspec"]

PROJECT = "runtime_hook_proxy"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# The CRI parts of a plan, by their ``hooks.Plan`` attribute names.
_PLAN_CRI_FIELDS = frozenset({"resources", "envs", "annotations", "labels", "cgroup_parent"})
_F = TypeVar("_F", bound=Callable[..., object])
_SPECS: list[Callable[..., object]] = []


def _stage(*cri_fields: str) -> Callable[[_F], _F]:
    """Mark a function as a hookspec of one stage that may change ``cri_fields``."""
    unknown = set(cri_fields) - _PLAN_CRI_FIELDS
    if unknown:
        raise ValueError(f"not CRI parts of a plan: {sorted(unknown)}")

    def mark(fn: _F) -> _F:
        fn.rhp_cri_fields = frozenset(cri_fields)  # type: ignore[attr-defined]
        _SPECS.append(fn)
        return hookspec(fn)

    return mark


# ---- pod sandbox lifecycle, in call order -----------------------------------------------------


@_stage("labels", "annotations", "cgroup_parent")
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Before ``RunPodSandbox`` is forwarded.

    May change: the sandbox's labels, annotations and cgroup parent. Pod-level writes happen once
    the runtime created the sandbox.

    :param pod: the pod to create; ``pod.sandbox_id`` is still empty.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """After the runtime created the pod sandbox.

    :param pod: the pod, with its ``sandbox_id``.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_pre_stop_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Before ``StopPodSandbox`` is forwarded.

    :param pod: the pod as stored at RunPodSandbox (or rebuilt from the runtime).
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_stop_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """After the runtime stopped the pod sandbox.

    :param pod: the stopped pod.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_pre_remove_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Before ``RemovePodSandbox`` is forwarded.

    :param pod: the pod about to be removed.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_remove_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """After the runtime removed the pod sandbox; the proxy has forgotten the pod.

    :param pod: the removed pod, as it was stored.
    :param node: the node's config, topology and bound cpusets.
    """


# ---- container lifecycle, in call order -------------------------------------------------------


@_stage("resources", "envs", "annotations", "cgroup_parent")
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Before ``CreateContainer`` is forwarded.

    May change: the container's resources, envs and annotations, and the cgroup parent in the
    request's sandbox config. Container-level writes (path ending in "/") get the new
    container's id and happen once the runtime created it.

    :param pod: the container's pod, as stored at RunPodSandbox.
    :param container: the container to create; ``container.id`` is still empty.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """After the runtime created the container.

    :param pod: the container's pod.
    :param container: the new container, with its ``id``.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_pre_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Before ``StartContainer`` is forwarded.

    :param pod: the container's pod.
    :param container: the container about to start.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """After the runtime started the container (its cgroup exists now).

    :param pod: the container's pod.
    :param container: the running container.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage("resources", "annotations")
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Before ``UpdateContainerResources`` is forwarded.

    May change: the resources and the annotations of the update (the runtime keeps a created
    container's own annotations; the proxy's store records these on the container until the
    proxy restarts).

    :param pod: the container's pod.
    :param container: the container; ``container.resources`` already carries the update.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """After the runtime updated the container's resources.

    :param pod: the container's pod.
    :param container: the container with its updated resources.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_pre_stop_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Before ``StopContainer`` is forwarded.

    :param pod: the container's pod.
    :param container: the container about to stop.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_stop_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """After the runtime stopped the container.

    :param pod: the container's pod.
    :param container: the stopped container.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_pre_remove_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Before ``RemoveContainer`` is forwarded.

    :param pod: the container's pod.
    :param container: the container about to be removed.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_post_remove_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """After the runtime removed the container; the proxy has forgotten it.

    :param pod: the container's pod.
    :param container: the removed container, as it was stored.
    :param node: the node's config, topology and bound cpusets.
    """


# ---- reconciliation ----------------------------------------------------------------------------


@_stage()
def rhp_reconcile_node(node: NodeFacts) -> Plan | None:
    """Node-wide state: kube-QoS cgroup directories, host applications, resctrl groups.

    The applier writes only what differs from the files on disk.

    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """The pod-level state of a running pod.

    :param pod: a pod known to the proxy, with ``pod.containers`` filled in.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage("resources")
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """The state of a running container.

    May change: the container's resources; the fields that differ from what the runtime last
    accepted, or from the container's cgroup files, are sent through UpdateContainerResources.

    :param pod: the container's pod, with ``pod.containers`` filled in.
    :param container: the container, with the resources the runtime last accepted.
    :param node: the node's config, topology and bound cpusets.
    """


@_stage()
def rhp_reconcile_resctrl_groups(
    node: NodeFacts, pods: tuple[PodFacts, ...], resctrl_groups: tuple[str, ...]
) -> Plan | None:
    """The resctrl control groups left behind: a plan removes (``Plan.remove("resctrl",
    group)``) the groups whose owner is gone. Called by the reconciler at the end of each round
    when the node has resctrl; removals are counted as drift.

    :param node: the node's config, topology and bound cpusets.
    :param pods: every pod known to the proxy, with ``pod.containers`` filled in.
    :param resctrl_groups: the control groups directly under the resctrl root now (not the
        root group, not ``info``), sorted.
    """


@_stage()
def rhp_reconcile_usage(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
    """Node-wide decisions driven by sampled usage: CPU suppress of the BE share, eviction by
    memory and by BE CPU satisfaction. Called by the usage loop after each sampling round.

    May plan writes (kube-QoS, pod and container levels, in the order they must happen) and
    evictions (``Plan.evict``); the usage loop performs them.

    :param node: the node's config, topology and bound cpusets.
    :param pods: every pod known to the proxy, with ``pod.containers`` filled in.
    :param usage: the sampled window, oldest first (``hooks.usage``).
    """


@_stage()
def rhp_reconcile_cpu_burst(node: NodeFacts, pods: tuple[PodFacts, ...], burst: BurstRound) -> Plan | None:
    """Koordinator's cfsQuotaBurst: throttled containers' CFS quota up while the share pool has
    room, down when it is loaded. Called by the CPU burst loop every second.

    May plan container and pod ``cpu.cfs_quota_us`` writes; reports a
    ``hooks.usage.BurstDecision`` per container decided: its writes (applied as one group) and
    its ``state``, handed back in the next round's ``burst.states``.

    :param node: the node's config, topology and bound cpusets.
    :param pods: the pods that call hooks, each with the containers the loop read.
    :param burst: this round's readings and last round's states (``hooks.usage.BurstRound``).
    """


def _stage_name(hook_name: str) -> str:
    return "".join(word.capitalize() for word in hook_name.removeprefix("rhp_").split("_"))


# Every stage (``PreCreateContainer``...) and its hook name, in call order.
STAGES: dict[str, str] = {_stage_name(fn.__name__): fn.__name__ for fn in _SPECS}
# The CRI parts of a plan (``hooks.Plan`` attribute names) each stage may change.
CRI_FIELDS: dict[str, frozenset[str]] = {
    _stage_name(fn.__name__): fn.rhp_cri_fields for fn in _SPECS  # type: ignore[attr-defined]
}

# The hook points of Koordinator's RuntimeHookService (its names are our stage names) that hook
# servers may register for.
KOORD_HOOK_POINTS: dict[str, str] = {
    stage: STAGES[stage]
    for stage in (
        "PreRunPodSandbox",
        "PostStopPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
    )
}

"""The hook specifications: the public contract between the proxy and its plugins.

Every CRI lifecycle call that the proxy intercepts has a ``pre`` hook, called before the call
is forwarded to the runtime, and a ``post`` hook, called after the runtime answered with
success. The ``reconcile`` hooks are called by the reconciler at proxy start, on every node
config change and periodically. A hook is named ``rhp_<pre|post>_<cri call in snake case>``.

How a plugin is called
    - Hooks are called with keyword arguments. An implementation may accept fewer arguments
      than its spec (only the ones it needs), so a spec can gain an argument later without
      breaking plugins. Asking for an argument the spec does not have fails at registration.
    - Each implementation is called on its own, in the configured plugin order, with its own
      timeout and failure policy (``Fail`` or ``Ignore``; default ``Ignore``). This is why the
      specs are not ``firstresult``: every result counts.
    - An implementation returns a ``hooks.plan.Plan`` or ``None`` ("no opinion"). It must not
      do I/O: the proxy's applier performs the plan. Plans are merged in plugin order and a
      field set to different values by two plugins is a conflict (see ``hooks.plan``).
    - Pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` call no hook at all.

What a plan may change, per stage
    - ``pre_run_pod_sandbox``: labels, annotations, cgroup parent of the sandbox request, and
      pod-level writes (performed once the runtime created the sandbox).
    - ``pre_create_container`` and ``pre_update_container_resources``: container resources,
      envs (create only), annotations (create only), and writes at any level (container-level
      writes are performed once the container exists).
    - every other stage and every ``post`` hook: writes, task moves and removals only; CRI
      changes in their plans are ignored and logged.
    - ``reconcile_*``: resources (applied through the runtime's UpdateContainerResources),
      writes, moves and removals.

.. versionadded:: 0.1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from hooks.facts import ContainerFacts, NodeFacts, PodFacts
    from hooks.plan import Plan

PROJECT = "runtime_hook_proxy"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# Hook point names as Koordinator spells them, mapped to our hook names. The proxy dispatches
# out-of-process hook servers (RuntimeHookService) by the Koordinator names.
KOORD_HOOK_POINTS: dict[str, str] = {
    "PreRunPodSandbox": "rhp_pre_run_pod_sandbox",
    "PostStopPodSandbox": "rhp_post_stop_pod_sandbox",
    "PreCreateContainer": "rhp_pre_create_container",
    "PreStartContainer": "rhp_pre_start_container",
    "PostStartContainer": "rhp_post_start_container",
    "PreUpdateContainerResources": "rhp_pre_update_container_resources",
    "PostStopContainer": "rhp_post_stop_container",
}
# Every stage name (``PreCreateContainer``...) mapped to its hook name, in call order.
STAGES: dict[str, str] = {
    "PreRunPodSandbox": "rhp_pre_run_pod_sandbox",
    "PostRunPodSandbox": "rhp_post_run_pod_sandbox",
    "PreStopPodSandbox": "rhp_pre_stop_pod_sandbox",
    "PostStopPodSandbox": "rhp_post_stop_pod_sandbox",
    "PreRemovePodSandbox": "rhp_pre_remove_pod_sandbox",
    "PostRemovePodSandbox": "rhp_post_remove_pod_sandbox",
    "PreCreateContainer": "rhp_pre_create_container",
    "PostCreateContainer": "rhp_post_create_container",
    "PreStartContainer": "rhp_pre_start_container",
    "PostStartContainer": "rhp_post_start_container",
    "PreUpdateContainerResources": "rhp_pre_update_container_resources",
    "PostUpdateContainerResources": "rhp_post_update_container_resources",
    "PreStopContainer": "rhp_pre_stop_container",
    "PostStopContainer": "rhp_post_stop_container",
    "PreRemoveContainer": "rhp_pre_remove_container",
    "PostRemoveContainer": "rhp_post_remove_container",
    "ReconcileNode": "rhp_reconcile_node",
    "ReconcilePod": "rhp_reconcile_pod",
    "ReconcileContainer": "rhp_reconcile_container",
}

# ---- pod sandbox lifecycle, in call order ---------------------------------------------------

@hookspec
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RunPodSandbox``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RunPodSandbox``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_stop_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StopPodSandbox``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_stop_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StopPodSandbox``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_remove_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RemovePodSandbox``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_remove_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RemovePodSandbox``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod sandbox. ``pod.sandbox_id`` is empty before RunPodSandbox returns.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


# ---- container lifecycle, in call order ----------------------------------------------------

@hookspec
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``CreateContainer``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``CreateContainer``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StartContainer``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StartContainer``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``UpdateContainerResources``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``UpdateContainerResources``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_stop_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StopContainer``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_stop_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``StopContainer``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


@hookspec
def rhp_pre_remove_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RemoveContainer``.

    Called before the runtime is called; the plan may change the request.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call for pre hooks; ``Ignore`` logs and
    goes on).
    """


@hookspec
def rhp_post_remove_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan for the CRI call ``RemoveContainer``.

    Called after the runtime answered with success; the plan may only write files.

    :param pod: the pod the container belongs to, as stored at RunPodSandbox.
    :param container: the container. ``container.id`` is empty before CreateContainer returns;
        for UpdateContainerResources, ``container.resources`` already carries the update.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion. Results of all plugins are merged in order.

    Failure policy: per plugin (``Fail`` fails the CRI call; ``Ignore`` logs and
    goes on). Post hooks never fail the call.
    """


# ---- reconciliation --------------------------------------------------------------------------


@hookspec
def rhp_reconcile_node(node: NodeFacts) -> Plan | None:
    """Plan node-wide state: kube-QoS cgroup directories, host applications, resctrl groups.

    Called by the reconciler at proxy start, on every node config change and periodically.
    The applier writes only the differences from what is on disk.

    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion.

    Failure policy: errors are logged and counted; the reconciler goes on with other plugins.
    """


@hookspec
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    """Plan the desired pod-level state of a running pod (stage ``Reconcile``).

    :param pod: a pod known to the proxy, rebuilt from the runtime after a restart.
    :param node: the node's config and topology.
    :returns: a plan of writes, or ``None`` for no opinion.

    Failure policy: errors are logged and counted; never affects a CRI call.
    """


@hookspec
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    """Plan the desired state of a running container (stage ``Reconcile``).

    ``resources`` in the plan are applied through the runtime's UpdateContainerResources
    (only the fields that differ from ``container.resources``); writes go to cgroup files.

    :param pod: the container's pod.
    :param container: the container, with the resources the runtime last accepted.
    :param node: the node's config and topology.
    :returns: a plan, or ``None`` for no opinion.

    Failure policy: errors are logged and counted; never affects a CRI call.
    """

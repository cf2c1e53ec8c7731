"""runtime-hook-proxy's plugin API: everything a plugin author needs, and nothing else.

A plugin is a module (or object) of functions marked with ``hookimpl`` and named after a hook in
``hooks.spec`` (``rhp_pre_create_container``, ``rhp_reconcile_container``...). Each takes the
frozen facts it asks for (``pod: PodFacts``, ``container: ContainerFacts``, ``node: NodeFacts``)
and returns a ``Plan`` or ``None``; it does no I/O. Publish it under the entry-point group
``runtime_hook_proxy.plugins``, with one name for the entry point, the module and the config
entry. The rules every hook shares are in ``hooks.spec``'s module docstring; ``docs/plugins.md``
is the guide.

Besides the facts and the plan: ``Usage`` and ``UsageSample``, the sampled usage that
``rhp_reconcile_usage`` receives; and the cgroup path helpers a plan's writes name their
directories with (``pod_cgroup_path``, ``container_cgroup_path``, ``kube_qos_cgroup_path``,
``host_app_cgroup_path``, and ``CgroupInfo``, the node's cgroup driver and kubelet root they
take), each relative to the cgroup root.

Everything else under ``hooks`` (the plugin manager, merging, the built-in plugins and their
helpers) belongs to the proxy and may change without notice.
"""

from hooks.facts import (
    CgroupInfo,
    ContainerFacts,
    CPUTopology,
    NodeFacts,
    PodFacts,
    Resources,
    container_cgroup_path,
    host_app_cgroup_path,
    kube_qos_cgroup_path,
    pod_cgroup_path,
)
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import Usage, UsageSample

__all__ = [
    "CPUTopology",
    "CgroupInfo",
    "ContainerFacts",
    "NodeFacts",
    "Plan",
    "PodFacts",
    "Resources",
    "Usage",
    "UsageSample",
    "container_cgroup_path",
    "hookimpl",
    "host_app_cgroup_path",
    "kube_qos_cgroup_path",
    "pod_cgroup_path",
]

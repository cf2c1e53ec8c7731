"""Frozen inputs handed to every plugin: what we know about a pod, a container and the node.

The proxy (``runtime_proxy.cri.door``) builds these values once per CRI call from the decoded
request and its store, and the planner (``runtime-proxy plan``) builds them from a JSON document.
Plugins only read them. Nothing here does I/O, so every plugin stays a pure function.

Koordinator's keys and formats live in ``koord_formats``; the helpers here combine those parsers
with the facts (share pools of a node, the resource-status of a pod, cgroup paths). Every
helper that reads an annotation raises only ``koord_formats.FormatError`` (a ``ValueError``)
when it is malformed, so a plugin catches one type and records a skip for that pod alone.

The names live in four modules by meaning, all importable from here (the plugin authors'
API, ``docs/plugins.md``): ``hooks.facts.types`` (the fact types), ``hooks.facts.cgroups``
(kubelet's cgroup layout), ``hooks.facts.pools`` (share pools and the cpusets bound to pods)
and ``hooks.facts.cpu`` (CFS conversions, CPU normalization, CPU burst configuration); the
NodeSLO strategies as typed rules (``NodeFacts.rules``) are ``hooks.facts.rules``.

The kernel's CPU list format ("0-3,8") appears only at the edges, through the single
``parse_cpu_list`` / ``format_cpu_list`` pair; inside the code a CPU set is a ``frozenset[int]``.
"""

from __future__ import annotations

from hooks.facts.cgroups import (
    CGROUP_PARENT_MAX_BYTES,
    KUBELET_ROOT_MAX_BYTES,
    KUBELET_ROOT_MAX_NAMES,
    CgroupInfo,
    CgroupOwner,
    KubeletPodParent,
    KubeletRootChoice,
    cgroup_path_of_parent,
    choose_kubelet_root,
    container_cgroup_path,
    host_app_cgroup_path,
    is_safe_path_part,
    kube_qos_cgroup_path,
    kube_qos_from_cgroup_parent,
    kubelet_root_key,
    parse_kubelet_cgroup_root,
    parse_kubelet_pod_parent,
    pod_cgroup_path,
)
from hooks.facts.cpu import (
    CFS_PERIOD_US,
    MAX_SHARES,
    MIN_QUOTA_US,
    MIN_SHARES,
    CPUQuota,
    container_cpu_quota,
    cpu_normalization_applies,
    cpu_normalization_ratio,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    normalize_cpu_quota,
    pod_cpu_burst_config,
)
from hooks.facts.pools import (
    CPUSET_QOS_CLASSES,
    BoundClaims,
    all_share_pool_cpus,
    allocation_refusal,
    compute_share_pools,
    cpuset_claim_refusal,
    kubelet_cpu_manager_policy,
    node_cpus,
    pod_resource_status,
    resolve_cpuset_claims,
    share_pools,
    system_qos_cpuset,
    trusted_cpuset,
    with_bound_pods,
)
from hooks.facts.rules import SLO_CLASSES, NodeSLORules, Rule, parse_rules
from hooks.facts.types import (
    SCALAR_RESOURCE_FIELDS,
    ContainerChanges,
    ContainerFacts,
    HugepageLimit,
    NodeChanges,
    NodeFacts,
    PodChanges,
    PodFacts,
    ResctrlFacts,
    Resources,
    ResourceValue,
    frozen_map,
    load_json_annotation,
    resource_value,
)
from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from koord_formats.node import CPUSharePool
from koord_formats.pod import ContainerResourceSpec, ResourceStatus
from koord_formats.topology import CPUInfo, CPUTopology

__all__ = [
    "CFS_PERIOD_US",
    "CGROUP_PARENT_MAX_BYTES",
    "CPUSET_QOS_CLASSES",
    "KUBELET_ROOT_MAX_BYTES",
    "KUBELET_ROOT_MAX_NAMES",
    "MAX_SHARES",
    "MIN_QUOTA_US",
    "MIN_SHARES",
    "SCALAR_RESOURCE_FIELDS",
    "SLO_CLASSES",
    "BoundClaims",
    "CPUInfo",
    "CPUQuota",
    "CPUSharePool",
    "CPUTopology",
    "CgroupInfo",
    "CgroupOwner",
    "ContainerChanges",
    "ContainerFacts",
    "ContainerResourceSpec",
    "HugepageLimit",
    "KubeletPodParent",
    "KubeletRootChoice",
    "NodeChanges",
    "NodeFacts",
    "NodeSLORules",
    "PodChanges",
    "PodFacts",
    "ResctrlFacts",
    "ResourceStatus",
    "ResourceValue",
    "Resources",
    "Rule",
    "all_share_pool_cpus",
    "allocation_refusal",
    "cgroup_path_of_parent",
    "choose_kubelet_root",
    "compute_share_pools",
    "container_cgroup_path",
    "container_cpu_quota",
    "cpu_normalization_applies",
    "cpu_normalization_ratio",
    "cpuset_claim_refusal",
    "format_cpu_list",
    "frozen_map",
    "host_app_cgroup_path",
    "is_safe_path_part",
    "kube_qos_cgroup_path",
    "kube_qos_from_cgroup_parent",
    "kubelet_cpu_manager_policy",
    "kubelet_root_key",
    "load_json_annotation",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "node_cpus",
    "normalize_cpu_quota",
    "parse_cpu_list",
    "parse_kubelet_cgroup_root",
    "parse_kubelet_pod_parent",
    "parse_rules",
    "pod_cgroup_path",
    "pod_cpu_burst_config",
    "pod_resource_status",
    "resolve_cpuset_claims",
    "resource_value",
    "share_pools",
    "system_qos_cpuset",
    "trusted_cpuset",
    "with_bound_pods",
]

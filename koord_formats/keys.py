"""Every Koordinator key we read or write, defined once: labels, annotations, resource names,
NodeSLO field names and the enumerations (QoS classes, priority classes, policies).

Spellings are Koordinator's; the file under ``apis/`` of koordinator-sh/koordinator that
defines each group is named above it. Importers use these names, never the string literals.
"""

from __future__ import annotations

__all__ = [
    "ANNOTATION_ALLOCATION_SIGNATURE",
    "ANNOTATION_CPU_QUOTA_NORMALIZATION",
    "ANNOTATION_DEVICE_ALLOCATED",
    "ANNOTATION_EVICTION_POLICY",
    "ANNOTATION_EXTENDED_RESOURCE_SPEC",
    "ANNOTATION_NUMA_TOPOLOGY_SPEC",
    "ANNOTATION_POD_CPU_BURST",
    "ANNOTATION_POD_CPU_QOS",
    "ANNOTATION_POD_MEMORY_QOS",
    "ANNOTATION_POD_RESCTRL",
    "ANNOTATION_RESERVATION_AFFINITY",
    "ANNOTATION_RESERVATION_ALLOCATED",
    "ANNOTATION_RESOURCE_SPEC",
    "ANNOTATION_RESOURCE_STATUS",
    "BIND_POLICIES",
    "BIND_POLICY_CONSTRAINED_BURST",
    "BIND_POLICY_DEFAULT",
    "BIND_POLICY_FULL_PCPUS",
    "BIND_POLICY_SPREAD_BY_PCPUS",
    "CPU_BURST_POLICIES",
    "CPU_EVICT_POLICIES",
    "CPU_EVICT_POLICY_ALLOCATABLE",
    "CPU_EVICT_POLICY_REAL_LIMIT",
    "CPU_POLICIES",
    "CPU_POLICY_CORE_SCHED",
    "CPU_POLICY_GROUP_IDENTITY",
    "CPU_SUPPRESS_POLICY_CFS_QUOTA",
    "CPU_SUPPRESS_POLICY_CPUSET",
    "DEVICE_TYPE_GPU",
    "EVENT_REASON_EVICT_POD_FAIL",
    "EVENT_REASON_EVICT_POD_SUCCESS",
    "EXCLUSIVE_POLICIES",
    "EXCLUSIVE_POLICY_NONE",
    "EXCLUSIVE_POLICY_NUMA_NODE_LEVEL",
    "EXCLUSIVE_POLICY_PCPU_LEVEL",
    "FEATURE_BE_CPU_EVICT",
    "FEATURE_BE_MEMORY_EVICT",
    "GPU_RESOURCE_NAMES",
    "HOST_APP_BASES",
    "HOST_APP_BASE_CGROUP_ROOT",
    "HOST_APP_BASE_KUBEPODS",
    "HOST_APP_BASE_KUBEPODS_BESTEFFORT",
    "HOST_APP_BASE_KUBEPODS_BURSTABLE",
    "KOORD_QOS_CLASSES",
    "LABEL_CPU_BIND_POLICY",
    "LABEL_CPU_NORMALIZATION_ENABLED",
    "LABEL_NUMA_ALLOCATE_STRATEGY",
    "LABEL_NUMA_TOPOLOGY_POLICY",
    "LABEL_PRIORITY",
    "LABEL_PRIORITY_CLASS",
    "LABEL_QOS_CLASS",
    "LABEL_RESERVATION_ORDER",
    "LABEL_SKIP_HOOKSERVER",
    "LEAST_ALLOCATED",
    "MOST_ALLOCATED",
    "NODE_ANNOTATION_BE_CPU_SHARED_POOLS",
    "NODE_ANNOTATION_CPU_BASIC_INFO",
    "NODE_ANNOTATION_CPU_NORMALIZATION_RATIO",
    "NODE_ANNOTATION_CPU_SHARED_POOLS",
    "NODE_ANNOTATION_CPU_TOPOLOGY",
    "NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY",
    "NODE_ANNOTATION_POD_CPU_ALLOCS",
    "NODE_ANNOTATION_RESERVATION",
    "NODE_ANNOTATION_RESOURCE_AMPLIFICATION_RATIO",
    "NODE_ANNOTATION_SYSTEM_QOS_RESOURCE",
    "NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY",
    "NODE_CPU_BIND_POLICY_SPREAD_BY_PCPUS",
    "NRT_POLICY_SINGLE_NUMA_NODE_POD_LEVEL",
    "NUMA_EXCLUSIVE_POLICIES",
    "NUMA_EXCLUSIVE_PREFERRED",
    "NUMA_EXCLUSIVE_REQUIRED",
    "NUMA_NODE_SHARED",
    "NUMA_NODE_SINGLE",
    "NUMA_POLICIES",
    "NUMA_POLICY_BEST_EFFORT",
    "NUMA_POLICY_NONE",
    "NUMA_POLICY_RESTRICTED",
    "NUMA_POLICY_SINGLE_NUMA_NODE",
    "POD_MEMORY_QOS_POLICIES",
    "POD_MEMORY_QOS_POLICY_AUTO",
    "POD_MEMORY_QOS_POLICY_DEFAULT",
    "POD_MEMORY_QOS_POLICY_NONE",
    "PRIORITY_BATCH",
    "PRIORITY_CLASSES",
    "PRIORITY_FREE",
    "PRIORITY_MID",
    "PRIORITY_PROD",
    "QOS_BE",
    "QOS_LS",
    "QOS_LSE",
    "QOS_LSR",
    "QOS_SYSTEM",
    "RESERVATION_ALLOCATE_POLICIES",
    "RESERVATION_ALLOCATE_POLICY_ALIGNED",
    "RESERVATION_ALLOCATE_POLICY_DEFAULT",
    "RESERVATION_ALLOCATE_POLICY_RESTRICTED",
    "RESERVATION_API_GROUP",
    "RESERVATION_API_VERSION",
    "RESERVATION_PHASE_AVAILABLE",
    "RESERVATION_PHASE_WAITING",
    "RESERVATION_PLURAL",
    "RESOURCE_BATCH_CPU",
    "RESOURCE_BATCH_MEMORY",
    "RESOURCE_GPU",
    "RESOURCE_GPU_CORE",
    "RESOURCE_GPU_MEMORY",
    "RESOURCE_GPU_MEMORY_RATIO",
    "RESOURCE_GPU_SHARED",
    "RESOURCE_MEMORY",
    "RESOURCE_MID_CPU",
    "RESOURCE_MID_MEMORY",
    "RESOURCE_NVIDIA_GPU",
    "SLO",
    "SLO_CLASS_KEYS",
]

# ---- QoS classes (apis/extension/qos.go) -------------------------------------------------------
LABEL_QOS_CLASS = "koordinator.sh/qosClass"
QOS_LSE = "LSE"
QOS_LSR = "LSR"
QOS_LS = "LS"
QOS_BE = "BE"
QOS_SYSTEM = "SYSTEM"
KOORD_QOS_CLASSES = (QOS_LSE, QOS_LSR, QOS_LS, QOS_BE, QOS_SYSTEM)

# ---- priority classes (apis/extension/priority.go) ---------------------------------------------
LABEL_PRIORITY = "koordinator.sh/priority"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
PRIORITY_PROD = "koord-prod"
PRIORITY_MID = "koord-mid"
PRIORITY_BATCH = "koord-batch"
PRIORITY_FREE = "koord-free"
PRIORITY_CLASSES = (PRIORITY_PROD, PRIORITY_MID, PRIORITY_BATCH, PRIORITY_FREE)

# ---- koord-runtime-proxy (pkg/runtimeproxy/server/cri, flag --runtime-hook-server-key) ---------
LABEL_SKIP_HOOKSERVER = "runtimeproxy.koordinator.sh/skip-hookserver"
# This project's own container annotation (not Koordinator's): kubelet's CFS quota and the
# normalized quota the proxy gave the runtime at CreateContainer, "<original>/<applied>"
# (plugin ``cpu_normalization``; containerd keeps a container's annotations across restarts).
ANNOTATION_CPU_QUOTA_NORMALIZATION = "runtimeproxy.koordinator.sh/cpu-quota-normalization"

# ---- pod annotations (apis/extension/{numa_aware,device_share,resource,resctrl}.go) ------------
ANNOTATION_RESOURCE_SPEC = "scheduling.koordinator.sh/resource-spec"
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_NUMA_TOPOLOGY_SPEC = "scheduling.koordinator.sh/numa-topology-spec"
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_POD_RESCTRL = "node.koordinator.sh/resctrl"
# Pod overrides of NodeSLO strategies (apis/slo/v1alpha1/pod.go).
ANNOTATION_POD_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_POD_CPU_BURST = "koordinator.sh/cpuBurst"
ANNOTATION_POD_MEMORY_QOS = "koordinator.sh/memoryQOS"
# Its ``policy`` (PodMemoryQOSPolicy): "" reads as "default" (the node's class values),
# "none" turns memory QoS off for the pod, "auto" starts from the class's defaults.
POD_MEMORY_QOS_POLICY_DEFAULT = "default"
POD_MEMORY_QOS_POLICY_NONE = "none"
POD_MEMORY_QOS_POLICY_AUTO = "auto"
POD_MEMORY_QOS_POLICIES = ("", POD_MEMORY_QOS_POLICY_DEFAULT, POD_MEMORY_QOS_POLICY_NONE, POD_MEMORY_QOS_POLICY_AUTO)

# This project's own pod annotation (not Koordinator's; koord-scheduler never writes it): the
# Ed25519 signature scheduler-ext's bind puts over the scheduler-owned annotations it writes
# (``koord_formats.signature``: format, canonical message and parser). Only scheduler-ext's bind
# writes it; node agents with public keys honour a resource-status cpuset only when it verifies.
ANNOTATION_ALLOCATION_SIGNATURE = "scheduler-ext.runtime-hook-proxy.io/signature"

# ---- node labels and annotations (apis/extension/{numa_aware,node_reservation,system_qos,
# ---- cpu_normalization}.go) and NodeResourceTopology annotations ---------------------------------
LABEL_CPU_BIND_POLICY = "node.koordinator.sh/cpu-bind-policy"
LABEL_NUMA_ALLOCATE_STRATEGY = "node.koordinator.sh/numa-allocate-strategy"
LABEL_NUMA_TOPOLOGY_POLICY = "node.koordinator.sh/numa-topology-policy"
NODE_ANNOTATION_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
NODE_ANNOTATION_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
NODE_ANNOTATION_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
NODE_ANNOTATION_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
NODE_ANNOTATION_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
NODE_ANNOTATION_RESERVATION = "node.koordinator.sh/reservation"
NODE_ANNOTATION_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
# A node label "true"/"false" that overrides cpu-normalization-config's enable for that node.
LABEL_CPU_NORMALIZATION_ENABLED = "node.koordinator.sh/cpu-normalization-enabled"
# NodeResourceTopology annotation: the node's CPU model, hyper-threading and turbo
# (koord_formats.cpunormalization, which the manager reads to choose the ratio).
NODE_ANNOTATION_CPU_BASIC_INFO = "node.koordinator.sh/cpu-basic-info"
# apis/extension/node_resource_amplification.go: resource name -> ratio, e.g. {"cpu": 1.5}.
NODE_ANNOTATION_RESOURCE_AMPLIFICATION_RATIO = "node.koordinator.sh/resource-amplification-ratio"

# ---- reservations (apis/extension/reservation.go, apis/scheduling/v1alpha1/reservation_types.go) --
# The Reservation kind: cluster-scoped, ``scheduling.koordinator.sh/v1alpha1``, plural ``reservations``.
RESERVATION_API_GROUP = "scheduling.koordinator.sh"
RESERVATION_API_VERSION = "v1alpha1"
RESERVATION_PLURAL = "reservations"
# Pod annotation: the reservation affinity a pod requires (JSON ``ReservationAffinity``).
ANNOTATION_RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"
# Pod annotation the scheduler writes at bind: the reservation the pod was allocated from,
# ``{"name":"r1","uid":"..."}``.
ANNOTATION_RESERVATION_ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"
# Reservation label: a positive integer, the lowest order is nominated first.
LABEL_RESERVATION_ORDER = "scheduling.koordinator.sh/reservation-order"
# The phases a reservation is usable in (``status.phase``; Pending, Succeeded and Failed are not).
RESERVATION_PHASE_AVAILABLE = "Available"
RESERVATION_PHASE_WAITING = "Waiting"
# ``spec.allocatePolicy``: "" (Default, deprecated, read as Aligned), Aligned or Restricted.
RESERVATION_ALLOCATE_POLICY_DEFAULT = ""
RESERVATION_ALLOCATE_POLICY_ALIGNED = "Aligned"
RESERVATION_ALLOCATE_POLICY_RESTRICTED = "Restricted"
RESERVATION_ALLOCATE_POLICIES = (
    RESERVATION_ALLOCATE_POLICY_DEFAULT,
    RESERVATION_ALLOCATE_POLICY_ALIGNED,
    RESERVATION_ALLOCATE_POLICY_RESTRICTED,
)

# ---- resource names (apis/extension/resource.go, device_share.go) ------------------------------
RESOURCE_BATCH_CPU = "kubernetes.io/batch-cpu"  # integer milli-cores
RESOURCE_BATCH_MEMORY = "kubernetes.io/batch-memory"  # bytes
RESOURCE_MEMORY = "memory"  # the pod spec's own memory request and limit, bytes
RESOURCE_MID_CPU = "kubernetes.io/mid-cpu"
RESOURCE_MID_MEMORY = "kubernetes.io/mid-memory"
RESOURCE_NVIDIA_GPU = "nvidia.com/gpu"
RESOURCE_GPU = "koordinator.sh/gpu"
RESOURCE_GPU_SHARED = "koordinator.sh/gpu.shared"
RESOURCE_GPU_CORE = "koordinator.sh/gpu-core"
RESOURCE_GPU_MEMORY = "koordinator.sh/gpu-memory"
RESOURCE_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
# Device types: the keys of device-allocated and Device ``spec.devices[].type``.
DEVICE_TYPE_GPU = "gpu"
GPU_RESOURCE_NAMES = (
    RESOURCE_NVIDIA_GPU,
    RESOURCE_GPU,
    RESOURCE_GPU_SHARED,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
)

# ---- scheduling policies (apis/extension/numa_aware.go) ----------------------------------------
BIND_POLICY_DEFAULT = "Default"
BIND_POLICY_FULL_PCPUS = "FullPCPUs"
BIND_POLICY_SPREAD_BY_PCPUS = "SpreadByPCPUs"
BIND_POLICY_CONSTRAINED_BURST = "ConstrainedBurst"
BIND_POLICIES = (
    BIND_POLICY_DEFAULT,
    BIND_POLICY_FULL_PCPUS,
    BIND_POLICY_SPREAD_BY_PCPUS,
    BIND_POLICY_CONSTRAINED_BURST,
)
EXCLUSIVE_POLICY_NONE = "None"
EXCLUSIVE_POLICY_PCPU_LEVEL = "PCPULevel"
EXCLUSIVE_POLICY_NUMA_NODE_LEVEL = "NUMANodeLevel"
EXCLUSIVE_POLICIES = (EXCLUSIVE_POLICY_NONE, EXCLUSIVE_POLICY_PCPU_LEVEL, EXCLUSIVE_POLICY_NUMA_NODE_LEVEL)
NUMA_POLICY_NONE = "None"
NUMA_POLICY_BEST_EFFORT = "BestEffort"
NUMA_POLICY_RESTRICTED = "Restricted"
NUMA_POLICY_SINGLE_NUMA_NODE = "SingleNUMANode"
NUMA_POLICIES = (NUMA_POLICY_NONE, NUMA_POLICY_BEST_EFFORT, NUMA_POLICY_RESTRICTED, NUMA_POLICY_SINGLE_NUMA_NODE)
# kubelet's Topology Manager policy as a NodeResourceTopology's ``topologyPolicies`` names it;
# koord-scheduler honours these three (BestEffort and Restricted are spelled as the NUMA policies).
NRT_POLICY_SINGLE_NUMA_NODE_POD_LEVEL = "SingleNUMANodePodLevel"
# Values of numa-topology-spec's singleNUMANodeExclusive (apis/extension/numa_aware.go); the
# scheduler reads "" as Required when the pod names a NUMA policy.
NUMA_EXCLUSIVE_PREFERRED = "Preferred"
NUMA_EXCLUSIVE_REQUIRED = "Required"
NUMA_EXCLUSIVE_POLICIES = (NUMA_EXCLUSIVE_PREFERRED, NUMA_EXCLUSIVE_REQUIRED)
# States of a NUMA node as the scheduler sees the cpusets on it (``NumaNodeStatus``); a node
# with no cpuset is "idle".
NUMA_NODE_SINGLE = "single"  # only cpusets confined to this one NUMA node hold CPUs here
NUMA_NODE_SHARED = "shared"  # a cpuset spanning several NUMA nodes holds CPUs here
# Values of the node label cpu-bind-policy.
NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY = "FullPCPUsOnly"
NODE_CPU_BIND_POLICY_SPREAD_BY_PCPUS = "SpreadByPCPUs"
# Values of the node label numa-allocate-strategy (LeastAllocated when absent; DistributeEvenly is
# read as LeastAllocated here); MostAllocated and LeastAllocated are also the scoring strategies
# of koord-scheduler's plugins (pkg/scheduler/apis/config ``ScoringStrategyType``), spelled the same.
MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"


# ---- NodeSLO spec field names (apis/slo/v1alpha1/nodeslo_types.go, host_application.go) -------
class SLO:
    """NodeSLO ``spec`` field names, in Koordinator's camelCase. A namespace, never instantiated."""

    RESOURCE_QOS_STRATEGY = "resourceQOSStrategy"
    POLICIES = "policies"
    CPU_POLICY = "cpuPolicy"
    LSR_CLASS = "lsrClass"
    LS_CLASS = "lsClass"
    BE_CLASS = "beClass"
    SYSTEM_CLASS = "systemClass"
    CGROUP_ROOT = "cgroupRoot"
    CPU_QOS = "cpuQOS"
    RESCTRL_QOS = "resctrlQOS"
    MEMORY_QOS = "memoryQOS"
    MIN_LIMIT_PERCENT = "minLimitPercent"
    LOW_LIMIT_PERCENT = "lowLimitPercent"
    THROTTLING_PERCENT = "throttlingPercent"
    WMARK_RATIO = "wmarkRatio"
    WMARK_SCALE_PERMILL = "wmarkScalePermill"
    WMARK_MIN_ADJ = "wmarkMinAdj"
    PRIORITY_ENABLE = "priorityEnable"
    OOM_KILL_GROUP = "oomKillGroup"
    ENABLE = "enable"
    GROUP_IDENTITY = "groupIdentity"
    SCHED_IDLE = "schedIdle"
    CORE_EXPELLER = "coreExpeller"
    CAT_RANGE_START_PERCENT = "catRangeStartPercent"
    CAT_RANGE_END_PERCENT = "catRangeEndPercent"
    MBA_PERCENT = "mbaPercent"
    CPU_BURST_STRATEGY = "cpuBurstStrategy"
    POLICY = "policy"
    CPU_BURST_PERCENT = "cpuBurstPercent"
    CFS_QUOTA_BURST_PERCENT = "cfsQuotaBurstPercent"
    CFS_QUOTA_BURST_PERIOD_SECONDS = "cfsQuotaBurstPeriodSeconds"
    SHARE_POOL_THRESHOLD_PERCENT = "sharePoolThresholdPercent"
    RESOURCE_USED_THRESHOLD_WITH_BE = "resourceUsedThresholdWithBE"
    CPU_SUPPRESS_THRESHOLD_PERCENT = "cpuSuppressThresholdPercent"
    CPU_SUPPRESS_POLICY = "cpuSuppressPolicy"
    CPU_SUPPRESS_MIN_PERCENT = "cpuSuppressMinPercent"
    MEMORY_EVICT_THRESHOLD_PERCENT = "memoryEvictThresholdPercent"
    MEMORY_EVICT_LOWER_PERCENT = "memoryEvictLowerPercent"
    CPU_EVICT_BE_SATISFACTION_LOWER_PERCENT = "cpuEvictBESatisfactionLowerPercent"
    CPU_EVICT_BE_SATISFACTION_UPPER_PERCENT = "cpuEvictBESatisfactionUpperPercent"
    CPU_EVICT_BE_USAGE_THRESHOLD_PERCENT = "cpuEvictBEUsageThresholdPercent"
    CPU_EVICT_TIME_WINDOW_SECONDS = "cpuEvictTimeWindowSeconds"
    CPU_EVICT_POLICY = "cpuEvictPolicy"
    EVICT_ENABLED_PRIORITY_THRESHOLD = "evictEnabledPriorityThreshold"
    HOST_APPLICATIONS = "hostApplications"
    NAME = "name"
    QOS = "qos"
    PRIORITY = "priority"
    CGROUP_PATH = "cgroupPath"
    BASE = "base"
    PARENT_DIR = "parentDir"
    RELATIVE_PATH = "relativePath"


# The NodeSLO class section each Koordinator QoS class reads (LSE shares the LSR section).
SLO_CLASS_KEYS = {
    QOS_LSE: SLO.LSR_CLASS,
    QOS_LSR: SLO.LSR_CLASS,
    QOS_LS: SLO.LS_CLASS,
    QOS_BE: SLO.BE_CLASS,
    QOS_SYSTEM: SLO.SYSTEM_CLASS,
}
CPU_POLICY_GROUP_IDENTITY = "groupIdentity"
CPU_POLICY_CORE_SCHED = "coreSched"
CPU_POLICIES = ("", CPU_POLICY_GROUP_IDENTITY, CPU_POLICY_CORE_SCHED)
CPU_BURST_POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")
CPU_SUPPRESS_POLICY_CPUSET = "cpuset"
CPU_SUPPRESS_POLICY_CFS_QUOTA = "cfsQuota"
HOST_APP_BASE_CGROUP_ROOT = "CgroupRoot"
HOST_APP_BASE_KUBEPODS = "Kubepods"
HOST_APP_BASE_KUBEPODS_BURSTABLE = "KubepodsBurstable"
HOST_APP_BASE_KUBEPODS_BESTEFFORT = "KubepodsBesteffort"
HOST_APP_BASES = (
    HOST_APP_BASE_CGROUP_ROOT,
    HOST_APP_BASE_KUBEPODS,
    HOST_APP_BASE_KUBEPODS_BURSTABLE,
    HOST_APP_BASE_KUBEPODS_BESTEFFORT,
)

# ---- eviction (apis/slo/v1alpha1/nodeslo_types.go, apis/extension/eviction.go) ------------------
CPU_EVICT_POLICY_REAL_LIMIT = "evictByRealLimit"
CPU_EVICT_POLICY_ALLOCATABLE = "evictByAllocatable"
CPU_EVICT_POLICIES = (CPU_EVICT_POLICY_REAL_LIMIT, CPU_EVICT_POLICY_ALLOCATABLE)
# Pod annotation: a JSON list of the eviction features allowed to evict the pod
# ('["BEMemoryEvict","BECPUEvict"]'); absent means every feature may.
ANNOTATION_EVICTION_POLICY = "koordinator.sh/eviction-policy"
# Reasons of the Events koordlet records on an evicted pod (pkg/koordlet/qosmanager/helpers).
EVENT_REASON_EVICT_POD_SUCCESS = "evictPodSuccess"
EVENT_REASON_EVICT_POD_FAIL = "evictPodFail"
# koordlet's feature-gate names of the evictions, used in that annotation and in Events.
FEATURE_BE_MEMORY_EVICT = "BEMemoryEvict"
FEATURE_BE_CPU_EVICT = "BECPUEvict"

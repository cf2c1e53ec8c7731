"""Built-in plugins, one module each. Every module is a plain module of ``@hookimpl`` functions
that return plans and do no I/O. ``BUILTIN_PLUGINS`` lists them in their default order; a
plugin's module name, registration name and config name are the same string.

- ``cpuset``: cpuset decision (bind, share pools, BE clear) and CFS quota unset for bound pods.
- ``numa``: ``cpuset_mems`` from the scheduler's ``numaNodeResources`` (our addition).
- ``group_identity``: ``cpu.bvt_warp_ns`` per QoS class at pod and kube-QoS level (or
  ``cpu.idle`` under ``cpuPolicy: coreSched``).
- ``batch_resource``: BE pods' batch-cpu/batch-memory as shares, quota and memory limit.
- ``cpu_normalization``: LS and label-less pods' CFS quotas divided by the node's
  ``cpu-normalization-ratio`` (CRI quota, pod and container ``cpu.cfs_quota_us``); after
  ``batch_resource`` (which divides BE batch quotas by the same ratio) and before ``cpu_burst``
  (whose burst and cfsQuotaBurst base are the normalized quota).
- ``gpu_env``: ``NVIDIA_VISIBLE_DEVICES`` from the device allocation.
- ``cpu_burst``: ``cpu.cfs_burst_us`` from ``cpuBurstStrategy``, and cfsQuotaBurst (the
  ``ReconcileCpuBurst`` stage the CPU burst loop runs every second).
- ``rdt``: resctrl class groups (LSR/LS/BE), pod-level groups, task moves, removal (also of
  the groups left behind, at ``ReconcileResctrlGroups``).
- ``host_app_qos``: group identity and the LS cpuset for NodeSLO ``hostApplications``.
- ``cpu_suppress``: the BE share (kube-QoS quota or BE cpusets) from sampled usage, at the
  ``ReconcileUsage`` stage run by the usage loop (``runtime_proxy.loops.qos``).
- ``memory_qos``: ``memory.min``, ``memory.low``, ``memory.high`` by QoS class at container,
  pod and kube-QoS level from NodeSLO ``memoryQOS``, on cgroup v2 only (stage
  ``ReconcileUsage``).
- ``memory_evict``: BE pods evicted when node memory crosses ``memoryEvictThresholdPercent``
  (stage ``ReconcileUsage``).
- ``cpu_evict``: BE pods evicted when BE CPU satisfaction stays below
  ``cpuEvictBESatisfactionLowerPercent`` (stage ``ReconcileUsage``).
"""

BUILTIN_PLUGINS: tuple[str, ...] = (
    "cpuset",
    "numa",
    "group_identity",
    "batch_resource",
    "cpu_normalization",
    "gpu_env",
    "cpu_burst",
    "rdt",
    "host_app_qos",
    "cpu_suppress",
    "memory_qos",
    "memory_evict",
    "cpu_evict",
)

"""``report``: the node agent's reports to the cluster (``runtime_proxy.report``), off by default.

The model lives here, beside what it configures; ``runtime_proxy.config.ProxyConfig`` holds it
as its ``report`` key (``docs/config.md``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ReportConfig"]


class ReportConfig(BaseModel):
    """``report``: NodeResourceTopology, Device and NodeMetric status, as koordlet reports them."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(default=False, description="Report this node to the cluster as koordlet does: its "
                         "NodeResourceTopology (CPU topology from sysfs, kubelet's CPU manager policy, share "
                         "pools, NUMA zones), a Device with its NVIDIA GPUs (none without GPUs) and its "
                         "NodeMetric's status (usage with percentiles, from the usage sampler). In-cluster or "
                         "kubeconfig credentials; RBAC: `packaging/kustomize/components/report`. Needs the "
                         "`kubernetes` client, the `[cluster]` extra (in the Debian package and the node image; a "
                         "wheel install: README.md, \"Install the wheel\"). Turn it off where "
                         "koordlet runs.")
    intervalSeconds: float = Field(default=10.0, ge=1, le=3600, description="Seconds between two checks of the "
                                   "NodeResourceTopology and Device (written only when what they report changed, "
                                   "and re-read every `resyncSeconds`).")
    resyncSeconds: float = Field(default=300.0, ge=10, le=86400, description="Seconds after which the "
                                 "NodeResourceTopology and Device are read back even when nothing changed here, "
                                 "so a change made by someone else is put right.")
    nodeMetricMinIntervalSeconds: float = Field(default=30.0, ge=1, le=3600, description="The shortest time "
                                                "between two NodeMetric status reports (koordlet: 30; the "
                                                "NodeMetric's `reportIntervalSeconds` sets the period above it).")
    createNodeMetric: bool = Field(default=False, description="Create this node's NodeMetric (default spec) "
                                   "when it does not exist, for a cluster without a manager; needs `create` on "
                                   "`nodemetrics`, which the packaged RBAC does not grant. Off: the manager "
                                   "creates it, as koord-manager does, and the node only writes its status.")
    sysRoot: str = Field(default="/sys", description="Where sysfs is read: the CPU topology, NUMA memory, "
                         "PCI devices (GPUs), SMT and turbo state and resctrl's L3 mask (the CPU basic info).")
    procRoot: str = Field(default="/proc", description="Where `cpuinfo` (the CPU model and vendor of "
                          "`node.koordinator.sh/cpu-basic-info`) and the NVIDIA driver's files "
                          "(`driver/nvidia/gpus/<bus id>/information`) are read.")
    kubeletConfigFile: str = Field(default="/var/lib/kubelet/config.yaml", description="kubelet's config file "
                                   "(its CPU manager policy, options and reserved CPUs, its topology manager "
                                   "policy and scope); absent or empty: kubelet's defaults (`none`).")
    kubeletCPUManagerStateFile: str = Field(default="/var/lib/kubelet/cpu_manager_state", description="kubelet's "
                                            "CPU manager checkpoint: under the `static` policy, the CPUs it pinned "
                                            "for pods that are neither LS nor BE are reported "
                                            "(`node.koordinator.sh/pod-cpu-allocs`) and left out of the share "
                                            "pools. Absent or empty: none.")
    gpuMemoryBytes: int | None = Field(default=None, ge=0, le=2**50, description="Each GPU's memory in bytes "
                                       "(`koordinator.sh/gpu-memory`); the driver's files do not tell it. Unset: "
                                       "left out of the Device.")

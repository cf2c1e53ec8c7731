"""Helpers for the QoS plugin tests on real containerd (``test_qos_plugins_real.py``): the node
config file the built-ins read, Koordinator's pod annotations, kubelet's pod-level cgroup set-up,
and reading and polling the real cgroup files."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rhp_devenv.cgroupfs import (
    CGROUP_ROOT,
    cgroup_hierarchies,
    read_cgroup_file,
    relative_cgroup_path,
    remove_cgroup_tree,
)

from koord_formats.topology import format_cpu_topology
from runtime_proxy.host.cgroups import v1_controller
from runtime_proxy.state.sysfs import read_cpu_topology

T = TypeVar("T")

LABEL_QOS = "koordinator.sh/qosClass"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"

NODE_SLO: dict[str, Any] = {
    # As slo-controller renders it by default: no group identity, no resctrl, no CPU suppress.
    "resourceQOSStrategy": {
        "lsrClass": {"cpuQOS": {"enable": False}, "resctrlQOS": {"enable": False}},
        "lsClass": {"cpuQOS": {"enable": False}, "resctrlQOS": {"enable": False}},
        "beClass": {"cpuQOS": {"enable": False}, "resctrlQOS": {"enable": False}},
    },
    "resourceUsedThresholdWithBE": {"enable": False},
    "cpuBurstStrategy": {"policy": "none"},
}


def node_topology_annotations(**extra: str) -> dict[str, str]:
    """The NodeResourceTopology annotations koordlet reports for this machine: its CPU
    topology (from sysfs), kubelet's CPU manager policy ``none``, and ``extra``."""
    return {
        CPU_TOPOLOGY: format_cpu_topology(read_cpu_topology()),
        CPU_MANAGER_POLICY: json.dumps({"policy": "none"}),
        **extra,
    }


def write_node_config(path: Path, *, nrt: Mapping[str, str] | None = None, name: str = "rhp-qos-node") -> Path:
    """Write the proxy's node config file (``nodeConfigFile``): node name, NRT annotations
    (``nrt``, default :func:`node_topology_annotations`) and the NodeSLO spec."""
    doc = {
        "name": name,
        "labels": {"kubernetes.io/hostname": name},
        "nodeResourceTopology": {"annotations": dict(nrt if nrt is not None else node_topology_annotations())},
        "nodeSLO": NODE_SLO,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    return path


def share_pools_annotation(cpus: str) -> str:
    """``node.koordinator.sh/cpu-shared-pools`` with one pool (socket 0, NUMA node 0)."""
    return json.dumps([{"socket": 0, "node": 0, "cpuset": cpus}])


def nrt_with_share_pool(cpus: str) -> dict[str, str]:
    """:func:`node_topology_annotations` plus the LS share pool koordlet computed."""
    return node_topology_annotations(**{CPU_SHARED_POOLS: share_pools_annotation(cpus)})


def resource_status(cpuset: str = "", numa: Mapping[int, Mapping[str, str]] | None = None) -> str:
    """``scheduling.koordinator.sh/resource-status`` as koord-scheduler writes it."""
    data: dict[str, Any] = {}
    if cpuset:
        data["cpuset"] = cpuset
    if numa:
        data["numaNodeResources"] = [{"node": n, "resources": dict(r)} for n, r in numa.items()]
    return json.dumps(data)


def extended_resource_spec(containers: Mapping[str, Mapping[str, Mapping[str, str]]]) -> str:
    """``node.koordinator.sh/extended-resource-spec`` as koord-manager's webhook writes it."""
    return json.dumps({"containers": {name: dict(spec) for name, spec in containers.items()}})


def pod_dir(cgroup_parent: str, file: str) -> Path:
    """The host directory of a pod cgroup in the v1 hierarchy that holds ``file``."""
    return CGROUP_ROOT / v1_controller(file) / relative_cgroup_path(cgroup_parent)


def kubelet_pod_cgroup(cgroup_parent: str, values: Mapping[str, int | str]) -> None:
    """Create the pod cgroup before RunPodSandbox and set pod-level values, as kubelet's pod
    container manager does (e.g. a Guaranteed pod's ``cpu.cfs_quota_us``)."""
    for file, value in values.items():
        directory = pod_dir(cgroup_parent, file)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / file).write_text(f"{value}\n")


@contextlib.contextmanager
def kubelet_qos_tree(root: str) -> Iterator[str]:
    """kubelet's QoS cgroups below the cgroup root ``root`` (``--cgroup-root``, cgroupfs driver)
    in every hierarchy, as kubelet's container manager makes them before any pod:
    ``<root>/kubepods/burstable`` and ``<root>/kubepods/besteffort`` (cpuset dirs take their
    parent's CPUs and memory nodes; besteffort ``cpu.shares`` 2). Removed afterwards with
    everything below it (processes left there are killed: use only a root of your own)."""
    names = [root, f"{root}/kubepods", f"{root}/kubepods/burstable", f"{root}/kubepods/besteffort"]
    try:
        for hierarchy in cgroup_hierarchies():
            for name in names:
                directory = hierarchy / relative_cgroup_path(name)
                directory.mkdir(exist_ok=True)
                if hierarchy.name == "cpuset":
                    for file in ("cpuset.cpus", "cpuset.mems"):
                        if not (directory / file).read_text().strip():
                            (directory / file).write_text((directory.parent / file).read_text())
        be_cpu = CGROUP_ROOT / "cpu" / relative_cgroup_path(names[-1])
        if be_cpu.is_dir():  # cgroup v1
            (be_cpu / "cpu.shares").write_text("2\n")
        yield root
    finally:
        remove_cgroup_tree(root, kill=True)


def read_pod_file(cgroup_parent: str, file: str) -> str:
    """A pod-level cgroup file, stripped."""
    return (pod_dir(cgroup_parent, file) / file).read_text().strip()


def read_container_file(cgroup_parent: str, container_id: str, file: str) -> str:
    """A container's (or sandbox's) cgroup file, stripped; the controller follows the file name."""
    return read_cgroup_file(cgroup_parent, container_id, v1_controller(file), file)


def wait_for(read: Callable[[], T], expected: T, *, what: str, timeout: float = 15.0) -> T:
    """Poll ``read()`` until it returns ``expected``; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value == expected:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout} s (want {expected!r})")
        time.sleep(0.02)

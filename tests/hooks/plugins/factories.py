"""Facts factories for plugin table tests: short calls that read like the row they build."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hooks.facts import CgroupInfo, ContainerFacts, CPUTopology, NodeFacts, PodFacts, ResctrlFacts, Resources
from hooks.plan import Plan
from tests.topologies import DUAL_SOCKET_HT, cpus

PARENTS = {
    "Guaranteed": "/kubepods/pod{uid}",
    "Burstable": "/kubepods/burstable/pod{uid}",
    "BestEffort": "/kubepods/besteffort/pod{uid}",
}


def status(cpuset: str | None = None, numa: list[dict[str, Any]] | None = None) -> str:
    """A ``scheduling.koordinator.sh/resource-status`` value."""
    data: dict[str, Any] = {}
    if cpuset is not None:
        data["cpuset"] = cpuset
    if numa is not None:
        data["numaNodeResources"] = numa
    return json.dumps(data)


def pod(
    qos: str | None = None,
    *,
    kube: str = "Burstable",
    uid: str = "uid-1",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    parent: str | None = None,
    sandbox_id: str = "",
    containers: tuple[ContainerFacts, ...] = (),
) -> PodFacts:
    all_labels = dict(labels or {})
    if qos is not None:
        all_labels["koordinator.sh/qosClass"] = qos
    return PodFacts(
        name="p",
        namespace="ns",
        uid=uid,
        labels=MappingProxyType(all_labels),
        annotations=MappingProxyType(dict(annotations or {})),
        cgroup_parent=parent if parent is not None else PARENTS[kube].format(uid=uid),
        sandbox_id=sandbox_id,
        containers=containers,
    )


def container(name: str = "c1", cid: str = "", **resources: Any) -> ContainerFacts:
    return ContainerFacts(name=name, id=cid, resources=Resources(**resources))


def node(
    topology: CPUTopology | None = DUAL_SOCKET_HT,
    *,
    slo: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    bound: Mapping[str, str] | None = None,
    lse: tuple[str, ...] = (),
    driver: str = "cgroupfs",
    resctrl: ResctrlFacts | None = None,
) -> NodeFacts:
    return NodeFacts(
        name="node-1",
        annotations=MappingProxyType(dict(annotations or {})),
        node_slo=MappingProxyType(dict(slo or {})),
        cpu_topology=topology,
        bound_cpusets=MappingProxyType({k: cpus(v) for k, v in (bound or {}).items()}),
        lse_pods=frozenset(lse),
        cgroup=CgroupInfo(driver=driver),
        resctrl=resctrl or ResctrlFacts(),
    )


def call(module: Any, hook: str, **kwargs: Any) -> Plan:
    """Call a plugin's hook; a ``None`` result becomes an empty plan."""
    plan = getattr(module, hook)(**kwargs)
    return plan if plan is not None else Plan()


def writes(plan: Plan) -> list[tuple[str, str, str, str]]:
    return [(w.level, w.path, w.file, w.value) for w in plan.writes]


def slo_class(cls: str, **cpu_qos: Any) -> dict[str, Any]:
    """NodeSLO spec with ``resourceQOSStrategy.<cls>.cpuQOS`` set."""
    return {"resourceQOSStrategy": {cls: {"cpuQOS": cpu_qos}}}

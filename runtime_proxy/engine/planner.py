"""The planner: what the hooks would do for one JSON document, without doing it
(``plan_document``; the command is ``runtime-proxy plan``, ``runtime_proxy.commands.plan``).

The document's schema is in ``docs/planner.md``; its shape is checked by ``PlanDocument`` (after
the caller's bounded JSON load), so an unknown key is an error naming its path. The planner
builds the same facts the proxy builds and runs the stage through the proxy's own hook runner
(``runtime_proxy.engine.pipeline.Pipeline``: plugin order, facts advanced from step to step,
the stage's CRI fields from ``hooks.spec.CRI_FIELDS``, merge and conflicts) over the plugin
manager it is given (``runtime_proxy.compose.plugin_manager`` gives what the proxy would load),
then returns the result: ``cri`` (the request changes the stage accepts), ``writes``, ``moves``,
``removals``, ``skipped`` and ``conflicts``, and ``evictions`` when the ``ReconcileUsage`` stage
ran (its ``pods`` and ``usage`` input decoded by ``runtime_proxy.engine.usage_input``). The plan
lists what a kernel that supports each file would get; nothing is read from or written to the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal

import pluggy
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from hooks.facts import (
    CgroupInfo,
    ContainerFacts,
    CPUTopology,
    NodeFacts,
    PodFacts,
    ResctrlFacts,
    Resources,
    frozen_map,
    load_json_annotation,
    parse_cpu_list,
)
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import MergeResult
from hooks.spec import STAGES
from hooks.usage import Usage
from koord_formats.keys import NODE_ANNOTATION_CPU_TOPOLOGY
from runtime_proxy.config import PluginConfig, ProxyConfig, validation_message
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.engine.usage_input import UsageInputError, usage_from_json

__all__ = [
    "PlanDocument",
    "PlanInputError",
    "container_facts_from_json",
    "node_facts_from_json",
    "plan_document",
    "pod_facts_from_json",
    "run_stages",
    "shorten",
]

POD_STAGES = {name for name, hook in STAGES.items() if "pod_sandbox" in hook} | {"ReconcilePod"}
NODE_STAGES = {"ReconcileNode"}
USAGE_STAGE = "ReconcileUsage"
# Stages whose arguments only their loop has (what it read this round): not planned here.
LOOP_STAGES = {"ReconcileCpuBurst": "the CPU burst loop", "ReconcileResctrlGroups": "the reconciler"}
MAX_USAGE_PODS = 4096


class PlanInputError(ValueError):
    """The planner document is malformed; the message says where."""


# ---- the document's shape (checked before any fact is built) ----------------------------------


class _Strict(BaseModel):
    """Unknown keys are errors; ``null`` means absent (as the fact builders below treat it)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: object) -> object:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data


class ContainerDocument(_Strict):
    name: StrictStr = ""
    id: StrictStr = ""
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    annotations: dict[str, StrictStr] = Field(default_factory=dict)
    envs: dict[str, StrictStr] = Field(default_factory=dict)
    resources: dict[str, object] = Field(default_factory=dict)  # checked by hooks.facts.Resources.from_dict


class PodDocument(_Strict):
    name: StrictStr = ""
    namespace: StrictStr = ""
    uid: StrictStr = ""
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    annotations: dict[str, StrictStr] = Field(default_factory=dict)
    cgroupParent: StrictStr = ""
    kubeQOS: StrictStr = ""
    sandboxId: StrictStr = ""
    containers: list[ContainerDocument] = Field(default_factory=list)
    priority: StrictInt | None = None


class ResctrlDocument(_Strict):
    cbmMask: StrictStr = ""
    cacheIds: list[StrictInt] = Field(default_factory=list)
    vendor: StrictStr = "intel"


class CgroupDocument(_Strict):
    version: StrictInt = 1
    driver: StrictStr = "cgroupfs"
    kubeletRoot: StrictStr = "/"  # checked by hooks.facts.parse_kubelet_cgroup_root


class NodeDocument(_Strict):
    name: StrictStr = ""
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    annotations: dict[str, StrictStr] = Field(default_factory=dict)
    cpuTopology: dict[str, object] | None = None  # checked by hooks.facts.CPUTopology.from_annotation
    boundCPUs: dict[str, StrictStr] = Field(default_factory=dict)
    lsePods: list[StrictStr] = Field(default_factory=list)
    resctrl: ResctrlDocument = Field(default_factory=ResctrlDocument)
    cgroup: CgroupDocument = Field(default_factory=CgroupDocument)


class PlanDocument(_Strict):
    """The planner's input (``docs/planner.md``): the keys and their JSON types. Values are
    checked further by the fact builders (CPU lists, kube QoS, topology, resources); the
    NodeSLO spec's own keys by the plugins through ``koord_formats`` (bad values are skips)."""

    stage: StrictStr
    pod: PodDocument | None = None
    container: ContainerDocument | None = None
    node: NodeDocument = Field(default_factory=NodeDocument)
    nodeSLO: dict[str, object] = Field(default_factory=dict)  # read by the plugins through koord_formats
    plugins: list[StrictStr] | None = None
    # The ReconcileUsage stage's input: every pod and the sampled usage window (checked by
    # runtime_proxy.engine.usage_input).
    pods: list[PodDocument] | None = Field(default=None, max_length=MAX_USAGE_PODS)
    usage: dict[str, object] | None = None  # checked by runtime_proxy.engine.usage_input


def _check_shape(doc: Mapping[str, object]) -> None:
    try:
        PlanDocument.model_validate(doc)
    except ValidationError as exc:
        raise PlanInputError(validation_message(exc, PlanDocument)) from exc
    except RecursionError as exc:
        raise PlanInputError("nested too deeply") from exc


def _map(data: Mapping[str, object], key: str, where: str) -> Mapping[str, str]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PlanInputError(f"{where}.{key} must be a map of strings")
    return frozen_map(value)


def _str(data: Mapping[str, object], key: str, where: str, default: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise PlanInputError(f"{where}.{key} must be a string")
    return value


def container_facts_from_json(data: object, where: str = "container") -> ContainerFacts:
    """``{"name","id","annotations","labels","resources","envs"}`` -> ``ContainerFacts``."""
    if not isinstance(data, Mapping):
        raise PlanInputError(f"{where} must be an object")
    try:
        resources = Resources.from_dict(data.get("resources"))
    except (ValueError, TypeError, KeyError) as exc:
        raise PlanInputError(f"{where}.resources: {exc}") from exc
    return ContainerFacts(
        name=_str(data, "name", where),
        id=_str(data, "id", where),
        labels=_map(data, "labels", where),
        annotations=_map(data, "annotations", where),
        resources=resources,
        envs=_map(data, "envs", where),
    )


def pod_facts_from_json(data: object, where: str = "pod") -> PodFacts:
    """``{"name","namespace","uid","labels","annotations","cgroupParent","kubeQOS",
    "sandboxId","containers","priority"}`` -> ``PodFacts``."""
    if not isinstance(data, Mapping):
        raise PlanInputError(f"{where} must be an object")
    kube_qos = _str(data, "kubeQOS", where)
    if kube_qos not in ("", "Guaranteed", "Burstable", "BestEffort"):
        raise PlanInputError(f"{where}.kubeQOS must be Guaranteed, Burstable or BestEffort")
    containers = data.get("containers") or []
    if not isinstance(containers, list):
        raise PlanInputError(f"{where}.containers must be a list")
    priority = data.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -(2**31) <= priority < 2**31):
        raise PlanInputError(f"{where}.priority must be a 32-bit integer (the pod's spec.priority)")
    return PodFacts(
        priority=priority,
        name=_str(data, "name", where),
        namespace=_str(data, "namespace", where),
        uid=_str(data, "uid", where),
        labels=_map(data, "labels", where),
        annotations=_map(data, "annotations", where),
        cgroup_parent=_str(data, "cgroupParent", where),
        sandbox_id=_str(data, "sandboxId", where),
        kube_qos=kube_qos,
        containers=tuple(container_facts_from_json(c, f"{where}.containers[{i}]") for i, c in enumerate(containers)),
    )


def node_facts_from_json(data: object, node_slo: Mapping[str, object] | None = None) -> NodeFacts:
    """``{"name","labels","annotations","cpuTopology","resctrl","cgroup","boundCPUs",
    "lsePods"}`` plus the NodeSLO spec -> ``NodeFacts``."""
    if not isinstance(data, Mapping):
        raise PlanInputError("node must be an object")
    annotations = _map(data, "annotations", "node")
    topo_data = data.get("cpuTopology")
    try:
        if topo_data is None:
            topo_data = load_json_annotation(annotations, NODE_ANNOTATION_CPU_TOPOLOGY)
        topology = CPUTopology.from_annotation(topo_data) if topo_data is not None else None
    except ValueError as exc:
        raise PlanInputError(f"node.cpuTopology: {exc}") from exc
    rc = data.get("resctrl") or {}
    if not isinstance(rc, Mapping):
        raise PlanInputError("node.resctrl must be an object")
    cache_ids = rc.get("cacheIds", [])
    if not isinstance(cache_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in cache_ids):
        raise PlanInputError("node.resctrl.cacheIds must be a list of integers")
    vendor = _str(rc, "vendor", "node.resctrl", "intel").lower()
    if vendor not in ("intel", "amd"):
        raise PlanInputError("node.resctrl.vendor must be intel or amd")
    cbm = _str(rc, "cbmMask", "node.resctrl")
    resctrl = ResctrlFacts(cbm_mask=cbm, cache_ids=tuple(cache_ids), vendor=vendor, supported=bool(cbm))
    cg = data.get("cgroup") or {}
    if not isinstance(cg, Mapping) or cg.get("version", 1) not in (1, 2):
        raise PlanInputError("node.cgroup.version must be 1 or 2")
    driver = _str(cg, "driver", "node.cgroup", "cgroupfs")
    if driver not in ("cgroupfs", "systemd"):
        raise PlanInputError("node.cgroup.driver must be cgroupfs or systemd")
    try:
        cgroup = CgroupInfo(version=int(cg.get("version", 1)), driver=driver,
                            kubelet_root=_str(cg, "kubeletRoot", "node.cgroup", "/"))
    except ValueError as exc:
        raise PlanInputError(f"node.cgroup.kubeletRoot: {exc}") from exc
    bound_raw = _map(data, "boundCPUs", "node")
    try:
        bound = {uid: parse_cpu_list(text) for uid, text in bound_raw.items()}
    except ValueError as exc:
        raise PlanInputError(f"node.boundCPUs: {exc}") from exc
    lse = data.get("lsePods") or []
    if not isinstance(lse, list) or not all(isinstance(u, str) for u in lse):
        raise PlanInputError("node.lsePods must be a list of pod uids")
    slo = node_slo if node_slo is not None else {}
    if not isinstance(slo, Mapping):
        raise PlanInputError("nodeSLO must be an object (the NodeSLO spec)")
    return NodeFacts(
        name=_str(data, "name", "node"),
        labels=_map(data, "labels", "node"),
        annotations=annotations,
        node_slo=MappingProxyType(dict(slo)),
        cpu_topology=topology,
        resctrl=resctrl,
        cgroup=cgroup,
        bound_cpusets=MappingProxyType(bound),
        lse_pods=frozenset(lse),
    )


def _stage_calls(
    stage: str, pod: PodFacts | None, container: ContainerFacts | None
) -> list[tuple[str, PodFacts, ContainerFacts | None]]:
    """The ``(stage, pod, container)`` runs one document asks for (``Reconcile`` is three;
    ``ReconcileUsage`` runs apart, see ``plan_document``)."""
    if stage == USAGE_STAGE:
        return []
    if stage == "Reconcile":
        calls: list[tuple[str, PodFacts, ContainerFacts | None]] = [("ReconcileNode", PodFacts(), None)]
        if pod is not None:
            calls.append(("ReconcilePod", pod, None))
            if container is not None:
                calls.append(("ReconcileContainer", pod, container))
        return calls
    if stage in NODE_STAGES:
        return [(stage, PodFacts(), None)]
    if pod is None:
        raise PlanInputError(f"stage {stage} needs a pod")
    if stage in POD_STAGES:
        return [(stage, pod, None)]
    if container is None:
        raise PlanInputError(f"stage {stage} needs a container")
    return [(stage, pod, container)]


async def run_stages(
    pipeline: Pipeline, calls: Iterable[tuple[str, PodFacts, ContainerFacts | None]], node: NodeFacts
) -> MergeResult:
    """Run each stage through ``pipeline`` (the proxy's own hook runner) and merge the stages'
    plans in order; each stage's conflicts are kept."""
    merged = MergeResult()
    for stage, pod, container in calls:
        part = await pipeline.run(stage, pod, container, node)
        merged.conflicts.extend(part.conflicts)
        merged.rejected.extend(c.second for c in part.conflicts)
        merged.add("", part.plan)
    return merged


def _settings(
    pm: pluggy.PluginManager, config: ProxyConfig, plugins: list[str] | None
) -> list[tuple[str, Literal["Fail", "Ignore"], float]]:
    """``(name, policy, timeout)`` per plugin to run: the document's ``plugins`` (each with its
    config entry's settings when the config names it) or else the config's list."""
    registered = plugin_order(pm)
    if plugins is not None:
        unknown = [name for name in plugins if name not in registered]
        if unknown:
            raise PlanInputError(f"unknown plugins {shorten(unknown)}; installed plugins are {registered}")
        entries = {p.name: p for p in config.plugins or ()}
        config = config.model_copy(update={"plugins": [
            entries[name].model_copy(update={"enabled": True}) if name in entries else PluginConfig(name=name)
            for name in plugins
        ]})
    names = plugin_order(pm, [p.name for p in config.plugins] if config.plugins else None)
    try:
        return config.plugin_settings(names)
    except ValueError as exc:
        raise PlanInputError(str(exc)) from exc


def plan_document(
    doc: object, *, pm: pluggy.PluginManager | None = None, config: ProxyConfig | None = None
) -> dict[str, object]:
    """The planner as a function: input document -> output document (see module doc).

    :param pm: the plugin manager to plan with (default: the built-in plugins only;
        ``runtime_proxy.compose.plugin_manager`` gives what the proxy would load).
    :param config: the proxy's config: plugin order, ``enabled``, policies and timeouts
        (default: every plugin of ``pm`` in ``plugin_order``, policy Ignore, 2 s).
    Raises ``PlanInputError`` for a malformed document (never for malformed annotations or
    NodeSLO values, which the plugins record under ``skipped``).
    """
    if not isinstance(doc, Mapping):
        raise PlanInputError("the document must be a JSON object")
    stage = doc.get("stage")
    if stage is None:
        raise PlanInputError(f"the document names no stage: add \"stage\", one of {sorted(STAGES)} or 'Reconcile'")
    if not isinstance(stage, str) or (stage != "Reconcile" and stage not in STAGES):
        raise PlanInputError(f"unknown stage {shorten(stage)}; use one of {sorted(STAGES)} or 'Reconcile'")
    if stage in LOOP_STAGES:
        raise PlanInputError(f"stage {stage} runs only in {LOOP_STAGES[stage]}, on what it reads; it cannot be planned")
    _check_shape(doc)
    plugins = doc.get("plugins")
    if pm is None:
        pm = make_plugin_manager(entry_points=False)
    settings = _settings(pm, config or ProxyConfig(), plugins)
    node = node_facts_from_json(doc.get("node") or {}, doc.get("nodeSLO") or {})
    pod = pod_facts_from_json(doc["pod"]) if doc.get("pod") is not None else None
    container = container_facts_from_json(doc["container"]) if doc.get("container") is not None else None
    calls = _stage_calls(stage, pod, container)
    usage_run: tuple[tuple[PodFacts, ...], Usage] | None = None
    if stage == USAGE_STAGE or (stage == "Reconcile" and doc.get("usage") is not None):
        usage_run = _usage_input(doc, pod)

    pipeline = Pipeline(plugin_steps(pm, settings))
    merged = asyncio.run(_run_all(pipeline, calls, node, usage_run))
    out: dict[str, object] = {
        "stage": stage,
        "plugins": [name for name, _, _ in settings],
        "settings": [{"plugin": name, "policy": policy, "timeout": timeout} for name, policy, timeout in settings],
        **merged.plan.to_json(),
        "conflicts": [
            {"field": c.field, "plugins": [c.first, c.second], "values": [c.first_value, c.second_value]}
            for c in merged.conflicts
        ],
    }
    if usage_run is not None:
        out["evictions"] = [e.to_json() for e in merged.plan.evictions]
    return out


def _usage_input(doc: Mapping[str, object], pod: PodFacts | None) -> tuple[tuple[PodFacts, ...], Usage]:
    """The ``ReconcileUsage`` arguments: ``pods`` (else the document's ``pod``) and ``usage``."""
    raw_pods = doc.get("pods")
    if isinstance(raw_pods, list):  # a list or absent: PlanDocument checked the shape
        pods = tuple(pod_facts_from_json(p, f"pods[{i}]") for i, p in enumerate(raw_pods))
    else:
        pods = (pod,) if pod is not None else ()
    try:
        usage = usage_from_json(doc.get("usage") or {})
    except UsageInputError as exc:
        raise PlanInputError(str(exc)) from exc
    return pods, usage


async def _run_all(
    pipeline: Pipeline,
    calls: Iterable[tuple[str, PodFacts, ContainerFacts | None]],
    node: NodeFacts,
    usage_run: tuple[tuple[PodFacts, ...], Usage] | None,
) -> MergeResult:
    """``run_stages``, then the ``ReconcileUsage`` stage when asked for (its plan merged last)."""
    merged = await run_stages(pipeline, calls, node)
    if usage_run is not None:
        part = await pipeline.run_usage(node, *usage_run)
        merged.conflicts.extend(part.conflicts)
        merged.rejected.extend(c.second for c in part.conflicts)
        merged.add("", part.plan)
    return merged


def shorten(value: object) -> str:
    """``repr(value)``, cut to 80 characters for a one-line error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

"""``runtime-proxy plan [FILE]``: show what the proxy would do, without doing it.

Called by the CLI (``runtime_proxy.cli`` wires ``runtime-proxy plan`` to ``main``) and by tests
through ``plan_document``. Reads one JSON document (the schema is in ``docs/planner.md``),
builds the same facts the proxy builds, runs the plugins of the stage in the proxy's order,
merges their plans with ``hooks.plan.merge`` and prints the result: ``cri`` (the request
changes the stage accepts), ``writes``, ``moves``, ``removals``, ``skipped`` and ``conflicts``.
The plan lists what a kernel that supports each file would get; nothing is read from or
written to the node. ``run_hook`` is shared with ``runtime_proxy.loops.reconciler``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pluggy

from hooks.facts import (
    NODE_ANNOTATION_CPU_TOPOLOGY,
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
from hooks.plan import MergeResult, Plan, Skip
from hooks.plugins import BUILTIN_PLUGINS
from hooks.spec import STAGES

__all__ = [
    "PlanInputError",
    "container_facts_from_json",
    "main",
    "node_facts_from_json",
    "plan_document",
    "pod_facts_from_json",
    "run_hook",
]

# CRI fields each stage may change (hooks.spec "What a plan may change, per stage").
CRI_FIELDS: dict[str, frozenset[str]] = {
    "rhp_pre_run_pod_sandbox": frozenset({"labels", "annotations", "cgroupParent"}),
    "rhp_pre_create_container": frozenset({"resources", "envs", "annotations"}),
    "rhp_pre_update_container_resources": frozenset({"resources"}),
    "rhp_reconcile_container": frozenset({"resources"}),
}
POD_STAGES = {name for name, hook in STAGES.items() if "pod_sandbox" in hook} | {"ReconcilePod"}
NODE_STAGES = {"ReconcileNode"}


class PlanInputError(ValueError):
    """The planner document is malformed; the message says where."""


def _map(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, str]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PlanInputError(f"{where}.{key} must be a map of strings")
    return frozen_map(value)


def _str(data: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise PlanInputError(f"{where}.{key} must be a string")
    return value


def container_facts_from_json(data: Mapping[str, Any], where: str = "container") -> ContainerFacts:
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


def pod_facts_from_json(data: Mapping[str, Any], where: str = "pod") -> PodFacts:
    """``{"name","namespace","uid","labels","annotations","cgroupParent","kubeQOS",
    "sandboxId","containers"}`` -> ``PodFacts``."""
    if not isinstance(data, Mapping):
        raise PlanInputError(f"{where} must be an object")
    kube_qos = _str(data, "kubeQOS", where)
    if kube_qos not in ("", "Guaranteed", "Burstable", "BestEffort"):
        raise PlanInputError(f"{where}.kubeQOS must be Guaranteed, Burstable or BestEffort")
    containers = data.get("containers") or []
    if not isinstance(containers, list):
        raise PlanInputError(f"{where}.containers must be a list")
    return PodFacts(
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


def node_facts_from_json(data: Mapping[str, Any], node_slo: Mapping[str, Any] | None = None) -> NodeFacts:
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
        cgroup=CgroupInfo(version=int(cg.get("version", 1)), driver=driver),
        bound_cpusets=MappingProxyType(bound),
        lse_pods=frozenset(lse),
    )


@dataclass
class _Calls:
    hook: str
    kwargs: dict[str, Any]


def run_hook(
    pm: pluggy.PluginManager,
    hook_name: str,
    order: Iterable[str],
    result: MergeResult | None = None,
    **kwargs: Any,
) -> MergeResult:
    """Call ``hook_name`` on each plugin in ``order`` separately (so each plan is attributed to
    its plugin), folding the plans into ``result``. A plugin that raises is recorded as a skip
    (failure policy ``Ignore``); it never stops the others."""
    result = result if result is not None else MergeResult()
    impls = {impl.plugin_name: impl for impl in getattr(pm.hook, hook_name).get_hookimpls()}
    for name in order:
        impl = impls.get(name)
        if impl is None:
            continue
        try:
            plan = impl.function(**{a: kwargs[a] for a in impl.argnames if a in kwargs})
        except Exception as exc:  # a plugin bug must not stop the others
            plan = Plan()
            plan.skip(f"plugin raised {type(exc).__name__}: {exc}")
        if plan is not None:
            result.add(name, plan)
    return result


def _filter_cri(hook: str, plan: Plan) -> list[Skip]:
    allowed = CRI_FIELDS.get(hook, frozenset())
    dropped: list[Skip] = []
    for key in ("resources", "envs", "annotations", "labels"):
        if key not in allowed and getattr(plan, key):
            dropped.append(Skip(f"stage ignores cri.{key} {sorted(getattr(plan, key))}", "planner"))
            getattr(plan, key).clear()
    if "cgroupParent" not in allowed and plan.cgroup_parent is not None:
        dropped.append(Skip("stage ignores cri.cgroupParent", "planner"))
        plan.cgroup_parent = None
    return dropped


def plan_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The planner as a pure function: input document -> output document (see module doc).

    Raises ``PlanInputError`` for a malformed document (never for malformed annotations or
    NodeSLO values, which the plugins record under ``skipped``).
    """
    if not isinstance(doc, Mapping):
        raise PlanInputError("the document must be a JSON object")
    stage = doc.get("stage")
    if stage != "Reconcile" and stage not in STAGES:
        raise PlanInputError(f"unknown stage {stage!r}; use one of {sorted(STAGES)} or 'Reconcile'")
    plugins = doc.get("plugins")
    if plugins is not None and (not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins)):
        raise PlanInputError("plugins must be a list of plugin names")
    unknown = sorted(set(plugins or ()) - set(BUILTIN_PLUGINS))
    if unknown:
        raise PlanInputError(f"unknown plugins {unknown}; built-in plugins are {list(BUILTIN_PLUGINS)}")
    node = node_facts_from_json(doc.get("node") or {}, doc.get("nodeSLO") or {})
    pod = pod_facts_from_json(doc["pod"]) if doc.get("pod") is not None else None
    container = container_facts_from_json(doc["container"]) if doc.get("container") is not None else None

    calls: list[_Calls] = []
    if stage == "Reconcile":
        calls.append(_Calls("rhp_reconcile_node", {"node": node}))
        if pod is not None:
            calls.append(_Calls("rhp_reconcile_pod", {"pod": pod, "node": node}))
            if container is not None:
                calls.append(_Calls("rhp_reconcile_container", {"pod": pod, "container": container, "node": node}))
    else:
        hook = STAGES[str(stage)]
        if stage not in NODE_STAGES and pod is None:
            raise PlanInputError(f"stage {stage} needs a pod")
        if stage not in NODE_STAGES | POD_STAGES and container is None:
            raise PlanInputError(f"stage {stage} needs a container")
        kwargs: dict[str, Any] = {"node": node}
        if pod is not None and stage not in NODE_STAGES:
            kwargs["pod"] = pod
        if container is not None and stage not in NODE_STAGES | POD_STAGES:
            kwargs["container"] = container
        calls.append(_Calls(hook, kwargs))

    pm = make_plugin_manager(builtins=plugins if plugins is not None else None, entry_points=False)
    order = plugin_order(pm, plugins)
    merged = MergeResult()
    dropped: list[Skip] = []
    for call in calls:
        part = run_hook(pm, call.hook, order, **call.kwargs)
        dropped += _filter_cri(call.hook, part.plan)
        for name in part.rejected:
            merged.rejected.append(name)
        merged.conflicts.extend(part.conflicts)
        merged.add("", part.plan)
    out = merged.plan.to_json()
    out["skipped"] = [s.to_json() for s in merged.plan.skipped] + [s.to_json() for s in dropped]
    return {
        "stage": stage,
        "plugins": order,
        **out,
        "conflicts": [
            {"field": c.field, "plugins": [c.first, c.second], "values": [c.first_value, c.second_value]}
            for c in merged.conflicts
        ],
    }


def main(argv: list[str]) -> int:
    """``runtime-proxy plan [FILE]``: read the document from FILE (or stdin when absent or
    ``-``), print the plan as JSON. Exit 0 on success, 2 for an unreadable or malformed
    document (the error is printed as ``{"error": ...}`` on stderr)."""
    parser = argparse.ArgumentParser(prog="runtime-proxy plan", description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="-", help="the input document (default: stdin)")
    parser.add_argument("--compact", action="store_true", help="print JSON on one line")
    args = parser.parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        doc = json.loads(text)
        result = plan_document(doc)
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}), file=sys.stderr)
        return 2
    print(json.dumps(result, indent=None if args.compact else 2, sort_keys=False, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))

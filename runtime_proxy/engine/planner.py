"""``runtime-proxy plan [FILE]``: show what the proxy would do, without doing it.

Called by the CLI (``runtime_proxy.cli`` wires ``runtime-proxy plan`` to ``main``) and by tests
through ``plan_document``. Reads one JSON document (the schema is in ``docs/planner.md``),
builds the same facts the proxy builds and runs the stage through the proxy's own hook runner
(``runtime_proxy.engine.pipeline.Pipeline``: plugin order, facts advanced from step to step,
the stage's CRI fields from ``hooks.spec.CRI_FIELDS``, merge and conflicts), then prints the
result: ``cri`` (the request changes the stage accepts), ``writes``, ``moves``, ``removals``,
``skipped`` and ``conflicts``. The plan lists what a kernel that supports each file would get;
nothing is read from or written to the node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pluggy

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
from hooks.plugins import BUILTIN_PLUGINS
from hooks.spec import STAGES
from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from koord_formats.keys import NODE_ANNOTATION_CPU_TOPOLOGY
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps

__all__ = [
    "PlanInputError",
    "container_facts_from_json",
    "main",
    "node_facts_from_json",
    "plan_document",
    "pod_facts_from_json",
    "run_stages",
]

# Seconds each plugin may take, as in the proxy's default config.
PLUGIN_TIMEOUT = 2.0
# The input document's bounds: a few topologies and NodeSLOs fit many times over.
MAX_DOCUMENT_CHARS = 4 * 1024 * 1024
MAX_DOCUMENT_DEPTH = 32
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


def _stage_calls(
    stage: str, pod: PodFacts | None, container: ContainerFacts | None
) -> list[tuple[str, PodFacts, ContainerFacts | None]]:
    """The ``(stage, pod, container)`` runs one document asks for (``Reconcile`` is three)."""
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


def plan_document(doc: Mapping[str, Any], *, pm: pluggy.PluginManager | None = None) -> dict[str, Any]:
    """The planner as a function: input document -> output document (see module doc).

    :param pm: the plugin manager to plan with (default: the built-in plugins named by the
        document's ``plugins``, or all of them); its plugins run in ``plugin_order``.
    Raises ``PlanInputError`` for a malformed document (never for malformed annotations or
    NodeSLO values, which the plugins record under ``skipped``).
    """
    if not isinstance(doc, Mapping):
        raise PlanInputError("the document must be a JSON object")
    stage = doc.get("stage")
    if not isinstance(stage, str) or (stage != "Reconcile" and stage not in STAGES):
        raise PlanInputError(f"unknown stage {_short(stage)}; use one of {sorted(STAGES)} or 'Reconcile'")
    plugins = doc.get("plugins")
    if plugins is not None and (not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins)):
        raise PlanInputError("plugins must be a list of plugin names")
    if pm is None:
        unknown = sorted(set(plugins or ()) - set(BUILTIN_PLUGINS))
        if unknown:
            raise PlanInputError(f"unknown plugins {unknown}; built-in plugins are {list(BUILTIN_PLUGINS)}")
        pm = make_plugin_manager(builtins=plugins if plugins is not None else None, entry_points=False)
    node = node_facts_from_json(doc.get("node") or {}, doc.get("nodeSLO") or {})
    pod = pod_facts_from_json(doc["pod"]) if doc.get("pod") is not None else None
    container = container_facts_from_json(doc["container"]) if doc.get("container") is not None else None
    calls = _stage_calls(stage, pod, container)

    order = plugin_order(pm, plugins)
    pipeline = Pipeline(plugin_steps(pm, [(name, "Ignore", PLUGIN_TIMEOUT) for name in order]))
    merged = asyncio.run(run_stages(pipeline, calls, node))
    return {
        "stage": stage,
        "plugins": order,
        **merged.plan.to_json(),
        "conflicts": [
            {"field": c.field, "plugins": [c.first, c.second], "values": [c.first_value, c.second_value]}
            for c in merged.conflicts
        ],
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


EXIT_CODES = """\
exit codes:
  0  the plan was printed on stdout
  1  the planner itself failed (the error is printed on stderr)
  2  the input is unreadable, not JSON, too large or too deep, or does not match the schema
     in docs/planner.md (the error is printed on stderr)
"""


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read(MAX_DOCUMENT_CHARS + 1)
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_DOCUMENT_CHARS + 1)


def main(argv: list[str]) -> int:
    """``runtime-proxy plan [FILE]``: read the document from FILE (or stdin when absent or
    ``-``), print the plan as JSON on stdout. Exit codes: ``EXIT_CODES``; an error is one line
    ``runtime-proxy plan: ...`` on stderr, never a traceback."""
    parser = argparse.ArgumentParser(
        prog="runtime-proxy plan",
        description=(__doc__ or "").splitlines()[0],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", nargs="?", default="-", help="the input document (default: stdin)")
    parser.add_argument("--compact", action="store_true", help="print JSON on one line")
    args = parser.parse_args(argv)
    try:
        text = _read(args.file)
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(f"cannot read {args.file}: {exc}", 2)
    try:
        doc = load_json(text, "plan document", max_chars=MAX_DOCUMENT_CHARS, max_depth=MAX_DOCUMENT_DEPTH)
        result = plan_document(doc)
    except (PlanInputError, FormatError) as exc:
        return _fail(str(exc), 2)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        return _fail(f"bad input: {type(exc).__name__}: {_short(str(exc))}", 2)
    except Exception as exc:  # no traceback for the user; the message says what failed
        return _fail(f"planner failed: {type(exc).__name__}: {_short(str(exc))}", 1)
    print(json.dumps(result, indent=None if args.compact else 2, sort_keys=False, default=str))
    return 0


def _fail(message: str, code: int) -> int:
    print(f"runtime-proxy plan: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))

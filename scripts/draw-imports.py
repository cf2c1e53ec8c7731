"""Draw the import tree from the code, and check it: no upward arrow, no cycle.

Usage: ``.venv/bin/python scripts/draw-imports.py [--walk MODULE,MODULE,...]... > docs/imports.md``

Builds the import graph of our packages with grimp (the graph library under import-linter; the
``[tool.importlinter]`` root packages of ``pyproject.toml``, imports under ``TYPE_CHECKING`` and
inside functions included, as ``lint-imports`` counts them). Prints, as Markdown:

- for every ``layers`` contract, its layers top to bottom, each member with the members of the
  same contract it imports directly (``->``); an arrow to a higher layer is marked ``UP``;
- every import cycle between modules (a strongly connected set of more than one module);
- for each walk (``WALKS``, then each ``--walk``), the modules one call goes through, each
  calling the next, and any later module that imports an earlier one (the walk climbing back up).

Exits 1 when there is an upward arrow, a cycle or a climbing walk (``tests/test_layers.py``
runs it). ``docs/imports.md`` is its output; run it again after moving modules.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp

ROOT = Path(__file__).resolve().parent.parent
_P, _S = "runtime_proxy", "scheduler_ext"
# Two calls walked end to end, as chains of modules each calling the next (a branch is a walk of
# its own). One CreateContainer, from the relay's parser to a cgroup write: the relay reaches the
# CRI door through the CallInterceptor seam (cri/transport.py), the door decodes with the CRI
# codec, the engine's walk of the table (``finish``) records the container in the store as the
# table says and has the core apply the plan's files (an UpdateContainerResources goes the same
# way). One bind in the extender: the HTTP verb, the binder, the pure decision (views,
# admission rules, allocator), the HA ledger, the Binding POST.
WALKS = (
    f"{_P}.cri.relay._session,{_P}.cri.relay._client,{_P}.cri.relay._intercept,{_P}.cri.door,{_P}.engine.walk,"
    f"{_P}.engine.lifecycle,{_P}.host.apply,{_P}.host.cgroups",
    f"{_P}.cri.door,{_P}.codecs.cri",
    f"{_P}.engine.walk,{_P}.engine.table,{_P}.state.store",
    f"{_P}.engine.lifecycle,{_P}.engine.pipeline",
    f"{_S}.server,{_S}.binder,{_S}.decide,{_S}.views,{_S}.admission,{_S}.allocator",
    f"{_S}.binder,{_S}.guard",
    f"{_S}.binder,{_S}.ledger",
    f"{_S}.binder,{_S}.kube,rhp_kube.http",
)


def _config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return config


def _members(graph: grimp.ImportGraph, container: str, layer: str) -> list[str]:
    names = [n.strip() for part in layer.split("|") for n in part.split(":")]
    return [f"{container}.{n}" if container else n for n in names
            if (f"{container}.{n}" if container else n) in graph.modules]


def _under(graph: grimp.ImportGraph, module: str) -> set[str]:
    return {module} | graph.find_descendants(module)


def _imports(graph: grimp.ImportGraph, importer: str, imported: str) -> bool:
    """Whether any module of ``importer`` (a module or package) imports one of ``imported``."""
    targets = _under(graph, imported)
    return any(graph.find_modules_directly_imported_by(m) & targets for m in _under(graph, importer))


def draw_contract(graph: grimp.ImportGraph, contract: dict[str, Any], out: list[str]) -> int:
    containers = contract.get("containers") or [""]
    ignored = set(contract.get("ignore_imports", []))
    upward = 0
    for container in containers:
        layers = [_members(graph, container, layer) for layer in contract["layers"]]
        out.append(f"## {contract['id']}{f' ({container})' if container else ''}: {contract['name']}")
        out.append("")
        for index, members in enumerate(layers):
            for member in members:
                arrows = []
                for other_index, others in enumerate(layers):
                    for other in others:
                        if other == member or not _imports(graph, member, other):
                            continue
                        short = other.removeprefix(f"{container}.") if container else other
                        kept = any(i in ignored for i in (f"{m} -> {o}" for m in _under(graph, member)
                                                          for o in _under(graph, other)))
                        if kept:
                            short += " (kept exception)"
                        elif other_index < index:
                            short += " UP"
                            upward += 1
                        elif other_index == index:
                            short += " (same layer)"
                        arrows.append(short)
                name = member.removeprefix(f"{container}.") if container else member
                out.append(f"- L{index + 1} `{name}` -> {', '.join(arrows) if arrows else '(nothing of these)'}")
        out.append("")
    return upward


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def walk(graph: grimp.ImportGraph, modules: list[str], out: list[str]) -> int:
    climbs = 0
    for module in modules:
        if module not in graph.modules:
            raise SystemExit(f"draw-imports: no module {module}")
    out.append(" -> ".join(f"`{m}`" for m in modules))
    for i, later in enumerate(modules):
        for earlier in modules[:i]:
            if graph.chain_exists(importer=later, imported=earlier):
                out.append(f"  - climbs back up: `{later}` imports `{earlier}`")
                climbs += 1
    return climbs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--walk", action="append", default=[], help="comma-separated modules of one call's path")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(1, str(ROOT / "devenv"))
    config = _config()
    graph = grimp.build_graph(*config["root_packages"],
                              exclude_type_checking_imports=bool(config.get("exclude_type_checking_imports")))
    out: list[str] = ["# The import tree, drawn from the code", "",
                      "Generated by `scripts/draw-imports.py` (see its docstring); do not edit.", ""]
    upward = 0
    for contract in config["contracts"]:
        if contract["type"] == "layers":
            upward += draw_contract(graph, contract, out)
    found = cycles(graph)
    out.append(f"**Upward arrows: {upward}. Import cycles between modules: {len(found)}.**")
    out += [f"- cycle: {', '.join(c)}" for c in found]
    climbs = 0
    out += ["", "## Walks"]
    for path in [*WALKS, *args.walk]:
        out.append("")
        climbs += walk(graph, [m.strip() for m in path.split(",") if m.strip()], out)
    print("\n".join(out))
    return 1 if upward or found or climbs else 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Write tests/MAP.md: for every module of the shipped packages, the tests that exercise it.

A module's tests are, first, those in its mirrored folder named after it (``a/b/c.py``:
``tests/a/b/test_c.py``, or ``test_*_c.py`` / ``test_c_*.py`` there; ``koord_formats`` is
mirrored in ``tests/formats/``), then the other test modules that import it, in path order. A
module no test imports is listed with "-" (it is exercised through its callers).
``tests/test_test_map.py`` checks the map: every module has a row and every test it names
exists. Run it again after adding a module:

    python scripts/gen-test-map.py
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "tests" / "MAP.md"
PACKAGES = ("runtime_proxy", "hooks", "scheduler_ext", "colocation_manager", "koord_formats", "rhp_kube",
            "rhp_ops", "cri_protos")
MIRROR = {"koord_formats": "formats"}
SHOWN = 6  # importers listed per module after the mirrored tests


def modules() -> list[Path]:
    """Every module of the packages (the generated protobuf modules left out), in path order."""
    out: list[Path] = []
    for pkg in PACKAGES:
        out += [p.relative_to(ROOT) for p in sorted((ROOT / pkg).rglob("*.py"))
                if "__pycache__" not in p.parts and "_pb2" not in p.name]
    return out


def dotted(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None


def _is_module(name: str) -> bool:
    base = ROOT / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def reexports() -> dict[str, str]:
    """``package.name`` -> the submodule it comes from, for the names a package's
    ``__init__.py`` imports from its own submodules (``hooks.facts.PodFacts`` ->
    ``hooks.facts.types``), so a test importing the name counts for the submodule."""
    out: dict[str, str] = {}
    for module in modules():
        if module.name != "__init__.py" or (tree := _tree(ROOT / module)) is None:
            continue
        package = dotted(module)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
                out.update({f"{package}.{a.asname or a.name}": node.module for a in node.names})
    return out


def _imports(path: Path, via: dict[str, str]) -> set[str]:
    """The modules of ours ``path`` imports: ``from a.b import c`` counts as ``a.b.c`` when that
    is a module, else as ``a.b`` (and as the submodule ``a.b`` takes ``c`` from)."""
    found: set[str] = set()
    if (tree := _tree(path)) is None:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                name = f"{node.module}.{a.name}"
                found.add(name if _is_module(name) else via.get(name, node.module))
    return found


def mirrored(path: Path) -> list[Path]:
    parts = list(path.parts)
    parts[0] = MIRROR.get(parts[0], parts[0])
    folder = ROOT / "tests" / Path(*parts[:-1])
    name = path.stem if path.stem != "__init__" else (parts[-2] if len(parts) > 1 else path.stem)
    if path.stem == "__init__":
        folder = folder.parent
    if not folder.is_dir():
        return []
    return [p.relative_to(ROOT) for p in sorted(folder.glob("test_*.py"))
            if (s := p.stem[len("test_"):]) == name or s.endswith("_" + name) or s.startswith(name + "_")]


def test_map() -> dict[Path, list[Path]]:
    tests = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if "__pycache__" not in p.parts]
    via = reexports()
    imports = {p.relative_to(ROOT): _imports(p, via) for p in tests}
    out: dict[Path, list[Path]] = {}
    for module in modules():
        name = dotted(module)
        first = mirrored(module)
        others = [t for t, found in imports.items() if name in found and t not in first]
        out[module] = first + others
    return out


def render(table: dict[Path, list[Path]]) -> str:
    lines = [
        "# Where each module's tests are",
        "",
        "The test of module `a/b/c.py` is `tests/a/b/test_c.py` (or `test_*_c.py`, `test_c_*.py` in",
        "that folder; `koord_formats/` is mirrored in `tests/formats/`), listed first; then the",
        f"other test modules that import it (the first {SHOWN}). Area-wide tests sit beside them:",
        "`tests/hostile/` (one adversarial file per area), `tests/integration/` (real containerd and",
        "runc), `tests/e2e/` (a real one-node cluster), `tests/v2/` (a cgroup v2 guest). A module",
        "with \"-\" is exercised only through its callers.",
        "",
        "Generated by `python scripts/gen-test-map.py`; `tests/test_test_map.py` fails when a module",
        "has no row or a row names a test that does not exist. Run the generator after adding or",
        "moving a module or a test. The fast tier is `bash scripts/test.sh --unit` (README, \"Tests\").",
        "",
    ]
    package = ""
    for module, tests in table.items():
        if module.parts[0] != package:
            package = module.parts[0]
            lines += [f"## `{package}/`", "", "| module | tests |", "|---|---|"]
        shown = tests[: len(mirrored(module)) + SHOWN]
        more = f" (+{len(tests) - len(shown)} more)" if len(tests) > len(shown) else ""
        cell = ", ".join(f"`{t}`" for t in shown) + more if shown else "-"
        lines.append(f"| `{module}` | {cell} |")
        if module == list(table)[-1] or list(table)[list(table).index(module) + 1].parts[0] != package:
            lines.append("")
    return "\n".join(lines)


def main() -> int:
    MAP.write_text(render(test_map()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

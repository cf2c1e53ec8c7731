"""The layering written in DEVELOPERS.md, checked.

The rules between our packages and modules are import-linter contracts in ``pyproject.toml``
(``[tool.importlinter]``), which ``lint-imports`` checks as a step of ``scripts/test.sh``; here a
forbidden import planted in a copy of the tree shows that ``lint-imports`` catches it. This file
keeps only what import-linter cannot say: rules about code that is not in a package (``tests/``,
``benchmarks/``, ``scripts/``, ``examples/``) and "the standard library only".
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cri_protos import api_pb2
from runtime_proxy.cri import methods

REPO = Path(__file__).resolve().parents[1]
OURS = ("runtime_proxy", "hooks", "scheduler_ext", "colocation_manager", "cri_protos", "koord_formats", "rhp_devenv",
        "rhp_ops", "rhp_kube")
# Where the development harness may be imported from (it is never installed on a node).
HARNESS_USERS = ("tests", "benchmarks", "scripts", "devenv")
_SKIP_DIRS = {".venv", "build", "dist", "__pycache__", ".git"}
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _contracts_config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return config


def _root_packages() -> list[str]:
    roots = _contracts_config()["root_packages"]
    assert isinstance(roots, list)
    return [str(r) for r in roots]


def _package_dir(root: Path, package: str) -> Path:
    """Where ``package`` lives under ``root``: the repository root, or ``devenv/`` for the harness."""
    return root / package if (root / package).is_dir() else root / "devenv" / package


def _imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports: ``from a.b import c`` gives ``a.b`` and ``a.b.c``
    (``c`` may be a module)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _all_files() -> list[Path]:
    out = [p for p in REPO.glob("*.py")]
    for top in REPO.iterdir():
        if top.is_dir() and top.name not in _SKIP_DIRS and not top.name.startswith(".") and "." not in top.name:
            out += [p for p in top.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(REPO).parts)]
    return sorted(out)


def _outside_the_contracts() -> list[Path]:
    """Python files that are in none of the packages the contracts check."""
    covered = [_package_dir(REPO, p) for p in _root_packages()]
    return [p for p in _all_files() if not any(p.is_relative_to(d) for d in covered)]


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def test_formats_package_is_pure_stdlib() -> None:
    """``koord_formats`` imports only itself and the standard library: every other package may
    import it, and it can be used and tested alone."""
    files = _files("koord_formats")
    assert files, "koord_formats is missing"
    bad = [
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        for name in sorted(_imports(path))
        if name.split(".")[0] not in (*sys.stdlib_module_names, "koord_formats", "__future__")
    ]
    assert bad == []


def test_plugins_import_only_hooks_formats_and_stdlib() -> None:
    """A built-in plugin imports ``hooks`` (the contracts say which parts), ``koord_formats`` and
    the standard library: nothing installed besides, so it runs wherever ``hooks`` does."""
    files = _files("hooks/plugins")
    assert files, "hooks/plugins is missing"
    bad = [
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        for name in sorted(_imports(path))
        if name.split(".")[0] not in (*sys.stdlib_module_names, "hooks", "koord_formats", "__future__")
    ]
    assert bad == []


def test_only_development_code_imports_the_harness() -> None:
    """The contracts keep the harness out of every package; this covers the code outside them."""
    users = [p for p in _outside_the_contracts() if p.relative_to(REPO).parts[0] not in HARNESS_USERS]
    assert users, "no code outside the packages: the rule checks nothing"
    assert _violations(users, ("rhp_devenv",)) == []


def test_only_the_proxys_own_users_import_it() -> None:
    """Nothing shipped besides ``runtime_proxy`` itself imports it (the contracts for the
    packages; this for the code outside them, such as ``examples/``); development code (tests,
    benchmarks, the harness's demo) may."""
    users = [p for p in _outside_the_contracts() if p.relative_to(REPO).parts[0] not in HARNESS_USERS]
    assert _violations(users, ("runtime_proxy",)) == []


def test_every_package_of_ours_is_checked() -> None:
    tops = {p.relative_to(REPO).parts[0] for p in _all_files() if len(p.relative_to(REPO).parts) > 1}
    # packaging/ holds build helpers (packaging/image/): outside the packages, so the two rules
    # above keep them off the proxy and the harness.
    known = {*OURS, "devenv", "tests", "benchmarks", "scripts", "examples", "docs", "packaging"}
    assert tops <= known, f"new top-level code needs a layering rule: {sorted(tops - known)}"
    packages = {p.parent.name for p in [*REPO.glob("*/__init__.py"), *REPO.glob("devenv/*/__init__.py")]}
    assert packages <= set(_root_packages()), (
        f"a package the import-linter contracts do not see: {sorted(packages - set(_root_packages()))}"
    )


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` run on the tree under ``root``, with only that tree on the path."""
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'devenv'}", "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages the contracts check and ``pyproject.toml``, copied (a plant never touches
    the real tree), and checked clean before anything is planted."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for package in _root_packages():
        source = _package_dir(REPO, package)
        shutil.copytree(source, root / source.relative_to(REPO), ignore=shutil.ignore_patterns("__pycache__"))
    clean = _lint_imports(root)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert " 0 broken." in clean.stdout
    return root


@pytest.mark.parametrize(
    ("module", "source", "importer", "imported", "contract"),
    [
        pytest.param("scheduler_ext/_planted.py", "from runtime_proxy import config\n",
                     "scheduler_ext._planted", "runtime_proxy.config", "Packages:", id="extender imports the proxy"),
        pytest.param("runtime_proxy/loops/_planted.py", "from hooks.plugins import cpuset\n",
                     "runtime_proxy.loops._planted", "hooks.plugins.cpuset",
                     "The proxy (its loops included) never imports",
                     id="a loop imports a plugin"),
        pytest.param("hooks/plugins/_planted.py", "import rhp_devenv\n",
                     "hooks.plugins._planted", "rhp_devenv", "No shipped package imports the development harness",
                     id="a plugin imports the harness"),
        pytest.param("runtime_proxy/host/_planted.py", "from runtime_proxy.engine import pipeline\n",
                     "runtime_proxy.host._planted", "runtime_proxy.engine.pipeline", "Proxy roles:",
                     id="host I/O imports the engine"),
    ],
)
def test_lint_imports_fails_on_a_planted_import(
    tree_copy: Path, module: str, source: str, importer: str, imported: str, contract: str
) -> None:
    plant = tree_copy / module
    plant.write_text(source)
    try:
        planted = _lint_imports(tree_copy)
    finally:
        plant.unlink()
    assert planted.returncode == 1, planted.stdout + planted.stderr
    broken = [line for line in planted.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), planted.stdout
    assert f"{importer} -> {imported} (l.1)" in planted.stdout


@pytest.mark.parametrize("package", ["runtime_proxy", "hooks"])
def test_lint_imports_fails_on_a_module_without_a_layer(tree_copy: Path, package: str) -> None:
    """Every module and folder directly under ``runtime_proxy/`` and ``hooks/`` has its layer
    (the contracts are exhaustive): a new one, even one that imports nothing, fails until it
    gets its place."""
    plant = tree_copy / package / "_unplaced.py"
    plant.write_text("import os\n")
    try:
        planted = _lint_imports(tree_copy)
    finally:
        plant.unlink()
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert "The following modules are not listed as layers:" in planted.stdout
    assert f"- {package}._unplaced" in planted.stdout


def test_method_table_matches_the_proto() -> None:
    from_proto: dict[str, bool] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            from_proto[f"/{service.full_name}/{m.name}"] = m.server_streaming
    assert {k for k, streaming in from_proto.items() if not streaming} == methods.UNARY
    assert {k for k, streaming in from_proto.items() if streaming} == methods.SERVER_STREAMING
    assert set(methods.INTERCEPTED) <= methods.UNARY


def test_the_drawn_import_tree_has_no_upward_arrow_no_cycle_and_walks_down() -> None:
    """``scripts/draw-imports.py`` (``docs/imports.md``): no arrow to a higher layer, no import
    cycle between modules (``lint-imports`` sees neither a cycle inside one layer nor a walk), and
    the two walked calls never import back a module they came from."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "draw-imports.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Upward arrows: 0. Import cycles between modules: 0." in done.stdout
    assert "climbs back up" not in done.stdout

"""The layering written in DEVELOPERS.md, checked: a forbidden import fails here."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from cri_protos import api_pb2
from runtime_proxy.cri import methods

REPO = Path(__file__).resolve().parents[1]
OURS = ("runtime_proxy", "hooks", "scheduler_ext", "cri_protos", "koord_formats", "rhp_devenv", "rhp_ops")
# Where the development harness may be imported from (it is never installed on a node).
HARNESS_USERS = ("tests", "benchmarks", "scripts", "devenv")
_SKIP_DIRS = {".venv", "build", "dist", "__pycache__", ".git"}


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


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        pytest.param("hooks", ("runtime_proxy", "scheduler_ext", "rhp_devenv"),
                     id="hooks import neither the proxy, the extender nor the harness"),
        pytest.param("scheduler_ext", ("runtime_proxy", "rhp_devenv"),
                     id="the extender never imports the proxy or the harness"),
        pytest.param("rhp_ops",
                     ("runtime_proxy", "scheduler_ext", "hooks", "cri_protos", "koord_formats", "rhp_devenv"),
                     id="the shared operations kit imports neither command nor anything else of ours"),
        pytest.param("cri_protos", ("runtime_proxy", "hooks", "scheduler_ext", "koord_formats", "rhp_devenv"),
                     id="the protos import nothing of ours"),
        pytest.param("runtime_proxy", ("scheduler_ext", "rhp_devenv"),
                     id="the proxy never imports the extender or the harness"),
        pytest.param("runtime_proxy/cri", tuple(f"runtime_proxy.{p}" for p in ("engine", "state", "host", "loops")),
                     id="the transports see the engine only through the seam in cri/transport.py"),
        pytest.param("runtime_proxy/host", tuple(f"runtime_proxy.{p}" for p in ("cri", "engine", "state", "loops")),
                     id="host I/O imports no transport, engine, state or loop"),
        pytest.param("runtime_proxy/state", tuple(f"runtime_proxy.{p}" for p in ("engine", "host", "loops")),
                     id="state imports no engine, host I/O or loop"),
        pytest.param("runtime_proxy/cri", ("runtime_proxy.cli", "runtime_proxy.server", "runtime_proxy.wiring"),
                     id="transports never import the entry points"),
        pytest.param("runtime_proxy/host", ("runtime_proxy.cli", "runtime_proxy.server", "runtime_proxy.wiring"),
                     id="host I/O never imports the entry points"),
        pytest.param("runtime_proxy/state", ("runtime_proxy.cli", "runtime_proxy.server", "runtime_proxy.wiring"),
                     id="state never imports the entry points"),
        pytest.param("runtime_proxy/loops", ("runtime_proxy.cli", "runtime_proxy.server", "runtime_proxy.wiring"),
                     id="loops never import the entry points"),
        pytest.param("runtime_proxy/engine", ("runtime_proxy.cli", "runtime_proxy.server"),
                     id="the engine never imports the command line or the server"),
    ],
)
def test_forbidden_imports(package: str, forbidden: tuple[str, ...]) -> None:
    assert _files(package), f"{package} has no modules: the rule checks nothing"
    assert _violations(_files(package), forbidden) == []


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


def test_plugins_import_only_the_contract_formats_and_stdlib() -> None:
    allowed = {"hooks", "hooks.spec", "hooks.facts", "hooks.plan", "hooks.usage", "__future__"}
    bad = []
    for path in _files("hooks/plugins"):
        for name in _imports(path):
            top = name.split(".")[0]
            if name in allowed or top in sys.stdlib_module_names or top == "koord_formats":
                continue
            # ``from hooks import X`` lists ``hooks.X`` too: the names of the public API are fine.
            if name.startswith("hooks.") and name.count(".") == 1 and name.split(".")[1][:1].isupper():
                continue
            if name.startswith(("hooks.spec.", "hooks.facts.", "hooks.plan.", "hooks.usage.")):
                continue
            bad.append(f"{path.relative_to(REPO)}: {name}")
    assert bad == []


def test_only_development_code_imports_the_harness() -> None:
    users = [p for p in _all_files() if p.relative_to(REPO).parts[0] not in HARNESS_USERS]
    assert _violations(users, ("rhp_devenv",)) == []


def test_only_the_proxys_own_users_import_it() -> None:
    """Nothing shipped besides ``runtime_proxy`` itself imports it (the extender, the hooks and
    the formats stand alone); development code (tests, benchmarks, the harness's demo) may."""
    users = [p for p in _all_files() if p.relative_to(REPO).parts[0] not in (*HARNESS_USERS, "runtime_proxy")]
    assert _violations(users, ("runtime_proxy",)) == []


def test_every_package_of_ours_is_checked() -> None:
    tops = {p.relative_to(REPO).parts[0] for p in _all_files() if len(p.relative_to(REPO).parts) > 1}
    known = {*OURS, "devenv", "tests", "benchmarks", "scripts", "examples", "docs"}
    assert tops <= known, f"new top-level code needs a layering rule: {sorted(tops - known)}"


def test_method_table_matches_the_proto() -> None:
    from_proto: dict[str, bool] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            from_proto[f"/{service.full_name}/{m.name}"] = m.server_streaming
    assert {k for k, streaming in from_proto.items() if not streaming} == methods.UNARY
    assert {k for k, streaming in from_proto.items() if streaming} == methods.SERVER_STREAMING
    assert set(methods.INTERCEPTED) <= methods.UNARY

"""The layering written in DEVELOPERS.md, checked: a forbidden import fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cri_protos import api_pb2
from runtime_proxy.cri import methods

REPO = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        pytest.param("hooks", ("runtime_proxy", "scheduler_ext"), id="hooks-import-neither-proxy-nor-extender"),
        pytest.param("scheduler_ext", ("runtime_proxy",), id="extender-never-imports-the-proxy"),
        pytest.param("cri_protos", ("runtime_proxy", "hooks", "scheduler_ext"), id="protos-import-nothing-of-ours"),
    ],
)
def test_forbidden_imports(package: str, forbidden: tuple[str, ...]) -> None:
    bad = [
        f"{path.relative_to(REPO)}: {name}"
        for path in _files(package)
        for name in _imports(path)
        if name.split(".")[0] in forbidden
    ]
    assert bad == []


def test_plugins_import_only_the_contract_and_stdlib() -> None:
    import sys

    allowed = {"hooks.spec", "hooks.facts", "hooks.plan", "hooks", "__future__"}
    bad = []
    for path in _files("hooks/plugins"):
        for name in _imports(path):
            top = name.split(".")[0]
            if name in allowed or top in sys.stdlib_module_names:
                continue
            bad.append(f"{path.relative_to(REPO)}: {name}")
    assert bad == []


def test_method_table_matches_the_proto() -> None:
    from_proto: dict[str, bool] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            from_proto[f"/{service.full_name}/{m.name}"] = m.server_streaming
    assert {k for k, streaming in from_proto.items() if not streaming} == methods.UNARY
    assert {k for k, streaming in from_proto.items() if streaming} == methods.SERVER_STREAMING
    assert set(methods.INTERCEPTED) <= methods.UNARY

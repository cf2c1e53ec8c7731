"""``tests/MAP.md`` tells a newcomer where each module's tests are (issue 34 item 7): every module
of the shipped packages has a row, every row names a module that exists, and every test a row
names exists. ``python scripts/gen-test-map.py`` writes it again after a module or a test moves."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAP = REPO / "tests" / "MAP.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$")


def _generator():  # type: ignore[no-untyped-def]  # a script, loaded by path
    spec = importlib.util.spec_from_file_location("gen_test_map", REPO / "scripts" / "gen-test-map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in MAP.read_text().splitlines():
        if m := ROW.match(line):
            rows[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
    return rows


def test_every_module_has_a_row() -> None:
    modules = {str(p) for p in _generator().modules()}
    missing = sorted(modules - set(_rows()))
    assert not missing, f"no row in tests/MAP.md (run python scripts/gen-test-map.py): {missing}"


def test_every_row_names_a_module_and_tests_that_exist() -> None:
    rows = _rows()
    assert len(rows) > 100
    gone = sorted(m for m in rows if not (REPO / m).is_file())
    assert not gone, f"tests/MAP.md names modules that do not exist: {gone}"
    dead = sorted({t for tests in rows.values() for t in tests if not (REPO / t).is_file()})
    assert not dead, f"tests/MAP.md names tests that do not exist (run python scripts/gen-test-map.py): {dead}"


def test_a_mirrored_test_comes_first() -> None:
    rows = _rows()
    assert rows["runtime_proxy/config.py"][0] == "tests/runtime_proxy/test_config.py"
    assert rows["koord_formats/node.py"][0] == "tests/formats/test_format_node.py"
    assert rows["colocation_manager/certs.py"][0] == "tests/colocation_manager/test_certs.py"

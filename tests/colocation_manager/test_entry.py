"""The manager as a product of its own (issue 34 item 3): ``colocation-manager`` is its console
script, with the flags of ``scheduler-ext manager`` (the command the chart and the manifests
run, kept), and the package borrows nothing from the extender."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from colocation_manager import cli, entry
from rhp_ops import build

REPO = Path(__file__).resolve().parents[2]


def _dests(parser: object) -> set[str]:
    return {a.dest for a in parser._actions if a.dest not in ("help", "version", "prog", "func")}  # type: ignore[attr-defined]


def test_the_console_script_is_declared() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["colocation-manager"] == "colocation_manager.entry:main"
    assert scripts["scheduler-ext"] == "scheduler_ext.entry:main"  # the old command stays


def test_scheduler_ext_manager_takes_the_same_flags() -> None:
    from scheduler_ext.cli import build_parser

    parser = build_parser()
    (manager,) = [a for a in parser._subparsers._group_actions if "manager" in a.choices]  # type: ignore[union-attr]
    assert _dests(manager.choices["manager"]) == _dests(cli.build_parser())
    old = parser.parse_args(["manager", "--in-cluster", "--mid-resources"])
    new = cli.build_parser().parse_args(["--in-cluster", "--mid-resources"])
    assert old.func is cli.run and old.in_cluster and new.in_cluster and old.mid_resources and new.mid_resources


def test_bad_flags_exit_2_with_one_line_named_by_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--identity", ""]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == (
        "colocation-manager: --identity must not be empty (it names the Lease's holder)\n")
    from scheduler_ext import cli as extender_cli

    assert extender_cli.main(["manager", "--identity", ""]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("scheduler-ext manager: --identity must not be empty")


def test_without_the_extra_it_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build, "missing_modules", lambda names: ["aiohttp"])
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out == build.version_line("colocation-manager") + "\n"
    assert entry.main(["--in-cluster"]) == entry.EXIT_MISSING_EXTRA
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aiohttp" in err and build.extra_hint("scheduler") in err


def test_the_manager_imports_nothing_of_the_extender() -> None:
    """lint-imports checks it on the import graph (the "packages" contract); here, every import
    statement of the package, so a contract exception added later does not hide a borrowing."""
    for path in sorted((REPO / "colocation_manager").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "scheduler_ext"], path.name


def test_a_run_of_the_module_answers_help() -> None:
    done = subprocess.run([sys.executable, "-m", "colocation_manager.entry", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: colocation-manager")

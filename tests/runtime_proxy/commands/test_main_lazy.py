"""``runtime-proxy`` imports a sub-command's module only when that sub-command runs (issue 35:
the other commands' modules and libraries were about 1 MiB of the proxy's and the NRI plugin's
resident memory), and the command line it parses is the same as with every parser built."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_proxy.commands import HELP
from runtime_proxy.commands.main import COMMANDS, build_parser, chosen_command

REPO = Path(__file__).resolve().parents[3]

PROBE = """
import json, sys
from runtime_proxy.commands.main import build_parser, chosen_command, command_module
argv = json.loads(sys.argv[1])
args = build_parser(chosen_command(argv)).parse_args(argv)
command_module(args.command)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("runtime_proxy.commands."))))
"""


def _loaded(argv: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--listen", "/tmp/x.sock"], ["runtime_proxy.commands.main", "runtime_proxy.commands.serve"]),
        (["--log-level", "debug", "nri", "--dry-run"], ["runtime_proxy.commands.main", "runtime_proxy.commands.nri"]),
    ],
)
def test_a_running_command_imports_only_its_own_module(argv: list[str], expected: list[str]) -> None:
    assert _loaded(argv) == expected


SAMPLES = [
    ["serve"],
    ["serve", "--listen", "unix:///tmp/p.sock", "--backend", "/tmp/b.sock", "--dry-run", "--log-level", "debug"],
    ["--log-format", "json", "nri", "--plugin-idx", "07", "--unsolicited-updates"],
    ["plan", "serve", "nri", "-o", "json"],  # files named like commands: plan's positionals
    ["doctor", "--mode", "nri", "--skip", "files", "-o", "json"],
    ["kubelet-switch", "--to", "containerd", "--no-restart", "--mode", "serve"],
    ["hook-server", "--listen", "/tmp/h.sock", "--hooks", "PreRunPodSandbox"],
]


@pytest.mark.parametrize("argv", SAMPLES, ids=[" ".join(a) for a in SAMPLES])
def test_the_parser_of_the_chosen_command_parses_as_the_whole_one(argv: list[str]) -> None:
    only = chosen_command(argv)
    assert only is not None
    assert build_parser(only).parse_args(argv) == build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "serve", "nri"],  # a global flag's value that names a command: refused both ways
        ["serve", "--bogus"],
        ["nri", "serve"],
        ["bogus"],
        [],
        ["--log-format", "nri"],
    ],
)
def test_a_bad_command_line_fails_the_same_way(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    def fails(parser: argparse.ArgumentParser) -> tuple[object, str]:
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(argv)
        return stop.value.code, capsys.readouterr().err

    assert fails(build_parser(chosen_command(argv))) == fails(build_parser())


def test_every_command_is_listed_with_its_help_line() -> None:
    assert list(COMMANDS) == list(HELP)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest: c.help for c in sub._choices_actions} == HELP
    assert chosen_command(["--log-level", "info", "--version"]) is None

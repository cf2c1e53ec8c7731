"""Both command lines follow one convention (``rhp_ops.cli``): ``--version``, the global flags
before or after the sub-command, one clear stderr line and exit code 2 for a bad value, data on
stdout and logs on stderr. Each case runs the real command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rhp_ops import build

REPO = Path(__file__).resolve().parents[2]
PLAN = str(REPO / "packaging/examples/plan-lsr-sandbox.json")
SIMULATE = str(REPO / "packaging/scheduler/simulate-example.yaml")
CLIS = {"runtime-proxy": "runtime_proxy.cli", "scheduler-ext": "scheduler_ext.cli",
        "colocation-manager": "colocation_manager.entry"}


def _run(prog: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", CLIS[prog], *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize("prog", list(CLIS))
def test_version_prints_one_line_and_exits_0(prog: str) -> None:
    done = _run(prog, "--version")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == build.version_line(prog) + "\n"
    assert done.stdout.startswith(f"{prog} {build.version()} (python ")


@pytest.mark.parametrize(
    ("prog", "argv"),
    [
        pytest.param("runtime-proxy", ["--log-level", "bogus", "plan", PLAN], id="runtime-proxy, bad level before"),
        pytest.param("runtime-proxy", ["plan", PLAN, "--log-level", "bogus"], id="runtime-proxy, bad level after"),
        pytest.param("runtime-proxy", ["serve", "--log-format", "xml"], id="runtime-proxy, bad format after"),
        pytest.param("scheduler-ext", ["--log-level", "bogus", "simulate", SIMULATE], id="scheduler-ext, before"),
        pytest.param("scheduler-ext", ["simulate", SIMULATE, "--log-level", "bogus"], id="scheduler-ext, after"),
        pytest.param("scheduler-ext", ["serve", "--log-format", "xml"], id="scheduler-ext, bad format after"),
        pytest.param("runtime-proxy", ["plan", "--output", "yaml", PLAN], id="runtime-proxy, bad output"),
        pytest.param("scheduler-ext", ["simulate", "--output", "yaml", SIMULATE], id="scheduler-ext, bad output"),
        pytest.param("runtime-proxy", ["frobnicate"], id="runtime-proxy, unknown sub-command"),
        pytest.param("scheduler-ext", ["--frobnicate"], id="scheduler-ext, unknown flag"),
        pytest.param("colocation-manager", ["--log-level", "bogus"], id="colocation-manager, bad level"),
        pytest.param("colocation-manager", ["--frobnicate"], id="colocation-manager, unknown flag"),
    ],
)
def test_bad_values_get_one_stderr_line_and_exit_2(prog: str, argv: list[str]) -> None:
    done = _run(prog, *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and ": error: " in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("prog", "argv"),
    [
        pytest.param("runtime-proxy", ["--log-level", "debug", "plan", "-o", "json", PLAN], id="proxy, flag before"),
        pytest.param("runtime-proxy", ["plan", "-o", "json", PLAN, "--log-level", "DEBUG"], id="proxy, flag after"),
        pytest.param("scheduler-ext", ["--log-level", "debug", "simulate", SIMULATE], id="extender, flag before"),
        pytest.param("scheduler-ext", ["simulate", SIMULATE, "--log-level", "debug"], id="extender, flag after"),
    ],
)
def test_global_flags_work_before_and_after_the_subcommand(prog: str, argv: list[str]) -> None:
    done = _run(prog, *argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{")  # data only on stdout


@pytest.mark.parametrize(
    ("prog", "argv", "first_line"),
    [
        pytest.param("runtime-proxy", ["plan", PLAN], "stage:   PreRunPodSandbox", id="plan prints text by default"),
        pytest.param("scheduler-ext", ["simulate", SIMULATE, "-o", "text"], "pod:      default/trainer",
                     id="simulate prints text with --output text"),
    ],
)
def test_text_output_is_for_people(prog: str, argv: list[str], first_line: str) -> None:
    done = _run(prog, *argv)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == first_line


@pytest.mark.parametrize(
    ("prog", "argv"),
    [
        pytest.param("runtime-proxy", [], id="runtime-proxy --help"),
        pytest.param("runtime-proxy", ["hook-server"], id="runtime-proxy hook-server --help"),
        pytest.param("runtime-proxy", ["serve"], id="runtime-proxy serve --help"),
        pytest.param("scheduler-ext", ["serve"], id="scheduler-ext serve --help"),
        pytest.param("colocation-manager", [], id="colocation-manager --help"),
    ],
)
def test_help_is_short_and_has_no_developer_markup(prog: str, argv: list[str]) -> None:
    done = _run(prog, *argv, "--help")
    assert done.returncode == 0
    assert "``" not in done.stdout and ":param" not in done.stdout
    assert "--log-level" in done.stdout and "exit codes" in done.stdout
    description = done.stdout.split("\n\n")[1]
    assert description.count("\n") < 5


def test_scheduler_ext_entry_answers_version_without_its_extra(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler_ext import entry, extra

    monkeypatch.setattr(extra, "missing", lambda: ["uvicorn"])
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out == build.version_line("scheduler-ext") + "\n"
    assert entry.main(["serve"]) == entry.EXIT_MISSING_EXTRA
    assert build.extra_hint("scheduler") in capsys.readouterr().err


# Runs scheduler-ext's console script with the [scheduler] extra's modules made unimportable, as on
# a node install (the wheel without extras).
_WITHOUT_EXTRA = """
import sys
from scheduler_ext import entry
sys.modules.update({name: None for name in entry.REQUIRED})
raise SystemExit(entry.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        pytest.param(["--help"], 0, "usage: scheduler-ext", id="help answers without the extra"),
        pytest.param(["serve", "--help"], 0, "--listen", id="serve's help answers without the extra"),
        pytest.param(["simulate", "packaging/scheduler/simulate-example.yaml"], 0, '"feasible": true',
                     id="simulate runs without the extra"),
        pytest.param(["serve"], 2, "-py3-none-any.whl[scheduler]' (the wheel",
                     id="serve names the extra to install"),
    ],
)
def test_scheduler_ext_without_its_extra(argv: list[str], code: int, said: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRA, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    assert said in done.stdout + done.stderr and "Traceback" not in done.stderr

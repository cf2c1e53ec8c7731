"""``runtime-proxy serve`` and ``runtime-proxy hook-server`` given bad input: each answers with
one clear line on stderr and its documented exit code (``runtime_proxy.process.EXIT_CODES_EPILOG``),
never a traceback; stdout stays empty (it is for machine-readable output only), and nothing found
at a listen path is removed. Each case runs the real command in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime_proxy.process import EXIT_START, EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


def _run(argv: list[str], cwd: Path) -> Run:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "runtime_proxy.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def work() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = Path(f"/tmp/rhp-cli-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


Setup = Callable[[Path], list[str]]


def _config(text: str, name: str = "c.yaml") -> Setup:
    def setup(d: Path) -> list[str]:
        (d / name).write_text(text)
        return ["--config", str(d / name)]
    return setup


def _flags(*argv: str) -> Setup:
    return lambda d: list(argv)


# Every serve case that passes the config checks would start the proxy: give it sockets in the
# scratch directory so nothing on the machine is touched.
def _serve(setup: Setup) -> Setup:
    def full(d: Path) -> list[str]:
        return ["serve", "--listen", str(d / "proxy.sock"), "--backend", str(d / "none.sock"),
                "--hook-server-dir", str(d / "hs"), "--no-entry-points", *setup(d)]
    return full


SERVE_CASES = [
    pytest.param(_serve(_config("plugins: [\n")), EXIT_USAGE, "not valid YAML (line 2",
                 id="a YAML syntax error names the line"),
    pytest.param(_serve(_config("plugins:\n  - name: no_such_plugin\n")), EXIT_USAGE,
                 "plugin 'no_such_plugin' is configured but not installed", id="an unknown plugin name is named"),
    pytest.param(_serve(_config("pluginModules: [no_such_module_here]\n")), EXIT_USAGE,
                 "pluginModules entry 'no_such_module_here' cannot be loaded",
                 id="a missing pluginModules entry is named, before any event loop runs"),
    pytest.param(_serve(_config("defaultTimeout: soon\nplugins: 5\n")), EXIT_USAGE,
                 "defaultTimeout: must be a number", id="wrongly typed settings name each field"),
    pytest.param(_serve(_config("- a\n- b\n")), EXIT_USAGE, "must be a mapping of settings, not list",
                 id="a config that is a list is refused"),
    pytest.param(_serve(_config("surprise: 1\n")), EXIT_USAGE, "surprise: unknown key",
                 id="an unknown setting is named"),
    pytest.param(_serve(_config('{"plugins": [', name="c.json")), EXIT_USAGE, "not valid JSON",
                 id="a JSON config with a syntax error"),
    pytest.param(_serve(_config("a: " + "[" * 5000 + "\n")), EXIT_USAGE, "c.yaml",
                 id="deeply nested YAML is refused"),
    pytest.param(_serve(_flags("--config", "/nonexistent/rhp.yaml")), EXIT_USAGE, "cannot read",
                 id="a missing config file"),
    pytest.param(_serve(_flags("--metrics-addr", "everywhere")), EXIT_USAGE, "--metrics-addr",
                 id="a metrics address without a port"),
    pytest.param(_serve(_flags("--metrics-addr", ":99999")), EXIT_USAGE, "port must be in 1..65535",
                 id="a metrics port out of range"),
    pytest.param(_serve(_flags("--transport", "carrier-pigeon")), EXIT_USAGE, "invalid choice",
                 id="an unknown transport is an argparse error"),
    pytest.param(_flags("serve", "--no-such-flag"), EXIT_USAGE, "unrecognized arguments",
                 id="an unknown serve flag"),
    pytest.param(_flags("--log-level", "loud", "serve"), EXIT_USAGE, "invalid choice",
                 id="an unknown log level"),
]


@pytest.mark.parametrize(("setup", "code", "message"), SERVE_CASES)
def test_serve_bad_input(work: Path, setup: Setup, code: int, message: str) -> None:
    run = _run(setup(work), work)
    assert run.code == code, run.stderr
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    assert "cannot reuse already awaited coroutine" not in run.stderr
    assert run.stdout == ""
    assert not (work / "proxy.sock").exists()


def _occupy(kind: str, path: Path) -> socket.socket | None:
    if kind == "file":
        path.write_text("precious\n")
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("precious\n")
    elif kind == "live socket":
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen()
        return srv
    return None


def _still_there(kind: str, path: Path) -> bool:
    if kind == "file":
        return path.read_text() == "precious\n"
    if kind == "directory":
        return (path / "inside").read_text() == "precious\n"
    return path.is_socket()


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        pytest.param("serve", "file", id="serve refuses a regular file at its listen path and keeps it"),
        pytest.param("hook-server", "file", id="hook-server refuses a regular file at its listen path and keeps it"),
        pytest.param("hook-server", "directory", id="hook-server refuses a directory at its listen path"),
        pytest.param("hook-server", "live socket", id="hook-server refuses a socket another process serves"),
    ],
)
def test_listen_path_taken(work: Path, command: str, kind: str) -> None:
    listen = work / "taken.sock"
    held = _occupy(kind, listen)
    try:
        if command == "serve":
            argv = ["serve", "--listen", str(listen), "--backend", str(work / "none.sock"),
                    "--hook-server-dir", str(work / "hs"), "--no-entry-points"]
        else:
            argv = ["hook-server", "--listen", str(listen), "--builtins", "", "--no-entry-points", "--no-apply"]
        run = _run(argv, work)
        assert run.code == EXIT_START, run.stderr
        assert f"runtime-proxy {command}: cannot start" in run.stderr
        assert "Traceback" not in run.stderr
        assert run.stdout == ""
        assert _still_there(kind, listen)
    finally:
        if held is not None:
            held.close()


HOOK_SERVER_CASES = [
    pytest.param([], EXIT_USAGE, "the following arguments are required: --listen", id="no listen path"),
    pytest.param(["--listen", "{w}/h.sock", "--bogus"], EXIT_USAGE, "unrecognized arguments: --bogus",
                 id="an unknown flag"),
    pytest.param(["--listen", "{w}/h.sock", "--timeout-seconds", "-1"], EXIT_USAGE,
                 "--timeout-seconds must be in (0, 300]", id="a negative registration timeout"),
    pytest.param(["--listen", "{w}/h.sock", "--timeout-seconds", "nan"], EXIT_USAGE,
                 "--timeout-seconds must be in (0, 300]", id="a registration timeout that is not a number"),
    pytest.param(["--listen", "{w}/h.sock", "--register-name", "../../etc/passwd"], EXIT_USAGE,
                 "--register-name must be a plain file name", id="a registration name that climbs out"),
    pytest.param(["--listen", "{w}/h.sock", "--hooks", "PreRemoveEverything"], EXIT_USAGE, "invalid choice",
                 id="an unknown hook point"),
    pytest.param(["--listen", "{w}/h.sock", "--plugin-module", "no_such_module:Plugin"], EXIT_USAGE,
                 "--plugin-module 'no_such_module:Plugin' cannot be loaded", id="a plugin module that is not there"),
    pytest.param(["--listen", "{w}/h.sock", "--plugin-module", "json:NoSuchPlugin"], EXIT_USAGE,
                 "--plugin-module 'json:NoSuchPlugin' cannot be loaded", id="a plugin class that is not there"),
    pytest.param(["--listen", "{w}/h.sock", "--config", "{w}/bad.yaml"], EXIT_USAGE, "not valid YAML",
                 id="a config file with a YAML syntax error"),
    pytest.param(["--listen", "{w}/h.sock", "--builtins", "cpuset,no_such_builtin"], EXIT_USAGE,
                 "no_such_builtin", id="an unknown built-in plugin"),
    pytest.param(["--listen", "{w}/afile/h.sock", "--builtins", "", "--no-entry-points"], EXIT_START,
                 "cannot start", id="a listen path under a regular file"),
]


@pytest.mark.parametrize(("argv", "code", "message"), HOOK_SERVER_CASES)
def test_hook_server_bad_input(work: Path, argv: list[str], code: int, message: str) -> None:
    (work / "bad.yaml").write_text("plugins: [\n")
    (work / "afile").write_text("precious\n")
    run = _run(["hook-server", *(a.replace("{w}", str(work)) for a in argv)], work)
    assert run.code == code, run.stderr
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout == ""
    assert (work / "afile").read_text() == "precious\n"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--help"], id="the top-level help lists the exit codes"),
        pytest.param(["serve", "--help"], id="serve's help lists the exit codes"),
        pytest.param(["hook-server", "--help"], id="hook-server's help lists the exit codes"),
    ],
)
def test_help_documents_exit_codes(work: Path, argv: list[str]) -> None:
    run = _run(argv, work)
    assert run.code == 0
    assert "exit codes:" in run.stdout
    assert "3  cannot start" in run.stdout

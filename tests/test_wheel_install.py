"""README's "Install the wheel", run as written: the commands of its shell block, one by one with
``bash -euo pipefail``, in a clone of this repository (so the build sees a git checkout and names
its commit, and this checkout is left as it was), with ``HOME`` a temporary directory.

Only where pip gets the dependencies differs from a user's machine: ``PIP_NO_INDEX`` and
``PIP_FIND_LINKS`` point it at the hash-checked wheel cache the Debian package and the images use
(``packaging/lib/venv.sh``, filled from PyPI once), so the test needs no package index after that.
Then the installed ``runtime-proxy --version`` names the clone's commit, ``LICENSE`` is in the
wheel, and a config with ``report.enable`` and ``fromCluster`` passes the start-up checks (the
``[cluster]`` extra brought the kubernetes client).

A clone holds what is committed: run it after committing."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"runtime_hook_proxy-{VERSION}-py3-none-any.whl"
PY = Path("/usr/bin/python3")

pytestmark = pytest.mark.slow


def _section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("### Install the wheel", 1)[1].split("\n## ", 1)[0]


def _commands() -> list[str]:
    section = _section()
    block = section.split("```sh host\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].rstrip() for line in block.splitlines() if line.strip()]


def test_the_readme_says_where_the_wheel_is() -> None:
    commands = _commands()
    assert commands[0] == "bash packaging/wheel/build.sh"
    assert f"# prints dist/{WHEEL}" in _section()
    assert any(f"./dist/{WHEEL}[cluster]" in c for c in commands)
    assert "pip install runtime-hook-proxy" not in (REPO / "README.md").read_text()  # not on PyPI


def _cache() -> Path:
    home = Path(os.environ.get("HOME", "/root"))
    return Path(os.environ.get("RHP_DEB_WHEEL_CACHE") or
                Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "runtime-hook-proxy/deb-wheels")


@pytest.mark.timeout(900)  # the first run on a machine fetches the pinned wheels
def test_the_documented_commands_install_a_working_wheel(tmp_path: Path) -> None:
    if not PY.exists() or subprocess.run([str(PY), "-c", "import ensurepip, venv"], check=False).returncode:
        pytest.skip("needs /usr/bin/python3 with venv")
    if not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to clone")
    cache = _cache()
    cache.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path / "home"),
           "RHP_DEB_WHEEL_CACHE": str(cache)}
    (tmp_path / "home").mkdir()
    # the dependencies' pinned wheels into the shared cache (nothing fetched when they are there)
    fetch = ('source packaging/lib/venv.sh; rhp_fetch_wheels "$1" "$2" packaging/deb/requirements.txt '
             'packaging/image/requirements-cluster.txt packaging/deb/build-requirements.txt')
    subprocess.run(["bash", "-euo", "pipefail", "-c", fetch, "_", str(cache), str(tmp_path)], cwd=REPO, env=env,
                   check=True, timeout=600, stdin=subprocess.DEVNULL)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=300,
                   env={**env, "GIT_CONFIG_NOSYSTEM": "1"})
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(cache), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    outputs = []
    for command in _commands():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=clone, env=offline,
                              capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, check=False)
        assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        outputs.append(proc)
    # the build said where the wheel is, with a line per step on stderr
    assert outputs[0].stdout.strip() == str(clone / "dist" / WHEEL)
    assert re.search(r"^packaging/wheel/build\.sh: \[ *\d+s\] done$", outputs[0].stderr, re.M), outputs[0].stderr
    with zipfile.ZipFile(clone / "dist" / WHEEL) as wheel:
        names = set(wheel.namelist())
        assert f"runtime_hook_proxy-{VERSION}.dist-info/licenses/LICENSE" in names
        assert wheel.read("rhp_ops/COMMIT").decode().strip() == commit
    assert outputs[-1].stdout.startswith(f"runtime-proxy {VERSION} (python ")
    assert outputs[-1].stdout.rstrip().endswith(f", commit {commit[:12]})")
    # the [cluster] extra: report.enable and fromCluster pass the start-up checks
    venv = tmp_path / "home" / "runtime-hook-proxy"
    node = tmp_path / "node.yaml"
    node.write_text("nodeSLO: {}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"nodeConfigFile: {node}\nfromCluster: true\nreport:\n  enable: true\n")
    check = ("from runtime_proxy.config import check_usable, load_config; "
             f"check_usable(load_config({str(config)!r})); print('usable')")
    proc = subprocess.run([str(venv / "bin/python"), "-c", check], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.stdout.strip() == "usable", proc.stderr[-2000:]

"""The shipped wheel: built from a copy of the source with ``pip wheel``, it holds our packages
and nothing of the development harness (``devenv/rhp_devenv``), the tests or the benchmarks; and
``runtime-proxy`` starts from it in a fresh virtualenv where ``rhp_devenv`` is not installed.

The fresh virtualenv has no pip (``python -m venv --without-pip``); the wheel is unpacked into
its site-packages, and a ``.pth`` file lends it the third-party dependencies of the project's
own virtualenv. Only a path is added, so the editable installs there (ours and ``rhp_devenv``,
activated by their own ``.pth`` files) stay inactive."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("runtime_proxy", "hooks", "scheduler_ext", "cri_protos", "koord_formats")
NEVER_SHIPPED = ("rhp_devenv", "devenv", "tests", "benchmarks", "scripts", "examples")

pytestmark = pytest.mark.slow


def _packages() -> list[str]:
    return [name for name in SHIPPED if (REPO / name / "__init__.py").exists()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy, so the build leaves nothing in the working tree."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    for name in (*_packages(), *NEVER_SHIPPED):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = out.glob("runtime_hook_proxy-*.whl")
    return found


def _names(wheel: Path) -> list[PurePosixPath]:
    with zipfile.ZipFile(wheel) as zf:
        return [PurePosixPath(n) for n in zf.namelist()]


def test_wheel_holds_our_packages(wheel: Path) -> None:
    tops = {n.parts[0] for n in _names(wheel) if not n.parts[0].endswith(".dist-info")}
    assert tops == set(_packages())
    names = {str(n) for n in _names(wheel)}
    for marker in sorted(REPO.glob("*/py.typed")):
        if marker.parent.name in SHIPPED:
            assert f"{marker.parent.name}/py.typed" in names


def test_wheel_holds_no_harness_tests_or_benchmarks(wheel: Path) -> None:
    bad = [str(n) for n in _names(wheel) if any(part in NEVER_SHIPPED for part in n.parts)]
    assert bad == []


def test_no_shipped_module_imports_the_harness(wheel: Path) -> None:
    bad = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not name.endswith(".py"):
                continue
            tree = ast.parse(zf.read(name))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    mods = [node.module]
                else:
                    continue
                bad += [f"{name}: {m}" for m in mods if m.split(".")[0] == "rhp_devenv"]
    assert bad == []


@pytest.fixture(scope="module")
def fresh_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip())
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # The project's virtualenv lends its third-party packages (grpcio, pydantic, ...) by path.
    (site / "zz_project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield python


def _python(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # -I: no PYTHONPATH, no user site, no current directory on sys.path.
    return subprocess.run([str(python), "-I", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd="/")


def test_fresh_environment_has_no_harness(fresh_python: Path) -> None:
    proc = _python(fresh_python, "-c", "import runtime_proxy; print(runtime_proxy.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(fresh_python.parents[1])), "runtime_proxy must come from the wheel"
    proc = _python(fresh_python, "-c", "import rhp_devenv")
    assert proc.returncode != 0 and "No module named 'rhp_devenv'" in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--help"], id="runtime-proxy --help runs without the harness"),
        pytest.param(["serve", "--help"], id="runtime-proxy serve --help runs without the harness"),
        pytest.param(["hook-server", "--help"], id="runtime-proxy hook-server --help runs without the harness"),
        pytest.param(["plan", "--help"], id="runtime-proxy plan --help runs without the harness"),
    ],
)
def test_cli_runs_from_the_wheel(fresh_python: Path, argv: list[str]) -> None:
    proc = _python(fresh_python, "-m", "runtime_proxy.cli", *argv)
    assert proc.returncode == 0, proc.stderr
    assert "usage: runtime-proxy" in proc.stdout


def test_every_shipped_module_imports_without_the_harness(fresh_python: Path) -> None:
    code = (
        "import importlib, pkgutil\n"
        f"for top in {_packages()!r}:\n"
        "    pkg = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, top + '.'):\n"
        "        importlib.import_module(info.name)\n"
    )
    proc = _python(fresh_python, "-c", code)
    assert proc.returncode == 0, proc.stderr

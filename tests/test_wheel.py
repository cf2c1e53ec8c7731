"""The shipped wheel: built from a copy of the source with ``pip wheel``, it holds our packages
and nothing of the development harness (``devenv/rhp_devenv``), the tests or the benchmarks; and
``runtime-proxy`` starts from it in a fresh virtualenv where ``rhp_devenv`` is not installed.
The base install runs the node part without the extender's dependencies, ``scheduler-ext``
names its extra when they are missing, and the ``[scheduler]`` and ``[cluster]`` extras bring
what they promise (the layouts below).

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
SHIPPED = ("runtime_proxy", "hooks", "scheduler_ext", "colocation_manager", "cri_protos", "koord_formats", "rhp_ops",
           "rhp_kube")
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


# ---- install layouts: the base distribution and its extras ---------------------------------------
#
# Each layout is a fresh virtualenv holding the wheel plus exactly the distributions that
# ``pip install 'runtime-hook-proxy[EXTRAS]'`` would bring: the closure of the wheel's own
# Requires-Dist (markers evaluated for the extras asked for) over the distributions installed in
# the project's virtualenv, lent by symlinking each one's top-level files into one directory on
# the fresh environment's path. No index, no download: the layout is what the wheel declares.

SCHEDULER_DEPS = ("starlette", "uvicorn", "aiohttp", "orjson", "httptools", "kubernetes")


def _closure(requirements: list[str], extras: tuple[str, ...]) -> set[str]:
    """Names of the installed distributions ``requirements`` (with ``extras``) pull in."""
    from importlib import metadata

    from packaging import requirements as packaging_requirements  # pytest depends on it
    walked: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(r, extras) for r in requirements]
    while todo:
        text, active = todo.pop()
        req = packaging_requirements.Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (*active, "")):
            continue
        ours = req.name.lower().replace("_", "-") == "runtime-hook-proxy"
        key = "runtime-hook-proxy" if ours else metadata.distribution(req.name).metadata["Name"].lower()
        node = (key.replace("_", "-"), tuple(sorted(req.extras)))
        if node in walked:
            continue
        walked.add(node)
        # Our own extras (dev pulls [cluster,scheduler]): the wheel's requirements again.
        requires = requirements if ours else metadata.distribution(req.name).requires or ()
        todo += [(r, tuple(req.extras)) for r in requires]
    return {name for name, _ in walked if name != "runtime-hook-proxy"}


def _lend(dists: set[str], target: Path) -> None:
    from importlib import metadata

    target.mkdir()
    for name in sorted(dists):
        dist = metadata.distribution(name)
        root = Path(str(dist.locate_file("")))
        for top in sorted({PurePosixPath(str(f)).parts[0] for f in dist.files or ()}):
            if top in ("..", "bin", "__pycache__") or (target / top).exists():
                continue
            if (root / top).exists():
                (target / top).symlink_to(root / top)


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _entry_points(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        lines = zf.read(name).decode().splitlines()
    out: dict[str, str] = {}
    section = ""
    for line in lines:
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section == "console_scripts":
            key, value = (part.strip() for part in line.split("=", 1))
            out[key] = value
    return out


@pytest.fixture(scope="module")
def layouts(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"base": python, "scheduler": python, "cluster": python}``."""
    requirements = _wheel_requirements(wheel)
    out: dict[str, Path] = {}
    for layout, extras in (("base", ()), ("scheduler", ("scheduler",)), ("cluster", ("cluster",))):
        venv = tmp_path_factory.mktemp(f"venv-{layout}")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        python = venv / "bin" / "python"
        site = Path(subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip())
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
        lent = venv / "lent"
        _lend(_closure(requirements, extras), lent)
        (site / "zz_lent_dependencies.pth").write_text(f"{lent}\n")
        out[layout] = python
    return out


def _script(python: Path, wheel: Path, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run console script ``name`` as its generated wrapper would: ``sys.exit(func())``."""
    module, func = _entry_points(wheel)[name].split(":")
    code = f"import sys; sys.argv = {[name, *argv]!r}; from {module} import {func}; sys.exit({func}())"
    return _python(python, "-c", code)


def test_the_base_install_holds_none_of_the_extras_dependencies(wheel: Path) -> None:
    base = _closure(_wheel_requirements(wheel), ())
    assert not base & {*SCHEDULER_DEPS, "aiohttp-retry", "urllib3", "requests"}, sorted(base)
    assert {"grpcio", "protobuf", "pydantic", "pluggy", "structlog"} <= base
    assert set(SCHEDULER_DEPS) <= _closure(_wheel_requirements(wheel), ("scheduler",))
    assert {"kubernetes", "aiohttp", "orjson"} <= _closure(_wheel_requirements(wheel), ("cluster",))
    assert set(SCHEDULER_DEPS) <= _closure(_wheel_requirements(wheel), ("dev",)), "dev must pull every extra"


def test_the_base_install_runs_the_node_part(layouts: dict[str, Path], wheel: Path) -> None:
    python = layouts["base"]
    proc = _script(python, wheel, "runtime-proxy", "serve", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: runtime-proxy serve" in proc.stdout
    code = (
        "import importlib, pkgutil\n"
        "for top in ('runtime_proxy', 'hooks', 'cri_protos', 'koord_formats'):\n"
        "    pkg = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, top + '.'):\n"
        "        importlib.import_module(info.name)\n"
        f"for name in {SCHEDULER_DEPS!r}:\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
    )
    proc = _python(python, "-c", code)
    assert proc.returncode == 0, proc.stderr


def test_scheduler_ext_without_its_extra_names_the_extra(layouts: dict[str, Path], wheel: Path) -> None:
    """On a node install ``--help`` answers and ``serve`` names the extra in one line."""
    proc = _script(layouts["base"], wheel, "scheduler-ext", "--help")
    assert proc.returncode == 0 and "usage: scheduler-ext" in proc.stdout, proc.stderr
    proc = _script(layouts["base"], wheel, "scheduler-ext", "serve")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "-py3-none-any.whl[scheduler]'" in proc.stderr
    proc = _script(layouts["base"], wheel, "colocation-manager", "--help")
    assert proc.returncode == 0 and "usage: colocation-manager" in proc.stdout, proc.stderr
    proc = _script(layouts["base"], wheel, "colocation-manager", "--in-cluster")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "-py3-none-any.whl[scheduler]'" in proc.stderr


def test_from_cluster_without_its_extra_names_the_extra(layouts: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("fromCluster: true\n")
    code = ("from runtime_proxy.config import check_usable, load_config\n"
            f"check_usable(load_config({str(config)!r}))\n")
    proc = _python(layouts["base"], "-c", code)
    assert proc.returncode != 0 and "-py3-none-any.whl[cluster]'" in proc.stderr
    proc = _python(layouts["cluster"], "-c", code)
    assert proc.returncode == 0, proc.stderr


def test_the_scheduler_extra_runs_the_extender(layouts: dict[str, Path], wheel: Path) -> None:
    python = layouts["scheduler"]
    proc = _script(python, wheel, "scheduler-ext", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: scheduler-ext" in proc.stdout
    proc = _script(python, wheel, "colocation-manager", "--help")
    assert proc.returncode == 0 and "usage: colocation-manager" in proc.stdout, proc.stderr
    code = (
        "import importlib, pkgutil\n"
        "for top in ('scheduler_ext', 'colocation_manager'):\n"
        "    pkg = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, top + '.'):\n"
        "        importlib.import_module(info.name)\n"
    )
    proc = _python(python, "-c", code)
    assert proc.returncode == 0, proc.stderr

"""Build information of the running program: the distribution's version, the Python version and
the git commit when it is known: the ``RHP_GIT_COMMIT`` environment variable, else the commit the
wheel was built from (``rhp_ops/COMMIT``, written into the build's copy of the source by
``packaging/lib/venv.sh``'s ``rhp_build_wheel``, which the wheel, the Debian package and the images
are all built by), else the checkout this package runs from."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["COMMIT_FILE", "DISTRIBUTION", "SCHEDULER_EXTRA", "build_info", "export_build_info", "extra_hint",
           "git_commit", "missing_modules", "python_version", "version", "version_line"]

DISTRIBUTION = "runtime-hook-proxy"
COMMIT_FILE = "COMMIT"
"""The file beside this module that holds the commit a built wheel was made from."""
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def python_version() -> str:
    return platform.python_version()


def _read(path: Path) -> str:
    try:
        with path.open(encoding="utf-8") as fh:
            return fh.read(4096).strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _commit_in_checkout(root: Path) -> str:
    """The commit HEAD names in the git checkout at ``root`` (a plain checkout or a worktree whose
    ``.git`` file points at its git directory); "" when there is none or it cannot be read."""
    dot_git = root / ".git"
    git_dir = dot_git
    if dot_git.is_file():
        line = _read(dot_git)
        if not line.startswith("gitdir: "):
            return ""
        git_dir = (root / line[len("gitdir: "):]).resolve()
    if not git_dir.is_dir():
        return ""
    head = _read(git_dir / "HEAD")
    if _SHA.fullmatch(head):
        return head
    if not head.startswith("ref: "):
        return ""
    ref = head[len("ref: "):]
    common = git_dir
    commondir = _read(git_dir / "commondir")
    if commondir:
        common = (git_dir / commondir).resolve()
    for base in (git_dir, common):
        value = _read(base / ref)
        if _SHA.fullmatch(value):
            return value
    for line in _read_packed(common / "packed-refs"):
        sha, _, name = line.partition(" ")
        if name == ref and _SHA.fullmatch(sha):
            return sha
    return ""


def _read_packed(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8") as fh:
            return fh.read(1 << 20).splitlines()
    except (OSError, UnicodeDecodeError):
        return []


@cache
def git_commit() -> str:
    """The git commit of this build, "" when unknown."""
    env = os.environ.get("RHP_GIT_COMMIT", "").strip().lower()
    if _SHA.fullmatch(env):
        return env
    here = Path(__file__).resolve()
    baked = _read(here.with_name(COMMIT_FILE)).lower()
    if _SHA.fullmatch(baked):
        return baked
    return _commit_in_checkout(here.parents[1])


# Import names of the [scheduler] extra's distributions (pyproject.toml): what ``scheduler-ext
# serve`` and ``colocation-manager`` need beyond a node install.
SCHEDULER_EXTRA = ("kubernetes", "starlette", "uvicorn", "orjson", "httptools", "aiohttp")


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """The modules of ``names`` that cannot be found (an extra not installed)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def extra_hint(extra: str) -> str:
    """How to install the ``extra`` (``cluster``, ``scheduler``): the project is not on PyPI, so
    into the wheel this checkout builds (README.md, "Install the wheel")."""
    wheel = f"dist/runtime_hook_proxy-{version()}-py3-none-any.whl"
    return (f"pip install './{wheel}[{extra}]' (the wheel `bash packaging/wheel/build.sh` builds; "
            f"README.md, \"Install the wheel\")")


def build_info() -> dict[str, str]:
    """``{"version", "python", "commit"}`` (``commit`` is "" when unknown)."""
    return {"version": version(), "python": python_version(), "commit": git_commit()}


def version_line(prog: str) -> str:
    """What ``PROG --version`` prints: ``PROG 0.1.0 (python 3.11.2, commit 0123abcd...)``."""
    info = build_info()
    commit = f", commit {info['commit'][:12]}" if info["commit"] else ""
    return f"{prog} {info['version']} (python {info['python']}{commit})"


_exported: list[Any] = []


def export_build_info(component: str) -> None:
    """Set the ``rhp_build_info`` metric (labels ``component``, ``version``, ``python``,
    ``commit``) in the default Prometheus registry; called by each command's metrics endpoint."""
    from prometheus_client import Info

    if not _exported:
        _exported.append(Info("rhp_build", "Version, Python version and git commit of the running command."))
    _exported[0].info({"component": component, **build_info()})

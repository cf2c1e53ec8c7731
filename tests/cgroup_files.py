"""A cgroup v1-shaped tree and a resctrl-shaped tree of plain files under a test's ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

from runtime_proxy.host.cgroups import v1_controller


def make_files(root: Path, path: str, files: dict[str, str]) -> None:
    """Create ``path`` under each file's v1 controller and write the files (value + newline)."""
    for file, value in files.items():
        d = root / v1_controller(file) / path
        d.mkdir(parents=True, exist_ok=True)
        (d / file).write_text(value + "\n")


def read_file(root: Path, path: str, file: str) -> str:
    """The stripped content of ``file`` in ``path`` under its v1 controller."""
    return (root / v1_controller(file) / path / file).read_text().strip()


def make_resctrl(root: Path, *, cbm_mask: str, schemata: str, tasks: str = "") -> Path:
    """A resctrl root at ``root``: the L3 ``cbm_mask``, the root group's schemata and tasks."""
    (root / "info" / "L3").mkdir(parents=True)
    (root / "info" / "L3" / "cbm_mask").write_text(cbm_mask + "\n")
    (root / "schemata").write_text(schemata)
    (root / "tasks").write_text(tasks)
    return root

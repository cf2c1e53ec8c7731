"""A cgroup v1 controller directory is looked up once, then remembered: the loops read and write
hundreds of cgroup files a second, and each used to stat the controller's directory first
(issue 35: 7 % of the burst loop's CPU). Reads and writes land in the same files as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_proxy.host.cgroups import Cgroups


def _tree(root: Path) -> Path:
    pod = root / "cpu" / "kubepods" / "podA"
    pod.mkdir(parents=True)
    (pod / "cpu.cfs_quota_us").write_text("-1\n")
    return pod


def test_the_controller_directory_is_statted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = _tree(tmp_path)
    cgroups = Cgroups(tmp_path, version=1)
    asked: list[Path] = []
    real_exists = Path.exists

    def exists(self: Path, *args: object, **kwargs: object) -> bool:
        if self == tmp_path / "cpu":
            asked.append(self)
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", exists)
    for _ in range(5):
        assert cgroups.read("kubepods/podA", "cpu.cfs_quota_us") == "-1"
    cgroups.write("kubepods/podA", "cpu.cfs_quota_us", "50000")
    assert (pod / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert len(asked) == 1  # the old main asked on every read and write: 6


def test_a_comma_named_controller_is_still_found(tmp_path: Path) -> None:
    pod = tmp_path / "cpu,cpuacct" / "kubepods" / "podA"
    pod.mkdir(parents=True)
    (pod / "cpu.cfs_quota_us").write_text("-1\n")
    cgroups = Cgroups(tmp_path, version=1)
    assert cgroups.read("kubepods/podA", "cpu.cfs_quota_us") == "-1"
    assert cgroups.file_path("kubepods/podA", "cpu.cfs_quota_us") == pod / "cpu.cfs_quota_us"

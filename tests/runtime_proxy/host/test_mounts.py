"""The one mount-table parser: escapes, the mount that holds a path, bounds; and the cgroup
tree's use of it (a controller root on a cgroup filesystem is trusted without resolving each
path, any other root is resolved per path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime_proxy.host import cgroups as cg
from runtime_proxy.host.mounts import MAX_MOUNTS_BYTES, Mount, fstype_at, is_mount_of, parse_mounts, read_mounts

TABLE = """\
sysfs /sys sysfs rw 0 0
tmpfs /sys/fs/cgroup tmpfs ro 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
broken-line
resctrl /sys/fs/resctrl resctrl rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        pytest.param("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1", "cgroup", id="a cgroup directory is on cgroup"),
        pytest.param("/sys/fs/cgroup/cpu,cpuacct", "cgroup", id="a mount point is on its own mount"),
        pytest.param("/sys/fs/cgroup/cpu", "tmpfs", id="a name that only starts like a mount is on the parent"),
        pytest.param("/sys/fs/cgroup/unified/x", "cgroup2", id="the unified tree is cgroup2"),
        pytest.param("/mnt/with space/a", "tmpfs", id="an escaped space in a mount point is read as a space"),
        pytest.param("/sys/kernel", "sysfs", id="the longest containing mount point wins"),
        pytest.param("/etc", None, id="a path under no listed mount has no type"),
    ],
)
def test_the_mount_that_holds_a_path(path: str, fstype: str | None) -> None:
    assert fstype_at(path, parse_mounts(TABLE)) == fstype


def test_lines_with_too_few_fields_are_skipped_and_a_later_mount_over_the_same_point_wins() -> None:
    mounts = parse_mounts(TABLE + "overlay /sys/fs/cgroup/cpu,cpuacct overlay rw 0 0\n")
    assert Mount("broken-line", "") not in mounts and len(mounts) == 7
    assert fstype_at("/sys/fs/cgroup/cpu,cpuacct/a", mounts) == "overlay"


def test_is_mount_of_asks_about_the_mount_point_itself() -> None:
    mounts = parse_mounts(TABLE)
    assert is_mount_of("/sys/fs/resctrl", "resctrl", mounts)
    assert not is_mount_of("/sys/fs/resctrl/sub", "resctrl", mounts)
    assert not is_mount_of("/sys/fs/resctrl", "cgroup", mounts)


def test_a_huge_or_missing_table_is_bounded_or_none(tmp_path: Path) -> None:
    big = tmp_path / "mounts"
    line = "cgroup /sys/fs/cgroup/x cgroup rw 0 0\n"
    big.write_text(line * (MAX_MOUNTS_BYTES // len(line) + 1000))
    mounts = read_mounts(big)
    assert mounts is not None and len(mounts) <= MAX_MOUNTS_BYTES // len(line) + 1
    assert read_mounts(tmp_path / "missing") is None


def test_this_machine_lists_its_cgroup_root() -> None:
    mounts = read_mounts()
    assert mounts is not None
    assert fstype_at(os.path.realpath(cg.DEFAULT_ROOT), mounts) in ("tmpfs", "cgroup2", "cgroup")


def test_a_symlink_under_a_root_that_is_no_cgroup_filesystem_is_still_refused(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "cpu" / "kubepods").mkdir(parents=True)
    (root / "cpu" / "kubepods" / "escape").symlink_to(tmp_path)
    tree = cg.Cgroups(root, version=1)
    assert tree.directory("kubepods") == root / "cpu" / "kubepods"
    with pytest.raises(cg.UnsafePathError):
        tree.directory("kubepods/escape")


def _cpu_root_on_cgroupfs() -> bool:
    real = os.path.realpath(cg.Cgroups()._controller_root("cpu"))
    return fstype_at(real, read_mounts() or []) in cg.CGROUP_FSTYPES


@pytest.mark.skipif(not _cpu_root_on_cgroupfs(), reason="needs a cgroup filesystem at /sys/fs/cgroup")
def test_a_root_on_a_cgroup_filesystem_gives_paths_under_its_real_place_without_resolving_each() -> None:
    tree = cg.Cgroups()
    real = Path(os.path.realpath(tree._controller_root("cpu")))
    assert tree.directory("kubepods/podx/c1") == real / "kubepods" / "podx" / "c1"
    assert real in tree._cgroupfs_roots
    with pytest.raises(cg.UnsafePathError):
        tree.directory("kubepods/../../x")


@pytest.mark.skipif(not _cpu_root_on_cgroupfs(), reason="needs a cgroup filesystem at /sys/fs/cgroup")
def test_a_file_on_a_cgroup_filesystem_is_found_once_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = cg.Cgroups()
    real = Path(os.path.realpath(tree._controller_root("cpu")))
    assert tree.file_path("kubepods/podx/c1", "cpu.shares") == real / "kubepods" / "podx" / "c1" / "cpu.shares"
    assert ("kubepods/podx/c1", "cpu.shares") in tree._files
    # Found again from memory: the directory is not looked up a second time.
    monkeypatch.setattr(tree, "_directory", lambda *_: pytest.fail("looked up again"))
    assert tree.file_path("kubepods/podx/c1", "cpu.shares") == real / "kubepods" / "podx" / "c1" / "cpu.shares"
    monkeypatch.undo()
    monkeypatch.setattr(cg, "MAX_REMEMBERED_FILES", 8)
    for i in range(20):
        tree.file_path(f"kubepods/pod{i}", "cpu.shares")
        assert len(tree._files) <= 8
    with pytest.raises(cg.UnsafePathError):  # a refused path is never remembered
        tree.file_path("kubepods/../../x", "cpu.shares")


@pytest.mark.skipif(not _cpu_root_on_cgroupfs(), reason="needs a cgroup filesystem at /sys/fs/cgroup")
def test_a_place_not_asked_for_within_two_periods_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removed pods' files leave the memory instead of filling it up to its bound (issue 35);
    the places still asked for are kept, and the character count follows what is kept."""
    now = [1000.0]
    monkeypatch.setattr(cg.time, "monotonic", lambda: now[0])
    tree = cg.Cgroups()
    for i in range(50):
        tree.file_path(f"kubepods/gone{i}", "cpu.shares")
    for period in range(3):
        now[0] += cg.REMEMBER_SECONDS
        tree.file_path("kubepods/live", "cpu.shares")  # asked for once a period: kept
        tree.file_path(f"kubepods/new{period}", "cpu.shares")
    kept = set(tree._files) | set(tree._files_before)
    assert kept == {("kubepods/live", "cpu.shares"), ("kubepods/new1", "cpu.shares"), ("kubepods/new2", "cpu.shares")}
    counted = tree._files_chars + tree._before_chars
    assert counted == sum(cg._chars(k, v) for k, v in [*tree._files.items(), *tree._files_before.items()])
    monkeypatch.setattr(tree, "_directory", lambda *_: pytest.fail("looked up again"))
    tree.file_path("kubepods/live", "cpu.shares")


def test_a_root_that_is_no_cgroup_filesystem_remembers_no_place_so_a_later_symlink_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cgroup"
    pod = root / "cpu" / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cpu.shares").write_text("2\n")
    tree = cg.Cgroups(root, version=1)
    assert tree.read("kubepods/pod1", "cpu.shares") == "2"
    assert not tree._files
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("9\n")
    (pod / "cpu.shares").unlink()
    pod.rmdir()
    pod.symlink_to(outside)
    with pytest.raises(cg.UnsafePathError):
        tree.read("kubepods/pod1", "cpu.shares")

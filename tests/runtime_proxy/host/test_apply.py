"""The applier: safe order, all-or-nothing, dry run, diff mode, resctrl; on a temporary root,
plus the kernel's own ordering rules on real cgroups (root only)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hooks.plan import CgroupWrite, Plan
from runtime_proxy.host.apply import Applier, FileApplier, RecordingApplier, apply_files, order_writes
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.host.resctrl import Resctrl
from tests.cgroup_files import make_files, make_resctrl, read_file

W = CgroupWrite


@pytest.mark.parametrize(
    ("writes", "current", "expected"),
    [
        pytest.param([W("container", "p/c", "cpu.cfs_quota_us", "80000"), W("pod", "p", "cpu.cfs_quota_us", "100000")],
                     {"p": "50000", "p/c": "40000"}, ["p=100000", "p/c=80000"],
                     id="quota scale-up writes the pod before the container"),
        pytest.param([W("pod", "p", "cpu.cfs_quota_us", "50000"), W("container", "p/c", "cpu.cfs_quota_us", "40000")],
                     {"p": "100000", "p/c": "80000"}, ["p/c=40000", "p=50000"],
                     id="quota scale-down writes the container before the pod"),
        pytest.param([W("pod", "p", "cpu.cfs_quota_us", "-1"), W("container", "p/c", "cpu.cfs_quota_us", "-1")],
                     {"p": "50000", "p/c": "50000"}, ["p=-1", "p/c=-1"], id="unsetting quota is a scale-up"),
        pytest.param([W("container", "p/c", "cpuset.cpus", "0-7"), W("pod", "p", "cpuset.cpus", "0-7")],
                     {"p": "0-3", "p/c": "0-3"}, ["p=0-7", "p/c=0-7"], id="cpuset grows parents first"),
        pytest.param([W("pod", "p", "cpuset.cpus", "0-1"), W("container", "p/c", "cpuset.cpus", "0-1")],
                     {"p": "0-3", "p/c": "0-3"}, ["p/c=0-1", "p=0-1"], id="cpuset shrinks children first"),
        pytest.param([W("pod", "p", "cpuset.cpus", "4-7"), W("container", "p/c", "cpuset.cpus", "4-5")],
                     {"p": "0-3", "p/c": "0-1"}, ["p=0-7", "p/c=0-1,4-5", "p/c=4-5", "p=4-7"],
                     id="sideways cpuset moves through the union"),
        pytest.param([W("pod", "p", "cpu.shares", "2"), W("container", "p/c", "cpu.cfs_quota_us", "1000")],
                     {"p/c": "5000"}, ["p=2", "p/c=1000"], id="unordered files keep plan order"),
    ],
)
def test_order(writes: list[CgroupWrite], current: dict[str, str], expected: list[str]) -> None:
    steps = order_writes(writes, lambda w: current.get(w.path))
    assert [f"{s.write.path}={s.value}" for s in steps] == expected


def test_failed_write_restores_what_the_plan_changed(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2", "cpu.cfs_quota_us": "-1"})
    plan = Plan().write("pod", "p", "cpu.shares", 1024).write("pod", "p", "cpu.cfs_quota_us", 50000)
    plan.write("container", "p/gone", "cpu.shares", 10)
    report = apply_files(plan, cgroups=Cgroups(tmp_path, version=1), resctrl=None)
    assert not report.ok and "does not exist" in report.errors[0]
    assert read_file(tmp_path, "p", "cpu.shares") == "2"
    assert read_file(tmp_path, "p", "cpu.cfs_quota_us") == "-1"  # a shrink: ordered after the failure
    assert len(report.rolled_back) == 1


def test_non_atomic_goes_on(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    plan = Plan().write("container", "p/gone", "cpu.shares", 10).write("pod", "p", "cpu.shares", 1024)
    report = apply_files(plan, cgroups=Cgroups(tmp_path, version=1), atomic=False)
    assert len(report.errors) == 1
    assert read_file(tmp_path, "p", "cpu.shares") == "1024"


def test_unsafe_path_in_a_plan_is_an_error_not_a_write(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    report = apply_files(Plan().write("pod", "../p", "cpu.shares", 1024), cgroups=Cgroups(tmp_path / "cpu", version=1))
    assert not report.ok and "'..'" in report.errors[0]


def test_unsupported_is_not_an_error(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    report = apply_files(Plan().write("pod", "p", "cpu.bvt_warp_ns", 2), cgroups=Cgroups(tmp_path, version=1))
    assert report.ok and [w.file for w in report.unsupported] == ["cpu.bvt_warp_ns"]


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    report = apply_files(Plan().write("pod", "p", "cpu.shares", 1024), cgroups=Cgroups(tmp_path, version=1),
                         compare_only=True)
    assert [w.value for w in report.changed] == ["1024"]
    assert read_file(tmp_path, "p", "cpu.shares") == "2"


async def test_the_recording_applier_records_logs_and_changes_nothing(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    applier: Applier = RecordingApplier(cgroups=Cgroups(tmp_path, version=1))
    plan = Plan().write("pod", "p", "cpu.shares", 1024)
    with capture_logs() as logs:
        assert applier.carries(plan, stage="PreCreateContainer") is False
        await applier.apply(plan, stage="PreCreateContainer")
    report = applier.apply_files(plan, diff=True)
    assert [w.value for w in report.changed] == ["1024"] and [w.file for w in report.drift] == ["cpu.shares"]
    assert report.compare_only
    assert read_file(tmp_path, "p", "cpu.shares") == "2"
    assert isinstance(applier, RecordingApplier)
    assert [stage for stage, _ in applier.plans] == ["PreCreateContainer", "PreCreateContainer", "files"]
    assert [e["event"] for e in logs] == ["dry-run plan", "dry-run: not applying"]
    assert RecordingApplier().apply_files(plan).changed == []  # without trees: records only
    assert RecordingApplier().carries(Plan(), stage="PostStopContainer") is False


async def test_the_file_applier_carries_every_plan_and_writes(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2"})
    applier: Applier = FileApplier(cgroups=Cgroups(tmp_path, version=1))
    plan = Plan().write("pod", "p", "cpu.shares", 1024)
    assert applier.carries(plan, stage="PreCreateContainer") is True
    await applier.apply(plan, stage="PreCreateContainer")
    assert read_file(tmp_path, "p", "cpu.shares") == "1024"
    assert applier.apply_files(plan, diff=True).drift == []


def test_diff_mode_counts_drift(tmp_path: Path) -> None:
    make_files(tmp_path, "p", {"cpu.shares": "2", "cpu.cfs_quota_us": "-1"})
    plan = Plan().write("pod", "p", "cpu.shares", 1024).write("pod", "p", "cpu.cfs_quota_us", -1)
    report = apply_files(plan, cgroups=Cgroups(tmp_path, version=1), diff=True)
    assert [w.file for w in report.drift] == ["cpu.shares"]
    again = apply_files(plan, cgroups=Cgroups(tmp_path, version=1), diff=True)
    assert again.drift == [] and again.changed == []


@pytest.fixture
def resctrl_tree(tmp_path: Path) -> Path:
    return make_resctrl(tmp_path / "resctrl", cbm_mask="fff", schemata="L3:0=fff;1=fff\nMB:0=100;1=100\n")


def test_resctrl_write_move_and_remove(tmp_path: Path, resctrl_tree: Path) -> None:
    make_files(tmp_path / "cg", "p/c", {"tasks": "11\n12"})
    cg, rc = Cgroups(tmp_path / "cg", version=1), Resctrl(resctrl_tree)
    plan = Plan().write("resctrl", "BE", "schemata", "L3:0=f;1=f;\nMB:0=100;1=100;\n")
    plan.move_tasks("container", "p/c", "BE")
    report = apply_files(plan, cgroups=cg, resctrl=rc)
    assert report.ok, report.errors
    assert (resctrl_tree / "BE" / "schemata").read_text().startswith("L3:0=f;1=f;")
    assert rc.tasks("BE") == {11, 12}
    assert [n for _, n in report.moved] == [2]
    assert apply_files(plan, cgroups=cg, resctrl=rc).moved[0][1] == 0
    assert apply_files(plan, cgroups=cg, resctrl=rc).changed == []
    removal = apply_files(Plan().remove("resctrl", "BE"), cgroups=cg, resctrl=rc)
    assert removal.ok and not (resctrl_tree / "BE").exists()


def test_failed_cgroup_write_removes_a_new_resctrl_group(tmp_path: Path, resctrl_tree: Path) -> None:
    plan = Plan().write("resctrl", "koordlet-u1", "schemata", "L3:0=f;\n").write("pod", "gone", "cpu.shares", 2)
    report = apply_files(plan, cgroups=Cgroups(tmp_path / "cg", version=1), resctrl=Resctrl(resctrl_tree))
    assert not report.ok
    # cgroup writes come first, so the resctrl group was never created
    assert not (resctrl_tree / "koordlet-u1").exists()


@pytest.mark.parametrize("group", ["..", "info", "a/b", ""])
def test_bad_resctrl_group_is_refused(tmp_path: Path, resctrl_tree: Path, group: str) -> None:
    report = apply_files(Plan().write("resctrl", group, "schemata", "L3:0=1;"), cgroups=Cgroups(tmp_path, version=1),
                         resctrl=Resctrl(resctrl_tree))
    assert not report.ok


# ---- the kernel's own rules, on the real cgroup filesystem -------------------------------------

REAL = Path("/sys/fs/cgroup")
needs_real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.cfs_quota_us").exists() or not (REAL / "cpuset").is_dir(),
    reason="needs root and cgroup v1 cpu and cpuset hierarchies",
)


@pytest.fixture
def real_dirs() -> Iterator[str]:
    name = f"rhp-test-apply-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    for ctrl in ("cpu", "cpuset"):
        parent = REAL / ctrl / name
        child = parent / "c"
        child.mkdir(parents=True)
        made += [child, parent]
        if ctrl == "cpuset":
            for f in ("cpuset.mems", "cpuset.cpus"):
                (parent / f).write_text((REAL / "cpuset" / f).read_text())
                (child / f).write_text((REAL / "cpuset" / f).read_text())
    yield name
    for d in made:
        d.rmdir()


@needs_real_v1
def test_real_quota_order_up_and_down(real_dirs: str) -> None:
    cg = Cgroups(REAL, version=1)
    base = apply_files(Plan().write("pod", real_dirs, "cpu.cfs_quota_us", 50000)
                       .write("container", f"{real_dirs}/c", "cpu.cfs_quota_us", 40000), cgroups=cg)
    assert base.ok, base.errors
    up = Plan().write("container", f"{real_dirs}/c", "cpu.cfs_quota_us", 80000)
    up.write("pod", real_dirs, "cpu.cfs_quota_us", 100000)
    assert apply_files(up, cgroups=cg).ok
    down = Plan().write("pod", real_dirs, "cpu.cfs_quota_us", 50000)
    down.write("container", f"{real_dirs}/c", "cpu.cfs_quota_us", 40000)
    report = apply_files(down, cgroups=cg)
    assert report.ok, report.errors
    assert cg.read(real_dirs, "cpu.cfs_quota_us") == "50000"


@needs_real_v1
def test_real_kernel_refusal_rolls_back(real_dirs: str) -> None:
    cg = Cgroups(REAL, version=1)
    plan = Plan().write("pod", real_dirs, "cpu.cfs_quota_us", 30000)
    plan.write("container", f"{real_dirs}/c", "cpu.shares", 512)
    plan.write("container", f"{real_dirs}/c", "cpu.cfs_burst_us", 50000)
    plan.write("container", f"{real_dirs}/c", "cpu.cfs_quota_us", 20000)  # below the burst: EINVAL
    report = apply_files(plan, cgroups=cg)
    assert not report.ok and "Invalid argument" in report.errors[0]
    assert len(report.rolled_back) == 2
    assert cg.read(f"{real_dirs}/c", "cpu.shares") == "1024"
    assert cg.read(f"{real_dirs}/c", "cpu.cfs_burst_us") == "0"
    assert cg.read(f"{real_dirs}/c", "cpu.cfs_quota_us") == "-1"
    assert cg.read(real_dirs, "cpu.cfs_quota_us") == "-1"


@needs_real_v1
def test_real_cpuset_shrink_children_first(real_dirs: str) -> None:
    all_cpus = (REAL / "cpuset" / "cpuset.cpus").read_text().strip()
    if all_cpus in ("0", ""):
        pytest.skip("needs at least two CPUs")
    cg = Cgroups(REAL, version=1)
    plan = Plan().write("pod", real_dirs, "cpuset.cpus", "0").write("container", f"{real_dirs}/c", "cpuset.cpus", "0")
    assert apply_files(plan, cgroups=cg).ok
    grow = Plan().write("container", f"{real_dirs}/c", "cpuset.cpus", all_cpus)
    grow.write("pod", real_dirs, "cpuset.cpus", all_cpus)
    report = apply_files(grow, cgroups=cg)
    assert report.ok, report.errors
    assert cg.read(f"{real_dirs}/c", "cpuset.cpus") == all_cpus

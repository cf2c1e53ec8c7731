"""``runtime-proxy doctor`` (``runtime_proxy.commands.doctor``): on this machine's real files, and on
prepared trees where one interface at a time is missing, and for cgroup v2."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.plugins import BUILTIN_PLUGINS
from runtime_proxy.commands import doctor
from runtime_proxy.commands.doctor import Check, DoctorOptions

REPO = Path(__file__).resolve().parents[2]
NOT_HERE = frozenset({"runtime", "nri", "listen", "hook-servers"})

V1_FILES = {
    "cpuset": ["cpuset.cpus", "cpuset.mems"],
    "cpu": ["cpu.cfs_quota_us", "cpu.shares", "cpu.cfs_burst_us", "cpu.stat", "cpu.idle"],
    "memory": ["memory.limit_in_bytes"],
}
V2_FILES = ["cpuset.cpus", "cpuset.mems", "cpu.max", "cpu.weight", "cpu.max.burst", "cpu.stat", "cpu.idle",
            "memory.max", "memory.min", "memory.low", "memory.high"]  # as a real v2 kernel's cgroups hold


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def _v1_tree(root: Path, drop: str = "") -> Path:
    for controller, files in V1_FILES.items():
        (root / controller).mkdir(parents=True, exist_ok=True)
        for f in files:
            if f != drop:
                (root / controller / f).write_text("0\n")
    return root


def _v2_tree(root: Path, drop: str = "", controllers: str = "cpuset cpu memory") -> Path:
    (root / "kubepods").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text(controllers + "\n")
    for f in V2_FILES:
        if f != drop:
            (root / "kubepods" / f).write_text("0\n")
    return root


def _resctrl(root: Path, l3: bool = True, mb: bool = True) -> Path:
    (root / "info").mkdir(parents=True)
    if l3:
        (root / "info" / "L3").mkdir()
        (root / "info" / "L3" / "cbm_mask").write_text("fff\n")
    if mb:
        (root / "info" / "MB").mkdir()
    return root


def _opts(tmp: Path, **kw: object) -> DoctorOptions:
    base: dict[str, object] = {"cgroup_root": str(tmp / "cg"), "resctrl_root": str(tmp / "resctrl"),
                               "proc_root": str(tmp / "proc"), "skip": NOT_HERE}
    base.update(kw)
    return DoctorOptions(**base)  # type: ignore[arg-type]


def test_this_machine_reports_what_is_here() -> None:
    """This machine: cgroup v1 with cpu.cfs_burst_us and cpu.idle, no cpu.bvt_warp_ns, no resctrl."""
    checks = _by_name(doctor.run(DoctorOptions(skip=NOT_HERE)))
    assert checks["cgroup version"].detail == "v1 at /sys/fs/cgroup"
    assert checks["cfs burst (cpu.cfs_burst_us)"].status == "ok"
    assert checks["cpu idle (cpu.idle)"].status == "ok"
    assert checks["cpuset cpus (cpuset.cpus)"].status == "ok"
    assert checks["memory limit (memory.limit_in_bytes)"].status == "ok"
    bvt = checks["group identity (cpu.bvt_warp_ns)"]
    assert bvt.status == "warn" and "cpuPolicy: coreSched" in bvt.detail
    resctrl = checks["resctrl"]
    assert resctrl.status == "warn" and resctrl.needed_by == ("rdt",) and "not mounted" in resctrl.detail
    assert "rdt will be skipped" in resctrl.detail
    assert [c.name for c in checks.values() if c.status == "fail"] == []


def test_this_machine_passes_with_every_plugin_rdt_skipped() -> None:
    """RDT configured on a node without resctrl is a warning (the proxy leaves it out at start),
    not a failed doctor."""
    assert doctor.passed(doctor.run(DoctorOptions(skip=NOT_HERE, plugins=tuple(BUILTIN_PLUGINS))))


def test_this_machine_passes_without_rdt() -> None:
    checks = doctor.run(DoctorOptions(skip=NOT_HERE, plugins=("cpuset", "group_identity", "cpu_burst")))
    assert doctor.passed(checks)
    assert _by_name(checks)["resctrl"].status == "warn"


@pytest.mark.parametrize(
    ("drop", "check", "needed_by"),
    [
        pytest.param("cpuset.cpus", "cpuset cpus (cpuset.cpus)", ("cpuset", "numa"), id="v1 without cpuset.cpus"),
        pytest.param("cpuset.mems", "cpuset mems (cpuset.mems)", ("numa",), id="v1 without cpuset.mems"),
        pytest.param("cpu.cfs_quota_us", "cfs quota (cpu.cfs_quota_us)", ("cpuset", "batch_resource", "cpu_burst"),
                     id="v1 without cfs quota"),
        pytest.param("cpu.shares", "cpu shares (cpu.shares)", ("batch_resource",), id="v1 without cpu.shares"),
        pytest.param("cpu.cfs_burst_us", "cfs burst (cpu.cfs_burst_us)", ("cpu_burst",), id="v1 without cfs burst"),
        pytest.param("cpu.stat", "cpu stat (cpu.stat)", ("cpu_burst",), id="v1 without cpu.stat"),
        pytest.param("memory.limit_in_bytes", "memory limit (memory.limit_in_bytes)", ("batch_resource",),
                     id="v1 without the memory limit"),
    ],
)
def test_each_missing_v1_interface_fails_naming_its_plugins(tmp_path: Path, drop: str, check: str,
                                                           needed_by: tuple[str, ...]) -> None:
    _v1_tree(tmp_path / "cg", drop)
    _resctrl(tmp_path / "resctrl")
    checks = doctor.run(_opts(tmp_path))
    failed = [c for c in checks if c.status == "fail"]
    assert [(c.name, c.needed_by) for c in failed] == [(check, needed_by)]
    assert not doctor.passed(checks)


def test_a_missing_interface_only_warns_when_no_configured_plugin_needs_it(tmp_path: Path) -> None:
    _v1_tree(tmp_path / "cg", "cpu.cfs_burst_us")
    checks = doctor.run(_opts(tmp_path, plugins=("cpuset",)))
    assert doctor.passed(checks)
    assert _by_name(checks)["cfs burst (cpu.cfs_burst_us)"].status == "warn"


@pytest.mark.parametrize(
    ("bvt", "idle", "statuses"),
    [
        pytest.param(True, False, ("ok", "warn"), id="bvt without cpu.idle is enough"),
        pytest.param(False, True, ("warn", "ok"), id="cpu.idle without bvt is enough"),
        pytest.param(True, True, ("ok", "ok"), id="both are fine"),
        pytest.param(False, False, ("fail", "fail"), id="neither fails group_identity and host_app_qos"),
    ],
)
def test_group_identity_needs_bvt_or_cpu_idle(tmp_path: Path, bvt: bool, idle: bool,
                                              statuses: tuple[str, str]) -> None:
    _v1_tree(tmp_path / "cg", "" if idle else "cpu.idle")
    if bvt:
        (tmp_path / "cg" / "cpu" / "cpu.bvt_warp_ns").write_text("0\n")
    checks = _by_name(doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"})))
    got = (checks["group identity (cpu.bvt_warp_ns)"].status, checks["cpu idle (cpu.idle)"].status)
    assert got == statuses
    if "fail" in statuses:
        assert checks["cpu idle (cpu.idle)"].needed_by == ("group_identity", "host_app_qos")


@pytest.mark.parametrize(
    ("present", "check", "policy"),
    [
        pytest.param("idle", "group identity (cpu.bvt_warp_ns)", "cpuPolicy: coreSched",
                     id="without bvt the warning says cpu.idle needs cpuPolicy coreSched"),
        pytest.param("bvt", "cpu idle (cpu.idle)", "cpuPolicy groupIdentity",
                     id="without cpu.idle the warning says bvt is written under cpuPolicy groupIdentity"),
    ],
)
def test_group_identity_warning_says_what_the_plugins_write(tmp_path: Path, present: str, check: str,
                                                            policy: str) -> None:
    """The plugins choose bvt or cpu.idle by the NodeSLO's cpuPolicy, never by the kernel: the
    warning names the policy instead of claiming the other file is used."""
    _v1_tree(tmp_path / "cg", "" if present == "idle" else "cpu.idle")
    if present == "bvt":
        (tmp_path / "cg" / "cpu" / "cpu.bvt_warp_ns").write_text("0\n")
    got = _by_name(doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"})))[check]
    assert got.status == "warn"
    assert policy in got.detail and "used instead" not in got.detail


def test_cgroup_v2_tree_uses_v2_names_and_looks_below_the_root(tmp_path: Path) -> None:
    _v2_tree(tmp_path / "cg")
    checks = _by_name(doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"})))
    assert checks["cgroup version"].detail == f"v2 at {tmp_path / 'cg'}"
    assert checks["cfs burst (cpu.max.burst)"].status == "ok"
    assert checks["cfs quota (cpu.max)"].detail == str(tmp_path / "cg" / "kubepods" / "cpu.max")
    assert checks["controller cpu"].status == "ok"
    assert checks["cgroup driver"].detail == "cgroupfs, detected from kubelet's cgroups (cgroupDriver unset)"
    assert all(c.status != "fail" for c in checks.values())


@pytest.mark.parametrize(
    ("drop", "controllers", "failed"),
    [
        pytest.param("cpu.max.burst", "cpuset cpu memory", ["cfs burst (cpu.max.burst)"], id="v2 without burst"),
        pytest.param("memory.max", "cpuset cpu memory", ["memory limit (memory.max)"], id="v2 without memory.max"),
        pytest.param("", "cpuset memory", ["controller cpu"], id="v2 with the cpu controller not enabled"),
    ],
)
def test_cgroup_v2_missing_parts(tmp_path: Path, drop: str, controllers: str, failed: list[str]) -> None:
    _v2_tree(tmp_path / "cg", drop, controllers)
    checks = doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"}))
    assert [c.name for c in checks if c.status == "fail"] == failed


def test_memory_qos_is_ready_on_v2_and_says_what_v1_does_instead(tmp_path: Path) -> None:
    """memory_qos writes memory.min/low/high on cgroup v2 only; on v1 the doctor warns that it
    writes nothing there, and a v2 tree without memory.min fails."""
    name = "memory qos (memory.min/low/high)"
    assert len(name) <= 33  # the doctor's check column: tests/v2 reads the first 34 characters of a line
    _v2_tree(tmp_path / "v2" / "cg")
    assert _by_name(doctor.run(_opts(tmp_path / "v2", skip=NOT_HERE | {"resctrl"})))[name].status == "ok"
    _v1_tree(tmp_path / "v1" / "cg")
    got = _by_name(doctor.run(_opts(tmp_path / "v1", skip=NOT_HERE | {"resctrl"})))[name]
    assert got.status == "warn" and "writes nothing" in got.detail and got.needed_by == ("memory_qos",)
    _v2_tree(tmp_path / "v2b" / "cg", "memory.min")
    got = _by_name(doctor.run(_opts(tmp_path / "v2b", skip=NOT_HERE | {"resctrl"})))[name]
    assert got.status == "fail" and "memory.min" in got.detail


def test_driver_mismatch_fails(tmp_path: Path) -> None:
    _v1_tree(tmp_path / "cg")
    (tmp_path / "cg" / "cpu" / "kubepods.slice").mkdir()
    check = _by_name(doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"}, cgroup_driver="cgroupfs")))
    assert check["cgroup driver"].status == "fail" and "set cgroupDriver: systemd" in check["cgroup driver"].detail


@pytest.mark.parametrize(
    ("kubepods", "status", "detail"),
    [
        pytest.param("kubepods.slice", "ok", "systemd, detected from kubelet's cgroups", id="a slice is systemd"),
        pytest.param("kubepods", "ok", "cgroupfs, detected from kubelet's cgroups", id="a plain dir is cgroupfs"),
        pytest.param("", "warn", "cgroupDriver unset and no kubepods cgroup yet",
                     id="nothing to detect from yet warns"),
    ],
)
def test_an_unset_driver_is_detected(tmp_path: Path, kubepods: str, status: str, detail: str) -> None:
    _v1_tree(tmp_path / "cg")
    if kubepods:
        (tmp_path / "cg" / "cpu" / kubepods).mkdir()
    check = _by_name(doctor.run(_opts(tmp_path, skip=NOT_HERE | {"resctrl"})))["cgroup driver"]
    assert (check.status, check.detail.startswith(detail)) == (status, True), check.detail


def test_no_cgroup_filesystem_fails(tmp_path: Path) -> None:
    checks = doctor.run(_opts(tmp_path, skip=frozenset(doctor.CHECKS) - {"cgroup", "interfaces"}))
    assert [(c.name, c.status) for c in checks] == [("cgroup", "fail")]


@pytest.mark.parametrize(
    ("l3", "mb", "failed"),
    [
        pytest.param(True, True, [], id="resctrl with L3 and MB passes"),
        pytest.param(False, True, ["resctrl L3 (cache ways)"], id="resctrl without L3 fails rdt"),
        pytest.param(True, False, ["resctrl MB (memory bandwidth)"], id="resctrl without MB fails rdt"),
    ],
)
def test_resctrl_resources(tmp_path: Path, l3: bool, mb: bool, failed: list[str]) -> None:
    _resctrl(tmp_path / "resctrl", l3, mb)
    checks = doctor.run(_opts(tmp_path, skip=NOT_HERE | {"cgroup", "interfaces"}))
    assert [c.name for c in checks if c.status == "fail"] == failed


def test_resctrl_not_mounted_is_read_from_proc_mounts(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "mounts").write_text("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    (check,) = doctor.run(_opts(tmp_path, skip=frozenset(doctor.CHECKS) - {"resctrl"}))
    assert check.status == "warn" and check.detail.startswith("not mounted at ")
    assert check.detail.endswith("; rdt will be skipped") and check.needed_by == ("rdt",)


@pytest.fixture
def short() -> Iterator[Path]:
    path = Path(f"/tmp/rhp-doc-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def _only(opts: DoctorOptions, group: str) -> dict[str, Check]:
    return _by_name(doctor.run(DoctorOptions(**{**opts.__dict__, "skip": frozenset(doctor.CHECKS) - {group}})))


def test_listen_path_states(short: Path) -> None:
    opts = DoctorOptions(listen=str(short / "run" / "proxy.sock"))
    assert _only(opts, "listen")["listen directory"].status == "warn"
    (short / "run").mkdir(mode=0o755)
    checks = _only(opts, "listen")
    assert checks["listen directory"].status == "ok" and checks["listen path"].detail.endswith("free")
    (short / "run" / "proxy.sock").write_text("")
    assert _only(opts, "listen")["listen path"].status == "fail"
    (short / "run" / "proxy.sock").unlink()
    with _listen(short / "run" / "proxy.sock"):
        assert "serves it" in _only(opts, "listen")["listen path"].detail
    assert "replaces it" in _only(opts, "listen")["listen path"].detail
    os.chmod(short / "run", 0o777)
    assert _only(opts, "listen")["listen directory"].status == "fail"


def test_runtime_that_is_not_there_or_does_not_speak_cri_fails(short: Path) -> None:
    opts = DoctorOptions(backend=str(short / "containerd.sock"), runtime_timeout=1.0)
    check = _only(opts, "runtime")["containerd (CRI)"]
    assert check.status == "fail" and "not reachable" in check.detail
    with _listen(short / "containerd.sock"):
        check = _only(opts, "runtime")["containerd (CRI)"]
    assert check.status == "fail" and "does not answer CRI v1 Version" in check.detail


def test_nri_socket_is_needed_only_in_nri_mode(short: Path) -> None:
    opts = DoctorOptions(nri_socket=str(short / "nri.sock"))
    assert _only(opts, "nri")["NRI socket"].status == "warn"
    assert _only(DoctorOptions(**{**opts.__dict__, "mode": "nri"}), "nri")["NRI socket"].status == "fail"
    with _listen(short / "nri.sock"):
        assert _only(opts, "nri")["NRI socket"].status == "ok"


def _reg(directory: Path, name: str, endpoint: str, policy: str = "Ignore", body: str | None = None) -> None:
    text = body if body is not None else json.dumps(
        {"remote-endpoint": endpoint, "failure-policy": policy, "runtime-hooks": ["PreCreateContainer"]})
    (directory / name).write_text(text)
    os.chmod(directory / name, 0o644)


def test_hook_server_registrations(short: Path) -> None:
    regdir = short / "hookserver.d"
    regdir.mkdir(mode=0o755)
    opts = DoctorOptions(hook_server_dir=str(regdir))
    assert _only(opts, "hook-servers")["hook servers"].detail.startswith("no registrations")
    _reg(regdir, "a-live.json", str(short / "live.sock"))
    _reg(regdir, "b-dead-ignore.json", str(short / "dead.sock"))
    _reg(regdir, "c-dead-fail.json", str(short / "dead.sock"), policy="Fail")
    _reg(regdir, "d-bad.json", "", body='{"remote-endpoint": "/x.sock", "runtime-hooks": [], "extra": 1}')
    _reg(regdir, "e-writable.json", str(short / "live.sock"))
    os.chmod(regdir / "e-writable.json", 0o666)
    with _listen(short / "live.sock"):
        checks = _only(opts, "hook-servers")
    got = {name: c.status for name, c in checks.items()}
    assert got == {"hook server a-live.json": "ok", "hook server b-dead-ignore.json": "warn",
                   "hook server c-dead-fail.json": "fail", "hook server d-bad.json": "fail",
                   "hook server e-writable.json": "fail"}
    assert "extra" in checks["hook server d-bad.json"].detail


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_config_and_node_config_are_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins: [{name: cpuset, colour: red}]\n")
    opts = doctor.options_from_args(_args("--config", str(bad)))
    assert _only(opts, "files")["config"].status == "fail"
    node = tmp_path / "node.yaml"
    node.write_text("nodeSLO: 3\n")
    good = tmp_path / "good.yaml"
    good.write_text(f"plugins: [{{name: cpuset}}, {{name: rdt, enabled: false}}]\nnodeConfigFile: {node}\n")
    opts = doctor.options_from_args(_args("--config", str(good)))
    assert opts.plugins == ("cpuset",)
    checks = _only(opts, "files")
    assert checks["config"].status == "ok" and checks["node config"].status == "fail"
    node.write_text("nodeSLO: {}\n")
    assert _only(opts, "files")["node config"].status == "ok"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "runtime_proxy.cli", "doctor", *argv], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    _v1_tree(tmp_path / "cg", "cpu.cfs_burst_us")
    skips = [a for g in sorted(NOT_HERE) for a in ("--skip", g)]
    done = _cli("--cgroup-root", str(tmp_path / "cg"), "--resctrl-root", str(tmp_path / "no"), "-o", "json", *skips)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ready"] is False
    assert [c["check"] for c in report["checks"] if c["status"] == "fail"] == ["cfs burst (cpu.cfs_burst_us)"]
    done = _cli("--cgroup-root", str(tmp_path / "cg"), "--plugins", "cpuset,group_identity", *skips)
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("CHECK ") and done.stdout.rstrip().endswith("ready for runtime-proxy")
    assert _cli("--skip", "everything").returncode == 2

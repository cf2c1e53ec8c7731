"""The product on a real cgroup v2 node with systemd (the guest of ``rhp_devenv.v2node``).

``guest_scenario.py`` runs in the guest: ``runtime-proxy serve`` (CRI proxy) or ``runtime-proxy
nri`` (NRI plugin) with the built-ins cpuset, numa, group_identity, batch_resource, cpu_burst,
cpu_suppress and host_app_qos (a BE application in ``hostapps.slice/hostbe.service``) in front
of containerd 2.1 (``SystemdCgroup = true``), LSR, LSE, LS and BE pods under kubelet's slice
names, and the files read back from the guest's kernel. Each door's test prints a table: plugin,
pod, the value planned (v1 terms, as plans name it), the v2 file and what the kernel reads back.
On the old main none of this existed (the tier is new with issue 33).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rhp_devenv.v2node import GUEST_SHARE, V2Node

from tests.v2.conftest import REPO
from tests.v2.report import REPORT

MiB = 1024**2


def _weight(shares: int) -> int:
    # runc's cpu.shares -> cpu.weight (the product's Cgroups uses the same formula)
    return 1 + ((shares - 2) * 9999) // 262142


# (plugin, pod, where, planned in v1 terms, v2 file, expected content of the v2 file)
EXPECTED: list[tuple[str, str, str, str, str, str]] = [
    ("cpuset", "LSR", "container", "cpuset_cpus=1", "cpuset.cpus", "1"),
    ("cpuset", "LSR", "container", "cpu_quota=-1", "cpu.max", "max 100000"),
    ("cpuset", "LSR", "pod", "cpu.cfs_quota_us=-1", "cpu.max", "max 100000"),
    ("cpuset", "LSE", "container", "cpuset_cpus=0", "cpuset.cpus", "0"),
    ("cpuset", "LSE", "pod", "cpu.cfs_quota_us=-1", "cpu.max", "max 100000"),
    ("cpuset", "LS", "container", "cpuset_cpus=0-1 (share pool)", "cpuset.cpus", "0-1"),
    ("group_identity", "LSR", "pod", "cpu.idle=0 (lsrClass schedIdle)", "cpu.idle", "0"),
    ("group_identity", "LS", "pod", "cpu.idle=0 (lsClass schedIdle)", "cpu.idle", "0"),
    ("group_identity", "BE", "pod", "cpu.idle=1 (beClass schedIdle)", "cpu.idle", "1"),
    ("cpu_burst", "LS", "container", "cpu.cfs_burst_us=50000 (1 core x 50%)", "cpu.max.burst", "50000"),
    ("batch_resource", "BE", "container", "cpu_shares=256 (batch-cpu 250m)", "cpu.weight", str(_weight(256))),
    ("batch_resource", "BE", "container", "cpu_quota=50000 (batch-cpu limit 500m)", "cpu.max", "50000 100000"),
    ("batch_resource", "BE", "container", f"memory_limit_in_bytes={96 * MiB}", "memory.max", str(96 * MiB)),
    ("batch_resource", "BE", "pod", "cpu.cfs_quota_us=50000", "cpu.max", "50000 100000"),
    ("batch_resource", "BE", "pod", f"memory.limit_in_bytes={96 * MiB}", "memory.max", str(96 * MiB)),
]


_RESULTS: dict[str, dict[str, Any]] = {}


def _scenario(node: V2Node, door: str) -> dict[str, Any]:
    """The guest scenario's results for *door* (run once per session: 1.5 minutes each)."""
    if door in _RESULTS:
        return _RESULTS[door]
    out = f"{GUEST_SHARE}/out"
    script = node.python(str(REPO / "tests" / "v2" / "guest_scenario.py"), door, out)
    result = node.run(script, timeout=900)
    path = node.share / "out" / f"{door}.json"
    assert result.rc == 0 and path.exists(), f"guest scenario failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    data: dict[str, Any] = json.loads(path.read_text())
    _RESULTS[door] = data
    return data


def _table(door: str, data: dict[str, Any]) -> tuple[list[str], list[str]]:
    lines = [f"{door}: plugin | pod | planned (v1 terms) | file written (v2) | read back",
             f"{door}: " + "-" * 90]
    wrong: list[str] = []
    for plugin, pod, where, planned, file, want in EXPECTED:
        info = data["pods"][pod]
        got = info["files"][f"{where}/{file}"]
        slice_path = info["pod_dir"].removeprefix("/sys/fs/cgroup/")
        shown = f"{slice_path}/{file}" if where == "pod" else f".../cri-containerd-<id>.scope/{file}"
        lines.append(f"{door}: {plugin} | {pod} | {planned} | {shown} | {got}")
        if got != want:
            wrong.append(f"{plugin} {pod} {where}/{file}: want {want!r}, read {got!r}")
    # cpu_suppress (cpuset policy): the BE tree follows the suppressed set, top-down consistent
    be_qos = data["qos"][0]["kubeqos/cpuset.cpus"]
    be_ctr = data["pods"]["BE"]["files"]["container/cpuset.cpus"]
    lines.append(f"{door}: cpu_suppress | BE | cpuset of the BE tree = suppressed set | "
                 f"kubepods.slice/kubepods-besteffort.slice/cpuset.cpus | {be_qos} (BE container: {be_ctr})")
    host_app = data["qos"][0]["hostapp/cpu.idle"]
    lines.append(f"{door}: host_app_qos | host app hostbe (BE) | cpu.idle=1 (beClass schedIdle) | "
                 f"hostapps.slice/hostbe.service/cpu.idle | {host_app}")
    if host_app != "1":
        wrong.append(f"host_app_qos hostapps.slice/hostbe.service/cpu.idle: want '1', read {host_app!r}")
    lines.append(f"{door}: pod start times (s): " + ", ".join(f"{k} {v['seconds']}" for k, v in data["pods"].items()))
    return lines, wrong


@pytest.mark.parametrize("door", ["serve", "nri"])
def test_plugins_write_real_v2_files(v2node: V2Node, door: str) -> None:
    data = _scenario(v2node, door)
    lines, wrong = _table(door, data)
    REPORT.extend(lines)
    print("\n".join(lines))
    assert not wrong, "\n".join(wrong) + "\n--- log ---\n" + data["log"][-6000:]
    be_qos = data["qos"][0]["kubeqos/cpuset.cpus"]
    assert be_qos and not be_qos.startswith("<"), data["qos"]
    assert data["pods"]["BE"]["files"]["container/cpuset.cpus"] == be_qos


def test_usage_readers_match_the_kernel(v2node: V2Node) -> None:
    data = _scenario(v2node, "serve")
    usage = data["usage"]
    stat = dict(line.split() for line in usage["cpu.stat"].splitlines())
    assert usage["parsed_cpu_ns"] == int(stat["usage_usec"]) * 1000
    mem = dict(line.split() for line in usage["memory.stat"].splitlines())
    assert usage["parsed_memory"] == int(mem["inactive_anon"]) + int(mem["active_anon"]) + int(mem["unevictable"])
    assert 0 < usage["parsed_memory"] <= int(usage["memory.current"])


def test_the_guest_is_a_v2_systemd_node_without_network(v2node: V2Node) -> None:
    result = v2node.run(
        "cat /sys/fs/cgroup/cgroup.controllers; stat -fc %T /sys/fs/cgroup; cat /proc/1/comm; "
        "ls /sys/class/net; systemctl is-active containerd; "
        "/opt/runtime-hook-proxy/containerd/2.1/usr/bin/containerd --version", check=True)
    lines = result.stdout.splitlines()
    assert {"cpuset", "cpu", "io", "memory", "pids"} <= set(lines[0].split())
    assert lines[1] == "cgroup2fs"
    assert lines[2] == "systemd"
    assert lines[3:-2] == ["lo"], "the guest must have no network device but loopback"
    assert lines[-2] == "active"
    assert " 2.1." in lines[-1]
    assert "-nic" in (cmd := v2node.command(v2node.build_dir or REPO)) and cmd[cmd.index("-nic") + 1] == "none"


def test_doctor_reports_v2_and_systemd(v2node: V2Node) -> None:
    # The CRI check may fail here: doctor gives the runtime 3 s, and a gRPC handshake in the
    # emulated guest (25-35x slower) can take longer. The cgroup checks are what this is about.
    cmd = v2node.python("-m", "runtime_proxy.cli", "doctor", "--cgroup-driver", "systemd",
                        "--plugins", "cpuset,group_identity,batch_resource,cpu_burst,cpu_suppress")
    result = v2node.run(cmd + " 2>&1", timeout=300)
    REPORT.append("doctor in the guest:")
    REPORT.extend("  " + line for line in result.stdout.splitlines())
    rows = {line[:34].strip(): line[34:].split(None, 1) for line in result.stdout.splitlines() if line[34:42].strip()}
    assert rows["cgroup version"] == ["ok", "v2 at /sys/fs/cgroup"], result.stdout
    assert rows["cgroup driver"][0] == "ok" and "systemd" in rows["cgroup driver"][1], result.stdout
    for check in ("cpuset cpus (cpuset.cpus)", "cfs quota (cpu.max)", "cpu shares (cpu.weight)",
                  "cfs burst (cpu.max.burst)", "cpu idle (cpu.idle)", "memory limit (memory.max)",
                  "controller cpu", "controller cpuset", "controller memory"):
        assert rows[check][0] == "ok", f"{check}: {rows.get(check)}\n{result.stdout}"
    assert rows["group identity (cpu.bvt_warp_ns)"][0] == "warn"  # not in a mainline kernel: cpu.idle instead


def test_a_memory_limit_is_compared_in_pages_on_the_real_kernel(v2node: V2Node) -> None:
    # The kernel keeps memory.max in pages (100000001 reads back 99999744); the second write of
    # the same limit must be "unchanged", not a rewrite (drift) every reconcile round.
    code = (
        "import os\n"
        "from runtime_proxy.host.cgroups import Cgroups\n"
        "os.makedirs('/sys/fs/cgroup/rhp-probe.slice', exist_ok=True)\n"
        "cg = Cgroups('/sys/fs/cgroup')\n"
        "first = cg.write('rhp-probe.slice', 'memory.limit_in_bytes', 100000001).status\n"
        "raw = open('/sys/fs/cgroup/rhp-probe.slice/memory.max').read().strip()\n"
        "second = cg.write('rhp-probe.slice', 'memory.limit_in_bytes', 100000001).status\n"
        "os.rmdir('/sys/fs/cgroup/rhp-probe.slice')\n"
        "print(first, raw, second)\n"
    )
    (v2node.share / "memory_pages.py").write_text(code)
    result = v2node.run(v2node.python(f"{GUEST_SHARE}/memory_pages.py"), timeout=300, check=True)
    assert result.stdout.splitlines()[-1].split() == ["written", "99999744", "unchanged"]  # after the log lines

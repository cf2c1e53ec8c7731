"""Run inside the v2 node (``rhp_devenv.v2node``) by ``tests/v2/test_v2_node.py``: start
``runtime-proxy serve`` or ``runtime-proxy nri`` with the built-in plugins in front of the
guest's containerd 2.1 (systemd cgroup driver), start LSR, LSE, LS and BE pods through CRI with
kubelet's slice names, and print as JSON what was planned, which file was written and what the
guest's kernel reads back. The host side compares and prints the table.

    python3 tests/v2/guest_scenario.py serve|nri OUT_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rhp_devenv.cri import CriClient, linux_resources
from rhp_devenv.image import build_image_archive, import_image

from koord_formats.topology import format_cpu_topology
from runtime_proxy.state.sysfs import read_cpu_topology

CG = Path("/sys/fs/cgroup")
CONTAINERD = "/run/containerd/containerd.sock"
NRI = "/var/run/nri/nri.sock"
CTR = Path("/opt/runtime-hook-proxy/containerd/2.1/usr/bin/ctr")
QOS = "koordinator.sh/qosClass"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED = "node.koordinator.sh/extended-resource-spec"
MiB = 1024**2

BUILTINS = ["cpuset", "numa", "group_identity", "batch_resource", "cpu_burst", "cpu_suppress", "host_app_qos"]
NODE_SLO: dict[str, Any] = {
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"},
        "lsrClass": {"cpuQOS": {"enable": True, "schedIdle": 0}},
        "lsClass": {"cpuQOS": {"enable": True, "schedIdle": 0}},
        "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}},
    },
    "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65,
                                    "cpuSuppressPolicy": "cpuset"},
    "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 50},
    # a BE application outside containers, in a systemd service of its own slice
    "hostApplications": [{"name": "hostbe", "qos": "BE", "cgroupPath": {
        "base": "CgroupRoot", "parentDir": "hostapps.slice", "relativePath": "hostbe.service"}}],
}
HOST_APP = CG / "hostapps.slice" / "hostbe.service"


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not in {timeout:.0f} s")
        time.sleep(0.2)


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError as exc:
        return f"<{type(exc).__name__}: {exc.strerror}>"


def slice_dir(kube_qos: str, uid: str) -> tuple[str, Path]:
    """kubelet's systemd names: the pod's cgroup parent and its directory."""
    u = uid.replace("-", "_")
    if kube_qos == "guaranteed":
        name = f"kubepods-pod{u}.slice"
        return name, CG / "kubepods.slice" / name
    name = f"kubepods-{kube_qos}-pod{u}.slice"
    return name, CG / "kubepods.slice" / f"kubepods-{kube_qos}.slice" / name


def node_config(path: Path) -> None:
    doc = {
        "name": "v2node",
        "labels": {"kubernetes.io/hostname": "v2node"},
        "nodeResourceTopology": {"annotations": {
            "node.koordinator.sh/cpu-topology": format_cpu_topology(read_cpu_topology()),
            "kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "none"}),
            "node.koordinator.sh/cpu-shared-pools": json.dumps([{"socket": 0, "node": 0, "cpuset": "0-1"}]),
        }},
        "nodeSLO": NODE_SLO,
    }
    path.write_text(json.dumps(doc))


def proxy_config(path: Path, node: Path) -> None:
    path.write_text(json.dumps({
        "plugins": [{"name": n} for n in BUILTINS],
        "nodeConfigFile": str(node),
        "cgroupRoot": str(CG),
        "usageLoop": {"evictBy": "runtime", "intervalSeconds": 1.0},
        "reconcilePeriodSeconds": 2.0,
    }))


def start_door(door: str, work: Path, timeout: float = 180.0) -> subprocess.Popen[bytes]:
    cfg, node = work / "proxy.json", work / "node.json"
    node_config(node)
    proxy_config(cfg, node)
    common = ["--config", str(cfg), "--cgroup-driver", "systemd", "--no-entry-points", "--log-level", "debug"]
    if door == "serve":
        args = ["serve", "--listen", str(work / "proxy.sock"), "--backend", CONTAINERD, *common]
    else:
        args = ["nri", "--nri-socket", NRI, "--backend", CONTAINERD, *common]
    log = open(work / f"{door}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "runtime_proxy.cli", *args], stdout=log, stderr=log)
    if door == "serve":
        wait_for("the proxy's socket", lambda: (work / "proxy.sock").exists() or proc.poll() is not None, timeout)
        if proc.poll() is None:
            with CriClient(work / "proxy.sock", timeout=180, wait_for_ready=True) as cri:
                wait_for("the proxy's answer to Version", lambda: _answers(cri), timeout)
    else:
        wait_for("the NRI plugin's Synchronize", lambda: b"NRI synchronized" in (work / "nri.log").read_bytes()
                 or proc.poll() is not None, timeout)
    if proc.poll() is not None:
        tail = (work / f"{door}.log").read_text()[-3000:]
        raise RuntimeError(f"runtime-proxy {door} exited {proc.returncode}: {tail}")
    return proc


def main() -> None:
    door, out = sys.argv[1], Path(sys.argv[2])
    work = Path(f"/run/rhp-{door}")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    wait_for("containerd", lambda: Path(CONTAINERD).exists(), 180)
    with CriClient(CONTAINERD, timeout=120, wait_for_ready=True) as direct:
        direct.version()  # the CRI plugin is up
    if not (work.parent / "rhp-image-imported").exists():
        archive = build_image_archive(work / "busybox.tar")
        import_image(CTR, Path(CONTAINERD), archive.archive, timeout=180)
        (work.parent / "rhp-image-imported").write_text("1")
    if not HOST_APP.is_dir():  # the user's job, as in Koordinator: the unit runs before the agent
        subprocess.run(["systemd-run", "--unit=hostbe", "--slice=hostapps.slice", "-p", "CPUWeight=100",
                        "-p", "AllowedCPUs=0-1", "sleep", "infinity"], check=True, capture_output=True)
        wait_for("the host application's cgroup", HOST_APP.is_dir, 60)
    (HOST_APP / "cpu.idle").write_text("0")  # what the other door's run left
    proc = start_door(door, work)
    socket = str(work / "proxy.sock") if door == "serve" else CONTAINERD
    rows: list[dict[str, Any]] = []
    pods: dict[str, Any] = {}
    try:
        # wait_for_ready: under emulation on a loaded host a connection attempt can outlast gRPC's
        # 20 s; the call then waits for the channel (up to its deadline) instead of failing
        with CriClient(socket, timeout=180, wait_for_ready=True) as cri:
            specs = {
                # name: (qos label, kube QoS, annotations, container resources)
                "LSR": ("LSR", "guaranteed", {RESOURCE_STATUS: json.dumps({"cpuset": "1"})},
                        linux_resources(cpu_shares=1024, cpu_quota=100_000, memory_limit_in_bytes=64 * MiB)),
                "LSE": ("LSE", "guaranteed", {RESOURCE_STATUS: json.dumps({"cpuset": "0"})},
                        linux_resources(cpu_shares=1024, cpu_quota=100_000, memory_limit_in_bytes=64 * MiB)),
                "LS": ("LS", "burstable", {},
                       linux_resources(cpu_shares=512, cpu_quota=100_000, memory_limit_in_bytes=128 * MiB)),
                "BE": ("BE", "besteffort", {EXTENDED: json.dumps({"containers": {"main": {
                    "requests": {"kubernetes.io/batch-cpu": "250", "kubernetes.io/batch-memory": "64Mi"},
                    "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "96Mi"}}}})},
                       linux_resources(cpu_shares=2)),
            }
            for name, (qos, kube_qos, annotations, resources) in specs.items():
                uid = str(uuid.uuid4())
                parent, pod_dir = slice_dir(kube_qos, uid)
                started = time.monotonic()
                pod = cri.run_pod(cgroup_parent=parent, labels={QOS: qos}, annotations=annotations,
                                  name=f"v2-{name.lower()}", uid=uid)
                cid = cri.run_container(pod, resources=resources, name="main")
                pods[name] = {"uid": uid, "parent": parent, "pod_dir": str(pod_dir), "cid": cid,
                              "seconds": round(time.monotonic() - started, 2),
                              "ctr_dir": str(pod_dir / f"cri-containerd-{cid}.scope")}
            # the files the plugins write, read back from the kernel
            time.sleep(3)  # the usage loop's CPU suppress rounds (interval 1 s) and post-start writes
            for info in pods.values():
                pod_dir, ctr_dir = Path(info["pod_dir"]), Path(info["ctr_dir"])
                files = {}
                for where, d in (("pod", pod_dir), ("container", ctr_dir)):
                    for f in ("cpuset.cpus", "cpuset.cpus.effective", "cpu.max", "cpu.weight", "cpu.idle",
                              "cpu.max.burst", "memory.max"):
                        files[f"{where}/{f}"] = read(d / f)
                info["files"] = files
            be_qos = CG / "kubepods.slice" / "kubepods-besteffort.slice"
            # host_app_qos runs in the reconciler's node round (every 2 s here); the test shows what was read
            with contextlib.suppress(TimeoutError):
                wait_for("the host application's cpu.idle", lambda: read(HOST_APP / "cpu.idle") == "1", 60)
            rows.append({"hostapp/cpu.idle": read(HOST_APP / "cpu.idle"),
                         "kubeqos/cpuset.cpus": read(be_qos / "cpuset.cpus"),
                         "kubeqos/cpuset.cpus.effective": read(be_qos / "cpuset.cpus.effective"),
                         "kubeqos/cgroup.subtree_control": read(be_qos / "cgroup.subtree_control"),
                         "kubepods/cgroup.subtree_control": read(CG / "kubepods.slice" / "cgroup.subtree_control")})
            # the usage loop's readers against the kernel's files
            from runtime_proxy.loops.usage import parse_cpu_stat_usage, parse_memory_stat
            be = Path(pods["BE"]["pod_dir"])
            cpu_stat = (be / "cpu.stat").read_bytes()
            mem_stat = (be / "memory.stat").read_bytes()
            usage = {"cpu.stat": cpu_stat.decode(), "parsed_cpu_ns": parse_cpu_stat_usage(cpu_stat),
                     "memory.stat": mem_stat.decode(), "parsed_memory": parse_memory_stat(mem_stat, 2),
                     "memory.current": read(be / "memory.current")}
            for info in pods.values():
                cri.remove_pod(_pod_id(cri, info["uid"]))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{door}.json").write_text(json.dumps({
        "door": door, "pods": pods, "qos": rows, "usage": usage, "seconds": round(time.monotonic() - t0, 1),
        "log": (work / f"{door}.log").read_text(errors="replace")[-20000:],
    }, indent=1))


def _answers(cri: CriClient) -> bool:
    try:
        cri.version(timeout=30)
    except Exception:  # the proxy is still starting under emulation
        return False
    return True


def _pod_id(cri: CriClient, uid: str) -> str:
    for sandbox in cri.list_pod_sandboxes():
        if sandbox.metadata.uid == uid:
            return str(sandbox.id)
    raise LookupError(uid)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()

"""Run inside the v2 node by ``tests/v2/test_memory_qos.py``: memory QoS under real memory
pressure. ``runtime-proxy serve`` with the ``memory_qos`` plugin in front of the guest's
containerd 2.1 starts an LS pod (memory request 256 MiB, through the extended-resource-spec
annotation, since there is no cluster here) and a BE pod under kubelet's slice names; kubepods.slice
gets a ``memory.max`` of 384 MiB, as kubelet's node-allocatable enforcement gives it.

Twice, first with ``lsClass.memoryQOS.enable: false`` (the plugin writes ``memory.min`` 0) and then
with ``enable: true, minLimitPercent: 100, lowLimitPercent: 100`` (``memory.min`` 256 MiB on the LS
container, pod, burstable slice and kubepods.slice): the LS container reads a 160 MiB file into
its page cache (its working set), then a process in the BE container writes 320 MiB of anonymous
memory (no swap: only page cache can be reclaimed), then the LS container reads the file again.
Printed as JSON: the LS container's memory.current and file pages before and after the BE
pressure, the refaults (``workingset_refault_file``) and seconds of the re-read, memory.events,
and how the BE process ended.

    python3 tests/v2/guest_memory_qos.py OUT_DIR
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.v2

from rhp_devenv.cri import CriClient, linux_resources
from rhp_devenv.image import build_image_archive, import_image

from tests.v2 import guest_scenario as gs  # the scenario's helpers: image, waits, slice names

MiB = 1024**2
KUBEPODS = gs.CG / "kubepods.slice"
KUBEPODS_MAX = 384 * MiB
FILE = Path("/var/tmp/rhp-ls-working-set")  # on the guest's ext4 disk: page cache, reclaimable
FILE_MIB = 160
BE_MIB = 288
LS_REQUEST = 256 * MiB
OFF = {"resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": False}}}}
# A third pod overrides the node's memory QoS with its own (koordinator.sh/memoryQOS, policy auto:
# the class's defaults, then its fields, whatever the NodeSLO says); memory.min 0 keeps the
# kube-QoS sums of memory.min the pressure phases assert.
MEMORY_QOS_ANNOTATION = "koordinator.sh/memoryQOS"
OWN = {"policy": "auto", "minLimitPercent": 0, "lowLimitPercent": 50, "throttlingPercent": 50}
OWN_REQUEST, OWN_LIMIT = 64 * MiB, 128 * MiB
OWN_EXPECTED = {"memory.min": "0", "memory.low": str(OWN_REQUEST // 2),
                "memory.high": str(OWN_REQUEST + (OWN_LIMIT - OWN_REQUEST) // 2)}
ON = {"resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": 100,
                                                        "lowLimitPercent": 100, "throttlingPercent": 0}}}}


def node_doc(slo: dict[str, Any]) -> str:
    return json.dumps({"name": "v2node", "labels": {"kubernetes.io/hostname": "v2node"}, "nodeSLO": slo})


def stat(cg: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cg / "memory.stat").read_text().splitlines())}


def events(cg: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cg / "memory.events").read_text().splitlines())}


def in_cgroup(cg: Path, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``command`` (sh) run as a process of cgroup ``cg``: it moves itself in, then execs."""
    return subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec {command}'],
                          capture_output=True, text=True, timeout=timeout)


def own_read(own: Path, phase: str) -> dict[str, str]:
    """The annotated pod's container files the plugin writes."""
    return {"phase": phase, **{f: (own / f).read_text().strip() for f in OWN_EXPECTED}}


def ls_read(ls: Path) -> dict[str, Any]:
    before = stat(ls)
    started = time.monotonic()
    result = in_cgroup(ls, f"cat {FILE} > /dev/null")
    assert result.returncode == 0, result.stderr
    after = stat(ls)
    return {"seconds": round(time.monotonic() - started, 2),
            "refaults": after["workingset_refault_file"] - before["workingset_refault_file"],
            "read_in_mib": round((after["file"] - before["file"]) / MiB, 1)}


def phase(name: str, ls: Path, be: Path) -> dict[str, Any]:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3")  # the working set is charged to LS alone
    first = ls_read(ls)
    ls_before = {"memory.current": int((ls / "memory.current").read_text()), "file": stat(ls)["file"]}
    ev_before = events(ls)
    oom_before = events(KUBEPODS).get("oom_kill", 0)
    hog = ("python3 -c 'import time; b = bytearray(b\"x\") * " + str(BE_MIB * MiB) + "; time.sleep(1)'")
    started = time.monotonic()
    be_result = in_cgroup(be, hog)
    be_seconds = round(time.monotonic() - started, 2)
    ls_after = {"memory.current": int((ls / "memory.current").read_text()), "file": stat(ls)["file"]}
    ev_after = events(ls)
    second = ls_read(ls)
    return {
        "phase": name,
        "ls_min": (ls / "memory.min").read_text().strip(), "ls_low": (ls / "memory.low").read_text().strip(),
        "burstable_min": (KUBEPODS / "kubepods-burstable.slice" / "memory.min").read_text().strip(),
        "kubepods_min": (KUBEPODS / "memory.min").read_text().strip(),
        "first_read": first, "ls_before": ls_before, "ls_after": ls_after,
        "ls_events_delta": {k: ev_after[k] - ev_before.get(k, 0) for k in ev_after},
        "be_rc": be_result.returncode, "be_seconds": be_seconds,
        "kubepods_oom_kills": events(KUBEPODS).get("oom_kill", 0) - oom_before,
        "second_read": second,
    }


def main() -> None:
    out = Path(sys.argv[1])
    work = Path("/run/rhp-memqos")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    gs.wait_for("containerd", lambda: Path(gs.CONTAINERD).exists(), 300)
    if not (work.parent / "rhp-image-imported").exists():
        archive = build_image_archive(work / "busybox.tar")
        import_image(gs.CTR, Path(gs.CONTAINERD), archive.archive, timeout=600)
        (work.parent / "rhp-image-imported").write_text("1")
    if not FILE.exists():
        subprocess.run(["dd", "if=/dev/zero", f"of={FILE}", "bs=1M", f"count={FILE_MIB}"],
                       check=True, capture_output=True)
    node = work / "node.json"
    node.write_text(node_doc(OFF))
    cfg = work / "proxy.json"
    cfg.write_text(json.dumps({"plugins": [{"name": "memory_qos"}], "nodeConfigFile": str(node),
                               "cgroupRoot": str(gs.CG), "usageLoop": {"intervalSeconds": 1.0}}))
    log = open(work / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "runtime_proxy.cli", "serve", "--listen", str(work / "proxy.sock"),
                             "--backend", gs.CONTAINERD, "--config", str(cfg), "--cgroup-driver", "systemd",
                             "--no-entry-points", "--log-level", "debug"], stdout=log, stderr=log)
    results: list[dict[str, Any]] = []
    own_values: list[dict[str, str]] = []
    pods: dict[str, Any] = {}
    timings: dict[str, float] = {"setup": round(time.monotonic() - t0, 1)}
    try:
        gs.wait_for("the proxy's socket", lambda: (work / "proxy.sock").exists() or proc.poll() is not None, 600)
        assert proc.poll() is None, (work / "serve.log").read_text()[-3000:]
        with CriClient(work / "proxy.sock", timeout=300, wait_for_ready=True) as cri:
            gs.wait_for("the proxy's answer to Version", lambda: gs._answers(cri), 600)
            timings["proxy ready"] = round(time.monotonic() - t0, 1)
            spec = {"containers": {"main": {"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}}}
            for name, qos, kube_qos, annotations, resources in (
                ("LS", "LS", "burstable", {gs.EXTENDED: json.dumps(spec)},
                 linux_resources(cpu_shares=512, memory_limit_in_bytes=512 * MiB)),
                ("BE", "BE", "besteffort", {}, linux_resources(cpu_shares=2)),
                ("OWN", "LS", "burstable", {gs.EXTENDED: json.dumps({"containers": {"main": {
                    "requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}}}}),
                    MEMORY_QOS_ANNOTATION: json.dumps(OWN)},
                 linux_resources(cpu_shares=128, memory_limit_in_bytes=OWN_LIMIT)),
            ):
                uid = str(uuid.uuid4())
                parent, pod_dir = gs.slice_dir(kube_qos, uid)
                pod = cri.run_pod(cgroup_parent=parent, labels={gs.QOS: qos}, annotations=annotations,
                                  name=f"memqos-{name.lower()}", uid=uid)
                cid = cri.run_container(pod, resources=resources, name="main")
                pods[name] = {"uid": uid, "ctr": str(pod_dir / f"cri-containerd-{cid}.scope")}
            ls, be, own = Path(pods["LS"]["ctr"]), Path(pods["BE"]["ctr"]), Path(pods["OWN"]["ctr"])
            timings["pods started"] = round(time.monotonic() - t0, 1)
            (KUBEPODS / "memory.max").write_text(str(KUBEPODS_MAX))  # kubelet's allocatable enforcement
            # enable false: the plugin writes the close values (memory.min 0) on its first rounds
            gs.wait_for("memory_qos's first writes", lambda: (ls / "memory.min").read_text().strip() == "0"
                        and (KUBEPODS / "kubepods-burstable.slice" / "memory.min").read_text().strip() == "0", 300)
            with contextlib.suppress(TimeoutError):  # the same plan writes it; the host's test compares
                gs.wait_for("the annotated pod's memory.high",
                            lambda: (own / "memory.high").read_text().strip() == OWN_EXPECTED["memory.high"], 120)
            own_values.append(own_read(own, "lsClass enable false"))
            results.append(phase("without memory QoS (lsClass enable false: memory.min 0)", ls, be))
            timings["phase without"] = round(time.monotonic() - t0, 1)
            node.write_text(node_doc(ON))
            gs.wait_for("memory_qos's protection", lambda: (ls / "memory.min").read_text().strip() == str(LS_REQUEST)
                        and (KUBEPODS / "memory.min").read_text().strip() == str(LS_REQUEST), 300)
            own_values.append(own_read(own, "lsClass minLimitPercent 100"))
            results.append(phase("with memory QoS (lsClass minLimitPercent 100: memory.min 256 MiB)", ls, be))
            timings["phase with"] = round(time.monotonic() - t0, 1)
            for info in pods.values():
                cri.remove_pod(gs._pod_id(cri, info["uid"]))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        for f, value in (("memory.max", "max"), ("memory.min", "0"), ("memory.low", "0")):
            if KUBEPODS.is_dir():
                (KUBEPODS / f).write_text(value)
        for sub in ("kubepods-burstable.slice", "kubepods-besteffort.slice"):
            for f in ("memory.min", "memory.low"):
                if (KUBEPODS / sub).is_dir():
                    (KUBEPODS / sub / f).write_text("0")
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_qos.json").write_text(json.dumps({
        "phases": results, "own": {"annotation": OWN, "expected": OWN_EXPECTED, "read": own_values},
        "seconds": round(time.monotonic() - t0, 1), "timings": timings,
        "log": (work / "serve.log").read_text(errors="replace")[-20000:],
    }, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()

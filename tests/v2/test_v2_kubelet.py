"""kubelet v1.34 in the cgroup v2 guest with ``cgroupDriver: systemd``, joined to a control plane
on the host through one QEMU forward (``restrict=on``, 10.0.2.100:6443 -> 127.0.0.1 only), runs
an LSR, an LS and a BE pod first through ``runtime-proxy serve`` (kubelet's runtime endpoint is
the proxy's socket) and then through ``runtime-proxy nri`` (kubelet on containerd, the plugin on
its NRI socket); the guest reaches no other address (issue 33, item 3; ``rhp_devenv.v2kubelet``).

On the host, kube-scheduler asks ``scheduler-ext`` as the end-to-end suite runs it
(``tests/e2e/conftest.py``: packaging/scheduler's extender entry, mutual TLS, the ServiceAccount
identity of packaging/scheduler/rbac.yaml), with the guest's CPU topology in the Node's
NodeResourceTopology; the extender's bind writes the LSR pod's ``resource-status`` cpuset, and
the test reads the container's ``cpuset.cpus.effective`` in the guest's systemd slice and checks
it is exactly those CPUs. The LS container's ``cpu.max.burst`` (cpu_burst) and the pods'
``cpu.idle`` (group_identity, coreSched) show the other pods went through the door too.
On the old main the pods went to containerd directly and no extender placed them: the
``cpuset.cpus.effective`` of the LSR container was the whole machine's ``0-1``.

Under emulation this takes many minutes (docs/v2-node.md has the times), so it runs only on
request: ``RHP_V2_KUBELET=1 bash scripts/test.sh tests/v2/test_v2_kubelet.py``. It boots a guest
of its own (the tier's shared guest has no network device at all). ``RHP_V2_KUBELET_DOORS=nri``
runs one door only; a failure shows the guest's containerd journal (its NRI lines: a plugin it
closed for answering late), kubelet's journal and the door's log, and
``RHP_V2_KUBELET_LOGS=DIR`` keeps those logs whole on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.kube import OLDEST_KUBE_VERSION, Cluster
from rhp_devenv.v2kubelet import API_GUEST_PORT, CONTAINERD_SOCKET, NODE, GuestKubelet
from rhp_devenv.v2node import GUEST_FORWARD_ADDRESS, V2Node, build

from hooks.facts import parse_cpu_list
from tests.e2e.conftest import _start_extender, container_id, pod_manifest
from tests.integration import qos_helpers as q
from tests.v2.conftest import REPO
from tests.v2.report import REPORT

pytestmark = pytest.mark.skipif(os.environ.get("RHP_V2_KUBELET") != "1",
                                reason="kubelet in the emulated guest takes minutes: run with RHP_V2_KUBELET=1")

NS = "default"
DOOR = str(REPO / "tests" / "v2" / "guest_door.py")
IMPORT = ("from pathlib import Path\n"
          "from rhp_devenv.image import build_image_archive, import_image\n"
          "a = build_image_archive(Path('/run/rhp-busybox.tar'))\n"
          "import_image(Path('/opt/runtime-hook-proxy/containerd/2.1/usr/bin/ctr'),"
          " Path('/run/containerd/containerd.sock'), a.archive, timeout=300)\n"
          "print(a.name)\n")
TOPOLOGY = ("from koord_formats.topology import format_cpu_topology\n"
            "from runtime_proxy.state.sysfs import read_cpu_topology\n"
            "print(format_cpu_topology(read_cpu_topology()))\n")
POD_TIMEOUT = 1200.0
DOORS = ("serve", "nri")
# RHP_V2_KUBELET_DOORS=nri runs one door only (a cheaper reproduction of that half)
RUN_DOORS = tuple(d for d in os.environ.get("RHP_V2_KUBELET_DOORS", ",".join(DOORS)).split(",") if d)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.times: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.times[what] = round(time.monotonic() - self.t0, 1)
        print(f"[{self.times[what]:7.1f} s] {what}", flush=True)


def _slice(pod: dict[str, Any]) -> str:
    """kubelet's systemd slice of the pod in the guest."""
    qos, uid = pod["status"]["qosClass"], pod["metadata"]["uid"].replace("-", "_")
    if qos == "Guaranteed":
        return f"/sys/fs/cgroup/kubepods.slice/kubepods-pod{uid}.slice"
    kind = qos.lower()
    return f"/sys/fs/cgroup/kubepods.slice/kubepods-{kind}.slice/kubepods-{kind}-pod{uid}.slice"


def _read(node: V2Node, path: str) -> str:
    return node.run(f"cat {path} 2>&1", timeout=120).stdout.strip()


def _read_until(node: V2Node, path: str, want: str, timeout: float = 180.0) -> str:
    """The file's value once it is *want* (post-start writes and reconcile rounds), or the last read."""
    deadline = time.monotonic() + timeout
    while True:
        got = _read(node, path)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(2)


def _guest_logs(node: V2Node, kubelet: GuestKubelet, door: str) -> str:
    """The guest's logs that explain a door's pods: containerd's journal (its NRI lines say when
    a plugin was closed or timed out), kubelet's journal, and the door's own log (its warnings
    and its tail)."""
    containerd = node.run("journalctl -u containerd --no-pager -n 400 2>&1 | grep -iE 'nri|plugin|error|level=warn' "
                          "| tail -c 12000", timeout=120).stdout
    door_log = f"/run/rhp-{door}/{door}.log"
    warnings = node.run(f"grep -E '\"level\": \"(warning|error|critical)\"' {door_log} | tail -c 8000",
                        timeout=120).stdout
    keep = os.environ.get("RHP_V2_KUBELET_LOGS")  # a host directory for the whole logs
    if keep:
        node.run(f"cp {door_log} /mnt/xfer/{door}.log; journalctl -u containerd --no-pager > /mnt/xfer/containerd.log; "
                 "journalctl -u rhp-kubelet --no-pager > /mnt/xfer/kubelet.log", timeout=300)
        Path(keep).mkdir(parents=True, exist_ok=True)
        for name in (f"{door}.log", "containerd.log", "kubelet.log"):
            shutil.copy(node.share / name, Path(keep) / f"{door}-{name}")
    tail = node.run(f"tail -c 12000 {door_log}", timeout=120).stdout
    return (f"\ncontainerd (NRI, plugin, error lines):\n{containerd}\nkubelet:\n{kubelet.log(120)}"
            f"\n{door} log, warnings:\n{warnings}\n{door} log, tail:\n{tail}")


def _debug(cluster: Cluster, node: V2Node, kubelet: GuestKubelet, door: str) -> str:
    pods = cluster.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False).stdout
    events = cluster.kubectl("get", "events", "-n", NS, check=False).stdout
    return (f"\npods:\n{pods}\nevents:\n{events[-4000:]}{_guest_logs(node, kubelet, door)}"
            f"\nscheduler-ext log:\n{cluster.log_tail('scheduler-ext')}")


def _run_pods(cluster: Cluster, node: V2Node, kubelet: GuestKubelet, door: str, image: str,
              clock: Clock) -> list[tuple[str, ...]]:
    """The LSR (placed by the extender), LS and BE pods through *door*; the table's rows."""
    names = {qos: f"{door}-{qos.lower()}" for qos in ("LSR", "LS", "BE")}
    manifests = [
        pod_manifest(names["LSR"], NS, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                     limits={"cpu": "1", "memory": "32Mi"}),
        pod_manifest(names["LS"], NS, qos="LS", requests={"cpu": "100m", "memory": "32Mi"},
                     limits={"cpu": "200m", "memory": "64Mi"}),
        pod_manifest(names["BE"], NS, qos="BE"),
    ]  # fmt: skip
    for m in manifests:
        m["spec"]["containers"][0]["image"] = image
    cluster.apply(*manifests)
    pods: dict[str, dict[str, Any]] = {}
    try:
        for qos, name in names.items():
            pods[qos] = cluster.wait_pod_running(NS, name, timeout=POD_TIMEOUT)
    except Exception as exc:
        raise AssertionError(f"{exc}{_debug(cluster, node, kubelet, door)}") from None
    clock.mark(f"{door}: three pods Running")
    rows: list[tuple[str, ...]] = []
    # LSR: placed by the extender; the container runs on exactly the CPUs of its annotation
    lsr = pods["LSR"]
    assert lsr["spec"]["nodeName"] == NODE
    bound = parse_cpu_list(json.loads(lsr["metadata"]["annotations"][q.RESOURCE_STATUS])["cpuset"])
    assert len(bound) == 1, lsr["metadata"]["annotations"]
    scope = f"{_slice(lsr)}/cri-containerd-{container_id(lsr)}.scope"
    cpus = _read(node, f"{scope}/cpuset.cpus")
    effective = _read(node, f"{scope}/cpuset.cpus.effective")
    rows.append((door, "LSR", "cpuset (extender's resource-status)", ",".join(map(str, sorted(bound))),
                 "container cpuset.cpus / .effective", f"{cpus} / {effective}"))
    print(" | ".join(rows[-1]), flush=True)
    assert parse_cpu_list(effective) == bound, f"{(bound, cpus, effective)}{_debug(cluster, node, kubelet, door)}"
    # LS: cpu_burst (cpuBurstOnly, 50 % of the 200m limit's 20000 us quota)
    ls_scope = f"{_slice(pods['LS'])}/cri-containerd-{container_id(pods['LS'])}.scope"
    burst = _read_until(node, f"{ls_scope}/cpu.max.burst", "10000")
    rows.append((door, "LS", "cpu_burst", "cpu.cfs_burst_us=10000", "container cpu.max.burst", burst))
    # group identity as cpu.idle (the 6.1 kernel has no bvt): BE idle, LS not
    be_idle = _read_until(node, f"{_slice(pods['BE'])}/cpu.idle", "1")
    ls_idle = _read(node, f"{_slice(pods['LS'])}/cpu.idle")
    rows.append((door, "BE", "group_identity (coreSched)", "cpu.idle=1", "pod cpu.idle", be_idle))
    rows.append((door, "LS", "group_identity (coreSched)", "cpu.idle=0", "pod cpu.idle", ls_idle))
    print("\n".join(" | ".join(r) for r in rows[1:]), flush=True)
    assert (burst, be_idle, ls_idle) == ("10000", "1", "0"), f"{rows}{_debug(cluster, node, kubelet, door)}"
    return rows


@pytest.mark.timeout(3600)
def test_kubelet_in_the_guest_runs_qos_pods_through_both_doors() -> None:
    clock = Clock()
    with Cluster("/nonexistent.sock", kubelet=False, scheduler=False, version=OLDEST_KUBE_VERSION) as cluster:
        extender, _health = _start_extender(cluster)
        cluster.start_scheduler(extenders=[extender])
        clock.mark("control plane and extender")
        api = cluster.ports["apiserver"]
        with V2Node(REPO, build_dir=build(REPO), forwards=[(API_GUEST_PORT, api)]) as node:
            clock.mark("guest booted")
            assert "restrict=on" in " ".join(node.command(node.build_dir or REPO))
            (node.share / "import.py").write_text(IMPORT)
            (node.share / "topology.py").write_text(TOPOLOGY)
            image = node.run(node.python("/mnt/xfer/import.py"), timeout=600, check=True).stdout.split()[-1]
            topology = node.run(node.python("/mnt/xfer/topology.py"), timeout=600, check=True).stdout.strip()
            # the guest's NodeResourceTopology, as koordlet would report it
            cluster.apply({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
                           "metadata": {"name": NODE, "annotations": {
                               q.CPU_TOPOLOGY: topology,
                               q.CPU_MANAGER_POLICY: json.dumps({"policy": "none"})}},
                           "topologyPolicies": ["None"], "zones": []})  # fmt: skip
            clock.mark("image imported, NodeResourceTopology")
            kubelet = GuestKubelet(node, cluster)
            rows: list[tuple[str, ...]] = []
            for door in RUN_DOORS:
                assert door in DOORS, f"RHP_V2_KUBELET_DOORS: {door!r} is not one of {DOORS}"
                started = node.run(node.python(DOOR, "start", door), timeout=1200)
                assert started.rc == 0, f"{door}: {started.stdout[-2000:]}\n{started.stderr[-4000:]}"
                socket = Path(started.stdout.split()[-1])
                assert (door == "nri") == (socket == CONTAINERD_SOCKET), socket
                clock.mark(f"{door}: door up")
                try:
                    kubelet.start(cri_socket=socket)
                except Exception:
                    print(kubelet.log())
                    raise
                clock.mark(f"{door}: kubelet on {socket}")
                if door == "serve":
                    # only the forward: the host's API server port is not reachable at the host's address
                    # (no probe of an outside address: restrict=on would drop it inside QEMU, but a
                    # test never aims a packet past loopback)
                    probe = node.run(f"busybox nc -w 5 {GUEST_FORWARD_ADDRESS} {API_GUEST_PORT} </dev/null; "
                                     f"echo fwd=$?; busybox nc -w 5 10.0.2.2 {api} </dev/null; echo host=$?",
                                     timeout=120)
                    assert "fwd=0" in probe.stdout and "host=0" not in probe.stdout, probe
                rows += _run_pods(cluster, node, kubelet, door, image, clock)
                print(_guest_logs(node, kubelet, door), flush=True)  # shown with -s
                # the next door on a clean node: kubelet stopped, the pods gone from the API
                # (the next kubelet removes their containers), this door ended
                kubelet.stop()
                cluster.kubectl("delete", "pods", "-n", NS, "--all", "--grace-period=0", "--force",
                                "--wait=false", check=False)
                node.run(node.python(DOOR, "stop", door), timeout=300, check=True)
                clock.mark(f"{door}: done")
    times = {**clock.times, **{f"kubelet: {k}": v for k, v in kubelet.timings.items()}}
    lines = ["kubelet in the v2 guest: door | pod | plugin | planned | file | read back",
             *(" | ".join(r) for r in rows), f"kubelet in the v2 guest (seconds from the start): {times}"]
    REPORT.extend(lines)
    print("\n".join(lines))

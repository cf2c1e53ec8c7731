"""Pod startup latency in the real one-node cluster (``rhp_devenv.kube.Cluster``), three runtime
paths against each other in one run, in both of kubelet's PLEG modes:

- ``direct``: kubelet → containerd 2.1 (NRI enabled, no plugin connected);
- ``proxy``:  kubelet → ``runtime-proxy serve`` → the same containerd;
- ``nri``:    kubelet → the same containerd, with ``runtime-proxy nri`` connected to its NRI socket.

    .venv/bin/python benchmarks/kube_pod_startup.py [--pods 30] [--batch 10] [--pleg generic,evented]

What is timed: a host-network busybox LS pod (100m CPU, 32Mi) created with ``spec.nodeName``
already set (no scheduler), from just before the POST to the arrival here of the watch event
showing it ``Running`` with its container ready (this machine's monotonic clock). The pod's own
timestamps (``creationTimestamp``, the conditions' ``lastTransitionTime``) have whole seconds
only, too coarse for a 2 % difference. Pods start one at a time (the next after the previous
one runs), so no pod waits for another.

How the arms are interleaved: one cluster, one containerd; the run is a sequence of batches of
``--batch`` pods, round-robin over (PLEG mode, arm), the order rotated every round. Each batch
starts by restarting kubelet on its arm's socket and feature gates (``EventedPLEG`` on or off),
also when they did not change, so every batch begins alike; the proxy runs only in its batches,
the NRI plugin only in its. One warm-up pod per batch is not counted. After a batch its pods are
deleted and their sandboxes removed from containerd before the next one. Separate clusters
alternated would cost a minute a switch and the machine allows one cluster at a time.

With ``EventedPLEG`` on, kubelet streams ``GetContainerEvents`` (through the proxy in the proxy
arm) and relists only every 300 s; kubelet's ``kubelet_evented_pleg_connection_error_count``
and ``..._success_count`` are read after each batch. Errors mean kubelet fell back to relisting
and the batch is flagged in the table.

A second table times create -> the container's start as containerd recorded it (``startedAt`` of
CRI ContainerStatus, nanoseconds, the same machine's clock as the POST): the runtime path
(kubelet's sync, RunPodSandbox, CreateContainer, StartContainer through the proxy or with the
plugin) without either PLEG's period. kubelet 1.34.4 with ``EventedPLEG`` on receives a
container's Started event within milliseconds, yet the pod turns Running about 5 s after
creation in every arm, direct included: the pod worker waits for a cached status newer than its
last sync, the event's timestamp is older than that, and the evented PLEG's global cache refresh
lets it go every 5 s (kubernetes/kubernetes#123087 and #135240, upstream).

Targets: each arm's p50 and p99 within 1.02x of ``direct`` in both PLEG modes. The table gives
the ratios and their 90 % bootstrap interval, and the load average at the start and end of
each mode's batches. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "devenv"))
sys.path.insert(0, str(REPO / "benchmarks"))

from kube_common import Api, PodWatch, bootstrap_ratio, delete_pods, loadavg, make_namespace, pct  # noqa: E402
from rhp_devenv.containerd import PrivateContainerd, binaries_for  # noqa: E402
from rhp_devenv.cri import CriClient  # noqa: E402
from rhp_devenv.image import DEFAULT_IMAGE  # noqa: E402
from rhp_devenv.kube import NODE_NAME, Cluster, kube_binary  # noqa: E402

from cri_protos import api_pb2  # noqa: E402
from tests.integration import qos_helpers as q  # noqa: E402
from tests.integration.harness import ProxyProcess  # noqa: E402
from tests.integration.test_nri_real import NriPluginProcess  # noqa: E402

ARMS = ("direct", "proxy", "nri")
PLEGS = ("generic", "evented")
PLUGINS = ("cpuset", "numa", "batch_resource")
TARGET = 1.02
NAMESPACE = "bench-startup"


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {q.LABEL_QOS: "LS"}},
        "spec": {
            "nodeName": NODE_NAME,
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": DEFAULT_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}},
            }],
        },
    }  # fmt: skip


def running(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status", {})
    statuses = status.get("containerStatuses", [])
    return bool(status.get("phase") == "Running" and statuses and all(s.get("ready") for s in statuses))


def proxy_config(work: Path) -> Path:
    node = q.write_node_config(work / "node.json", name=NODE_NAME)
    hooks = work / "hookserver.d"
    hooks.mkdir(mode=0o755, exist_ok=True)
    path = work / "proxy-config.yaml"
    path.write_text(yaml.safe_dump({"plugins": [{"name": n} for n in PLUGINS], "nodeConfigFile": str(node),
                                    "hookServerDir": str(hooks), "cgroupDriver": "cgroupfs"}))  # fmt: skip
    return path


def evented_counters(cluster: Cluster) -> dict[str, float]:
    """kubelet's evented-PLEG connection counters, from its own /metrics on 127.0.0.1 (the API
    server's node proxy refuses loopback addresses), with the admin certificate."""
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.ports["kubelet"], context=cluster.admin_tls(), timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        if response.status != 200:
            raise RuntimeError(f"kubelet /metrics: HTTP {response.status}: {text[:300]}")
    finally:
        conn.close()
    out = {"success": 0.0, "error": 0.0}
    for line in text.splitlines():
        for key in out:
            if line.startswith(f"kubelet_evented_pleg_connection_{key}_count "):
                out[key] = float(line.split()[1])
    return out


def collect_sandboxes(ctrd: PrivateContainerd, timeout: float = 120.0) -> None:
    """Wait until kubelet stopped every sandbox of the namespace, then remove them (kubelet's
    garbage collection, early), so the next batch starts on an empty runtime."""
    deadline = time.monotonic() + timeout
    with CriClient(ctrd.socket) as cri:
        while boxes := cri.list_pod_sandboxes(labels={"io.kubernetes.pod.namespace": NAMESPACE}):
            for box in boxes:
                if box.state == api_pb2.SANDBOX_NOTREADY:
                    with contextlib.suppress(Exception):
                        cri.remove_pod_sandbox(box.id)
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandboxes still there: {[b.id for b in boxes]}")
            time.sleep(0.2)


def wait_kubelet(cluster: Cluster, timeout: float = 300.0) -> None:
    """Until the (restarted) kubelet answers its health check on 127.0.0.1."""

    def healthy() -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", cluster.ports["kubelet_healthz"], timeout=5)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    cluster.wait_for(healthy, what="kubelet /healthz", timeout=timeout, log="kubelet")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, ctrd: PrivateContainerd, cluster: Cluster) -> None:
        self.args = args
        self.work = work
        self.ctrd = ctrd
        self.cluster = cluster
        self.api = Api(cluster.server, cluster.admin_tls())
        self.config = proxy_config(work)
        self.proxy_socket = work / "proxy.sock"
        self.samples: dict[tuple[str, str], list[float]] = {}
        self.started: dict[tuple[str, str], list[float]] = {}
        self.load: dict[str, list[str]] = {}
        self.evented: list[str] = []
        self.counter = 0

    def run_batch(self, pleg: str, arm: str, size: int) -> None:
        cluster = self.cluster
        cluster.kubelet_extra = {"featureGates": {"EventedPLEG": pleg == "evented"}}
        cluster.cri_socket = self.proxy_socket if arm == "proxy" else self.ctrd.socket
        proxy: ProxyProcess | None = None
        plugin: NriPluginProcess | None = None
        try:
            if arm == "proxy":
                proxy = ProxyProcess(["--backend", str(self.ctrd.socket), "--config", str(self.config),
                                      "--no-entry-points"], log=self.work / "proxy.log")  # fmt: skip
                proxy.start(str(self.proxy_socket))
            elif arm == "nri":
                plugin = NriPluginProcess(self.ctrd.nri_socket, self.work / "nri", "--config", str(self.config))
                plugin.wait_synchronized = _patient(plugin.wait_synchronized)  # type: ignore[method-assign]
                plugin.start()
            cluster.restart_kubelet(rewrite_config=True, timeout=300)
            wait_kubelet(cluster)  # the node's Ready condition is still the old kubelet's
            before = evented_counters(cluster) if pleg == "evented" else {}
            rv = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"]["resourceVersion"]
            watch = PodWatch(self.api, NAMESPACE, rv, running).start()
            cri = CriClient(self.ctrd.socket)
            try:
                for i in range(self.args.warmup + size):
                    self.counter += 1
                    name = f"p{self.counter}-{arm}-{pleg}"
                    began, began_wall = time.monotonic(), time.time_ns()
                    self.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name))
                    seen = watch.wait([name], timeout=180)[name]
                    cid = str(watch.objects[name]["status"]["containerStatuses"][0]["containerID"]).split("://")[-1]
                    started_ns = cri.container_status(cid).started_at  # containerd's own record, in ns
                    if i >= self.args.warmup:
                        self.samples.setdefault((pleg, arm), []).append(seen - began)
                        self.started.setdefault((pleg, arm), []).append((started_ns - began_wall) / 1e9)
            finally:
                cri.close()
                watch.stop()
            if pleg == "evented":
                after = evented_counters(cluster)
                errors = after["error"] - before.get("error", 0.0)
                if errors or after["success"] <= 0:
                    self.evented.append(f"{arm}: {errors:.0f} GetContainerEvents errors, "
                                        f"{after['success']:.0f} streams opened since kubelet started")  # fmt: skip
            delete_pods(self.api, NAMESPACE)
            collect_sandboxes(self.ctrd)
        finally:
            if proxy is not None:
                proxy.terminate()
                self.proxy_socket.unlink(missing_ok=True)
            if plugin is not None:
                plugin.stop()

    def run(self) -> None:
        arms = [a for a in self.args.arms.split(",") if a]
        plegs = [p for p in self.args.pleg.split(",") if p]
        rounds = max(1, math.ceil(self.args.pods / self.args.batch))
        left = {(p, a): self.args.pods for p in plegs for a in arms}
        for r in range(rounds):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for pleg in plegs if r % 2 == 0 else list(reversed(plegs)):
                self.load.setdefault(pleg, []).append(loadavg())
                for arm in order:
                    size = min(self.args.batch, left[(pleg, arm)])
                    if size:
                        left[(pleg, arm)] -= size
                        print(f"round {r + 1}/{rounds} {pleg:8} {arm:6} {size} pods (load {loadavg()})",
                              file=sys.stderr, flush=True)  # fmt: skip
                        self.run_batch(pleg, arm, size)
                self.load[pleg].append(loadavg())

    def report(self) -> None:
        print(f"\nPod startup, create (nodeName set) -> Running and ready (watch arrival) and -> container started "
              f"(containerd's startedAt, ns); kube {self.cluster.binary.parent.name}, containerd {self.ctrd.version}")
        self._table("Running", self.samples, judged=True)
        self._table("container started", self.started, judged=False)
        for pleg in [p for p in self.args.pleg.split(",") if p]:
            loads = " / ".join(self.load.get(pleg, []))
            print(f"load average during {pleg} batches (start / end of each round): {loads}")
        if "evented" in self.args.pleg:
            print("EventedPLEG: " + ("; ".join(self.evented) if self.evented
                                     else "every batch streamed GetContainerEvents without an error"))  # fmt: skip

        def ms(samples: Mapping[tuple[str, str], list[float]]) -> dict[str, list[float]]:
            return {f"{p}/{a}": [round(x * 1000, 1) for x in xs] for (p, a), xs in samples.items()}

        print(json.dumps({"running_ms": ms(self.samples), "started_ms": ms(self.started)}))

    def _table(self, what: str, samples: Mapping[tuple[str, str], list[float]], *, judged: bool) -> None:
        arms = [a for a in self.args.arms.split(",") if a]
        print(f"\nto {what}:")
        print("| PLEG | arm | pods | p50 ms | p99 ms | p50 / direct (90% CI) | p99 / direct (90% CI) |"
              + (" target |" if judged else ""))
        print("|---|---|---|---|---|---|---|" + ("---|" if judged else ""))
        for pleg in [p for p in self.args.pleg.split(",") if p]:
            base = samples.get((pleg, "direct"), [])
            for arm in arms:
                xs = samples.get((pleg, arm), [])
                cells = [pleg, arm, str(len(xs)), f"{pct(xs, 50) * 1000:.0f}", f"{pct(xs, 99) * 1000:.0f}"]
                if arm == "direct" or not base:
                    cells += ["", ""] + ([""] if judged else [])
                else:
                    met = True
                    for qq in (50, 99):
                        ratio = pct(xs, qq) / pct(base, qq)
                        lo, hi = bootstrap_ratio(xs, base, qq)
                        met = met and ratio <= TARGET
                        cells.append(f"{ratio:.3f} ({lo:.3f}-{hi:.3f})")
                    if judged:
                        cells.append(f"<= {TARGET} {'met' if met else 'MISSED'}")
                print("| " + " | ".join(cells) + " |")


def _patient(wait: Any) -> Any:
    def call(times: int, timeout: float = 120.0) -> None:
        wait(times, max(timeout, 120.0))

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=30, help="counted pods per arm and PLEG mode (default 30)")
    parser.add_argument("--batch", type=int, default=10, help="pods per batch (one kubelet restart each)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted pods at the start of each batch")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of direct,proxy,nri")
    parser.add_argument("--pleg", default=",".join(PLEGS), help="comma-separated, of generic,evented")
    parser.add_argument("--containerd", default="2.1")
    parser.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)  # accepted for symmetry
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("kube_pod_startup: needs root (kubelet, containerd, cgroups)", file=sys.stderr)
        return 2
    if kube_binary() is None or binaries_for(args.containerd).missing():
        print("kube_pod_startup: run scripts/install-deps.sh first (kube binary and containerd)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="rhp-bench-startup-", dir="/tmp"))
    ctrd = PrivateContainerd(args.containerd, nri=True).start()
    try:
        with Cluster(ctrd.socket, scheduler=False) as cluster:
            print(f"cluster up in {cluster.start_seconds:.0f} s (load {loadavg()})", file=sys.stderr, flush=True)
            bench = Bench(args, work, ctrd, cluster)
            make_namespace(bench.api, NAMESPACE)
            bench.run()
            bench.report()
    finally:
        ctrd.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

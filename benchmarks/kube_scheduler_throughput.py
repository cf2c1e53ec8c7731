"""kube-scheduler throughput with the real components (``rhp_devenv.kube.Cluster`` without kubelet):
no extender, a do-nothing extender, ``scheduler-ext serve`` and Koordinator's koord-scheduler,
interleaved in one run.

    bash scripts/build-koord.sh koord-scheduler     # once, cached; without it the koord arm is skipped
    .venv/bin/python benchmarks/kube_scheduler_throughput.py [--nodes 1000,5000] [--pods 2000] \
        [--rounds 1] [--profile] [--arms none,noop,noop-bind,ours,koord] [--koord-scheduler PATH]

Set-up: API-only nodes (Node objects with no kubelet, as kube-scheduler's own performance tests
use): 64 CPUs, 256Gi, 110 pods each, and a NodeResourceTopology each with a 64-CPU topology (2
sockets x 16 cores x 2 threads). The API server runs without the ``TaintNodesByCondition``
admission plugin and kube-controller-manager without its node lifecycle controller, so no
``not-ready`` or ``unreachable`` taint lands on them. kube-scheduler gets ``qps``/``burst``
5000 (``--scheduler-qps``; its default 50 would cap every arm at about 50 binds a second).

One measurement: ``--pods`` LSR pods of 1 CPU (Guaranteed, ``koordinator.sh/qosClass: LSR``) are
created pending, then kube-scheduler starts with the arm's extender; pods/s is (pods - 1) over
the time from the first to the last bind, each bind time being the arrival here of the watch
event that first shows the pod's ``spec.nodeName``. Then kube-scheduler (and the extender) stop
and the pods are deleted. Arms:

- ``none``: kube-scheduler alone;
- ``noop``: a do-nothing extender (aiohttp; filter answers every node feasible, prioritize
  scores every node 0), kube-scheduler binds;
- ``ours``: ``scheduler-ext serve`` (filter, prioritize, bind; HA ledger on, as packaged) with
  packaging/scheduler's extender entry, over plain HTTP on 127.0.0.1 (both extenders alike);
- ``koord``: koord-scheduler v1.8.0 (``scripts/build-koord.sh koord-scheduler``) instead of
  kube-scheduler, on the admin kubeconfig with the same qps/burst, no extender. Its profile is
  kube-scheduler's default plugins plus Koordinator's NodeNUMAResource (PreFilter, Filter, Score,
  Reserve, PreBind; default arguments: default CPU bind policy FullPCPUs, LeastAllocated
  scoring of CPU and memory) and DefaultPreBind, which patches the pod with NodeNUMAResource's
  ``resource-status`` before the Binding (two writes a pod, as ours: Lease and Binding). The
  Reservation, Coscheduling, ElasticQuota, DeviceShare and LoadAwareScheduling plugins are off;
  koord-scheduler still lists and watches Reservations and Devices at start (its framework
  extender's informers), so their CRDs are applied from packaging/crds/. Skipped, saying why, when
  the binary is missing;
- ``noop-bind``: the do-nothing extender that also binds, as ours does: its bind verb makes the
  one API write ours makes without the HA ledger, a Binding whose metadata carries a
  ``resource-status`` annotation (a fixed cpuset, not an allocation: the floor of the bind hop);
- ``ours-noha`` (only when named in ``--arms``): the same as ours with ``--no-ha-ledger``.

Each run of ``ours`` starts without the ledger Leases of an earlier one (deleted), as a fresh
deployment would. For ``ours`` and ``koord`` every pod's resource-status cpuset is checked: exactly
one CPU, on its node's topology, disjoint from every other pod's on that node. The order of the arms
rotates every round; the load average is printed at the start and end of each measurement.
Ratios are taken within each round (same-run baselines) and summarised as median [min, max].
Targets (issue 35): ours >= 0.9x noop's pods/s and >= koord's, at 1,000 and 5,000 nodes.

``--profile`` adds one unmeasured ``ours`` run per node count with py-spy sampling the extender
(the thread holding the GIL, 100 times a second, from kube-scheduler's start to the last bind)
and prints its top functions by own and inclusive samples. Every run reports the CPU seconds of
the extender (by thread), kube-scheduler and kube-apiserver during the scheduling window. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "devenv"))
sys.path.insert(0, str(REPO / "benchmarks"))

from kube_common import Api, PodWatch, delete_pods, loadavg, make_namespace  # noqa: E402
from rhp_devenv.kube import Cluster, free_port, kube_binary  # noqa: E402

from koord_formats.cpulist import parse_cpu_list  # noqa: E402
from koord_formats.keys import ANNOTATION_RESOURCE_STATUS  # noqa: E402
from koord_formats.topology import format_cpu_topology  # noqa: E402
from scheduler_ext.topology import synthetic_topology  # noqa: E402
from scheduler_ext.trust import Signer  # noqa: E402

ARMS = ("none", "noop", "noop-bind", "ours", "koord")
EXTRA_ARMS = ("ours-noha",)  # ours with --no-ha-ledger: what the HA ledger costs
CPUSET_ARMS = ("ours", "ours-noha", "koord")  # the arms that allocate exact cpusets
NAMESPACE = "bench-sched"
CPUS = 64
TOPO_TEXT = format_cpu_topology(synthetic_topology(2, 1, 16, 2))
SCHEDULER_CONFIG = REPO / "packaging" / "scheduler" / "kube-scheduler-config.yaml"
SCHEDULER_RBAC = REPO / "packaging" / "scheduler" / "rbac.yaml"
NRT_CRD = REPO / "packaging" / "crds" / "noderesourcetopology.yaml"
EXTENDER_USER = "system:serviceaccount:kube-system:scheduler-ext"
TARGET = 0.9

PY_SPY = Path(sys.executable).with_name("py-spy")  # pinned in pyproject.toml's dev extra

# -- the koord-scheduler arm ----------------------------------------------------------------------------

# Koordinator's CRDs that koord-scheduler v1.8.0 lists and watches at start even with none of the
# plugins that use them enabled (it waits for their informers' caches before it schedules a pod, and
# logs "could not find the requested resource" until they exist): Reservation and Device, besides
# NodeResourceTopology, which every arm has. packaging/crds/ ships all three. ElasticQuota, PodGroup
# and NodeMetric are read only by plugins this arm leaves off.
PACKAGED_CRDS = {  # file in packaging/crds/: the CRD's name
    "reservation.yaml": "reservations.scheduling.koordinator.sh",
    "device.yaml": "devices.scheduling.koordinator.sh",
}
KOORD_PLUGIN = "NodeNUMAResource"


def koord_binary(path: str | None) -> tuple[Path | None, str]:
    """koord-scheduler's path (given, or where ``scripts/build-koord.sh koord-scheduler`` puts it)
    and, when it cannot run, why: (None, reason)."""
    if path is None:
        try:
            out = subprocess.run(["bash", str(REPO / "scripts" / "build-koord.sh"), "koord-scheduler", "--print-path"],
                                 capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"its path is unknown ({exc}); bash scripts/build-koord.sh koord-scheduler builds it"
        path = out.strip().splitlines()[-1] if out.strip() else ""
    binary = Path(path)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return None, f"no binary at {binary} (bash scripts/build-koord.sh koord-scheduler builds it)"
    return binary, ""


def koord_config(kubeconfig: Path, qps: int) -> dict[str, Any]:
    """koord-scheduler's configuration: the default profile (the pods name no scheduler) with
    kube-scheduler's default plugins and Koordinator's NodeNUMAResource in every extension point
    where it acts, so LSR pods get an exact cpuset (its PreBind writes resource-status, which
    DefaultPreBind patches onto the pod before the bind). Reservation, Coscheduling, ElasticQuota,
    DeviceShare and LoadAwareScheduling are not enabled; no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": qps},
        "leaderElection": {"leaderElect": False},
        "profiles": [{
            "schedulerName": "default-scheduler",
            "plugins": {
                "preFilter": {"enabled": [{"name": KOORD_PLUGIN}]},
                "filter": {"enabled": [{"name": KOORD_PLUGIN}]},
                "score": {"enabled": [{"name": KOORD_PLUGIN, "weight": 1}]},
                "reserve": {"enabled": [{"name": KOORD_PLUGIN}]},
                "preBind": {"enabled": [{"name": KOORD_PLUGIN}, {"name": "DefaultPreBind"}]},
            },
        }],
    }  # fmt: skip


# -- the do-nothing extender ----------------------------------------------------------------------


def serve_noop(port: int, kubeconfig: str | None = None) -> None:
    """filter: every node feasible; prioritize: every node 0; with *kubeconfig*, bind: one Binding
    carrying a fixed ``resource-status`` annotation (the ``noop-bind`` arm). aiohttp, uvloop when
    installed."""
    import asyncio
    import ssl

    import aiohttp
    from aiohttp import web

    session: list[aiohttp.ClientSession] = []
    server = ""
    context: ssl.SSLContext | bool = False
    if kubeconfig:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        server = config["clusters"][0]["cluster"]["server"]
        context = ssl.create_default_context(cafile=config["clusters"][0]["cluster"]["certificate-authority"])
        user = config["users"][0]["user"]
        context.load_cert_chain(user["client-certificate"], user["client-key"])

    async def bind(request: web.Request) -> web.Response:
        args = await request.json()
        if not session:
            session.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=64)))
        ns, name = args["PodNamespace"], args["PodName"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": ns, "uid": args["PodUID"],
                             "annotations": {ANNOTATION_RESOURCE_STATUS: '{"cpuset":"0"}'}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}}  # fmt: skip
        async with session[0].post(f"{server}/api/v1/namespaces/{ns}/pods/{name}/binding", json=body) as resp:
            error = "" if resp.status < 300 else f"binding: HTTP {resp.status}: {(await resp.text())[:200]}"
        return web.json_response({"Error": error})

    async def filter_(request: web.Request) -> web.Response:
        args = await request.json()
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
        return web.json_response({"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                  "Error": ""})  # fmt: skip

    async def prioritize(request: web.Request) -> web.Response:
        args = await request.json()
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
        return web.json_response([{"Host": n, "Score": 0} for n in names])

    app = web.Application()
    app.add_routes([web.post("/filter", filter_), web.post("/prioritize", prioritize), web.post("/bind", bind)])
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- objects ------------------------------------------------------------------------------------------


def node(name: str) -> dict[str, Any]:
    resources = {"cpu": str(CPUS), "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "rhp-bench": "api-only"}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "API-only"}],
            "phase": "Running",
        },
    }


def nrt(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {"node.koordinator.sh/cpu-topology": TOPO_TEXT}},
        "topologyPolicies": ["None"],
        "zones": [],
    }


def lsr_pod(name: str) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "64Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"koordinator.sh/qosClass": "LSR"}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "localhost/rhp-busybox:1", "imagePullPolicy": "Never",
                            "resources": {"requests": res, "limits": res}}],
        },
    }  # fmt: skip


def bound(obj: Mapping[str, Any]) -> bool:
    return bool(obj.get("spec", {}).get("nodeName"))


def check_cpusets(pods: Sequence[Mapping[str, Any]]) -> str:
    """Every pod: exactly one CPU of its node's topology, none shared on a node."""
    held: dict[str, set[int]] = {}
    problems: list[str] = []
    for p in pods:
        name, node_name = p["metadata"]["name"], p["spec"].get("nodeName", "")
        raw = (p["metadata"].get("annotations") or {}).get(ANNOTATION_RESOURCE_STATUS)
        try:
            cpus = parse_cpu_list(json.loads(raw)["cpuset"]) if raw else frozenset()
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{name}: unreadable resource-status {raw!r} ({exc})")
            continue
        if len(cpus) != 1 or not cpus <= set(range(CPUS)):
            problems.append(f"{name}: cpuset {sorted(cpus)}")
            continue
        taken = held.setdefault(node_name, set())
        if cpus & taken:
            problems.append(f"{name}: CPU {sorted(cpus)} given twice on {node_name}")
        taken |= cpus
    if problems:
        return f"{len(problems)} BAD, e.g. {problems[:3]}"
    return f"all {len(pods)} exact and disjoint"


# -- processes ----------------------------------------------------------------------------------------


def proc_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (``comm``) of a process so far."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Cluster, work: Path, koord: Path | None = None) -> None:
        self.args = args
        self.koord = koord
        self.cluster = cluster
        self.work = work
        self.api = Api(cluster.server, cluster.admin_tls())
        self.nodes: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.seal = work / "signing.key"
        self.seal.write_bytes(Signer.generate().pem())
        self.seal.chmod(0o600)
        self.ext_kubeconfig = cluster.kubeconfig_for("scheduler-ext", user=EXTENDER_USER,
                                                     groups=("system:serviceaccounts",))  # fmt: skip

    def setup(self) -> None:
        self.cluster.apply(SCHEDULER_RBAC.read_text(), NRT_CRD.read_text())
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s",
                             "crd/noderesourcetopologies.topology.node.k8s.io")  # fmt: skip
        make_namespace(self.api, NAMESPACE)
        if self.koord is not None:
            crds = [(REPO / "packaging" / "crds" / f).read_text() for f in PACKAGED_CRDS]
            self.cluster.apply(*crds)
            for name in PACKAGED_CRDS.values():
                self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s", f"crd/{name}")

    def grow_nodes(self, count: int) -> None:
        new = [f"node-{i:05d}" for i in range(len(self.nodes), count)]
        if not new:
            return
        began = time.monotonic()

        def make(name: str) -> None:
            self.api.create("/api/v1/nodes", node(name))
            self.api.create("/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies", nrt(name))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, new))
        self.nodes += new
        print(f"{count} nodes (+{len(new)} with their topology) in {time.monotonic() - began:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip

    def create_pods(self, count: int, tag: str) -> list[str]:
        names = [f"{tag}-{i:05d}" for i in range(count)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", lsr_pod(n)), names))
        return names

    def extender_entry(self, arm: str, port: int) -> dict[str, Any]:
        if arm in ("noop", "noop-bind"):
            entry = {"urlPrefix": f"http://127.0.0.1:{port}", "filterVerb": "filter", "prioritizeVerb": "prioritize",
                     "weight": 5, "enableHTTPS": False, "httpTimeout": "5s", "nodeCacheCapable": True,
                     "ignorable": False, "managedResources": []}  # fmt: skip
            if arm == "noop-bind":
                entry["bindVerb"] = "bind"
            return entry
        (entry,) = yaml.safe_load(SCHEDULER_CONFIG.read_text())["extenders"]
        entry["urlPrefix"] = f"http://127.0.0.1:{port}"
        entry["enableHTTPS"] = False
        entry.pop("tlsConfig", None)
        return dict(entry)

    def start_extender(self, arm: str) -> tuple[int, dict[str, Any]]:
        port = free_port()
        if arm in ("noop", "noop-bind"):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-noop", str(port)]
            if arm == "noop-bind":
                cmd.append(f"--noop-kubeconfig={self.ext_kubeconfig}")
            self.cluster.spawn("extender", cmd, env={"PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"})
            ready = f"http://127.0.0.1:{port}/filter"
        else:
            health = free_port()
            argv = ["serve", f"--listen=127.0.0.1:{port}", f"--health-listen=127.0.0.1:{health}",
                    f"--kubeconfig={self.ext_kubeconfig}", f"--signing-key-file={self.seal}",
                    "--ledger-namespace=kube-system", f"--identity=bench-{secrets.token_hex(3)}",
                    "--log-level=warning", "--log-format=json"]  # fmt: skip
            if arm == "ours-noha":
                argv.append("--no-ha-ledger")
            cmd = [sys.executable, "-m", "scheduler_ext.entry", *argv]
            self.cluster.spawn("extender", cmd, env={"PYTHONPATH": str(REPO)})
            ready = f"http://127.0.0.1:{health}/readyz"

        def answers() -> bool:
            import http.client

            hostport, _, path = ready.removeprefix("http://").partition("/")
            host, _, port_text = hostport.partition(":")
            conn = http.client.HTTPConnection(host, int(port_text), timeout=5)
            try:
                conn.request("GET", "/" + path)
                status = conn.getresponse().status
                return status in (200, 405)  # noop's /filter answers GET with 405: it is up
            except OSError:
                return False
            finally:
                conn.close()

        self.cluster.wait_for(answers, what=f"the {arm} extender", timeout=300, log="extender")
        return port, self.extender_entry(arm, port)

    def start_koord(self) -> None:
        """koord-scheduler (the built binary) with :func:`koord_config`, on the admin kubeconfig
        (it reads Koordinator's objects kube-scheduler's identity may not), until /healthz answers."""
        assert self.koord is not None
        config = self.work / "koord-scheduler-config.json"
        config.write_text(json.dumps(koord_config(self.cluster.admin_kubeconfig, self.args.scheduler_qps)))
        port = free_port()
        self.cluster.spawn("koord-scheduler", [str(self.koord), f"--config={config}", "--bind-address=127.0.0.1",
                                               f"--secure-port={port}", "--v=1"])  # fmt: skip

        def healthy() -> bool:
            import http.client
            import ssl

            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed at start
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=insecure, timeout=5)
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except OSError:
                self.cluster.check_alive("koord-scheduler")
                return False
            finally:
                conn.close()

        self.cluster.wait_for(healthy, what="koord-scheduler", timeout=300, log="koord-scheduler")

    def koord_complaints(self) -> None:
        """Print koord-scheduler's log lines about an API it could not list or watch (a CRD missing)."""
        try:
            text = self.cluster.log_path("koord-scheduler").read_text(errors="replace")
        except OSError:
            return
        seen: set[str] = set()
        for line in text.splitlines():
            if ("failed to list" in line or "Failed to watch" in line) and line[-200:] not in seen:
                seen.add(line[-200:])
                print(f"koord-scheduler could not list: {line[-300:]}", file=sys.stderr, flush=True)

    def measure(self, arm: str, nodes: int, round_: int, *, profile: Path | None = None) -> dict[str, Any]:
        tag = f"r{round_}-{arm}-{nodes}" + ("-prof" if profile else "")
        if arm.startswith("ours"):
            # each run of ours starts as a fresh deployment: no ledger Lease of an earlier run
            # (the apiserver's identity Lease, labelled, stays)
            self.api.request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
                             "?labelSelector=!apiserver.kubernetes.io/identity")  # fmt: skip
        names = self.create_pods(self.args.pods, tag)
        extenders: list[dict[str, Any]] = []
        if arm not in ("none", "koord"):
            extenders = [self.start_extender(arm)[1]]
        scheduler = "koord-scheduler" if arm == "koord" else "kube-scheduler"
        rv = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")["metadata"]["resourceVersion"]
        watch = PodWatch(self.api, NAMESPACE, rv, bound).start()
        load_start = loadavg()
        ext_pid = self.cluster.pid("extender")
        try:
            spy = None
            if profile is not None and ext_pid:
                # py-spy samples the thread holding the GIL (--gil), 100 times a second
                spy = subprocess.Popen([str(PY_SPY), "record", "-p", str(ext_pid), "-o", str(profile), "-f", "raw",
                                        "-r", "100", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # py-spy attaches before kube-scheduler sends the first verb
            if arm == "koord":
                self.start_koord()
            else:
                base = {"qps": self.args.scheduler_qps, "burst": self.args.scheduler_qps}
                self.cluster.start_scheduler(extenders=extenders, base={"clientConnection": base})
            cpu0 = {"scheduler": proc_cpu(self.cluster.pid(scheduler)),
                    "apiserver": proc_cpu(self.cluster.pid("kube-apiserver")),
                    "extender": proc_cpu(ext_pid) if ext_pid else 0.0}  # fmt: skip
            threads0 = thread_cpu(ext_pid) if ext_pid and arm.startswith("ours") else {}
            times = watch.wait(names, timeout=self.args.timeout)
            cpu1 = {"scheduler": proc_cpu(self.cluster.pid(scheduler)),
                    "apiserver": proc_cpu(self.cluster.pid("kube-apiserver")),
                    "extender": proc_cpu(ext_pid) if ext_pid else 0.0}  # fmt: skip
            threads1 = thread_cpu(ext_pid) if ext_pid and arm.startswith("ours") else {}
            pods = [watch.objects[n] for n in names]
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                spy.wait(60)
        finally:
            watch.stop()
            if arm == "koord":
                self.koord_complaints()
            self.cluster.stop_process(scheduler)
            self.cluster.stop_process("extender")
        first, last = min(times.values()), max(times.values())
        rate = (len(names) - 1) / (last - first) if last > first else float("nan")
        row = {"nodes": nodes, "arm": arm, "round": round_, "pods": len(names), "pods_s": rate,
               "window_s": last - first, "load": f"{load_start} -> {loadavg()}",
               "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0},
               "threads": {k: v - threads0.get(k, 0.0) for k, v in threads1.items() if v - threads0.get(k, 0.0) > 0.05},
               "cpusets": check_cpusets(pods) if arm in CPUSET_ARMS else "n/a"}  # fmt: skip
        delete_pods(self.api, NAMESPACE)
        print(f"{nodes} nodes {arm:4} round {round_}: {rate:.0f} pods/s ({row['load']}) {row['cpusets']}",
              file=sys.stderr, flush=True)  # fmt: skip
        return row

    def run(self) -> None:
        arms = [a for a in self.args.arms.split(",") if a]
        for count in [int(n) for n in self.args.nodes.split(",") if n]:
            self.grow_nodes(count)
            for r in range(self.args.rounds):
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                for arm in order:
                    self.rows.append(self.measure(arm, count, r + 1))
            if self.args.profile and "ours" in arms:
                if not PY_SPY.exists():
                    print(f"\n(no profile: {PY_SPY} is missing; pip install the dev extra)")
                    continue
                out = self.work / f"extender-{count}.txt"
                self.measure("ours", count, 0, profile=out)
                print_profile(out, count)

    def same_round_ratios(self, nodes: int, arm: str, base: str) -> list[float]:
        """*arm*'s pods/s over *base*'s, round by round (both measured in the same round)."""
        by_round = {(r["arm"], r["round"]): r["pods_s"] for r in self.rows if r["nodes"] == nodes and r["round"] > 0}
        return [v / by_round[(base, rnd)] for (a, rnd), v in by_round.items() if a == arm and (base, rnd) in by_round]

    def report(self) -> None:
        print(f"\nkube-scheduler throughput, {self.args.pods} LSR pods of 1 CPU, pods/s first to last bind "
              f"(kube {self.cluster.binary.parent.name}, scheduler qps/burst {self.args.scheduler_qps})")  # fmt: skip
        print("| nodes | arm | round | pods/s | vs noop | load (1/5/15 min) start -> end | cpusets |")
        print("|---|---|---|---|---|---|---|")
        for row in self.rows:
            noop = [r["pods_s"] for r in self.rows
                    if r["nodes"] == row["nodes"] and r["arm"] == "noop" and r["round"] == row["round"]]  # fmt: skip
            ratio = f"{row['pods_s'] / noop[0]:.2f}" if noop and row["arm"] != "noop" else ""
            print(f"| {row['nodes']} | {row['arm']} | {row['round']} | {row['pods_s']:.0f} | {ratio} | "
                  f"{row['load']} | {row['cpusets']} |")  # fmt: skip
        print("\nMedian [min, max] over the rounds; a ratio is taken within each round, then summarised:")
        print("| nodes | arm | rounds | pods/s | / noop | / noop-bind | / koord | extender CPU ms per pod |")
        print("|---|---|---|---|---|---|---|---|")
        for count in sorted({r["nodes"] for r in self.rows}):
            for arm in (*ARMS, *EXTRA_ARMS):
                rates = [r["pods_s"] for r in self.rows if r["nodes"] == count and r["arm"] == arm and r["round"] > 0]
                if not rates:
                    continue
                cpu = [1000 * r["cpu"]["extender"] / r["pods"] for r in self.rows
                       if r["nodes"] == count and r["arm"] == arm and r["round"] > 0]  # fmt: skip
                cells = [spread(rates, "{:.0f}")]
                for base in ("noop", "noop-bind", "koord"):
                    cells.append(spread(self.same_round_ratios(count, arm, base), "{:.2f}") if arm != base else "1")
                cells.append(spread(cpu, "{:.2f}") if arm not in ("none", "koord") else "n/a")
                print(f"| {count} | {arm} | {len(rates)} | " + " | ".join(cells) + " |")
        for count in sorted({r["nodes"] for r in self.rows}):
            for base, target in (("noop", TARGET), ("koord", 1.0)):
                ratios = self.same_round_ratios(count, "ours", base)
                if ratios:
                    verdict = "met" if median(ratios) >= target else "MISSED"
                    print(f"{count} nodes: ours / {base} = {median(ratios):.2f} median (target >= {target}: {verdict})")
        print("\nCPU seconds from the scheduler's start to the last bind (ms of CPU per pod):")
        for row in self.rows:
            cpu = ", ".join(f"{k} {v:.1f} ({1000 * v / row['pods']:.1f})" for k, v in row["cpu"].items())
            threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(row["threads"].items(), key=lambda kv: -kv[1]))
            print(f"  {row['nodes']} {row['arm']:4} r{row['round']}: {cpu}" + (f"; extender threads: {threads}"
                                                                             if threads else ""))  # fmt: skip


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def spread(values: Sequence[float], fmt: str) -> str:
    """``median [min, max]``, or n/a for no values."""
    if not values:
        return "n/a"
    return f"{fmt.format(median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def print_profile(path: Path, nodes: int, top: int = 25) -> None:
    """py-spy's collapsed stacks (``a;b;c N``) as the functions with most samples: where the
    extender's Python ran itself (self) and what it ran under (inclusive)."""
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            under[frame] = under.get(frame, 0) + count
    print(f"\nExtender profile at {nodes} nodes (py-spy, samples of the thread holding the GIL, 100/s; "
          f"{total} samples):")  # fmt: skip
    for title, table in (("self", own), ("inclusive", under)):
        print(f"  by {title}:")
        for frame, count in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {100 * count / max(total, 1):5.1f}%  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated node counts, ascending")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1, help="measurements per arm and node count")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="comma-separated, of none,noop,noop-bind,ours,koord,ours-noha")  # fmt: skip
    parser.add_argument("--koord-scheduler", metavar="PATH",
                        help="default: where scripts/build-koord.sh koord-scheduler puts it")  # fmt: skip
    parser.add_argument("--scheduler-qps", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one arm's pods to bind")
    parser.add_argument("--profile", action="store_true", help="one more (unmeasured) ours run sampled by py-spy")
    parser.add_argument("--serve-noop", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--noop-kubeconfig", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_noop:
        serve_noop(args.serve_noop, args.noop_kubeconfig)
        return 0
    if os.geteuid() != 0:
        print("kube_scheduler_throughput: needs root (the cluster's route and processes)", file=sys.stderr)
        return 2
    if kube_binary() is None:
        print("kube_scheduler_throughput: the kube binary is missing: run scripts/install-deps.sh", file=sys.stderr)
        return 2
    koord: Path | None = None
    if "koord" in args.arms.split(","):
        koord, why = koord_binary(args.koord_scheduler)
        if koord is None:
            print(f"koord-scheduler arm skipped: {why}", flush=True)
            args.arms = ",".join(a for a in args.arms.split(",") if a != "koord")
    work = Path(tempfile.mkdtemp(prefix="rhp-bench-sched-", dir="/tmp"))
    try:
        cluster = Cluster(
            work / "no-kubelet.sock", scheduler=False, kubelet=False,
            apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"],
            controller_manager_args=["--controllers=-nodelifecycle"],
        )  # fmt: skip
        with cluster:
            print(f"cluster up in {cluster.start_seconds:.0f} s (load {loadavg()})", file=sys.stderr, flush=True)
            bench = Bench(args, cluster, work, koord)
            bench.setup()
            bench.run()
            bench.report()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 32 item 4: the cluster's ordinary faults on the real one-node cluster, each with pods
being scheduled and run before, during and after it.

One bed for the whole module (module-scoped, the tests run in file order on it): the session
stack on containerd 2.1, the two ``scheduler-ext manager`` replicas of ``test_e2e_manager``
(one Lease, resync 2 s, the pod webhook on ``manager-a``), a thread that writes the node's
NodeMetric every 5 s as the node agent does, an API-only node of 64 CPUs, and two
``scheduler-ext serve`` replicas (the stack's own command line, short watch timeouts and ledger
TTL) behind :class:`tests.e2e.failover.Failover`, which kube-scheduler calls as it would call a
Service with two endpoints.

Each fault is one round:

- *before*: the previous round's pods run (an LSR pod on the real node with its exclusive CPU, an
  LS pod, a BE pod on batch resources);
- *during*: a burst of LSR pods for the API-only node and an LS pod for the real node is
  created just before (or, where the API stays up, while) the fault is injected;
- *after*: the burst is bound, the previous round's pods still run in the same containers with
  the same cpusets, and a new burst (API-only LSR pods, a real LSR pod, a BE pod) is bound and
  runs within :data:`AFTER_BOUND` seconds.

After every round: no CPU is given twice (the allocation annotations of every live pod on each
node, and the real cgroups of the pods running here: each LSR container on exactly its
annotation's CPUs, no LS container on an LSR pod's CPU); the batch resources stayed on the
Node, whose metric is kept fresh (a gap longer than :data:`BATCH_GAP` fails); the manager's
Lease was renewed after the fault (and moved when its holder was killed); no extender replica
holds a CPU that no live pod has once the ledger TTL passed (a pod asking for every free CPU of
the API-only node passes the replica's filter).

The node agent's NRI round moves kubelet to containerd with ``runtime-proxy nri`` and back; the
15 s kube-apiserver round runs the node agent with ``fromCluster`` and checks its own watches
after the outage (a NodeSLO change reaches the node, a BE pod's batch limits come from its spec).

Each round adds a row (recovery time, pods bound after, CPUs given twice, batch resources lost)
to a table printed at the end of the module and written to :data:`TABLE` (Markdown).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NODE_NAME, Cluster, free_port

from hooks.facts import format_cpu_list, parse_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import (
    NriPlugin,
    Stack,
    collect_sandboxes,
    container_id,
    http_get,
    pod_cgroup,
    pod_manifest,
)
from tests.e2e.extenderlib import STATUS, annotations_of, api_call, api_only_node, lsr, on_node
from tests.e2e.failover import Failover
from tests.e2e.test_e2e_manager import (  # noqa: F401 - managers is a fixture of this module too
    BATCH_CPU,
    BATCH_MEMORY,
    CONFIG,
    LEASE,
    NAMESPACE,
    REPLICAS,
    SERVED,
    holder,
    managers,
    write_metric,
)
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO

TABLE = Path(os.environ.get("RHP_FAULT_TABLE", "/tmp/rhp-e2e-faults.md"))
"""Where the module's table of faults goes (Markdown); also printed at the end."""

WATCH_TIMEOUT, IDLE_TIMEOUT, LEDGER_TTL = 5, 8.0, 38.0  # the shortest TTL serve accepts with them
API_CORES = 32  # the API-only node: 64 CPUs
RECOVERY_BOUND = 300.0
"""Seconds from a fault's end within which every pod created before or during it is bound:
kube-scheduler's 5 minute flush of its unschedulable pods, the worst case for a refusal nothing
requeues (the extender requeues the pods it refused from a stale cache once it is fresh)."""
AFTER_BOUND = 90.0
"""Seconds within which a pod created after the recovery is bound (and, on the node, runs)."""
BATCH_GAP = 10.0
"""Longest time the Node may be seen without batch resources while its metric is fresh (the
manager resyncs every 2 s)."""
WAIT = 240.0  # deadline of a wait that only a broken cluster misses
TOPO = read_cpu_topology()
BE_RESOURCES = {BATCH_CPU: "200", BATCH_MEMORY: "64Mi"}
BE_LIMITS = {"cpu.cfs_quota_us": "20000", "cpu.shares": "204", "memory.limit_in_bytes": str(64 << 20)}
"""What ``BE_RESOURCES`` give the BE pod's container and pod cgroups (hooks/plugins/batch_resource.py:
200 milli-cores are 20000 us a 100000 us period and 200 x 1024 / 1000 shares)."""
NODE_RBAC = REPO / "packaging" / "kustomize" / "base" / "node" / "rbac.yaml"
NODE_USER = "system:serviceaccount:kube-system:runtime-hook-proxy-node"


@dataclass
class Row:
    fault: str
    recovery: float
    bound_after: int
    cpus_twice: int
    batch_lost: str
    lease: str
    notes: str = ""


ROWS: list[Row] = []


@pytest.fixture(autouse=True)
def _two_cpus_one_numa_node() -> None:
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {TOPO.cpus} on {TOPO.numa_nodes}")


# -- the bed ---------------------------------------------------------------------------------------


@dataclass
class Extender:
    name: str
    port: int
    health: int


@dataclass
class Bed:
    stack: Stack
    node: str
    """The API-only node."""
    extenders: tuple[Extender, Extender]
    failover: Failover
    client_tls: ssl.SSLContext
    """kube-scheduler's client certificate for the extender (and its CA)."""
    batch_seen: list[tuple[float, bool]] = field(default_factory=list)
    """(monotonic time, batch resources on the Node) as a thread read them every second."""
    namespaces: list[str] = field(default_factory=list)
    last_extender_kill: float = 0.0
    threshold: int = 55
    """The ``cpuSuppressThresholdPercent`` last written to slo-controller-config."""

    @property
    def cluster(self) -> Cluster:
        return self.stack.cluster


def _namespace(cluster: Cluster) -> str:
    name = f"faults-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for(lambda: cluster.get_json("serviceaccount", "default", namespace=name) is not None,
                     what=f"ServiceAccount {name}/default", timeout=WAIT)  # fmt: skip
    return name


def _every(stop: threading.Event, seconds: float, fn: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the API server may be down: the next turn retries
                fn()
            stop.wait(seconds)

    thread = threading.Thread(target=run, daemon=True, name=f"every-{seconds}")
    thread.start()
    return thread


def _batch_on_node(cluster: Cluster) -> bool:
    status, node = api_call(cluster, "GET", f"/api/v1/nodes/{NODE_NAME}")
    if status != 200:
        raise OSError(f"HTTP {status}")
    alloc, cap = node["status"].get("allocatable", {}), node["status"].get("capacity", {})
    return all(k in alloc and cap.get(k) == alloc[k] for k in (BATCH_CPU, BATCH_MEMORY))


def _replica_command(cluster: Cluster, name: str, port: int, health: int) -> list[str]:
    """The stack's extender command line with its own listeners and identity, short watch
    timeouts and the shortest ledger TTL they allow."""
    argv = []
    for arg in cluster.command("scheduler-ext"):
        if arg.startswith("--listen="):
            arg = f"--listen=127.0.0.1:{port}"
        elif arg.startswith("--health-listen="):
            arg = f"--health-listen=127.0.0.1:{health}"
        elif arg.startswith("--identity="):
            arg = f"--identity={name}"
        argv.append(arg)
    return [*argv, f"--watch-timeout={WATCH_TIMEOUT}", f"--watch-idle-timeout={IDLE_TIMEOUT}",
            f"--ledger-ttl={LEDGER_TTL}"]  # fmt: skip


def _wait_ready(cluster: Cluster, ext: Extender, timeout: float = WAIT) -> None:
    def ready() -> bool:
        cluster.check_alive(ext.name)
        try:
            return http_get(f"http://127.0.0.1:{ext.health}/readyz")[0] == 200
        except OSError:
            return False

    cluster.wait_for(ready, what=f"{ext.name} /readyz", timeout=timeout, log=ext.name)


@pytest.fixture(scope="module")
def bed(stack: Stack, request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Bed]:
    if stack.ctrd.version != "2.1":
        pytest.skip("the faults are checked on the containerd 2.1 stack (NRI mode needs it)")
    request.getfixturevalue("managers")  # test_e2e_manager's two replicas, this module's own
    # Reclaim up to the whole node: with an LSR pod holding one of this machine's 2 CPUs, the
    # default 60 % would leave no batch CPU for the rounds' BE pods.
    data: dict[str, str] = dict(CONFIG["data"])  # type: ignore[arg-type]
    colocation = {**json.loads(data["colocation-config"]), "cpuReclaimThresholdPercent": 100,
                  "memoryReclaimThresholdPercent": 100}  # fmt: skip
    stack.cluster.apply({**CONFIG, "data": {**data, "colocation-config": json.dumps(colocation)}})
    cluster = stack.cluster
    stop = threading.Event()
    saved_extenders = [dict(e) for e in cluster.extenders]
    failover: Failover | None = None
    with contextlib.ExitStack() as exits:
        _every(stop, 5.0, lambda: write_metric(cluster, time.time()))  # the node agent's report
        node = exits.enter_context(api_only_node(cluster, cores=API_CORES))
        replicas = []
        for name in ("scheduler-ext-a", "scheduler-ext-b"):
            ext = Extender(name, free_port(), free_port())
            cluster.spawn(name, _replica_command(cluster, name, ext.port, ext.health),
                          env={"PYTHONPATH": str(REPO)})  # fmt: skip
            replicas.append(ext)
        for ext in replicas:
            _wait_ready(cluster, ext)
        failover = Failover([e.port for e in replicas]).start()
        (entry,) = saved_extenders
        tls = entry["tlsConfig"]
        client_tls = ssl.create_default_context(cafile=tls["caFile"])
        client_tls.load_cert_chain(tls["certFile"], tls["keyFile"])
        cluster.start_scheduler(extenders=[{**entry, "urlPrefix": f"https://127.0.0.1:{failover.port}"}])
        bed = Bed(stack, node, (replicas[0], replicas[1]), failover, client_tls)
        _every(stop, 1.0, lambda: bed.batch_seen.append((time.monotonic(), _batch_on_node(cluster))))
        cluster.wait_for(lambda: _batch_on_node(cluster), what="batch resources on the Node", timeout=WAIT,
                         log=REPLICAS[0])  # fmt: skip
        try:
            yield bed
        finally:
            stop.set()
            _print_table(pytestconfig)
            for ns in bed.namespaces:
                cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force",
                                "--wait=true", "--timeout=120s", check=False)  # fmt: skip
                with contextlib.suppress(AssertionError):
                    collect_sandboxes(stack, ns)
                cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            cluster.start_scheduler(extenders=saved_extenders)
            for ext in replicas:
                cluster.stop_process(ext.name)
            failover.stop()


def _print_table(config: pytest.Config) -> None:
    lines = [
        "| fault | recovery (s) | pods bound after | CPUs given twice | batch resources lost | Lease | notes |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r.fault} | {r.recovery:.1f} | {r.bound_after} | {r.cpus_twice} | {r.batch_lost} | {r.lease} | "
          f"{r.notes} |" for r in ROWS),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    with contextlib.suppress(OSError):
        TABLE.write_text(text)
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nfaults on the real cluster (also in {TABLE}):")
        for line in lines:
            reporter.write_line(line)


# -- pods ------------------------------------------------------------------------------------------


def _on_this_node(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
    return manifest


def _real_lsr(name: str, ns: str) -> dict[str, Any]:
    return _on_this_node(lsr(name, ns, 1))


def _real_ls(name: str, ns: str) -> dict[str, Any]:
    return _on_this_node(pod_manifest(name, ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"},
                                      limits={"cpu": "1"}))  # fmt: skip


def _real_be(name: str, ns: str, *, annotated: bool = True) -> dict[str, Any]:
    """A BE pod on batch resources; *annotated*: with the webhook's extended-resource-spec
    annotation (else the node agent reads its batch requests from its pod spec, ``fromCluster``)."""
    spec = q.extended_resource_spec({"app": {"requests": BE_RESOURCES, "limits": BE_RESOURCES}})
    annotations = {q.EXTENDED_RESOURCE_SPEC: spec} if annotated else None
    return _on_this_node(pod_manifest(name, ns, qos="BE", annotations=annotations,
                                      requests=BE_RESOURCES, limits=BE_RESOURCES))  # fmt: skip


def _create(cluster: Cluster, manifests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": manifests})
    return [(m["metadata"]["namespace"], m["metadata"]["name"]) for m in manifests]


def _pods(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    proc = cluster.kubectl("get", "pods", "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return {}
    return {p["metadata"]["name"]: p for p in json.loads(proc.stdout).get("items", [])}


def _running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return pod.get("status", {}).get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)


def _wait_pods(cluster: Cluster, names: list[tuple[str, str]], *, run: set[str], timeout: float) -> float:
    """Wait until every pod is bound (and the ones named in *run* run); returns when that was."""

    def done() -> bool:
        by_ns: dict[str, dict[str, dict[str, Any]]] = {}
        for ns, name in names:
            pods = by_ns.setdefault(ns, _pods(cluster, ns))
            pod = pods.get(name)
            if pod is None or not pod["spec"].get("nodeName") or (name in run and not _running(pod)):
                return False
        return True

    try:
        cluster.wait_for(done, what=f"pods {names} bound (running: {sorted(run)})", timeout=timeout)
    except Exception as exc:
        events = {ns: cluster.kubectl("get", "events", "-n", ns, check=False).stdout[-3000:] for ns, _ in names}
        raise AssertionError(f"{exc}\nevents: {events}\nextender a:\n{cluster.log_tail('scheduler-ext-a')}"
                             f"\nextender b:\n{cluster.log_tail('scheduler-ext-b')}") from None  # fmt: skip
    return time.monotonic()


# -- checks ----------------------------------------------------------------------------------------


def _live(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and not pod["metadata"].get("deletionTimestamp") and \
        pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")  # fmt: skip


def _cpusets(cluster: Cluster) -> dict[str, list[tuple[str, frozenset[int]]]]:
    """Every live bound pod's CPUs from its allocation annotation, by node."""
    out = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)
    by_node: dict[str, list[tuple[str, frozenset[int]]]] = {}
    for pod in out.get("items", []):
        text = annotations_of(pod).get(STATUS)
        if not _live(pod) or not text:
            continue
        cpus = json.loads(text).get("cpuset", "")
        if cpus:
            name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            by_node.setdefault(pod["spec"]["nodeName"], []).append((name, frozenset(parse_cpu_list(cpus))))
    return by_node


def _given_twice(cluster: Cluster) -> tuple[int, list[str]]:
    twice: list[str] = []
    for node, grants in _cpusets(cluster).items():
        owner: dict[int, str] = {}
        for name, cpus in grants:
            for cpu in cpus:
                if cpu in owner:
                    twice.append(f"{node} CPU {cpu}: {owner[cpu]} and {name}")
                owner[cpu] = name
    return len(twice), twice


def _real_cgroups_agree(bed: Bed, namespaces: list[str]) -> None:
    """Each running LSR container on this node is on exactly its annotation's CPUs, and no LS
    container is on one of them (waited for: a reconciler round may be due)."""
    cluster = bed.cluster

    def agree() -> str:
        lsr_cpus: set[int] = set()
        problems = []
        pods = [p for ns in namespaces for p in _pods(cluster, ns).values()
                if p["spec"].get("nodeName") == NODE_NAME and _running(p)]  # fmt: skip
        for pod in pods:
            qos = pod["metadata"].get("labels", {}).get(q.LABEL_QOS)
            actual = q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus")
            if qos == "LSR":
                want = json.loads(annotations_of(pod)[STATUS])["cpuset"]
                if parse_cpu_list(actual) != parse_cpu_list(want):
                    problems.append(f"{pod['metadata']['name']} on {actual}, granted {want}")
                if lsr_cpus & set(parse_cpu_list(actual)):
                    problems.append(f"{pod['metadata']['name']} shares an LSR CPU: {actual}")
                lsr_cpus |= set(parse_cpu_list(actual))
        for pod in pods:
            if pod["metadata"].get("labels", {}).get(q.LABEL_QOS) == "LS":
                actual = q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus")
                if set(parse_cpu_list(actual)) & lsr_cpus:
                    problems.append(f"LS {pod['metadata']['name']} on {actual}, LSR CPUs {format_cpu_list(lsr_cpus)}")
        return "; ".join(problems) or "ok"

    q.wait_for(agree, "ok", what="cpusets in the real cgroups", timeout=90)


def _longest_batch_gap(bed: Bed, since: float) -> float:
    longest, gap_start = 0.0, None
    for when, present in list(bed.batch_seen):
        if when < since:
            continue
        if not present and gap_start is None:
            gap_start = when
        elif present and gap_start is not None:
            longest, gap_start = max(longest, when - gap_start), None
    if gap_start is not None:
        longest = max(longest, time.monotonic() - gap_start)
    return longest


def _lease(cluster: Cluster) -> tuple[str, str]:
    spec = (cluster.get_json("lease", LEASE, namespace=NAMESPACE) or {}).get("spec", {})
    return str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or "")


def _filter_passes(bed: Bed, ext: Extender, pod: dict[str, Any]) -> bool:
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", ext.port, timeout=30, context=bed.client_tls)
    try:
        conn.request("POST", "/filter", body=json.dumps({"Pod": pod, "NodeNames": [bed.node]}),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        reply = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return bed.node in (reply.get("NodeNames") or [])


def _nothing_held_past_ttl(bed: Bed) -> None:
    """Once the ledger TTL passed since the last extender kill, each replica offers every CPU of
    the API-only node that no live pod was granted: a pod asking for exactly that many passes."""
    cluster = bed.cluster
    cluster.wait_for(lambda: time.monotonic() > bed.last_extender_kill + LEDGER_TTL + 5,
                     what="the ledger TTL to pass", timeout=LEDGER_TTL + 30)  # fmt: skip
    for ext in bed.extenders:

        def free_all_pass(ext: Extender = ext) -> bool:
            held = sum(len(cpus) for _, cpus in _cpusets(cluster).get(bed.node, []))
            free = 2 * API_CORES - held
            probe = on_node(lsr(f"probe-{secrets.token_hex(3)}", "default", free), bed.node)
            probe["metadata"]["uid"] = f"probe-{secrets.token_hex(8)}"
            return _filter_passes(bed, ext, probe)

        cluster.wait_for(free_all_pass, what=f"{ext.name} offering every CPU no live pod holds", timeout=30,
                         log=ext.name)  # fmt: skip


def _watches_alive(bed: Bed, fault_end: float) -> None:
    """Past the time a dead watch makes an extender replica stale, both replicas are ready; the
    manager's leader writes a changed ``cpuSuppressThresholdPercent`` into the NodeSLO."""
    cluster = bed.cluster
    stale_by = fault_end + WATCH_TIMEOUT + IDLE_TIMEOUT + 15
    time.sleep(max(0.0, stale_by - time.monotonic()))
    for ext in bed.extenders:
        _wait_ready(cluster, ext, timeout=60)
        assert http_get(f"http://127.0.0.1:{ext.health}/healthz")[0] == 200, ext.name
    bed.threshold = 40 + (bed.threshold + 1) % 20
    strategy = {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": bed.threshold}}
    patch = {"data": {"resource-threshold-config": json.dumps(strategy)}}
    cluster.kubectl("patch", "configmap", "slo-controller-config", "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps(patch))  # fmt: skip

    def followed() -> bool:
        slo = cluster.get_json("nodeslo", NODE_NAME) or {}
        value = slo.get("spec", {}).get("resourceUsedThresholdWithBE", {}).get("cpuSuppressThresholdPercent")
        return bool(value == bed.threshold)

    cluster.wait_for(followed, what=f"the NodeSLO following the ConfigMap ({bed.threshold} %)", timeout=60,
                     log=_holder_name(cluster))  # fmt: skip


def _holder_name(cluster: Cluster) -> str:
    return holder(cluster) or REPLICAS[0]


# -- the node agent's own watches (fromCluster) -----------------------------------------------------


def _burst_percent(cluster: Cluster, percent: int) -> None:
    """slo-controller-config's cpu-burst-config, which the manager's leader writes into the NodeSLO."""
    burst = {"clusterStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": percent}}
    cluster.kubectl("patch", "configmap", "slo-controller-config", "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"data": {"cpu-burst-config": json.dumps(burst)}}))  # fmt: skip


@contextlib.contextmanager
def _node_agent_from_cluster(bed: Bed) -> Iterator[None]:
    """The node agent restarted with ``fromCluster`` as the node's ServiceAccount (its Node,
    NodeSLO and NodeResourceTopology and the pods on it watched through ``rhp_kube``), with
    ``cpu_burst`` too; the session's proxy again afterwards."""
    stack, cluster = bed.stack, bed.cluster
    cluster.apply(NODE_RBAC.read_text())
    groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
    kubeconfig = cluster.kubeconfig_for("runtime-hook-proxy-node-faults", user=NODE_USER, groups=groups)
    _burst_percent(cluster, 50)
    config = yaml.safe_load((stack.work / "proxy-config.yaml").read_text())
    config["plugins"] = [*config["plugins"], {"name": "cpu_burst"}]
    config.update(fromCluster=True, nodeName=NODE_NAME, reconcilePeriodSeconds=2)
    stack.restart_proxy_with_config(config, "faults-from-cluster", env={"KUBECONFIG": str(kubeconfig)})
    try:
        yield
    finally:
        stack.restart_proxy()


def _nodeslo_reaches_the_node(bed: Bed, ns: str) -> None:
    """A cpuBurstPercent changed after the fault reaches the running LS pod's ``cpu.cfs_burst_us``
    (1 CPU limit: percent x 1000 us) through the manager's NodeSLO and the node agent's watch."""
    cluster = bed.cluster
    percent = 80
    _burst_percent(cluster, percent)
    pod = _pods(cluster, ns)["during-ls"]
    q.wait_for(lambda: q.read_container_file(pod_cgroup(pod), container_id(pod), "cpu.cfs_burst_us"),
               str(percent * 1000), what="the NodeSLO's cpuBurstPercent in the LS pod", timeout=90)  # fmt: skip


def _be_limits_from_pod_spec(cluster: Cluster, ns: str, name: str) -> None:
    """The BE pod without the annotation has its batch limits in its container's and pod's cgroups."""
    pod = _pods(cluster, ns)[name]
    assert q.EXTENDED_RESOURCE_SPEC not in pod["metadata"].get("annotations", {})
    parent, cid = pod_cgroup(pod), container_id(pod)
    q.wait_for(lambda: {"container": {f: q.read_container_file(parent, cid, f) for f in BE_LIMITS},
                        "pod": {f: q.read_pod_file(parent, f) for f in BE_LIMITS}},
               {"container": BE_LIMITS, "pod": BE_LIMITS}, what="the BE pod's batch limits from its pod spec",
               timeout=90)  # fmt: skip


# -- a round ---------------------------------------------------------------------------------------


@dataclass
class Round:
    bed: Bed
    fault: str
    ns: str = ""
    during: list[tuple[str, str]] = field(default_factory=list)
    began: float = 0.0
    lease_before: tuple[str, str] = ("", "")
    previous: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The previous round's running pods on this node: name -> (container id, cpuset.cpus)."""
    node_watches: bool = False
    """The node agent runs with ``fromCluster`` (:func:`_node_agent_from_cluster`): after the
    fault, a NodeSLO change must reach the node's cgroups and the new BE pod (without the
    annotation) must get its batch limits from its pod spec."""

    def start(self, *, n_api: int = 4) -> Round:
        """Note what runs, and create the *during* burst (API-only LSR pods, a real LS pod)."""
        cluster = self.bed.cluster
        self.began = time.monotonic()
        self.lease_before = _lease(cluster)
        if self.bed.namespaces:
            for name, pod in _pods(cluster, self.bed.namespaces[-1]).items():
                if pod["spec"].get("nodeName") == NODE_NAME and _running(pod):
                    self.previous[name] = (container_id(pod), self._cpuset(pod))
        self.ns = _namespace(cluster)
        self.bed.namespaces.append(self.ns)
        manifests = [on_node(lsr(f"during-{i}", self.ns, 1), self.bed.node) for i in range(n_api)]
        manifests.append(_real_ls("during-ls", self.ns))
        self.during = _create(cluster, manifests)
        return self

    @staticmethod
    def _cpuset(pod: dict[str, Any]) -> str:
        return q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus")

    def finish(
        self, fault_end: float, *, lease_moves: bool = False, watches_outlive: bool = False, notes: str = ""
    ) -> Row:
        """Everything after the fault; adds the round's row and asserts the acceptance.

        *watches_outlive*: the API server went away, so wait until a replica whose watches died
        would have gone stale, and see every extender replica ready and the manager following a
        change of its ConfigMap, before the new burst."""
        bed, cluster = self.bed, self.bed.cluster
        probe = _create(cluster, [on_node(lsr("probe", self.ns, 1), bed.node)])
        bound = _wait_pods(cluster, self.during + probe, run={"during-ls"}, timeout=RECOVERY_BOUND + 30)
        recovery = max(0.0, bound - fault_end)
        if watches_outlive:
            _watches_alive(bed, fault_end)
        if self.node_watches:
            _nodeslo_reaches_the_node(bed, self.ns)
        # what ran before the fault runs on, in the same containers with the same cpusets
        old_ns = self.bed.namespaces[-2] if len(self.bed.namespaces) > 1 else ""
        if old_ns:
            pods = _pods(cluster, old_ns)
            for name, (cid, cpus) in self.previous.items():
                pod = pods.get(name)
                assert pod is not None and _running(pod), f"{old_ns}/{name} stopped running over {self.fault}"
                assert (container_id(pod), self._cpuset(pod)) == (cid, cpus), f"{name} changed over {self.fault}"
            cluster.kubectl("delete", "pods", "--all", "-n", old_ns, "--grace-period=0", "--force", "--wait=true",
                            "--timeout=120s", check=False)  # fmt: skip
            collect_sandboxes(self.bed.stack, old_ns, timeout=WAIT)
        # the after burst: API-only LSR pods, and on this node an LSR pod and a BE pod that run
        created = time.monotonic()
        after = _create(cluster, [*(on_node(lsr(f"after-{i}", self.ns, 1), bed.node) for i in range(2)),
                                  _real_lsr("after-lsr", self.ns),
                                  _real_be("after-be", self.ns, annotated=not self.node_watches)])  # fmt: skip
        _wait_pods(cluster, after, run={"after-lsr", "after-be"}, timeout=AFTER_BOUND + WAIT)
        after_seconds = time.monotonic() - created
        if self.node_watches:
            _be_limits_from_pod_spec(cluster, self.ns, "after-be")
        twice, which = _given_twice(cluster)
        _real_cgroups_agree(bed, [self.ns])
        gap = _longest_batch_gap(bed, self.began)
        cluster.wait_for(lambda: _lease(cluster)[1] != self.lease_before[1], what="the manager's Lease renewed",
                         timeout=WAIT, log=REPLICAS[0])  # fmt: skip
        holder_after, _ = _lease(cluster)
        lease = f"{self.lease_before[0]} -> {holder_after}" if holder_after != self.lease_before[0] else \
            f"{holder_after} renewed"  # fmt: skip
        row = Row(self.fault, recovery, len(self.during) + len(probe) + len(after), twice,
                  "none" if gap == 0 else f"{gap:.0f} s without", lease, notes)  # fmt: skip
        ROWS.append(row)
        assert twice == 0, which
        assert recovery <= RECOVERY_BOUND, f"{self.fault}: bound {recovery:.0f} s after the fault ended"
        assert after_seconds <= AFTER_BOUND + 30, f"{self.fault}: new pods took {after_seconds:.0f} s"
        assert gap <= BATCH_GAP, f"{self.fault}: the Node was without batch resources for {gap:.0f} s"
        assert holder_after in REPLICAS
        if lease_moves:
            assert holder_after != self.lease_before[0], f"the Lease stayed with {holder_after}"
        return row


# -- the faults, in order ----------------------------------------------------------------------------


def _first_bound(cluster: Cluster, r: Round) -> None:
    cluster.wait_for(lambda: any(p["spec"].get("nodeName") for p in _pods(cluster, r.ns).values()),
                     what="the burst's first bind", timeout=WAIT)  # fmt: skip


def _extender_killed(bed: Bed, index: int) -> None:
    cluster, ext = bed.cluster, bed.extenders[index]
    bed.failover.prefer(ext.port)  # kube-scheduler's next connection reaches this replica
    r = Round(bed, f"extender replica {'ab'[index]} SIGKILL mid-bind").start(n_api=8)
    _first_bound(cluster, r)
    cluster.kill(ext.name)
    bed.last_extender_kill = killed = time.monotonic()
    r.finish(killed, notes="the other replica binds; the killed one restarts after")
    cluster.respawn(ext.name)
    _wait_ready(cluster, ext)


def test_extender_replica_a_killed_mid_bind(bed: Bed) -> None:
    _extender_killed(bed, 0)


def test_extender_replica_b_killed_mid_bind_and_nothing_is_held_past_the_ttl(bed: Bed) -> None:
    _extender_killed(bed, 1)
    _nothing_held_past_ttl(bed)


def test_manager_leader_killed(bed: Bed) -> None:
    cluster = bed.cluster
    r = Round(bed, "manager leader SIGKILL").start()
    leader = holder(cluster)
    cluster.kill(leader)
    killed = time.monotonic()
    other = next(n for n in REPLICAS if n != leader)
    cluster.wait_for(lambda: holder(cluster) == other, what=f"{other} taking the Lease", timeout=WAIT, log=other)
    took = time.monotonic() - killed
    r.finish(killed, lease_moves=True, notes=f"Lease taken over {took:.0f} s after the kill")
    cluster.respawn(leader)


def test_kube_scheduler_killed_mid_burst(bed: Bed) -> None:
    cluster = bed.cluster
    r = Round(bed, "kube-scheduler SIGKILL mid-burst").start(n_api=8)
    _first_bound(cluster, r)
    ready = cluster.restart_component("kube-scheduler", timeout=WAIT)
    r.finish(time.monotonic(), notes=f"healthy {ready:.1f} s after the restart")


def test_node_agent_cri_proxy_killed(bed: Bed) -> None:
    stack = bed.stack
    stack.proxy.kill9()
    killed = time.monotonic()
    r = Round(bed, "node agent (runtime-proxy serve) SIGKILL, back after 5 s").start()
    time.sleep(max(0.0, killed + 5 - time.monotonic()))
    stack.restart_proxy()
    r.finish(time.monotonic(), notes="kubelet retries the sandboxes it could not create")


def test_node_agent_nri_plugin_killed(bed: Bed) -> None:
    from tests.e2e.test_e2e_nri import nri_mode

    stack = bed.stack
    if stack.ctrd.version != "2.1":
        pytest.skip("NRI mode runs on containerd 2.1 here")
    with nri_mode(stack) as plugin:
        plugin.kill9()
        killed = time.monotonic()
        r = Round(bed, "node agent (runtime-proxy nri) SIGKILL, back after 5 s").start()
        time.sleep(max(0.0, killed + 5 - time.monotonic()))
        again = NriPlugin(plugin.socket, Path(plugin.log).parent / "again", *_nri_extra(plugin))
        again.start()
        try:
            r.finish(time.monotonic(), notes="containerd runs pods unadjusted while no plugin is registered")
        finally:
            again.stop()


def _nri_extra(plugin: NriPlugin) -> list[str]:
    """The arguments *plugin* was started with after its own (its ``--config``)."""
    return plugin.args[plugin.args.index("--config") :]


def test_webhook_certificate_renewed(bed: Bed) -> None:
    cluster = bed.cluster
    pki_dir = cluster.work_dir / "manager-webhook-pki"
    cert, key = pki_dir / "manager-webhook.crt", pki_dir / "manager-webhook.key"
    r = Round(bed, "webhook certificate renewed").start()
    from rhp_devenv.kube import Pki, TlsPair

    pki = Pki(pki_dir / "renewed")
    fresh = pki.issue(TlsPair(pki_dir / "manager-webhook-ca.crt", pki_dir / "manager-webhook-ca.key"),
                      "manager-webhook", cn="rhp-manager", ips=("127.0.0.1",), server=True, client=False)  # fmt: skip
    os.replace(fresh.key, key)
    os.replace(fresh.cert, cert)
    renewed = time.monotonic()
    want = ssl.PEM_cert_to_DER_cert(cert.read_text())
    port = _webhook_port(cluster)

    def serves_the_new_one() -> bool:
        with contextlib.suppress(OSError):
            return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port), timeout=5)) == want
        return False

    cluster.wait_for(serves_the_new_one, what="the webhook serving the renewed certificate", timeout=WAIT,
                     log=REPLICAS[0])  # fmt: skip
    took = time.monotonic() - renewed
    served = _namespace(cluster)
    bed.namespaces.insert(0, served)
    cluster.kubectl("label", "namespace", served, *(f"{k}={v}" for k, v in SERVED.items()))
    sneaky = pod_manifest("sneaky", served, requests={BATCH_CPU: "500"}, limits={BATCH_CPU: "500"})
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(sneaky), check=False)
    assert "must specify koordinator QoS BE" in refused.stderr, refused.stderr
    r.finish(time.monotonic(), notes=f"served {took:.0f} s after the files changed")


def _webhook_port(cluster: Cluster) -> int:
    for arg in cluster.command(REPLICAS[0]):
        if arg.startswith("--webhook-listen="):
            return int(arg.rsplit(":", 1)[1])
    raise AssertionError(f"{REPLICAS[0]} has no webhook")


def _apiserver_outage(bed: Bed, seconds: float, *, node_watches: bool = False) -> None:
    cluster = bed.cluster
    r = Round(bed, f"kube-apiserver SIGKILL, down {seconds:.0f} s", node_watches=node_watches).start()
    ready = cluster.restart_component("kube-apiserver", down=seconds, timeout=WAIT)
    also = "; the node agent's watches follow a NodeSLO change and a BE pod's spec" if node_watches else ""
    r.finish(time.monotonic(), watches_outlive=True, notes=f"API ready {ready:.1f} s after the restart{also}")


def test_kube_apiserver_killed_and_back_after_15_seconds(bed: Bed) -> None:
    """Also the node agent's own watches (``fromCluster``: runtime_proxy/state/podspecs.py and
    nodeconfig.py through ``rhp_kube``): after the restart a NodeSLO change reaches the node and
    a new BE pod gets its limits from its pod spec."""
    with _node_agent_from_cluster(bed):
        _apiserver_outage(bed, 15, node_watches=True)


def test_kube_apiserver_killed_and_back_after_90_seconds(bed: Bed) -> None:
    _apiserver_outage(bed, 90)


def test_etcd_killed_and_restarted_on_its_data(bed: Bed) -> None:
    cluster = bed.cluster
    r = Round(bed, "etcd SIGKILL, restarted after 5 s").start()
    ready = cluster.restart_component("etcd", down=5, timeout=WAIT)
    cluster.wait_for(lambda: cluster.healthy("kube-apiserver"), what="kube-apiserver /readyz", timeout=WAIT,
                     log="kube-apiserver")  # fmt: skip
    r.finish(time.monotonic(), watches_outlive=True, notes=f"etcd healthy {ready:.1f} s after the restart")

"""End-to-end fixtures: a real one-node Kubernetes (:class:`rhp_devenv.kube.Cluster`) whose
kubelet runs pods through ``runtime-proxy serve`` in front of a private containerd (2.1, then
1.7), and whose kube-scheduler uses ``scheduler-ext serve`` over mutual TLS.

- ``stack`` (session, one per containerd version, ids ``containerd-2.1`` and ``containerd-1.7``):
  everything above on the newest Kubernetes the harness builds (``rhp_devenv.kube.KUBE_VERSION``),
  started once per version (about 30 s) and shared by the tests; see :class:`Stack`.
  ``test_e2e_oldest.py`` opens the same stack on the oldest supported Kubernetes
  (:func:`open_stack`) for a smoke subset. A containerd version that is not installed is
  skipped with the reason (``RHP_REQUIRE_CONTAINERD`` turns that into a failure, as for the
  integration tests).
- ``ns`` (function): a fresh namespace for one test, deleted (with its pods) afterwards.

The kube binary comes from ``scripts/build-kube.sh`` (``scripts/install-deps.sh`` runs it). When
it is missing the tests skip and say so, unless ``RHP_REQUIRE_KUBE=1`` (``scripts/test.sh`` sets
it), which turns the skip into a failure. Not root: skipped.

Every test under ``tests/e2e/`` gets the ``e2e`` marker and a 600 s timeout (the session's first
test also waits for the cluster, and for any other cluster on this machine to stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from rhp_devenv.containerd import PrivateContainerd, binaries_for, reap_stale_work_dirs
from rhp_devenv.cri import CriClient
from rhp_devenv.kube import KUBE_VERSION, NODE_NAME, Cluster, Pki, TlsPair, free_port, kube_binary

from cri_protos import api_pb2
from scheduler_ext.trust import Signer
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO, ProxyProcess, required_versions
from tests.integration.test_nri_real import NriPluginProcess

E2E_DIR = Path(__file__).parent
CONTAINERD_VERSIONS = ("2.1", "1.7")
PROXY_PLUGINS = ("cpuset", "numa", "batch_resource")
SCHEDULER_CONFIG = REPO / "packaging" / "scheduler" / "kube-scheduler-config.yaml"
SCHEDULER_RBAC = REPO / "packaging" / "scheduler" / "rbac.yaml"
NRT_CRD = REPO / "packaging" / "crds" / "noderesourcetopology.yaml"
EXTENDER_USER = "system:serviceaccount:kube-system:scheduler-ext"


HARNESS_TESTS = "test_e2e_harness.py"
OLDEST_TESTS = "test_e2e_oldest.py"
FIRST_MODULES = (HARNESS_TESTS, OLDEST_TESTS)
"""Modules that start a cluster of their own (with the machine's lock, which a session stack of
this process would hold until the session ends): they run first, before any stack starts."""
SWITCH_TIMEOUT = 180.0  # a kubelet restart to Ready, generous under load
PROXY_START_TIMEOUT = 90.0  # a restarted proxy's socket answering (imports and the store rebuilt, under load)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(600))
    # FIRST_MODULES take the machine's cluster lock themselves, which a session stack of this
    # process would hold until the session ends: they run first, in that order.
    items.sort(key=lambda item: FIRST_MODULES.index(item.path.name) if item.path.name in FIRST_MODULES
               else len(FIRST_MODULES))  # fmt: skip


def _require_kube() -> bool:
    return os.environ.get("RHP_REQUIRE_KUBE", "") not in ("", "0")


@dataclass
class Stack:
    """The running end-to-end stack."""

    cluster: Cluster
    """The one-node cluster (``kubectl``, ``apply``, ``get_json``, ``wait_pod_running``, ...)."""
    ctrd: PrivateContainerd
    """The containerd behind the proxy."""
    proxy: ProxyProcess
    """``runtime-proxy serve`` (its log: ``proxy_log``)."""
    proxy_socket: Path
    proxy_log: Path
    proxy_args: list[str]
    """``runtime-proxy serve``'s arguments but ``--listen`` (for :meth:`restart_proxy`)."""
    proxy_readyz: str
    """The proxy's ``/readyz`` URL (on its ``--metrics-addr``)."""
    extender_health: str
    """``http://127.0.0.1:PORT`` of the extender's plain health port."""
    work: Path
    """The stack's own directory (the proxy's config ``proxy-config.yaml``, node config and log)."""

    def restart_proxy(
        self, *, kill9: bool = False, args: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """Stop ``runtime-proxy serve`` (SIGKILL with *kill9*, else SIGTERM) and start a new one
        on the same socket and log, with the session's arguments (or *args*, e.g. another
        config; the next call without them restores the session's) and *env* added; kubelet
        reconnects by itself."""
        if kill9:
            self.proxy.kill9()
        else:
            self.proxy.terminate()
        argv = list(args) if args is not None else self.proxy_args
        self.proxy = ProxyProcess(argv, env=dict(env or {}), log=self.proxy_log).start(
            str(self.proxy_socket), timeout=PROXY_START_TIMEOUT
        )

    def serve_args(self, config: Path) -> list[str]:
        """``runtime-proxy serve``'s arguments (but ``--listen``) for the proxy config file
        *config*, on the session's containerd, without plugins from entry points."""
        return ["--backend", str(self.ctrd.socket), "--config", str(config), "--no-entry-points"]

    def restart_proxy_with_config(
        self, config: Mapping[str, Any], name: str, *, env: Mapping[str, str] | None = None
    ) -> None:
        """:meth:`restart_proxy` with the proxy config *config*, written to
        ``proxy-config-NAME.yaml`` in the stack's directory, and *env* added."""
        path = self.work / f"proxy-config-{name}.yaml"
        path.write_text(yaml.safe_dump(dict(config)))
        self.restart_proxy(args=self.serve_args(path), env=env)

    def wait_kubelet_ready(self) -> None:
        """kubelet (a restarted one) answers its health check and the node is Ready."""
        cluster = self.cluster
        url = f"http://127.0.0.1:{cluster.ports['kubelet_healthz']}/healthz"

        def healthy() -> bool:
            try:
                return http_get(url)[0] == 200
            except OSError:
                return False

        cluster.wait_for(healthy, what="kubelet /healthz", timeout=SWITCH_TIMEOUT, log="kubelet")

        def ready() -> bool:
            node = cluster.get_json("node", NODE_NAME) or {}
            return any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in node.get("status", {}).get("conditions", []))  # fmt: skip

        cluster.wait_for(ready, what="node Ready", timeout=SWITCH_TIMEOUT, log="kubelet")

    def kubelet_on_containerd(self) -> None:
        """The live node moved to NRI mode as an operator would: kubelet restarts with
        containerd's socket, the proxy stops (start the NRI plugin first)."""
        self.cluster.cri_socket = self.ctrd.socket
        self.cluster.restart_kubelet(rewrite_config=True, timeout=SWITCH_TIMEOUT)
        self.proxy.terminate()
        self.wait_kubelet_ready()

    def kubelet_on_proxy(self) -> None:
        """Back from :meth:`kubelet_on_containerd`: the proxy starts (with the session's
        arguments) and kubelet restarts with the proxy's socket (stop the NRI plugin after)."""
        self.restart_proxy()
        self.cluster.cri_socket = self.proxy_socket
        self.cluster.restart_kubelet(rewrite_config=True, timeout=SWITCH_TIMEOUT)
        self.wait_kubelet_ready()


class NriPlugin(NriPluginProcess):
    """``runtime-proxy nri`` with a deadline for its first Synchronize that suits a loaded machine."""

    def wait_synchronized(self, times: int, timeout: float = 120.0) -> None:
        super().wait_synchronized(times, timeout)


def _proxy_config(work: Path) -> Path:
    node = q.write_node_config(work / "node.json", name=NODE_NAME)
    hook_dir = work / "hookserver.d"
    hook_dir.mkdir(mode=0o755)
    config = {
        "plugins": [{"name": name} for name in PROXY_PLUGINS],
        "nodeConfigFile": str(node),
        "hookServerDir": str(hook_dir),
        "cgroupDriver": "cgroupfs",
    }
    path = work / "proxy-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _scheduler_extender(ext_pki: Pki, ext_ca: TlsPair, port: int) -> dict[str, Any]:
    """packaging/scheduler's extender entry, pointed at 127.0.0.1:PORT with the harness's
    client certificate for kube-scheduler and the extender's CA."""
    base = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = base["extenders"]
    client = ext_pki.issue(ext_ca, "kube-scheduler-ext-client", cn="kube-scheduler")
    extender["urlPrefix"] = f"https://127.0.0.1:{port}"
    extender["tlsConfig"] = {"certFile": str(client.cert), "keyFile": str(client.key), "caFile": str(ext_ca.cert)}
    return dict(extender)


def _start_extender(cluster: Cluster) -> tuple[dict[str, Any], str]:
    """RBAC and CRD from packaging/, the node's NodeResourceTopology, then ``scheduler-ext
    serve`` with the ServiceAccount identity of packaging/scheduler/rbac.yaml; returns the
    kube-scheduler extender entry and the health URL."""
    cluster.apply(SCHEDULER_RBAC.read_text(), NRT_CRD.read_text())
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/noderesourcetopologies.topology.node.k8s.io")  # fmt: skip
    cluster.apply(node_topology())
    ext_pki = Pki(cluster.work_dir / "extender-pki")
    ext_ca = ext_pki.ca("extender-ca")
    serving = ext_pki.issue(ext_ca, "extender-serving", cn="scheduler-ext", ips=("127.0.0.1",), server=True,
                            client=False)  # fmt: skip
    port, health = free_port(), free_port()
    signing_key = signing_key_path(cluster)  # what binds sign their annotations with
    signing_key.write_bytes(Signer.generate().pem())
    signing_key.chmod(0o600)
    kubeconfig = cluster.kubeconfig_for("scheduler-ext", user=EXTENDER_USER, groups=("system:serviceaccounts",))
    cluster.spawn("scheduler-ext", [
        sys.executable, "-m", "scheduler_ext.entry", "serve", f"--listen=127.0.0.1:{port}",
        f"--tls-cert={serving.cert}", f"--tls-key={serving.key}", f"--tls-client-ca={ext_ca.cert}",
        f"--health-listen=127.0.0.1:{health}", f"--kubeconfig={kubeconfig}", f"--signing-key-file={signing_key}",
        "--ledger-namespace=kube-system", "--identity=scheduler-ext-e2e", "--log-format=json",
    ], env={"PYTHONPATH": str(REPO)})  # fmt: skip
    health_url = f"http://127.0.0.1:{health}"

    def ready() -> bool:
        cluster.check_alive("scheduler-ext")  # one that exited says why at once
        try:
            return http_get(f"{health_url}/readyz")[0] == 200
        except OSError:
            return False

    cluster.wait_for(ready, what="scheduler-ext /readyz", timeout=90, log="scheduler-ext")
    return _scheduler_extender(ext_pki, ext_ca, port), health_url


def signing_key_path(cluster: Cluster) -> Path:
    """The extender's ``--signing-key-file`` (a fresh key made when the stack starts)."""
    return cluster.work_dir / "extender-pki" / "signing.key"


def http_get(url: str) -> tuple[int, bytes]:
    """A plain GET on 127.0.0.1 (never through a proxy)."""
    import http.client

    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/" + path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def node_topology() -> dict[str, Any]:
    """The NodeResourceTopology of node 127.0.0.1 as koordlet reports it: this machine's CPU
    topology and kubelet's CPU manager policy ``none``."""
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": NODE_NAME, "annotations": q.node_topology_annotations()},
        "topologyPolicies": ["None"],
        "zones": [],
    }


@pytest.fixture(scope="session", params=CONTAINERD_VERSIONS, ids=[f"containerd-{v}" for v in CONTAINERD_VERSIONS])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The whole end-to-end stack on one containerd version and the newest Kubernetes (see the
    module docstring)."""
    with open_stack(request.param) as opened:
        yield opened


@contextlib.contextmanager
def open_stack(version: str, kube_version: str = KUBE_VERSION) -> Iterator[Stack]:
    """The stack of the ``stack`` fixture on containerd *version* and Kubernetes *kube_version*
    (one of ``rhp_devenv.kube.KUBE_VERSIONS``): skipped (or failed, as ``stack`` is) when a part
    is missing. It takes the machine's cluster lock: open it only while no other stack of this
    process runs (``FIRST_MODULES``)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (kubelet, containerd, cgroups, routes)")
    if kube_binary(kube_version) is None:
        reason = (f"the kube binary of Kubernetes {kube_version} is missing: run scripts/build-kube.sh "
                  "(scripts/install-deps.sh does)")
        if _require_kube():
            pytest.fail(reason + " (RHP_REQUIRE_KUBE is set)")
        pytest.skip(reason)
    missing = binaries_for(version).missing()
    if missing:
        reason = f"containerd {version} is not installed ({missing}); scripts/install-deps.sh installs it"
        if version in required_versions():
            pytest.fail(reason)
        pytest.skip(reason)
    work = Path(tempfile.mkdtemp(prefix="rhp-e2e-", dir="/tmp"))
    reap_stale_work_dirs()
    ctrd = PrivateContainerd(version, nri=True).start()  # no NRI plugin until a test starts one
    proxy: ProxyProcess | None = None
    cluster: Cluster | None = None
    try:
        socket = work / "proxy.sock"
        log = work / "proxy.log"
        metrics = free_port()
        args = ["--backend", str(ctrd.socket), "--config", str(_proxy_config(work)), "--no-entry-points",
                f"--metrics-addr=127.0.0.1:{metrics}"]  # fmt: skip
        proxy = ProxyProcess(args, log=log).start(str(socket), timeout=PROXY_START_TIMEOUT)
        cluster = Cluster(socket, scheduler=False, version=kube_version).start()
        extender, health = _start_extender(cluster)
        cluster.start_scheduler(extenders=[extender])
        stack = Stack(cluster, ctrd, proxy, socket, log, args, f"http://127.0.0.1:{metrics}/readyz", health, work)
        yield stack
        proxy = stack.proxy  # a test may have restarted it
    finally:
        if cluster is not None:
            cluster.stop()
        if proxy is not None:
            proxy.terminate()
        ctrd.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def ns(stack: Stack) -> Iterator[str]:
    """A fresh namespace (with its ``default`` ServiceAccount), deleted with its pods afterwards."""
    with namespace_in(stack) as name:
        yield name


@contextlib.contextmanager
def namespace_in(stack: Stack) -> Iterator[str]:
    """The ``ns`` fixture's namespace in *stack*."""
    name = f"e2e-{secrets.token_hex(3)}"
    stack.cluster.kubectl("create", "namespace", name)
    stack.cluster.wait_for(
        lambda: stack.cluster.get_json("serviceaccount", "default", namespace=name) is not None,
        what=f"ServiceAccount {name}/default",
    )
    try:
        yield name
    finally:
        stack.cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", "--wait=true",
                              "--timeout=120s", check=False)  # fmt: skip
        collect_sandboxes(stack, name)
        stack.cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def sandboxes(stack: Stack, namespace: str, *, direct: bool = True) -> list[api_pb2.PodSandbox]:
    """The runtime's pod sandboxes of *namespace*'s pods (asked of containerd, or of the proxy)."""
    with CriClient(stack.ctrd.socket if direct else stack.proxy_socket) as cri:
        return cri.list_pod_sandboxes(labels={"io.kubernetes.pod.namespace": namespace})


def collect_sandboxes(stack: Stack, namespace: str, timeout: float = 60.0) -> None:
    """Do kubelet's garbage collection of deleted pods early: wait until kubelet stopped every
    sandbox of *namespace*, then remove them through the proxy, as kubelet's collector would
    (it runs once a minute). Until then the proxy counts a stopped sandbox's bound CPUs as held,
    and the next test's LSR pod would not get them (``test_e2e_pods.py`` shows it). While kubelet
    talks to containerd itself (NRI mode: no proxy runs), through containerd. A call the server
    does not take yet (a proxy just restarted, on a loaded machine) is tried again until the
    deadline."""
    deadline = time.monotonic() + timeout
    on_proxy = stack.cluster.cri_socket == stack.proxy_socket
    with CriClient(stack.proxy_socket if on_proxy else stack.ctrd.socket) as cri:

        def sandboxes() -> list[Any]:
            while True:
                try:
                    return list(cri.list_pod_sandboxes(labels={"io.kubernetes.pod.namespace": namespace}))
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or \
                            time.monotonic() > deadline:  # fmt: skip
                        raise
                    time.sleep(0.5)

        while boxes := sandboxes():
            for box in boxes:
                if box.state == api_pb2.SANDBOX_NOTREADY:
                    with contextlib.suppress(grpc.RpcError):
                        cri.remove_pod_sandbox(box.id)
            assert time.monotonic() < deadline, f"sandboxes of {namespace} still there: {[b.id for b in boxes]}"
            time.sleep(0.2)


def pod_manifest(
    name: str,
    namespace: str,
    *,
    qos: str | None = None,
    annotations: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    node_name: str | None = None,
    command: tuple[str, ...] = ("sleep", "3600"),
) -> dict[str, Any]:
    """A host-network busybox pod (the private containerd's image, never pulled)."""
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "app",
            "image": "localhost/rhp-busybox:1",
            "imagePullPolicy": "Never",
            "command": list(command),
            "resources": resources,
        }],
    }  # fmt: skip
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {q.LABEL_QOS: qos} if qos else {},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def container_id(pod: Mapping[str, Any], name: str = "app") -> str:
    """The container's ID from the pod's status (``containerd://<id>``)."""
    for status in pod["status"]["containerStatuses"]:
        if status["name"] == name:
            return str(status["containerID"]).split("://", 1)[1]
    raise AssertionError(f"no container {name} in {json.dumps(pod['status'])[:500]}")


def pod_cgroup(pod: Mapping[str, Any]) -> str:
    """kubelet's pod cgroup (cgroupfs driver, cgroup root ``/``) from its QoS class and UID."""
    from rhp_devenv.cgroupfs import pod_cgroup_parent

    return pod_cgroup_parent("/", pod["status"]["qosClass"], pod["metadata"]["uid"])


def wait_deleted(cluster: Cluster, kind: str, name: str, namespace: str, timeout: float = 60.0) -> None:
    """Wait until the object is gone from the API."""
    deadline = time.monotonic() + timeout
    while cluster.get_json(kind, name, namespace=namespace) is not None:
        assert time.monotonic() < deadline, f"{kind} {namespace}/{name} still exists after {timeout} s"
        time.sleep(0.2)

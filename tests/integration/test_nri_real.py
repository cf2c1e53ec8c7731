"""``runtime-proxy nri`` against real containerd 2.1 and 1.7 with NRI on a private socket.

Pods are created directly against containerd (no proxy in the CRI path); the plugin runs as a
child process with the built-in plugins and changes them through NRI and the applier. Each
test checks the real cgroup files. Everything is private: the NRI socket lives in the private
containerd's work dir, pods use the session's own top cgroup, the plugin is stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.cgroupfs import remove_cgroup_tree
from rhp_devenv.containerd import PrivateContainerd, binaries_for
from rhp_devenv.cri import SLEEP_COMMAND, linux_resources
from rhp_devenv.env import ContainerdEnv

from cri_protos import api_pb2
from hooks.facts import format_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO, required_versions

VERSIONS = ("2.1", "1.7")
MiB = 1 << 20
TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus))  # the bound CPU; the rest is the LS share pool
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)})


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"containerd-{v}-nri" for v in VERSIONS])
def nri_env(request: pytest.FixtureRequest) -> Iterator[ContainerdEnv]:
    """A private containerd with NRI enabled on ``work_dir/nri/nri.sock`` (never /var/run/nri)."""
    version: str = request.param
    if os.geteuid() != 0:
        pytest.skip("needs root to run containerd")
    missing = binaries_for(version).missing()
    if missing:
        reason = f"containerd {version} is not installed ({', '.join(map(str, missing))} missing)"
        if version in required_versions():
            pytest.fail(reason)
        pytest.skip(reason)
    ctrd = PrivateContainerd(version, nri=True).start()
    top = f"/rhptest-nri-{os.getpid()}-{version.replace('.', '')}"
    ctrd.track_cgroup_parent(top)
    env = ContainerdEnv(ctrd=ctrd, cgroup_top=top)
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def containerd(nri_env: ContainerdEnv) -> Iterator[ContainerdEnv]:
    nri_env.begin_round()
    try:
        yield nri_env
    finally:
        nri_env.end_round()


class NriPluginProcess:
    """``runtime-proxy nri`` as a child process, stopped by its PID."""

    def __init__(self, socket: Path, tmp_path: Path, *extra: str, python: str = sys.executable) -> None:
        self.socket = socket
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.log = tmp_path / "nri-plugin.log"
        hooks = tmp_path / "hookserver.d"
        hooks.mkdir(exist_ok=True)
        self.args = [
            python, "-m", "runtime_proxy.cli", "--log-format", "json", "--log-level", "info", "nri",
            "--nri-socket", str(socket), "--plugin-name", "rhp-test", "--plugin-idx", "10",
            "--no-entry-points", "--hook-server-dir", str(hooks), *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NriPluginProcess:
        out = open(self.log, "ab")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
        self.proc = subprocess.Popen(self.args, env=env, stdout=out, stderr=out)
        out.close()
        try:
            self.wait_synchronized(1)
        except BaseException:
            self.stop()  # never leave a plugin that did not come up running
            raise
        return self

    def events(self, name: str) -> int:
        count = 0
        for line in self.log.read_text().splitlines():
            try:
                if json.loads(line).get("event") == name:
                    count += 1
            except ValueError:
                continue
        return count

    def wait_synchronized(self, times: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.events("NRI synchronized") < times:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"plugin exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"plugin not synchronized {times}x:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def nri_plugin(containerd: ContainerdEnv, tmp_path: Path) -> Iterator[NriPluginProcess]:
    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path).start()
    try:
        yield plugin
    finally:
        plugin.stop()


def _lsr_pod(containerd: ContainerdEnv, cpu: str, command: tuple[str, ...] = SLEEP_COMMAND) -> tuple[str, Any, str]:
    client = containerd.cri_client()
    parent = containerd.new_cgroup_parent("burstable")
    pod = client.run_pod(cgroup_parent=parent, labels={q.LABEL_QOS: "LSR"},
                         annotations={q.RESOURCE_STATUS: q.resource_status(cpuset=cpu)})
    cid = client.run_container(pod, command=command,
                               resources=linux_resources(cpu_shares=1024, cpu_quota=50_000, cpuset_cpus="0"))
    return parent, pod, cid


def _a_cpu() -> str:
    """The highest online CPU (so the bound value differs from kubelet's "0")."""
    return str(max(os.sched_getaffinity(0)))


def test_lsr_pod_gets_its_cpuset_and_unlimited_quota(containerd: ContainerdEnv, nri_plugin: NriPluginProcess) -> None:
    cpu = _a_cpu()
    parent, _, cid = _lsr_pod(containerd, cpu)
    assert q.read_container_file(parent, cid, "cpuset.cpus") == cpu
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"
    assert q.read_container_file(parent, cid, "cpu.shares") == "1024"
    assert q.read_pod_file(parent, "cpu.cfs_quota_us") == "-1"


def test_be_pod_gets_batch_values(containerd: ContainerdEnv, nri_plugin: NriPluginProcess) -> None:
    client = containerd.cri_client()
    parent = containerd.new_cgroup_parent("besteffort")
    q.kubelet_pod_cgroup(parent, {"cpu.shares": 2})
    spec = q.extended_resource_spec({
        "be-app": {
            "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"},
            "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "256Mi"},
        }
    })
    pod = client.run_pod(cgroup_parent=parent, labels={q.LABEL_QOS: "BE"},
                         annotations={q.EXTENDED_RESOURCE_SPEC: spec})
    cid = client.run_container(pod, name="be-app", resources=linux_resources(cpu_shares=2))
    expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "100000", "memory.limit_in_bytes": str(256 * MiB)}
    assert {f: q.read_container_file(parent, cid, f) for f in expect} == expect
    assert {f: q.read_pod_file(parent, f) for f in expect} == expect


def test_update_is_rewritten_for_the_same_container(containerd: ContainerdEnv,
                                                     nri_plugin: NriPluginProcess) -> None:
    cpu = _a_cpu()
    parent, _, cid = _lsr_pod(containerd, cpu)
    # kubelet resizes the container with a quota and a cpuset; the plugin keeps the bound values.
    containerd.cri_client().update_container_resources(
        cid, linux_resources(cpu_shares=2048, cpu_quota=80_000, cpuset_cpus="0"))
    assert q.read_container_file(parent, cid, "cpu.shares") == "2048"
    assert q.read_container_file(parent, cid, "cpuset.cpus") == cpu
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"


def test_pods_keep_starting_after_the_plugin_is_killed(containerd: ContainerdEnv,
                                                        nri_plugin: NriPluginProcess) -> None:
    nri_plugin.kill9()
    parent, _, cid = _lsr_pod(containerd, _a_cpu())
    # Nobody changed the request: kubelet's values are what runc wrote.
    assert q.read_container_file(parent, cid, "cpuset.cpus") == "0"
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "50000"


def test_plugin_reconnects_after_containerd_restarts(containerd: ContainerdEnv,
                                                      nri_plugin: NriPluginProcess) -> None:
    containerd.ctrd.restart_daemon()
    nri_plugin.wait_synchronized(2)
    cpu = _a_cpu()
    parent, _, cid = _lsr_pod(containerd, cpu)
    assert q.read_container_file(parent, cid, "cpuset.cpus") == cpu
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"
    assert nri_plugin.events("NRI plugin registered") == 2


def test_synchronize_after_a_plugin_restart_repairs_a_value_changed_by_hand(
    containerd: ContainerdEnv, nri_plugin: NriPluginProcess, tmp_path: Path
) -> None:
    cpu = _a_cpu()
    parent, _, cid = _lsr_pod(containerd, cpu)
    nri_plugin.kill9()
    cpuset = q.pod_dir(parent, "cpuset.cpus") / cid / "cpuset.cpus"
    cpuset.write_text("0\n")
    assert q.read_container_file(parent, cid, "cpuset.cpus") == "0"
    restarted = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "again")
    try:
        restarted.start()
        q.wait_for(lambda: q.read_container_file(parent, cid, "cpuset.cpus"), cpu,
                   what="cpuset repaired by the Synchronize reply", timeout=10.0)
    finally:
        restarted.stop()


def test_a_sandbox_stopped_while_the_plugin_was_down_is_not_planned_and_holds_no_cpus(
    containerd: ContainerdEnv, nri_plugin: NriPluginProcess, tmp_path: Path
) -> None:
    """Pods deleted while the plugin is down leave NotReady sandboxes that containerd keeps
    (and lists at Synchronize, with no pid) until kubelet's garbage collection removes them:
    the restarted plugin plans none of them (no "applying plan failed" for their gone cgroups)
    and their CPUs are free for a new LSR pod."""
    cpu = _a_cpu()
    client = containerd.cri_client()
    # A pod that keeps running: the runtime reports its sandbox's pid (what the plugin reads a
    # stopped sandbox by needs one; a node with stopped sandboxes only keeps the old behaviour).
    client.run_container(client.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"),
                                        labels={q.LABEL_QOS: "LS"}), name="ls-app")
    parent, pod, cid = _lsr_pod(containerd, cpu)
    nri_plugin.kill9()
    client.stop_container(cid)
    client.stop_pod_sandbox(pod.pod_id)
    remove_cgroup_tree(parent)  # kubelet removes a stopped pod's cgroup
    restarted = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "again")
    try:
        restarted.start()
        new_parent, _, new_cid = _lsr_pod(containerd, cpu)
        assert q.read_container_file(new_parent, new_cid, "cpuset.cpus") == cpu
        assert restarted.events("applying plan failed") == 0, restarted.log.read_text()[-3000:]
    finally:
        restarted.stop()


def test_pods_keep_starting_while_the_plugin_hangs(containerd: ContainerdEnv, nri_plugin: NriPluginProcess) -> None:
    assert nri_plugin.proc is not None
    os.kill(nri_plugin.proc.pid, signal.SIGSTOP)
    try:
        # containerd waits its request timeout (2 s) for the stopped plugin, drops it, and goes on.
        parent, unhooked, cid = _lsr_pod(containerd, _a_cpu())
        assert q.read_container_file(parent, cid, "cpuset.cpus") == "0"
    finally:
        os.kill(nri_plugin.proc.pid, signal.SIGCONT)
    # Woken up, the plugin finds its session closed, dials again and hooks the next pod. (The
    # unhooked pod goes first: as the older pod it would keep the CPU both claim.)
    nri_plugin.wait_synchronized(2)
    containerd.cri_client().remove_pod(unhooked)
    cpu = _a_cpu()
    parent, _, cid = _lsr_pod(containerd, cpu)
    assert q.read_container_file(parent, cid, "cpuset.cpus") == cpu


def test_a_value_changed_by_hand_on_a_quiet_node_is_repaired_through_the_runtimes_cri(
    containerd: ContainerdEnv, tmp_path: Path
) -> None:
    """The reconciler finds an LSR container's cpuset changed by hand; no container event comes
    whose NRI reply could carry the repair, so after ``CARRY_WAIT`` it goes through containerd's
    CRI UpdateContainerResources (``--backend``), which containerd passes through the plugin's
    UpdateContainer. Before, the repair waited for a reply for ever: the same wait left an LSR
    container in the v2 guest on the whole machine after containerd had dropped the plugin for
    being slow (docs/v2-node.md)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"reconcilePeriodSeconds": 1.0}))
    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "plugin", "--config", str(config),
                              "--backend", str(containerd.ctrd.socket)).start()
    try:
        cpu = _a_cpu()
        parent, _, cid = _lsr_pod(containerd, cpu)
        assert q.read_container_file(parent, cid, "cpuset.cpus") == cpu
        (q.pod_dir(parent, "cpuset.cpus") / cid / "cpuset.cpus").write_text("0\n")
        q.wait_for(lambda: q.read_container_file(parent, cid, "cpuset.cpus"), cpu,
                   what="cpuset repaired with no container event", timeout=60.0)
        q.wait_for(lambda: plugin.events("container update no NRI reply carried sent by CRI UpdateContainerResources")
                   >= 1, True, what="the plugin's log of the update it sent by CRI", timeout=60.0)
    finally:
        plugin.stop()


@pytest.mark.parametrize("leaves", [
    pytest.param("container first", id="kubelet stops the LSR container, then stops and removes its pod"),
    pytest.param("with the pod", id="the LSR pod is stopped and removed with its container still running"),
    pytest.param("by exiting", id="the LSR container exits on its own, then its pod is stopped and removed"),
])
def test_ls_pod_gets_the_share_pool_and_follows_it_when_an_lsr_pod_arrives_and_leaves(
    containerd: ContainerdEnv, tmp_path: Path, leaves: str
) -> None:
    """The running LS container shrinks off the LSR pod's CPU with the LSR container's own
    CreateContainer reply, and grows back with the StopContainer call of the LSR pod's last
    container (containerd sends it for kubelet's StopContainer, for a container still running at
    StopPodSandbox, and when a container exits on its own), with no other pod or event on the
    node; containerd itself reports the new cpuset each time. No unsolicited UpdateContainers:
    on these containerd versions it can deadlock containerd (see
    ``runtime_proxy/nri/backend.py``)."""
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {ALL_CPUS} on {TOPO.numa_nodes}")
    node_file = q.write_node_config(tmp_path / "node.json")
    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "plugin", "--node-config", str(node_file))
    plugin.start()
    try:
        client = containerd.cri_client()

        def run_ls() -> tuple[str, str]:
            parent = containerd.new_cgroup_parent("burstable")
            pod = client.run_pod(cgroup_parent=parent, labels={q.LABEL_QOS: "LS"})
            return parent, client.run_container(pod, name="ls-app",
                                                resources=linux_resources(cpu_shares=512, cpu_quota=100_000))

        ls_parent, ls_cid = run_ls()

        def ls_cpus() -> str:
            return q.read_container_file(ls_parent, ls_cid, "cpuset.cpus")

        def reported() -> str:
            return str(client.container_status(ls_cid).resources.linux.cpuset_cpus)

        assert ls_cpus() == ALL_CPUS
        # Long enough to be seen running; the checks below need well under a second.
        command = ("sleep", "3") if leaves == "by exiting" else SLEEP_COMMAND
        lsr_parent, lsr, lsr_cid = _lsr_pod(containerd, LSR_CPU, command)
        assert q.read_container_file(lsr_parent, lsr_cid, "cpuset.cpus") == LSR_CPU
        q.wait_for(ls_cpus, LS_POOL_WITH_LSR, what="LS cpuset after the LSR pod arrived", timeout=5.0)
        q.wait_for(reported, LS_POOL_WITH_LSR, what="containerd's record of the LS cpuset", timeout=5.0)
        assert q.read_container_file(ls_parent, ls_cid, "cpu.cfs_quota_us") == "100000"
        if leaves == "container first":
            client.stop_container(lsr_cid)
            q.wait_for(ls_cpus, ALL_CPUS, what="LS cpuset after the LSR container stopped", timeout=5.0)
        elif leaves == "by exiting":
            q.wait_for(ls_cpus, ALL_CPUS, what="LS cpuset after the LSR container exited", timeout=10.0)
            q.wait_for(lambda: client.container_status(lsr_cid).state, api_pb2.CONTAINER_EXITED,
                       what="the LSR container's state", timeout=5.0)
        client.remove_pod(lsr)
        q.wait_for(ls_cpus, ALL_CPUS, what="LS cpuset after the LSR pod left", timeout=5.0)
        q.wait_for(reported, ALL_CPUS, what="containerd's record of the LS cpuset", timeout=5.0)
        assert plugin.proc is not None and plugin.proc.poll() is None
    finally:
        plugin.stop()


def test_env_from_the_gpu_plugin_arrives_in_the_container(containerd: ContainerdEnv,
                                                          nri_plugin: NriPluginProcess) -> None:
    """A pod whose ``device-allocated`` annotation names GPU minors 1 and 3: the container's
    process sees ``NVIDIA_VISIBLE_DEVICES=1,3`` (read from its /proc/1/environ by ExecSync)."""
    client = containerd.cri_client()
    allocated = json.dumps({"gpu": [{"minor": 1, "resources": {}}, {"minor": 3, "resources": {}}]})
    pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"), labels={q.LABEL_QOS: "LS"},
                         annotations={"scheduling.koordinator.sh/device-allocated": allocated})
    cid = client.run_container(pod, name="cuda")
    out = client.runtime.ExecSync(
        api_pb2.ExecSyncRequest(container_id=cid, cmd=["cat", "/proc/1/environ"], timeout=10), timeout=20)
    assert out.exit_code == 0, out.stderr
    env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "1,3"


def test_a_synchronize_larger_than_one_message_is_answered(
    containerd: ContainerdEnv, tmp_path: Path
) -> None:
    """Ten pods and their containers, each with a 250 KiB annotation (about Kubernetes' cap for
    a pod), make the runtime's state over the 4 MiB message bound: containerd 2.1 sends it in
    several Synchronize messages with ``more``, containerd 1.7 in one message of about 5 MiB;
    the plugin takes either and then serves the next pod."""
    client = containerd.cri_client()
    big = "x" * (250 << 10)
    for i in range(10):
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"), labels={q.LABEL_QOS: "LS"},
                             annotations={"example.com/big": big})
        client.run_container(pod, name=f"big-{i}", annotations={"example.com/big": big}, start=False)
    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "plugin").start()
    try:
        [synced] = [json.loads(line) for line in plugin.log.read_text().splitlines()
                    if '"NRI synchronized"' in line]
        assert synced["pods"] >= 10 and synced["containers"] >= 10
        if containerd.ctrd.version == "1.7":
            assert synced["messages"] == 1, synced
        else:
            assert synced["messages"] > 1, synced
        parent, _, cid = _lsr_pod(containerd, LSR_CPU)
        assert q.read_container_file(parent, cid, "cpuset.cpus") == LSR_CPU
    finally:
        plugin.stop()


def test_readyz_follows_registration_and_the_runtime(containerd: ContainerdEnv, tmp_path: Path) -> None:
    import socket as socket_module
    import urllib.error
    import urllib.request

    with socket_module.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def status() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path, "--metrics-addr", f"127.0.0.1:{port}").start()
    try:
        q.wait_for(status, 200, what="/readyz once synchronized", timeout=10.0)
        containerd.ctrd.kill_daemon()
        q.wait_for(status, 503, what="/readyz while containerd is down", timeout=10.0)
        containerd.ctrd.restart_daemon()
        plugin.wait_synchronized(2)
        q.wait_for(status, 200, what="/readyz when containerd is back", timeout=10.0)
    finally:
        plugin.stop()


def test_usage_loop_evictions_by_the_runtime_stop_the_victims_containers(
    containerd: ContainerdEnv, tmp_path: Path
) -> None:
    """``usageLoop.evictBy: runtime`` in NRI mode: the plugin learns the pods from NRI, samples
    their memory, and stops the ``memory_evict`` victim's containers through the runtime's CRI
    socket (``--backend``); node memory comes from a prepared ``/proc/meminfo``."""
    from tests.integration.test_eviction_real import SLO, TOTAL, fill_command, write_meminfo

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(Path("/proc/stat").read_text())
    write_meminfo(proc, 0)
    node_file = tmp_path / "node.json"
    node_file.write_text(json.dumps({"name": "rhp-nri-node",
                                     "nodeResourceTopology": {"annotations": q.node_topology_annotations()},
                                     "nodeSLO": SLO}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "plugins": [{"name": "memory_evict"}],
        "nodeConfigFile": str(node_file),
        "reconcilePeriodSeconds": 60.0,
        "usageLoop": {"enable": True, "intervalSeconds": 0.5, "procRoot": str(proc), "evictBy": "runtime"},
    }))
    import socket as socket_module
    import urllib.request

    with socket_module.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "plugin", "--config", str(config),
                              "--backend", str(containerd.ctrd.socket), "--metrics-addr", f"127.0.0.1:{port}")
    plugin.start()
    try:
        client = containerd.cri_client()
        fills = {"be-big": 48, "be-small": 8}
        pods: dict[str, tuple[str, str]] = {}
        for name, mib in fills.items():
            parent = containerd.new_cgroup_parent("besteffort")
            pod = client.run_pod(cgroup_parent=parent, name=name, labels={q.LABEL_QOS: "BE"})
            pods[name] = (parent, client.run_container(pod, name="fill", command=fill_command(mib)))

        def sampled() -> bool:
            """Whether the usage loop's last sample has each pod holding its fill."""
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            seen = {name: 0.0 for name in fills}
            for line in text.splitlines():
                if line.startswith("rhp_pod_memory_usage_bytes{"):
                    for name in fills:
                        if f'pod="{name}"' in line:
                            seen[name] = float(line.rsplit(" ", 1)[1])
            return all(seen[name] >= mib * MiB * 0.95 for name, mib in fills.items())

        q.wait_for(sampled, True, what="the usage loop sees each BE pod's memory", timeout=20.0)
        # 72% used with the threshold at 70% (down to 68%): 4% of 512 MiB is freed by be-big alone.
        write_meminfo(proc, TOTAL * 72 // 100)

        def state(name: str) -> int:
            return int(client.container_status(pods[name][1]).state)

        q.wait_for(lambda: state("be-big"), int(api_pb2.CONTAINER_EXITED), what="be-big stopped", timeout=20.0)
        write_meminfo(proc, 0)
        # The plugin logs the eviction once the runtime answered the stop, which can be just
        # after the container shows as exited.
        evicted = "pod evicted by stopping its containers"
        q.wait_for(lambda: plugin.events(evicted), 1, what="the eviction logged", timeout=10.0)
        assert state("be-small") == api_pb2.CONTAINER_RUNNING
        assert plugin.events(evicted) == 1
    finally:
        plugin.stop()

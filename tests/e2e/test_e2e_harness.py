"""The cluster harness itself (``rhp_devenv.kube``), without starting a cluster: what it renders,
the certificates it makes, and the clean-up after a run that died without stopping."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from rhp_devenv import kube

# the machine-touching tests here take the cluster lock: they may wait for a running cluster
pytestmark = pytest.mark.timeout(1900)


def test_kubelet_config_listens_on_loopback_and_never_collects_or_evicts(tmp_path: Path) -> None:
    pair = kube.TlsPair(tmp_path / "s.crt", tmp_path / "s.key")
    config = kube.kubelet_config(cri_socket=Path("/run/x.sock"), port=1, healthz_port=2, client_ca=tmp_path / "ca",
                                 serving=pair, pod_logs_dir=tmp_path / "logs",
                                 extra={"featureGates": {"EventedPLEG": True}})  # fmt: skip
    assert (config["address"], config["healthzBindAddress"], config["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert config["containerRuntimeEndpoint"] == "unix:///run/x.sock"
    assert (config["cgroupDriver"], config["cgroupRoot"], config["failCgroupV1"]) == ("cgroupfs", "/", False)
    assert (config["imageGCHighThresholdPercent"], config["imageGCLowThresholdPercent"]) == (100, 99)
    assert all(v in ("1Mi", "1%") for v in config["evictionHard"].values())
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["featureGates"] == {"EventedPLEG": True}
    other = kube.kubelet_config(cri_socket=Path("/run/x.sock"), port=1, healthz_port=2, client_ca=tmp_path / "ca",
                                serving=pair, pod_logs_dir=tmp_path / "logs", cgroup_root="/rhp-other")  # fmt: skip
    assert other["cgroupRoot"] == "/rhp-other"


def test_kubelet_config_allows_cgroup_v1_only_on_a_v1_node(tmp_path: Path) -> None:
    """kubelet 1.35 and later refuse to start on cgroup v1 unless ``failCgroupV1`` is false: the
    harness sets it on this v1 machine and leaves kubelet's default on a v2 node."""
    pair = kube.TlsPair(tmp_path / "s.crt", tmp_path / "s.key")
    common = {"cri_socket": Path("/run/x.sock"), "port": 1, "healthz_port": 2, "client_ca": tmp_path / "ca",
              "serving": pair, "pod_logs_dir": tmp_path / "logs"}  # fmt: skip
    assert kube.kubelet_config(**common)["failCgroupV1"] is False
    assert "failCgroupV1" not in kube.kubelet_config(**common, cgroup_v1=False)


def test_each_supported_version_has_its_own_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """scripts/build-kube.sh puts each version's binary under <prefix>/<version>/; the newest
    is the default, the oldest supported is v1.34.4, and a version it does not build is refused."""
    assert kube.KUBE_VERSIONS == (kube.NEWEST_KUBE_VERSION, kube.OLDEST_KUBE_VERSION) == ("v1.37.2", "v1.34.4")
    assert kube.KUBE_VERSION == kube.NEWEST_KUBE_VERSION
    monkeypatch.delenv("RHP_KUBE_BINARY", raising=False)
    for version in kube.KUBE_VERSIONS:
        (tmp_path / version).mkdir()
        (tmp_path / version / "kube").write_text("#!/bin/sh\n")
        (tmp_path / version / "kube").chmod(0o755)
    assert kube.kube_binary(prefix=tmp_path) == tmp_path / "v1.37.2" / "kube"
    assert kube.kube_binary(kube.OLDEST_KUBE_VERSION, tmp_path) == tmp_path / "v1.34.4" / "kube"
    with pytest.raises(ValueError, match="not built here"):
        kube.kube_binary("v1.33.0", tmp_path)
    scripts = (Path(__file__).parents[2] / "scripts" / "build-kube.sh").read_text()
    assert all(f"{name}={version}" in scripts for name, version in
               (("NEWEST", kube.NEWEST_KUBE_VERSION), ("OLDEST", kube.OLDEST_KUBE_VERSION)))  # fmt: skip


@pytest.mark.parametrize("root", ["/a/../b", "/kubelet.slice"])
def test_a_cgroup_root_leaving_the_hierarchy_is_refused(root: str) -> None:
    if kube.kube_binary() is None:
        pytest.skip("no kube binary (the constructor needs one)")
    with pytest.raises(ValueError):
        kube.Cluster("/x.sock", cgroup_root=root)


def test_scheduler_config_keeps_the_base_and_replaces_the_extenders(tmp_path: Path) -> None:
    base = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "extenders": [{"urlPrefix": "https://elsewhere"}], "percentageOfNodesToScore": 50}  # fmt: skip
    config = kube.scheduler_config(kubeconfig_path=tmp_path / "k", base=base, extenders=[{"urlPrefix": "x"}])
    assert config["extenders"] == [{"urlPrefix": "x"}]
    assert config["percentageOfNodesToScore"] == 50
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["clientConnection"] == {"kubeconfig": str(tmp_path / "k")}
    assert base["extenders"] == [{"urlPrefix": "https://elsewhere"}]  # the base is not changed


def test_scheduler_config_keeps_the_bases_client_settings_with_this_clusters_kubeconfig(tmp_path: Path) -> None:
    base = {"clientConnection": {"qps": 5000, "burst": 5000, "kubeconfig": "/elsewhere"}}
    config = kube.scheduler_config(kubeconfig_path=tmp_path / "k", base=base)
    assert config["clientConnection"] == {"qps": 5000, "burst": 5000, "kubeconfig": str(tmp_path / "k")}


def test_certificates_carry_the_identity_and_the_addresses(tmp_path: Path) -> None:
    pki = kube.Pki(tmp_path)
    ca = pki.ca("ca")
    pair = pki.issue(ca, "node", cn="system:node:127.0.0.1", orgs=("system:nodes",), ips=("127.0.0.1",),
                     dns=("localhost",), server=True)  # fmt: skip
    text = subprocess.run(["openssl", "x509", "-in", str(pair.cert), "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert "O = system:nodes, CN = system:node:127.0.0.1" in text
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(ca.cert), str(pair.cert)], capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert verify.returncode == 0, verify.stderr
    config = kube.kubeconfig("https://127.0.0.1:1", ca.cert, pair, "u")
    assert config["users"][0]["user"] == {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


def _blackhole_routes() -> str:
    return subprocess.run(["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


@pytest.mark.requires_root
def test_a_crashed_runs_processes_route_and_files_are_undone_at_the_next_start(tmp_path: Path) -> None:
    """What a run that died left behind (recorded in its state file) is undone when the next
    cluster takes the machine's lock: its processes (by PID and start time), the blackhole route,
    kubelet's sysctl changes, the cgroup root it made (with what is below it) and the work
    directory. A PID now used by another process is spared."""
    if kube.kube_binary() is None:
        pytest.skip("no kube binary (the constructor needs one)")
    cluster = kube.Cluster("/nonexistent.sock", lock_timeout=1800)
    cluster._take_lock()
    try:
        leftover = subprocess.Popen(["sleep", "600"], start_new_session=True)
        bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
        work = Path(os.environ.get("TMPDIR", "/tmp")) / f"rhp-kube-crashtest-{os.getpid()}"
        work.mkdir()
        subprocess.run(["ip", "route", "replace", "blackhole", kube.SERVICE_CIDR], check=True)
        tunable = "kernel/panic"
        root = f"/rhp-crashtest-root-{os.getpid()}"
        kube._make_cgroup_root(f"{root}/kubepods")
        assert kube._cgroup_root_exists(root)
        current = (Path("/proc/sys") / tunable).read_text().strip()
        state = {
            "owner": 1,
            "work_dir": str(work),
            "pids": [[leftover.pid, kube._proc_start_time(leftover.pid)], [bystander.pid, "1"]],
            "tunables": {tunable: current},
            "iptables": [],
            "kubepods_created": False,
            "cgroup_roots": [root],
        }
        kube._STATE_PATH.write_text(json.dumps(state))
        assert kube.SERVICE_CIDR.split("/")[0] in _blackhole_routes()
        cluster._recover_crashed_run()
        assert kube._proc_start_time(leftover.pid) is None  # killed (and reaped: it was our child)
        assert bystander.poll() is None  # its recorded start time does not match: not ours
        assert kube.SERVICE_CIDR.split("/")[0] not in _blackhole_routes()
        assert not work.exists()
        assert not kube._cgroup_root_exists(root)
        assert not kube._STATE_PATH.exists()
        assert (Path("/proc/sys") / tunable).read_text().strip() == current
    finally:
        for proc in (leftover, bystander):
            proc.kill()
            proc.wait()
        cluster.stop()  # releases the lock (nothing else was started)


def test_the_cluster_refuses_to_start_without_the_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RHP_KUBE_BINARY", str(tmp_path / "missing"))
    with pytest.raises(kube.KubeError, match=r"build-kube\.sh"):
        kube.Cluster("/x.sock")


@pytest.mark.requires_root
def test_a_process_holding_the_cluster_lock_never_waits_for_itself() -> None:
    """flock conflicts between two open files of one process: a second take in the process that
    holds the lock answers at once, and a cluster refuses to start instead of waiting for the
    lock until its timeout (a session stack and a harness test once did, for 30 minutes)."""
    lock = kube.take_kubepods_lock(0)
    if lock is None:
        pytest.skip("another process runs a cluster on this machine")
    try:
        assert kube.held_in_this_process()
        started = time.monotonic()
        assert kube.take_kubepods_lock(30) is None
        assert time.monotonic() - started < 25, "it waited for its own lock"
        if kube.kube_binary() is not None:
            with pytest.raises(kube.KubeError, match="already holds"):
                kube.Cluster("/x.sock", lock_timeout=30)._take_lock()
    finally:
        lock.close()
    assert not kube.held_in_this_process()


def test_stop_releases_the_lock_of_a_cluster_that_never_started(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """A cluster that took the machine's lock but never started lets it go on stop (it once kept
    it, and the next cluster of the same process waited for its own lock). On a lock file of
    the test's own, so no other cluster of the machine is involved."""
    monkeypatch.setattr(kube, "_LOCK_PATH", tmp_path / "cluster.lock")
    monkeypatch.setenv("RHP_KUBE_BINARY", "/bin/true")
    cluster = kube.Cluster("/nonexistent.sock", lock_timeout=0)
    cluster._take_lock()
    assert kube.held_in_this_process()
    cluster.stop()
    assert not kube.held_in_this_process()

"""The development environment itself, straight against containerd (no proxy).

One pass of the pod and container lifecycle per containerd version, with the CPU settings our
plugins care about read back from the host cgroup files, plus GetContainerEvents behaviour
(UNIMPLEMENTED on 1.6). The pure helpers at the end need neither root nor containerd.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
from rhp_devenv import cgroupfs
from rhp_devenv.containerd import binaries_for, clean_up_work_dir, reap_stale_work_dirs, render_config
from rhp_devenv.cri import BURN_CPU_COMMAND, CriClient, linux_resources
from rhp_devenv.env import ContainerdEnv
from rhp_devenv.image import DEFAULT_IMAGE, build_image_archive

from cri_protos import api_pb2
from tests.integration.harness import required_versions

HOST_CPUS = Path("/sys/fs/cgroup/cpuset/cpuset.cpus")


def _cpu(parent: str, cid: str, name: str) -> str:
    return cgroupfs.read_cgroup_file(parent, cid, "cpu", name)


def test_runtime_answers_version_and_is_ready(containerd: ContainerdEnv, cri: CriClient) -> None:
    version = cri.version()
    assert version.runtime_name == "containerd"
    assert version.runtime_version.startswith(containerd.version + ".")
    conditions = {c.type: c.status for c in cri.status().status.conditions}
    assert conditions["RuntimeReady"] and conditions["NetworkReady"], conditions


def test_image_is_known_to_cri(cri: CriClient) -> None:
    response = cri.images.ImageStatus(api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=DEFAULT_IMAGE)))
    assert DEFAULT_IMAGE in response.image.repo_tags


def test_lifecycle_with_cpu_resources_read_back_from_cgroupfs(cri: CriClient, cgroup_parent: str) -> None:
    pod = cri.run_pod(cgroup_parent=cgroup_parent, labels={"app": "devenv"})
    assert cri.pod_sandbox_status(pod.pod_id).status.state == api_pb2.SANDBOX_READY
    assert (cgroupfs.container_cgroup_dir(cgroup_parent, pod.pod_id, "cpu")).is_dir()

    cid = cri.run_container(pod, resources=linux_resources(cpuset_cpus="0", cpu_shares=512, cpu_quota=50000))
    assert cgroupfs.read_cgroup_file(cgroup_parent, cid, "cpuset", "cpuset.cpus") == "0"
    assert _cpu(cgroup_parent, cid, "cpu.shares") == "512"
    assert _cpu(cgroup_parent, cid, "cpu.cfs_quota_us") == "50000"
    assert _cpu(cgroup_parent, cid, "cpu.cfs_period_us") == "100000"
    status = cri.container_status(cid)
    assert status.state == api_pb2.CONTAINER_RUNNING
    assert (status.resources.linux.cpuset_cpus, status.resources.linux.cpu_shares) == ("0", 512)
    assert status.resources.linux.cpu_quota == 50000

    all_cpus = HOST_CPUS.read_text().strip()
    cri.update_container_resources(
        cid, linux_resources(cpuset_cpus=all_cpus, cpu_shares=1024, cpu_quota=150000, cpu_period=100000)
    )
    assert cgroupfs.read_cgroup_file(cgroup_parent, cid, "cpuset", "cpuset.cpus") == all_cpus
    assert _cpu(cgroup_parent, cid, "cpu.shares") == "1024"
    assert _cpu(cgroup_parent, cid, "cpu.cfs_quota_us") == "150000"
    linux = cri.container_status(cid).resources.linux
    assert (linux.cpuset_cpus, linux.cpu_shares, linux.cpu_quota) == (all_cpus, 1024, 150000)

    assert [c.id for c in cri.list_containers(pod_id=pod.pod_id)] == [cid]
    cri.stop_container(cid)
    assert cri.container_status(cid).state == api_pb2.CONTAINER_EXITED
    cri.remove_container(cid)
    assert cri.list_containers(pod_id=pod.pod_id) == []
    assert not cgroupfs.container_cgroup_dir(cgroup_parent, cid, "cpu").exists()

    cri.remove_pod(pod)
    assert pod.pod_id not in {p.id for p in cri.list_pod_sandboxes()}


def test_cpu_burner_runs_and_stop_pod_kills_it(cri: CriClient, cgroup_parent: str) -> None:
    pod = cri.run_pod(cgroup_parent=cgroup_parent)
    cid = cri.run_container(pod, command=BURN_CPU_COMMAND, resources=linux_resources(cpu_quota=10000))
    procs = cgroupfs.read_cgroup_file(cgroup_parent, cid, "cpu", "cgroup.procs").split()
    assert len(procs) == 1
    cri.stop_pod_sandbox(pod.pod_id)
    assert cri.container_status(cid).state == api_pb2.CONTAINER_EXITED


def test_get_container_events(containerd: ContainerdEnv, cri: CriClient, cgroup_parent: str) -> None:
    stream = cri.container_events(timeout=20.0)
    if containerd.version == "1.6":
        with pytest.raises(grpc.RpcError) as excinfo:
            next(iter(stream))
        assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED
        return

    events: queue.Queue[api_pb2.ContainerEventResponse] = queue.Queue()

    def pump() -> None:
        with_errors = (grpc.RpcError,)
        try:
            for event in stream:
                events.put(event)
        except with_errors:
            pass  # cancelled at the end of the test, or deadline

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    pod = cri.run_pod(cgroup_parent=cgroup_parent)
    cid = cri.run_container(pod)
    cri.stop_container(cid)
    cri.remove_container(cid)
    wanted = [
        api_pb2.CONTAINER_CREATED_EVENT,
        api_pb2.CONTAINER_STARTED_EVENT,
        api_pb2.CONTAINER_STOPPED_EVENT,
        api_pb2.CONTAINER_DELETED_EVENT,
    ]
    seen: list[int] = []
    try:
        while seen != wanted:
            event = events.get(timeout=15.0)
            if event.container_id == cid:
                seen.append(event.container_event_type)
    finally:
        stream.cancel()  # type: ignore[attr-defined]
        reader.join(timeout=5.0)
    assert seen == wanted


def test_cgroup_parent_is_private_and_removed(containerd: ContainerdEnv, cri: CriClient) -> None:
    parent = containerd.new_cgroup_parent("besteffort")
    assert parent.startswith(containerd.cgroup_top + "/kubepods/besteffort/pod")
    pod = cri.run_pod(cgroup_parent=parent)
    cri.remove_pod(pod)
    assert Path("/sys/fs/cgroup/cpu", parent.lstrip("/")).is_dir()  # containerd leaves it behind
    assert cgroupfs.remove_cgroup_tree(parent) == []
    assert not Path("/sys/fs/cgroup/cpu", parent.lstrip("/")).exists()


def test_killed_daemon_restarts_with_pods_intact(containerd: ContainerdEnv, cri: CriClient, cgroup_parent: str) -> None:
    pod = cri.run_pod(cgroup_parent=cgroup_parent)
    cid = cri.run_container(pod, resources=linux_resources(cpu_shares=256))
    containerd.ctrd.kill_daemon()
    with pytest.raises(grpc.RpcError) as excinfo:
        cri.version(timeout=2.0)
    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
    containerd.ctrd.restart_daemon()
    patient = containerd.cri_client(wait_for_ready=True, timeout=10.0)
    assert patient.container_status(cid).state == api_pb2.CONTAINER_RUNNING
    assert _cpu(cgroup_parent, cid, "cpu.shares") == "256"


_CRASHING_OWNER = """
import sys, time
from pathlib import Path
from rhp_devenv.containerd import PrivateContainerd
from rhp_devenv.cri import CriClient
ctrd = PrivateContainerd("1.6", work_dir=Path(sys.argv[1])).start()
ctrd.track_cgroup_parent(sys.argv[2])
with CriClient(ctrd.socket) as cri:
    cri.run_container(cri.run_pod(cgroup_parent=sys.argv[2] + "/kubepods/podx"))
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.requires_root
@pytest.mark.skipif(bool(binaries_for("1.6").missing()) and "1.6" not in required_versions(),
                    reason="containerd 1.6 not installed")
def test_work_dir_of_a_killed_owner_is_reaped(tmp_path: Path) -> None:
    work_dir = tmp_path / "rhp-ctrd-crash"
    top = f"/rhptest-reap-{uuid.uuid4().hex[:8]}"
    owner = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_OWNER, str(work_dir), top], stdout=subprocess.PIPE, text=True
    )
    reaped: list[Path] = []
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        assert reap_stale_work_dirs(tmp_path, min_age=0) == []  # owner alive: untouched
        owner.kill()
        owner.wait()
        assert Path("/sys/fs/cgroup/cpu", top.lstrip("/")).is_dir()  # the crash left the pod behind
        deadline = time.monotonic() + 10
        while not reaped and time.monotonic() < deadline:  # containerd dies a moment after its owner
            reaped = reap_stale_work_dirs(tmp_path, min_age=0)
            time.sleep(0.02)
    finally:
        owner.kill()
        owner.wait()
        if not reaped:
            clean_up_work_dir(work_dir, [top])
    assert reaped == [work_dir]
    assert not work_dir.exists()
    assert not any(Path(h, top.lstrip("/")).exists() for h in cgroupfs.cgroup_hierarchies())
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(work_dir) in line]


# -- pure helpers (no root, no containerd) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("top", "qos", "expected"),
    [
        pytest.param("/", "guaranteed", "/kubepods/podu1", id="guaranteed-pods-sit-under-kubepods"),
        pytest.param("/", "Burstable", "/kubepods/burstable/podu1", id="qos-names-are-case-insensitive"),
        pytest.param("/rhptest-x/", "besteffort", "/rhptest-x/kubepods/besteffort/podu1", id="private-top"),
    ],
)
def test_pod_cgroup_parent(top: str, qos: str, expected: str) -> None:
    assert cgroupfs.pod_cgroup_parent(top, qos, "u1") == expected


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param("/kubepods/../etc", id="dotdot-escapes-the-root"),
        pytest.param("kubepods-burstable.slice", id="systemd-slices-unsupported"),
    ],
)
def test_bad_cgroup_parents_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        cgroupfs.relative_cgroup_path(bad)


def test_config_keeps_everything_private(tmp_path: Path) -> None:
    text = render_config(work_dir=tmp_path, version="2.1")
    for needle in ("SystemdCgroup = false", "restrict_oom_score_adj = true", "disable_apparmor = true"):
        assert needle in text
    assert f'socket_path = "{tmp_path}/nri/nri.sock"' in text
    assert "disable = true" in text
    paths = [
        line.split("=", 1)[1].strip().strip('"')
        for line in text.splitlines()
        if line.strip().startswith(("root =", "state =", "address =", "path =", "conf_dir =", "Root ="))
    ]
    assert paths and all(p.startswith(str(tmp_path)) for p in paths)


@pytest.mark.skipif(not Path("/bin/busybox").is_file(), reason="busybox-static not installed")
def test_image_archive_names_the_image_and_hardlinks_applets(tmp_path: Path) -> None:
    built = build_image_archive(tmp_path / "image.tar")
    with tarfile.open(built.archive) as outer:
        index_file = outer.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        manifest = index["manifests"][0]
        assert manifest["annotations"]["io.containerd.image.name"] == DEFAULT_IMAGE
        assert manifest["digest"] == built.manifest_digest
        layer_blob = next(m for m in outer.getmembers() if m.size > 1_000_000)
        layer = outer.extractfile(layer_blob)
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            sh = inner.getmember("bin/sh")
            assert sh.islnk() and sh.linkname == "bin/busybox"


def test_free_ports_sit_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    """ci4 lost a kube-apiserver start to a port the kernel had meanwhile given to an outgoing
    connection: a picked port is now outside that range, and one process never gets it twice."""
    from rhp_devenv.kube import _ephemeral_range, free_port

    low, _high = _ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < low for p in ports)


def test_a_start_that_lost_its_port_starts_again_on_new_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    from rhp_devenv import kube

    cluster = kube.Cluster.__new__(kube.Cluster)
    calls: list[int] = []

    def once() -> kube.Cluster:
        calls.append(1)
        if len(calls) < 3:
            raise kube.KubeError("kube-apiserver exited with code 1: bind: address already in use")
        return cluster

    monkeypatch.setattr(cluster, "_start_once", once)
    assert cluster.start() is cluster and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(cluster, "_start_once", lambda: (_ for _ in ()).throw(kube.KubeError("etcd exited")))
    with pytest.raises(kube.KubeError, match="etcd exited"):
        cluster.start()

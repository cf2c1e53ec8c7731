"""runtime_proxy/report/sources.py over a prepared sysfs and procfs: NUMA memory, NVIDIA GPUs
(sysfs and the driver's files), kubelet's config; what cannot be used is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord_formats.cpulist import parse_cpu_list
from koord_formats.device import GPUInfo
from runtime_proxy.report.sources import (
    KubeletConfig,
    discover_gpus,
    parse_kubelet_config,
    read_kubelet_config,
    read_numa_memory,
)
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.fake_sysfs import add_nvidia_gpu, copy_machine, write_topology
from tests.topologies import DUAL_SOCKET_HT


def test_numa_memory(tmp_path: Path) -> None:
    write_topology(tmp_path, DUAL_SOCKET_HT, {0: 1024, 1: 2048})
    assert read_numa_memory(tmp_path) == {0: 1024 * 1024, 1: 2048 * 1024}
    assert read_cpu_topology(tmp_path) == DUAL_SOCKET_HT


def test_numa_memory_garbage_leaves_out_that_node(tmp_path: Path) -> None:
    write_topology(tmp_path, DUAL_SOCKET_HT)
    (tmp_path / "devices/system/node/node1/meminfo").write_text("Node 1 MemTotal: lots kB\n")
    (tmp_path / "devices/system/node/node0/meminfo").write_bytes(b"x" * 100_000)
    assert read_numa_memory(tmp_path) == {}
    assert read_numa_memory(tmp_path / "absent") == {}


def test_the_real_machine_copied(tmp_path: Path) -> None:
    copy_machine(tmp_path)
    assert read_cpu_topology(tmp_path) == read_cpu_topology("/sys")


def test_gpus(tmp_path: Path) -> None:
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    add_nvidia_gpu(sys_root, proc, "0000:af:00.0", minor=1, uuid="GPU-bbbb", numa=1, root="pci0000:ae")
    add_nvidia_gpu(sys_root, proc, "0000:3b:00.0", minor=0, uuid="GPU-aaaa", numa=-1)
    assert discover_gpus(sys_root, proc, memory_bytes=1 << 34) == (
        GPUInfo(0, "GPU-aaaa", "0000:3b:00.0", 0, "pci0000:3a", 1 << 34, model="Tesla T4"),
        GPUInfo(1, "GPU-bbbb", "0000:af:00.0", 1, "pci0000:ae", 1 << 34, model="Tesla T4"),
    )


def test_no_gpus(tmp_path: Path) -> None:
    assert discover_gpus(tmp_path, tmp_path) == ()
    add_nvidia_gpu(tmp_path, tmp_path, "0000:01:00.1", minor=0, uuid="GPU-x", pci_class="0x040300")
    add_nvidia_gpu(tmp_path, tmp_path, "0000:02:00.0", minor=1, uuid="GPU-y", vendor="0x8086")
    assert discover_gpus(tmp_path, tmp_path) == (), "an NVIDIA audio function and another vendor are no GPUs"


@pytest.mark.parametrize("info", [
    pytest.param(None, id="no driver files"),
    pytest.param("GPU UUID: GPU-a\n", id="no minor"),
    pytest.param("Device Minor: 0\nGPU UUID: nope\n", id="bad uuid"),
    pytest.param("Device Minor: 99999999\nGPU UUID: GPU-a\n", id="huge minor"),
    pytest.param("x" * 10_000, id="oversized"),
    pytest.param("\udcff", id="not text"),
])  # fmt: skip
def test_a_gpu_the_driver_does_not_describe_is_left_out(tmp_path: Path, info: str | None) -> None:
    add_nvidia_gpu(tmp_path, tmp_path, "0000:3b:00.0", minor=0, uuid="GPU-a", driver=info is not None)
    add_nvidia_gpu(tmp_path, tmp_path, "0000:af:00.0", minor=1, uuid="GPU-b")
    if info is not None:
        (tmp_path / "driver/nvidia/gpus/0000:3b:00.0/information").write_bytes(
            info.encode("utf-8", "surrogateescape"))
    assert [g.minor for g in discover_gpus(tmp_path, tmp_path)] == [1], "the other GPU still counts"


def test_kubelet_config() -> None:
    text = """
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
cpuManagerPolicyOptions: {full-pcpus-only: "true"}
reservedSystemCPUs: "0,8"
kubeReserved: {cpu: 500m}
systemReserved: {cpu: "1"}
topologyManagerPolicy: single-numa-node
"""
    assert parse_kubelet_config(text) == KubeletConfig("static", {"full-pcpus-only": "true"}, parse_cpu_list("0,8"),
                                                       1500, "single-numa-node", "container")
    assert parse_kubelet_config("") == KubeletConfig()


@pytest.mark.parametrize("text", ["[", "- a\n", "cpuManagerPolicy: [1]\n", "cpuManagerPolicyOptions: 5\n",
                                  "kubeReserved: {cpu: -1}\n", "reservedSystemCPUs: 0-99999999\n"])
def test_a_bad_kubelet_config_reads_as_kubelets_defaults(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert read_kubelet_config(str(path)) == KubeletConfig()


def test_kubelet_config_absent_fifo_or_huge(tmp_path: Path) -> None:
    import os

    assert read_kubelet_config(str(tmp_path / "absent")) == KubeletConfig()
    assert read_kubelet_config("") == KubeletConfig()
    os.mkfifo(tmp_path / "fifo")
    assert read_kubelet_config(str(tmp_path / "fifo")) == KubeletConfig()
    (tmp_path / "huge").write_text("a: b\n" * 100_000)
    assert read_kubelet_config(str(tmp_path / "huge")) == KubeletConfig()


def test_cpu_manager_state(tmp_path: Path) -> None:
    from runtime_proxy.report.sources import read_cpu_manager_state

    path = tmp_path / "cpu_manager_state"
    path.write_text('{"policyName":"static","defaultCpuSet":"0-1,6-15","entries":{"u1":{"app":"2-3","side":"4"},'
                    '"u2":{"app":""}},"checksum":1}')
    assert read_cpu_manager_state(str(path)) == {"u1": parse_cpu_list("2-4")}
    assert read_cpu_manager_state(str(tmp_path / "absent")) == {}
    assert read_cpu_manager_state("") == {}


@pytest.mark.parametrize("text", [
    "[", '{"entries":[]}', '{"entries":{"u":{"c":"0-99999999"}}}', '{"entries":{"u":{"c":5}}}',
    '{"entries":{' + ",".join(f'"u{i}":{{"c":"1"}}' for i in range(4097)) + "}}", "[" * 100_000,
    '{"entries":{"u":{' + ",".join(f'"c{i}":"1"' for i in range(65)) + "}}}",
])  # fmt: skip
def test_a_bad_cpu_manager_state_reads_as_none(tmp_path: Path, text: str) -> None:
    from runtime_proxy.report.sources import read_cpu_manager_state

    path = tmp_path / "cpu_manager_state"
    path.write_text(text)
    assert read_cpu_manager_state(str(path)) == {}

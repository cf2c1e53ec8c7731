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


# ---- CPU basic info (node.koordinator.sh/cpu-basic-info) -----------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz
flags\t\t: fpu ht

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: Another CPU
"""


def _cpu_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "ht", "turbo"),
    [
        pytest.param({"devices/system/cpu/smt/active": "1\n", "devices/system/cpu/intel_pstate/no_turbo": "0\n"},
                     True, True, id="SMT active, intel_pstate turbo allowed"),
        pytest.param({"devices/system/cpu/smt/active": "0\n", "devices/system/cpu/intel_pstate/no_turbo": "1\n"},
                     False, False, id="SMT off (the topology's siblings do not count), no_turbo set"),
        pytest.param({"devices/system/cpu/cpufreq/boost": "1\n"}, True, True,
                     id="no smt file: the topology's siblings; acpi-cpufreq boost on"),
        pytest.param({"devices/system/cpu/cpufreq/boost": "0\n", "devices/system/cpu/smt/active": "x"}, True, False,
                     id="an smt file that says nothing: the siblings; boost off"),
        pytest.param({}, True, False, id="a VM with no turbo control: turbo off"),
    ],
)
def test_cpu_basic_info(tmp_path: Path, files: dict[str, str], ht: bool, turbo: bool) -> None:
    from runtime_proxy.report.sources import read_cpu_basic_info

    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    _cpu_files(sys_root, files)
    _cpu_files(proc, {"cpuinfo": CPUINFO})
    info = read_cpu_basic_info(DUAL_SOCKET_HT, sys_root, proc)
    assert (info.cpu_model, info.vendor_id) == ("Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz", "GenuineIntel"), \
        "the first processor's"
    assert (info.hyper_thread_enabled, info.turbo_enabled) == (ht, turbo)


def test_cpu_basic_info_resctrl_mask_and_garbage(tmp_path: Path) -> None:
    from runtime_proxy.report.sources import read_cpu_basic_info
    from tests.topologies import SINGLE_SOCKET_HT

    _cpu_files(tmp_path, {"fs/resctrl/info/L3/cbm_mask": "7ff\n",
                          "cpuinfo": "model name\t: \x1b[31mred\nvendor_id\t: " + "V" * 300 + "\n"})
    info = read_cpu_basic_info(SINGLE_SOCKET_HT, tmp_path, tmp_path)
    assert info.cat_l3_cbm_mask == "7ff"
    assert info.cpu_model == "" and info.vendor_id == "", "control characters and overlong values are left out"
    (tmp_path / "cpuinfo").write_bytes(b"\xff" * 1_000_000)
    (tmp_path / "fs/resctrl/info/L3/cbm_mask").write_text("zz")
    info = read_cpu_basic_info(SINGLE_SOCKET_HT, tmp_path, tmp_path)
    assert (info.cpu_model, info.cat_l3_cbm_mask) == ("", ""), "a megabyte of garbage: only its head is read"
    info = read_cpu_basic_info(SINGLE_SOCKET_HT, tmp_path / "absent", tmp_path / "absent")
    assert info.cpu_model == "" and info.hyper_thread_enabled, "nothing to read: the siblings still tell"


def test_cpu_basic_info_of_this_machine() -> None:
    """This machine's own files: the model name /proc/cpuinfo shows and the SMT state sysfs shows."""
    from runtime_proxy.report.sources import read_cpu_basic_info

    info = read_cpu_basic_info(read_cpu_topology("/sys"), "/sys", "/proc")
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    if models:
        assert info.cpu_model == models[0]
    smt = Path("/sys/devices/system/cpu/smt/active")
    if smt.exists():
        assert info.hyper_thread_enabled == (smt.read_text().strip() == "1")

"""The usage sampler over prepared ``/proc`` and cgroup trees (v1 and v2): node, pod, container,
host-application and BE readings; garbage files and unsafe paths cost only their own pod."""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from hooks.facts import CgroupInfo, ContainerFacts, NodeFacts, PodFacts
from runtime_proxy.loops.usage import (
    MAX_FILE_BYTES,
    POD_CPU,
    SampleError,
    UsageSampler,
    parse_cpu_stat_usage,
    parse_memory_stat,
    parse_proc_stat,
    read_bounded,
)
from tests.usage_tree import BE, Tree

HZ = 100
GiB = 1 << 30
MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(uid: str, qos: str = "LS", *, kube: str = "burstable", parent: str | None = None,
        containers: tuple[str, ...] = ()) -> PodFacts:
    return PodFacts(
        name=f"name-{uid}", namespace="ns", uid=uid, sandbox_id=f"sb-{uid}",
        labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
        cgroup_parent=parent if parent is not None else f"/kubepods/{kube}/pod{uid}",
        containers=tuple(ContainerFacts(name=c, id=c) for c in containers),
    )


def sampler(tree: Tree, clock: Clock, **kwargs: object) -> UsageSampler:
    return UsageSampler(tree.cgroups(), proc_root=tree.proc, clock=clock, ticks_per_second=HZ, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=[1, 2], ids=["cgroup v1", "cgroup v2"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Tree:
    return Tree(tmp_path, request.param)


def test_two_readings_give_node_pod_container_host_app_and_be_usage(tree: Tree) -> None:
    clock = Clock()
    apps = [{"name": "nginx", "qos": "LS"}]
    node = NodeFacts(node_slo=MappingProxyType({"hostApplications": apps}))
    ls = pod("a", containers=("c1",))
    tree.node(busy=1000, total_kb=8 * MiB // 1024 * 1024, available_kb=6 * MiB // 1024 * 1024)
    tree.cgroup("kubepods/burstable/poda", cpu_ns=10**9, memory=300 * MiB)
    tree.cgroup("kubepods/burstable/poda/c1", cpu_ns=10**9, memory=200 * MiB)
    tree.cgroup("host-latency-sensitive/nginx", cpu_ns=0, memory=50 * MiB)
    tree.cgroup(BE, cpu_ns=0, memory=MiB)
    tree.be_limits(50000, "0-3")
    s = sampler(tree, clock)
    assert s.sample(node, [ls]) is None, "the first reading is the baseline"

    clock.now += 2.0
    tree.node(busy=1000 + 300 * 2 * HZ // 100, total_kb=8 << 20, available_kb=5 << 20)
    tree.cgroup("kubepods/burstable/poda", cpu_ns=10**9 + 2 * 500_000_000, memory=300 * MiB)
    tree.cgroup("kubepods/burstable/poda/c1", cpu_ns=10**9 + 2 * 250_000_000, memory=200 * MiB)
    tree.cgroup("host-latency-sensitive/nginx", cpu_ns=2 * 100_000_000, memory=50 * MiB)
    tree.cgroup(BE, cpu_ns=2 * 1_500_000_000, memory=MiB)
    got = s.sample(node, [ls])
    assert got is not None
    assert got.at == clock.now
    assert got.node_cpu_milli == 3000
    assert got.node_memory_used_bytes == 3 << 30
    assert got.node_memory_total_bytes == 8 << 30
    assert got.pods["a"].cpu_milli == 500
    assert got.pods["a"].memory_bytes == 300 * MiB, "page cache is not usage"
    assert got.containers["c1"].cpu_milli == 250
    assert got.containers["c1"].memory_bytes == 200 * MiB
    assert got.host_apps["nginx"].cpu_milli == 100
    assert got.be_cpu_milli == 1500
    assert got.be.cfs_quota_us == 50000
    assert got.be.cfs_period_us == 100000
    assert got.be.cpuset == frozenset(range(4))
    assert s.usage().latest == got
    assert s.usage().interval == 1.0


def test_v2_unlimited_quota_and_empty_cpuset_read_max_and_the_effective_cpus(tmp_path: Path) -> None:
    tree, clock = Tree(tmp_path, 2), Clock()
    tree.cgroup(BE, cpu_ns=0, memory=0)
    tree.be_limits(-1, "", effective="0-7")
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [])
    clock.now += 1
    got = s.sample(NodeFacts(), [])
    assert got is not None
    assert got.be.cfs_quota_us == -1
    assert got.be.cpuset == frozenset(range(8))


def test_a_pod_seen_for_the_first_time_has_its_memory_and_no_cpu_yet(tree: Tree) -> None:
    clock = Clock()
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [])
    tree.cgroup("kubepods/besteffort/podb", cpu_ns=5 * 10**9, memory=64 * MiB)
    clock.now += 1
    got = s.sample(NodeFacts(), [pod("b", "BE", kube="besteffort")])
    assert got is not None
    assert got.pods["b"].cpu_milli == 0
    assert got.pods["b"].memory_bytes == 64 * MiB


def test_a_counter_that_went_backwards_counts_as_a_new_baseline(tree: Tree) -> None:
    clock = Clock()
    tree.cgroup("kubepods/burstable/poda", cpu_ns=9 * 10**9, memory=MiB)
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [pod("a")])
    tree.cgroup("kubepods/burstable/poda", cpu_ns=10**9, memory=MiB)
    clock.now += 1
    got = s.sample(NodeFacts(), [pod("a")])
    assert got is not None and got.pods["a"].cpu_milli == 0
    tree.cgroup("kubepods/burstable/poda", cpu_ns=2 * 10**9, memory=MiB)
    clock.now += 1
    got = s.sample(NodeFacts(), [pod("a")])
    assert got is not None and got.pods["a"].cpu_milli == 1000


def test_the_window_keeps_only_the_newest_samples(tree: Tree) -> None:
    clock = Clock()
    s = sampler(tree, clock, window=3)
    for _ in range(6):
        clock.now += 1
        s.sample(NodeFacts(), [])
    assert [x.at for x in s.samples] == [clock.now - 2, clock.now - 1, clock.now]


def test_a_pod_that_is_gone_is_left_out_quietly(tree: Tree) -> None:
    clock = Clock()
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [])
    clock.now += 1
    with capture_logs() as logs:
        got = s.sample(NodeFacts(), [pod("gone")])
    assert got is not None and "gone" not in got.pods
    assert not [entry for entry in logs if entry["log_level"] == "warning"]


GARBAGE_CPU = [
    pytest.param(b"abc\n", id="a cpu counter that is not a number"),
    pytest.param(b"-5\n", id="a negative cpu counter"),
    pytest.param(b"1" * 25 + b"\n", id="a cpu counter of twenty-five digits"),
    pytest.param(b"", id="an empty cpu file"),
    pytest.param(b"\xff\xfe\x00garbage", id="binary garbage in the cpu file"),
    pytest.param(b"1" * (MAX_FILE_BYTES + 10), id="a cpu file larger than the read bound"),
    pytest.param(b"usage_usec\nusage_usec x\n", id="cpu.stat-like lines without a number"),
]


@pytest.mark.parametrize("content", GARBAGE_CPU)
def test_a_garbage_cpu_file_costs_only_its_own_pod(tree: Tree, content: bytes) -> None:
    clock = Clock()
    tree.cgroup("kubepods/burstable/podbad", cpu_ns=0, memory=MiB)
    tree.cgroup("kubepods/burstable/podok", cpu_ns=0, memory=MiB)
    tree.cpu_file("kubepods/burstable/podbad").write_bytes(content)
    s = sampler(tree, clock)
    pods = [pod("bad"), pod("ok")]
    with capture_logs() as logs:
        s.sample(NodeFacts(), pods)
        clock.now += 1
        got = s.sample(NodeFacts(), pods)
    assert got is not None
    assert "bad" not in got.pods
    assert got.pods["ok"].memory_bytes == MiB
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1, "a pod that keeps failing is logged once"
    assert warnings[0]["what"] == "pod:bad"


GARBAGE_MEMORY = [
    pytest.param(b"cache 5\nrss 7\n", id="memory.stat without any anon key"),
    pytest.param(b"total_inactive_anon 1\ninactive_anon 1\nactive_anon zz\nunevictable 0\n",
                 id="memory.stat with a non-numeric value"),
    pytest.param(b"inactive_anon 1\nactive_anon 99999999999999999999\nunevictable 0\n",
                 id="memory.stat with a twenty-digit value"),
    pytest.param(b"\n" * (MAX_FILE_BYTES + 1), id="memory.stat larger than the read bound"),
]


@pytest.mark.parametrize("content", GARBAGE_MEMORY)
def test_a_garbage_memory_stat_costs_only_its_own_pod(tree: Tree, content: bytes) -> None:
    clock = Clock()
    tree.cgroup("kubepods/burstable/podbad", cpu_ns=0, memory=MiB)
    tree.cgroup("kubepods/burstable/podok", cpu_ns=0, memory=2 * MiB)
    tree.memory_file("kubepods/burstable/podbad").write_bytes(content)
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [pod("bad"), pod("ok")])
    clock.now += 1
    got = s.sample(NodeFacts(), [pod("bad"), pod("ok")])
    assert got is not None and set(got.pods) == {"ok"}


def test_a_garbage_container_file_costs_only_that_container(tree: Tree) -> None:
    clock = Clock()
    tree.cgroup("kubepods/burstable/poda", cpu_ns=0, memory=MiB)
    tree.cgroup("kubepods/burstable/poda/good", cpu_ns=0, memory=MiB)
    tree.cgroup("kubepods/burstable/poda/bad", cpu_ns=0, memory=MiB)
    tree.cpu_file("kubepods/burstable/poda/bad").write_bytes(b"nope")
    s = sampler(tree, clock)
    p = pod("a", containers=("good", "bad"))
    s.sample(NodeFacts(), [p])
    clock.now += 1
    got = s.sample(NodeFacts(), [p])
    assert got is not None and "a" in got.pods
    assert set(got.containers) == {"good"}


ESCAPES = [
    pytest.param(pod("dots", parent="/kubepods/../../../etc"), id="a cgroup parent with dot-dot parts"),
    pytest.param(pod("nul", parent="/kubepods/pod\x00x"), id="a cgroup parent with a NUL byte"),
    pytest.param(pod("slice", parent="kubepods--x.slice"), id="a malformed systemd slice name"),
    pytest.param(pod("ok", containers=("../../../../outside",)), id="a container id with dot-dot parts"),
]


@pytest.mark.parametrize("hostile", ESCAPES)
def test_pod_derived_paths_never_leave_the_cgroup_root(tree: Tree, hostile: PodFacts) -> None:
    clock = Clock()
    outside = tree.root.parent / "outside"
    outside.mkdir()
    (outside / "cpuacct.usage").write_text("1\n")
    (outside / "cpu.stat").write_text("usage_usec 1\n")
    (outside / "memory.stat").write_text("inactive_anon 1\nactive_anon 1\nunevictable 1\n")
    tree.cgroup("kubepods/burstable/podok", cpu_ns=0, memory=MiB)
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [hostile, pod("ok")])
    clock.now += 1
    got = s.sample(NodeFacts(), [hostile, pod("ok")])
    assert got is not None
    assert "ok" in got.pods
    assert hostile.uid == "ok" or hostile.uid not in got.pods
    assert not got.containers


def test_a_symlink_out_of_the_cgroup_root_is_refused(tree: Tree) -> None:
    clock = Clock()
    outside = tree.root.parent / "elsewhere"
    outside.mkdir()
    (outside / "cpuacct.usage").write_text("1\n")
    (outside / "cpu.stat").write_text("usage_usec 1\n")
    (outside / "memory.stat").write_text("inactive_anon 1\nactive_anon 1\nunevictable 1\n")
    parent = tree.root / "kubepods" / "burstable" if tree.version == 2 else tree.root / "cpuacct" / "kubepods"
    parent.mkdir(parents=True, exist_ok=True)
    if tree.version == 2:
        os.symlink(outside, parent / "podlink")
    else:
        os.symlink(outside, parent / "burstable")
        (tree.root / "memory" / "kubepods").mkdir(parents=True)
        os.symlink(outside, tree.root / "memory" / "kubepods" / "burstable")
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [pod("link")])
    clock.now += 1
    got = s.sample(NodeFacts(), [pod("link")])
    assert got is not None and "link" not in got.pods


def test_a_host_application_path_that_leaves_the_root_is_skipped(tree: Tree) -> None:
    clock = Clock()
    apps = [{"name": "evil", "cgroupPath": {"base": "CgroupRoot", "parentDir": "../..", "relativePath": "x"}},
            {"name": "fine", "qos": "LS"}]
    tree.cgroup("host-latency-sensitive/fine", cpu_ns=0, memory=MiB)
    node = NodeFacts(node_slo=MappingProxyType({"hostApplications": apps}))
    s = sampler(tree, clock)
    s.sample(node, [])
    clock.now += 1
    got = s.sample(node, [])
    assert got is not None and set(got.host_apps) == {"fine"}


@pytest.mark.parametrize(
    ("stat", "meminfo"),
    [
        pytest.param("garbage\n", None, id="a /proc/stat without the cpu line"),
        pytest.param("cpu  1 2 x 4 5 6 7 8\n", None, id="a /proc/stat with a non-numeric field"),
        pytest.param(None, "MemTotal: 10 kB\n", id="a /proc/meminfo without MemAvailable"),
        pytest.param(None, "MemTotal: 10 MB\nMemAvailable: 5 kB\n", id="a /proc/meminfo in an unknown unit"),
        pytest.param(None, "x" * (MAX_FILE_BYTES + 1), id="a /proc/meminfo larger than the read bound"),
    ],
)
def test_unreadable_node_files_give_no_sample_and_no_error(tree: Tree, stat: str | None, meminfo: str | None) -> None:
    clock = Clock()
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [])
    if stat is not None:
        (tree.proc / "stat").write_text(stat)
    if meminfo is not None:
        (tree.proc / "meminfo").write_text(meminfo)
    clock.now += 1
    assert s.sample(NodeFacts(), []) is None


def test_systemd_paths_are_sampled(tree: Tree) -> None:
    clock = Clock()
    node = NodeFacts(cgroup=CgroupInfo(version=tree.version, driver="systemd"))
    p = pod("s", parent="kubepods-burstable-pods.slice", containers=("c",))
    base = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pods.slice"
    tree.cgroup(base, cpu_ns=0, memory=MiB)
    tree.cgroup(f"{base}/cri-containerd-c.scope", cpu_ns=0, memory=MiB)
    s = sampler(tree, clock)
    s.sample(node, [p])
    clock.now += 1
    got = s.sample(node, [p])
    assert got is not None and "s" in got.pods and "c" in got.containers


def test_pod_gauges_follow_the_pods(tree: Tree) -> None:
    clock = Clock()
    tree.cgroup("kubepods/burstable/podg", cpu_ns=0, memory=MiB)
    s = sampler(tree, clock)
    s.sample(NodeFacts(), [pod("g")])
    clock.now += 1
    s.sample(NodeFacts(), [pod("g")])
    labels = {"namespace": "ns", "pod": "name-g", "uid": "g"}
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("rhp_pod_memory_usage_bytes", labels) == MiB
    clock.now += 1
    s.sample(NodeFacts(), [])
    assert REGISTRY.get_sample_value("rhp_pod_memory_usage_bytes", labels) is None
    assert POD_CPU is not None


def test_parsers_follow_koordinator(tmp_path: Path) -> None:
    # busy = user + nice + system + irq + softirq; iowait and steal are not usage.
    assert parse_proc_stat(b"cpu  10 1 5 100 50 2 3 40 0 0\n") == (21, 211)
    v1 = b"total_inactive_anon 1\ntotal_active_anon 2\ntotal_unevictable 4\ninactive_anon 100\n"
    assert parse_memory_stat(v1, 1) == 7
    assert parse_memory_stat(b"inactive_anon 1\nactive_anon 2\nunevictable 4\n", 1) == 7
    with pytest.raises(SampleError):
        parse_memory_stat(v1, 2)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 10)
    assert read_bounded(big, 4, head=True) == b"xxxx"
    with pytest.raises(SampleError):
        read_bounded(big, 4)
    with pytest.raises(SampleError):
        read_bounded(tmp_path, 4)


def test_older_samples_keep_only_the_node_and_be_readings(tree: Tree) -> None:
    from runtime_proxy.loops.usage import DETAILED_SAMPLES

    clock = Clock()
    tree.cgroup("kubepods/burstable/poda", cpu_ns=0, memory=MiB)
    tree.cgroup(BE, cpu_ns=0, memory=MiB)
    s = sampler(tree, clock)
    for _ in range(DETAILED_SAMPLES + 3):
        clock.now += 1
        s.sample(NodeFacts(), [pod("a")])
    kept = s.samples
    assert all("a" in x.pods for x in kept[-DETAILED_SAMPLES:])
    assert all(not x.pods for x in kept[:-DETAILED_SAMPLES])
    assert all(x.node_memory_total_bytes > 0 for x in kept)


# A BE pod's files as the v2 node's kernel (Debian 6.1, tests/v2/) wrote them, verbatim.
_REAL_V2_CPU_STAT = (b"usage_usec 441088\nuser_usec 152525\nsystem_usec 288562\nnr_periods 10\nnr_throttled 2\n"
                     b"throttled_usec 94054\nnr_bursts 0\nburst_usec 0\n")
_REAL_V2_MEMORY_STAT = (
    b"anon 102400\nfile 12288\nkernel 307200\nkernel_stack 32768\npagetables 40960\nsec_pagetables 0\n"
    b"percpu 14272\nsock 0\nvmalloc 0\nshmem 0\nzswap 0\nzswapped 0\nfile_mapped 0\nfile_dirty 0\n"
    b"file_writeback 0\nswapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 94208\n"
    b"active_anon 8192\ninactive_file 4096\nactive_file 8192\nunevictable 0\nslab_reclaimable 92016\n"
    b"slab_unreclaimable 78048\nslab 170064\nworkingset_refault_anon 0\npgfault 941\npgmajfault 1\n"
    b"thp_fault_alloc 2\nthp_collapse_alloc 0\n"
)


def test_the_v2_parsers_read_what_the_kernel_writes() -> None:
    # The kernel's cpu.stat carries throttling and burst counters after usage_usec, and its
    # memory.stat some thirty keys (the fakes now write cpu.stat's full set too).
    assert parse_cpu_stat_usage(_REAL_V2_CPU_STAT) == 441088 * 1000
    assert parse_memory_stat(_REAL_V2_MEMORY_STAT, 2) == 94208 + 8192 + 0


def _line_by_line(data: bytes, version: int) -> int | None:
    """The reading of memory.stat the parser must keep: each line split at its first space, a
    wanted key's value a counter, a later line of the same key winning (None: SampleError)."""
    wanted = (b"total_inactive_anon", b"total_active_anon", b"total_unevictable", b"inactive_anon",
              b"active_anon", b"unevictable")
    found: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key in wanted:
            text = value.strip()
            if not text or len(text) > 19 or not text.isdigit() or int(text) > (1 << 63) - 1:
                return None
            found[key] = int(text)
    keys = wanted[:3] if version == 1 and all(k in found for k in wanted[:3]) else wanted[3:]
    return sum(found[k] for k in keys) if all(k in found for k in keys) else None


_STAT_LINES = st.lists(
    st.tuples(
        st.sampled_from([b"total_inactive_anon", b"total_active_anon", b"total_unevictable", b"inactive_anon",
                         b"active_anon", b"unevictable", b"active_anon_x", b"xactive_anon", b"cache", b""]),
        st.sampled_from([b" ", b"  ", b"\t", b"", b" \r"]),
        st.one_of(st.integers(0, 1 << 64).map(lambda n: str(n).encode()), st.sampled_from([b"", b"-1", b"1 2", b"x"])),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_STAT_LINES, version=st.sampled_from([1, 2]), end=st.sampled_from([b"", b"\n", b"\r\n"]))
def test_memory_stat_is_read_as_line_by_line(lines: list[tuple[bytes, bytes, bytes]], version: int,
                                             end: bytes) -> None:
    data = b"\n".join(k + sep + v for k, sep, v in lines) + end
    want = _line_by_line(data, version)
    if want is None:
        with pytest.raises(SampleError):
            parse_memory_stat(data, version)
    else:
        assert parse_memory_stat(data, version) == want

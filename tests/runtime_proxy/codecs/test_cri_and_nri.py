"""A plan's ``ResourceChanges`` as each door writes them: every field, hugepage limits included,
into the CRI ``LinuxContainerResources`` (proxy door) and the NRI ``LinuxResources`` (NRI door)."""

from __future__ import annotations

from cri_protos import api_pb2
from hooks.plan import Plan
from runtime_proxy.codecs.cri import set_linux_resources
from runtime_proxy.codecs.nri import linux_resources


def _plan() -> Plan:
    return (Plan().set_resource("cpu_period", 100000).set_resource("cpu_quota", -1).set_resource("cpu_shares", 2)
            .set_resource("memory_limit_in_bytes", 1 << 30).set_resource("memory_swap_limit_in_bytes", 1 << 31)
            .set_resource("cpuset_cpus", "0-3").set_resource("cpuset_mems", "0")
            .set_resource("unified", {"memory.high": "max"})
            .set_resource("hugepage_limits", [("2MB", 1 << 21), ("1GB", 0)]))


def test_the_cri_door_writes_every_resource_field() -> None:
    msg = api_pb2.LinuxContainerResources(cpuset_cpus="7")
    msg.hugepage_limits.add(page_size="2MB", limit=5)
    set_linux_resources(msg, _plan().set_resource("oom_score_adj", 3).resources)
    assert (msg.cpu_period, msg.cpu_quota, msg.cpu_shares, msg.memory_limit_in_bytes, msg.memory_swap_limit_in_bytes,
            msg.cpuset_cpus, msg.cpuset_mems, msg.oom_score_adj, dict(msg.unified)) == (
        100000, -1, 2, 1 << 30, 1 << 31, "0-3", "0", 3, {"memory.high": "max"})
    assert [(h.page_size, h.limit) for h in msg.hugepage_limits] == [("2MB", 1 << 21), ("1GB", 0)]


def test_the_nri_door_writes_every_resource_field_it_can_carry() -> None:
    res, skipped = linux_resources(_plan().set_resource("oom_score_adj", 3).resources)
    assert (res.cpu.period.value, res.cpu.quota.value, res.cpu.shares.value, res.memory.limit.value,
            res.memory.swap.value, res.cpu.cpus, res.cpu.mems, dict(res.unified)) == (
        100000, -1, 2, 1 << 30, 1 << 31, "0-3", "0", {"memory.high": "max"})
    assert [(h.page_size, h.limit) for h in res.hugepage_limits] == [("2MB", 1 << 21), ("1GB", 0)]
    assert skipped == ["oom_score_adj"]

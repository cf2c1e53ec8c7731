"""The CRI door's rewrite of a plan made before its container existed."""

from __future__ import annotations

from dataclasses import dataclass

from hooks.plan import CgroupWrite, Eviction, Plan, Record
from runtime_proxy.engine.pending import complete


@dataclass(frozen=True)
class _Note(Record):
    text: str


def test_binding_the_container_id_keeps_every_other_part_of_the_plan() -> None:
    eviction = Eviction(uid="u1", namespace="ns", name="be", feature="BECPUEvict", reason="test")
    plan = Plan(
        writes=[CgroupWrite("container", "kubepods/pod1/", "cpu.shares", "2"),
                CgroupWrite("pod", "kubepods/pod1", "cpu.shares", "4")],
        evictions=[eviction],
        records=[_Note("kept")],
        envs={"A": "1"},
    )
    bound = complete(plan, "c0ffee", "PreCreateContainer")
    assert [w.path for w in bound.writes] == ["kubepods/pod1/c0ffee", "kubepods/pod1"]
    assert bound.evictions == [eviction]
    assert bound.records == [_Note("kept")]
    assert bound.envs == {"A": "1"}

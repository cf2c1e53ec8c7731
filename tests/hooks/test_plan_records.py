"""Records: what a plugin reports beside its plan for the loop that runs its stage (the CPU
suppress decision). They merge as claims, survive the stage's field filter and change nothing."""

from __future__ import annotations

from dataclasses import dataclass

from hooks.facts import NodeFacts, PodFacts
from hooks.manager import make_plugin_manager
from hooks.plan import Plan, Record, merge
from hooks.spec import hookimpl
from hooks.usage import SuppressDecision, Usage
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps


@dataclass(frozen=True, slots=True)
class PerPod(Record):
    uid: str
    value: int

    @property
    def key(self) -> str:
        return f"PerPod:{self.uid}"


def test_records_change_nothing_and_stay_out_of_the_document() -> None:
    plan = Plan().report(SuppressDecision("cfsQuota", cfs_quota_us=200000))
    assert plan.is_empty()
    assert "records" not in plan.to_json()
    assert plan.records == [SuppressDecision("cfsQuota", cfs_quota_us=200000)]


def test_records_merge_as_claims_on_their_key() -> None:
    same = merge([("a", Plan().report(PerPod("u1", 1))), ("b", Plan().report(PerPod("u1", 1)))])
    assert same.conflicts == [] and same.plan.records == [PerPod("u1", 1)]
    other_key = merge([("a", Plan().report(PerPod("u1", 1))), ("b", Plan().report(PerPod("u2", 2)))])
    assert other_key.plan.records == [PerPod("u1", 1), PerPod("u2", 2)]
    clash = merge([("a", Plan().report(PerPod("u1", 1))),
                   ("b", Plan().report(PerPod("u1", 2)).write("pod", "p", "cpu.shares", 2))])
    assert [c.field for c in clash.conflicts] == ["record:PerPod:u1"]
    assert clash.plan.records == [PerPod("u1", 1)] and clash.plan.writes == [], "the later plan is left out whole"


class Reporter:
    @hookimpl
    def rhp_reconcile_usage(self) -> Plan:
        # a CRI field the stage cannot carry: the runner drops it and must keep the record
        return Plan().set_label("a", "b").report(SuppressDecision("cpuset", cpuset=frozenset({1, 2})))


async def test_the_runner_keeps_records_when_it_drops_fields_the_stage_cannot_carry() -> None:
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(Reporter(), name="reporter")
    pipeline = Pipeline(plugin_steps(pm, [("reporter", "Ignore", 5.0)]))
    result = await pipeline.run_usage(NodeFacts(), [PodFacts()], Usage())
    assert result.failures == []
    assert result.plan.labels == {}
    assert result.plan.records == [SuppressDecision("cpuset", cpuset=frozenset({1, 2}))]

"""The usage loop with a fake backend and a stub ``ReconcileUsage`` plugin: the stage's
arguments, writes applied in plan order, evictions handed to the evictor and remembered, dry
run, and failures that cost nothing but their own part."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import REGISTRY

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager
from hooks.plan import Eviction, Plan
from hooks.spec import hookimpl
from hooks.usage import SuppressDecision, Usage
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.host.cgroups import Cgroups, WriteResult
from runtime_proxy.loops.qos import EvictionResult, LoggingEvictor, UsageLoop, UsageRound
from runtime_proxy.loops.usage import UsageSampler
from tests.fake_clock import Clock
from tests.usage_tree import BE, Tree

Decide = Callable[[NodeFacts, tuple[PodFacts, ...], Usage], Plan | None]


class Stub:
    """A ``ReconcileUsage`` plugin whose decision the test sets; it records its arguments."""

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.calls: list[tuple[NodeFacts, tuple[PodFacts, ...], Usage]] = []

    @hookimpl
    def rhp_reconcile_usage(self, node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
        self.calls.append((node, pods, usage))
        return self.decide(node, pods, usage)


@dataclass
class Backend:
    node_facts: NodeFacts = field(default_factory=NodeFacts)
    pod_list: list[PodFacts] = field(default_factory=list)
    container_list: list[tuple[PodFacts, ContainerFacts]] = field(default_factory=list)

    def node(self) -> NodeFacts:
        return self.node_facts

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.container_list)


class RecordingEvictor:
    def __init__(self, status: str = "evicted", fail: bool = False) -> None:
        self.status = status
        self.fail = fail
        self.calls: list[list[Eviction]] = []

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]:
        self.calls.append(list(evictions))
        if self.fail:
            raise RuntimeError("api server unreachable")
        return [EvictionResult(e, self.status) for e in evictions]


class RecordingCgroups(Cgroups):
    """Cgroups that remember every write in the order it was made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: list[tuple[str, str, str]] = []

    def write(self, path: str, file: str, value: str | int, *, compare_only: bool = False) -> WriteResult:
        result = super().write(path, file, value, compare_only=compare_only)
        self.order.append((path, file, str(value)))
        return result


def be_pod(uid: str) -> PodFacts:
    return PodFacts(name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}",
                    labels=MappingProxyType({"koordinator.sh/qosClass": "BE"}),
                    cgroup_parent=f"/kubepods/besteffort/pod{uid}")


def make_loop(tmp_path: Path, decide: Decide, *, recording: bool = False,
              **kwargs: Any) -> tuple[UsageLoop, Stub, Backend, Tree, Clock]:
    """The loop over a prepared tree; ``recording``: with the dry-run applier."""
    tree, clock = Tree(tmp_path, 1), Clock()
    tree.cgroup(BE, cpu_ns=0, memory=0)
    tree.be_limits(-1, "0-7")
    p = be_pod("b1")
    tree.cgroup("kubepods/besteffort/podb1", cpu_ns=0, memory=1 << 20)
    tree.cgroup("kubepods/besteffort/podb1/c1", cpu_ns=0, memory=1 << 20)
    tree.write("cpuset", "kubepods/besteffort/podb1", "cpuset.cpus", "0-7\n")
    tree.write("cpuset", "kubepods/besteffort/podb1/c1", "cpuset.cpus", "0-7\n")
    backend = Backend(pod_list=[p], container_list=[(p, ContainerFacts(name="c", id="c1"))])
    stub = Stub(decide)
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(stub, name="stub")
    pipeline = Pipeline(plugin_steps(pm, [("stub", "Ignore", 2.0)]))
    cgroups = RecordingCgroups(tree.root, version=1)
    sampler = UsageSampler(cgroups, proc_root=tree.proc, clock=clock, ticks_per_second=100)
    if recording:
        kwargs["applier"] = RecordingApplier(cgroups=cgroups)
    loop = UsageLoop(backend, pipeline=pipeline, cgroups=cgroups, sampler=sampler, clock=clock, **kwargs)
    return loop, stub, backend, tree, clock


async def step(loop: UsageLoop) -> UsageRound:
    """One round and then the results of the evictions it started (they run beside the loop)."""
    out = await loop.step()
    await loop.wait_evictions()
    return out


async def two_rounds(loop: UsageLoop, clock: Clock) -> None:
    await step(loop)
    clock.now += 1
    await step(loop)


def two_pass(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
    """The leveled cpuset write of CPU suppress: the union top-down, the target bottom-up."""
    plan = Plan()
    for path in (BE, "kubepods/besteffort/podb1", "kubepods/besteffort/podb1/c1"):
        plan.write("kubeqos" if path == BE else "pod", path, "cpuset.cpus", "0-9")
    for path in ("kubepods/besteffort/podb1/c1", "kubepods/besteffort/podb1", BE):
        plan.write("kubeqos" if path == BE else "pod", path, "cpuset.cpus", "8-9")
    return plan


async def test_the_stage_gets_the_node_every_pod_with_its_containers_and_the_window(tmp_path: Path) -> None:
    loop, stub, _, _, clock = make_loop(tmp_path, lambda n, p, u: None)
    first = await step(loop)
    assert first.sample is None and not stub.calls, "the baseline round runs no decision"
    clock.now += 1
    await step(loop)
    node, pods, usage = stub.calls[0]
    assert node.bound_cpusets == {}
    assert [p.uid for p in pods] == ["b1"]
    assert [c.id for c in pods[0].containers] == ["c1"]
    assert usage.latest is not None and usage.latest.pods["b1"].memory_bytes == 1 << 20
    assert usage.latest.be.cpuset == frozenset(range(8))
    assert usage.interval == 1.0


async def test_writes_are_applied_in_plan_order(tmp_path: Path) -> None:
    loop, _, _, tree, clock = make_loop(tmp_path, two_pass)
    await two_rounds(loop, clock)
    assert loop.last_round is not None and loop.last_round.applied is not None
    assert loop.last_round.applied.errors == []
    written = [(p, v) for p, f, v in loop.cgroups.order if f == "cpuset.cpus"]  # type: ignore[attr-defined]
    assert written == [
        (BE, "0-9"), ("kubepods/besteffort/podb1", "0-9"), ("kubepods/besteffort/podb1/c1", "0-9"),
        ("kubepods/besteffort/podb1/c1", "8-9"), ("kubepods/besteffort/podb1", "8-9"), (BE, "8-9"),
    ]
    assert (tree.root / "cpuset" / BE / "cpuset.cpus").read_text().strip() == "8-9"


async def test_dry_run_writes_nothing_and_evicts_nothing(tmp_path: Path) -> None:
    def decide(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        return two_pass(node, pods, usage).evict("b1", "ns", "b1", "BEMemoryEvict", "memory above 70%")

    evictor = RecordingEvictor()
    loop, _, _, tree, clock = make_loop(tmp_path, decide, evictor=evictor, recording=True)
    await two_rounds(loop, clock)
    assert (tree.root / "cpuset" / BE / "cpuset.cpus").read_text().strip() == "0-7"
    assert evictor.calls == []
    assert loop.last_round is not None
    assert [r.status for r in loop.last_round.evictions] == ["dry-run"]


async def test_evictions_go_to_the_evictor_once_and_are_remembered(tmp_path: Path) -> None:
    def decide(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        return Plan().evict("b1", "ns", "b1", "BEMemoryEvict", "memory above 70%")

    evictor = RecordingEvictor()
    loop, stub, _, _, clock = make_loop(tmp_path, decide, evictor=evictor)
    await two_rounds(loop, clock)
    before = REGISTRY.get_sample_value("rhp_usage_evictions_total", {"feature": "BEMemoryEvict", "result": "evicted"})
    assert [[e.uid for e in call] for call in evictor.calls] == [["b1"]]
    clock.now += 1
    await step(loop)
    assert len(evictor.calls) == 1, "a pod just evicted is not evicted again while it terminates"
    usage = stub.calls[-1][2]
    assert usage.evicted_uids == {"b1"}
    assert usage.last_eviction("BEMemoryEvict") == 1001.0
    clock.now += 200
    await step(loop)
    assert len(evictor.calls) == 2, "after the remembered time it may be evicted again"
    after = REGISTRY.get_sample_value("rhp_usage_evictions_total", {"feature": "BEMemoryEvict", "result": "evicted"})
    assert (after or 0) - (before or 0) == 1


@pytest.mark.parametrize(
    ("evictor", "status"),
    [
        pytest.param(RecordingEvictor(status="refused"), "refused",
                     id="an eviction a disruption budget refuses is tried again next round"),
        pytest.param(RecordingEvictor(fail=True), "failed", id="an evictor that raises reports every eviction failed"),
    ],
)
async def test_evictions_that_did_not_happen_are_retried(tmp_path: Path, evictor: RecordingEvictor,
                                                         status: str) -> None:
    loop, _, _, _, clock = make_loop(tmp_path, lambda n, p, u: Plan().evict("b1", "ns", "b1", "BECPUEvict", "low"),
                                     evictor=evictor)
    await two_rounds(loop, clock)
    assert loop.last_round is not None and [r.status for r in loop.last_round.evictions] == [status]
    clock.now += 1
    await step(loop)
    assert len(evictor.calls) == 2


async def test_a_refused_eviction_is_passed_to_the_decisions_until_it_is_done(tmp_path: Path) -> None:
    evictor = RecordingEvictor(status="refused")
    loop, stub, _, _, clock = make_loop(tmp_path, lambda n, p, u: Plan().evict("b1", "ns", "b1", "BEMemoryEvict", "x"),
                                        evictor=evictor)
    await two_rounds(loop, clock)
    clock.now += 1
    await step(loop)
    assert stub.calls[-1][2].refused_uids == {"b1"}
    assert stub.calls[-1][2].evicted_uids == frozenset(), "a refusal starts no cool-down"
    evictor.status = "evicted"
    clock.now += 1
    await step(loop)
    clock.now += 1
    await step(loop)
    assert stub.calls[-1][2].refused_uids == frozenset() and stub.calls[-1][2].evicted_uids == {"b1"}


async def test_the_default_evictor_logs_and_performs_nothing(tmp_path: Path) -> None:
    loop, _, _, _, clock = make_loop(tmp_path, lambda n, p, u: Plan().evict("b1", "ns", "b1", "BECPUEvict", "low"))
    assert isinstance(loop.evictor, LoggingEvictor)
    await two_rounds(loop, clock)
    assert loop.last_round is not None
    assert [r.status for r in loop.last_round.evictions] == ["not-configured"]


async def test_a_failing_plugin_and_a_failing_write_cost_only_themselves(tmp_path: Path) -> None:
    def boom(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        raise ValueError("bad decision")

    loop, _, _, _, clock = make_loop(tmp_path, boom)
    await two_rounds(loop, clock)
    assert loop.last_round is not None and "bad decision" in loop.last_round.failures[0]

    def bad_write(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        plan = Plan().write("kubeqos", "kubepods/../../etc", "cpu.cfs_quota_us", "1000")
        plan.write("kubeqos", BE, "cpu.cfs_quota_us", "20000")
        return plan.write("pod", "kubepods/besteffort/podgone", "cpu.cfs_quota_us", "1000")

    loop2, _, _, tree, clock2 = make_loop(tmp_path / "second", bad_write)
    await two_rounds(loop2, clock2)
    assert loop2.last_round is not None and loop2.last_round.applied is not None
    assert len(loop2.last_round.applied.errors) == 1
    assert (tree.root / "cpu" / BE / "cpu.cfs_quota_us").read_text().strip() == "20000"


async def test_a_plugin_may_write_one_file_twice_without_conflicting_with_itself(tmp_path: Path) -> None:
    loop, _, _, _, clock = make_loop(tmp_path, two_pass)
    await two_rounds(loop, clock)
    assert loop.last_round is not None and loop.last_round.failures == []
    assert loop.last_round.plan is not None and len(loop.last_round.plan.writes) == 6


async def test_the_loop_runs_rounds_until_stopped(tmp_path: Path) -> None:
    loop, _, _, _, _ = make_loop(tmp_path, lambda n, p, u: None, interval=0.01)
    loop.sampler.clock = __import__("time").monotonic
    await loop.start()
    for _ in range(200):
        if loop.rounds >= 3:
            break
        await asyncio.sleep(0.01)
    await loop.stop()
    assert loop.rounds >= 3
    stopped = loop.rounds
    await asyncio.sleep(0.05)
    assert loop.rounds == stopped


async def test_a_write_already_in_place_is_not_repeated_within_the_cache_time(tmp_path: Path) -> None:
    target = ["20000"]

    def quota(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        return Plan().write("kubeqos", BE, "cpu.cfs_quota_us", target[0])

    loop, _, _, tree, clock = make_loop(tmp_path, quota)
    cgroups: RecordingCgroups = loop.cgroups  # type: ignore[assignment]
    await two_rounds(loop, clock)
    assert len(cgroups.order) == 1
    clock.now += 1
    await step(loop)
    assert len(cgroups.order) == 1, "the same value again is left out"
    target[0] = "30000"
    clock.now += 1
    await step(loop)
    assert cgroups.order[-1] == (BE, "cpu.cfs_quota_us", "30000")
    (tree.root / "cpu" / BE / "cpu.cfs_quota_us").write_text("-1\n")
    clock.now += 61
    await step(loop)
    assert (tree.root / "cpu" / BE / "cpu.cfs_quota_us").read_text().strip() == "30000", \
        "a file changed by hand is put back once the cache time is over"


# ---- evictions run beside the loop ------------------------------------------------------------


class HangingEvictor:
    """An API server that accepts every eviction and never answers."""

    def __init__(self) -> None:
        self.calls: list[list[Eviction]] = []
        self.never = asyncio.Event()

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]:
        self.calls.append(list(evictions))
        await self.never.wait()
        return [EvictionResult(e, "evicted") for e in evictions]


def evict_ten_and_suppress(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
    """Every round: a CPU-suppress-like write and ten victims."""
    plan = Plan().write("kubeqos", BE, "cpu.cfs_quota_us", "20000")
    for i in range(10):
        plan.evict(f"v{i}", "ns", f"v{i}", "BEMemoryEvict", "memory above 70%")
    return plan


def _tasks(outcome: str) -> float:
    return REGISTRY.get_sample_value("rhp_usage_eviction_tasks_total", {"outcome": outcome}) or 0.0


async def test_rounds_go_on_while_evictions_hang_with_a_bounded_budget(tmp_path: Path) -> None:
    """With an evictor that never answers, five rounds each sample, decide and write; at most
    four evictions are in flight, one per pod, and the rest are deferred, counted."""
    evictor = HangingEvictor()
    loop, stub, _, tree, clock = make_loop(tmp_path, evict_ten_and_suppress, evictor=evictor)
    started, deferred = _tasks("started"), _tasks("deferred")
    await loop.step()  # baseline
    for _ in range(5):
        clock.now += 1
        tree.write("cpu", BE, "cpu.cfs_quota_us", "-1\n")  # put back by hand: the next round rewrites it
        clock.now += 61  # past the write cache
        out = await asyncio.wait_for(loop.step(), 60)  # a round that waited for the evictor would never end
        assert out.applied is not None and out.applied.errors == []
        assert (tree.root / "cpu" / BE / "cpu.cfs_quota_us").read_text().strip() == "20000"
    assert len(stub.calls) == 5
    assert [[e.uid for e in call] for call in evictor.calls] == [["v0"], ["v1"], ["v2"], ["v3"]]
    assert loop.evictions_in_flight == {"v0", "v1", "v2", "v3"}
    assert _tasks("started") - started == 4
    assert _tasks("deferred") - deferred == 5 * 6
    await loop.stop()
    assert loop.evictions_in_flight == frozenset()


async def test_an_unanswered_eviction_fails_at_its_deadline_and_frees_its_slot(tmp_path: Path) -> None:
    evictor = HangingEvictor()
    loop, _, _, _, clock = make_loop(tmp_path, evict_ten_and_suppress, evictor=evictor, eviction_deadline=0.01,
                                     max_evictions_in_flight=2)
    timeouts = _tasks("timeout")
    await loop.step()
    clock.now += 1
    first = await loop.step()
    await asyncio.wait_for(loop.wait_evictions(), 60)
    assert [(r.eviction.uid, r.status) for r in first.evictions] == [("v0", "failed"), ("v1", "failed")]
    assert all("no answer within" in r.message for r in first.evictions)
    assert _tasks("timeout") - timeouts == 2
    clock.now += 1
    await loop.step()
    assert loop.evictions_in_flight == {"v0", "v1"}, "the slots are free again: the next round starts two more"
    await loop.stop()


class TickingClock:
    """A monotonic clock that moves a second each time it is read."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


async def test_the_running_loop_keeps_its_interval_while_evictions_hang(tmp_path: Path) -> None:
    """The loop as the proxy runs it (``start``): rounds keep coming while the four evictions it
    started are still unanswered."""
    evictor = HangingEvictor()
    loop, _, _, _, _ = make_loop(tmp_path, evict_ten_and_suppress, evictor=evictor, interval=0.01)
    loop.clock = loop.sampler.clock = TickingClock()
    await loop.start()
    try:
        for _ in range(6000):  # wait for the condition; the bound only ends a hung test
            if loop.rounds >= 20:
                break
            await asyncio.sleep(0.01)
        assert loop.rounds >= 20
        assert len(evictor.calls) == 4 and loop.evictions_in_flight == {"v0", "v1", "v2", "v3"}
    finally:
        await loop.stop()


def _target(policy: str) -> float | None:
    return REGISTRY.get_sample_value("rhp_cpu_suppress_target_cores", {"policy": policy})


async def test_the_suppress_target_metric_follows_the_decision_the_plan_reports(tmp_path: Path) -> None:
    """The metric comes from the ``SuppressDecision`` in the stage's plan, whichever plugin
    reported it (here a stub, not ``cpu_suppress``); a round without one keeps the value."""
    decision: dict[str, SuppressDecision | None] = {"now": SuppressDecision("cfsQuota", cfs_quota_us=250000)}

    def report(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        plan = Plan()
        now = decision["now"]
        return plan if now is None else plan.report(now)

    loop, _, _, _, clock = make_loop(tmp_path, report)
    await two_rounds(loop, clock)
    assert _target("cfsQuota") == 2.5
    decision["now"] = SuppressDecision("cpuset", cfs_quota_us=-1, cpuset=frozenset({0, 1, 2}))
    clock.now += 1
    await step(loop)
    assert _target("cpuset") == 3.0 and _target("cfsQuota") is None
    decision["now"] = None
    clock.now += 1
    await step(loop)
    assert _target("cpuset") == 3.0


async def test_the_loop_hands_its_plans_to_the_applier_it_is_given(tmp_path: Path) -> None:
    """The dry-run applier records the round's plan and is asked whether it carries it: it does
    not, so nothing is written and nobody is evicted. A file applier in dry-run mode (what the
    composition root still builds for ``--dry-run``) carries nothing either."""
    def decide(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan:
        return two_pass(node, pods, usage).evict("b1", "ns", "b1", "BEMemoryEvict", "memory above 70%")

    evictor = RecordingEvictor()
    loop, _, _, tree, clock = make_loop(tmp_path / "a", decide, evictor=evictor, recording=True)
    await two_rounds(loop, clock)
    assert isinstance(loop.applier, RecordingApplier)
    stages = [stage for stage, _ in loop.applier.plans]
    assert "ReconcileUsage" in stages and "files" in stages
    recorded = next(plan for stage, plan in loop.applier.plans if stage == "ReconcileUsage")
    assert [e.uid for e in recorded.evictions] == ["b1"]
    assert evictor.calls == []
    loop, _, _, tree, clock = make_loop(tmp_path / "b", decide, evictor=evictor)
    loop.applier = RecordingApplier(cgroups=loop.cgroups)
    await two_rounds(loop, clock)
    assert (tree.root / "cpuset" / BE / "cpuset.cpus").read_text().strip() == "0-7"
    assert evictor.calls == []


async def test_a_plugins_skip_is_logged_once_not_every_round(tmp_path: Path) -> None:
    """memory_qos on cgroup v1 says every round that it writes nothing; the log says it once."""
    from structlog.testing import capture_logs

    loop, _, _, _, clock = make_loop(tmp_path, lambda n, p, u: Plan().skip("needs cgroup v2"))
    with capture_logs() as logs:
        await two_rounds(loop, clock)
        clock.now += 1
        await step(loop)
    skipped = [e for e in logs if e["event"] == "usage loop: plugin skipped"]
    assert [(e["plugin"], e["reason"]) for e in skipped] == [("stub", "needs cgroup v2")]


async def test_containers_are_read_only_while_a_step_may_read_container_usage(tmp_path: Path) -> None:
    """The built-in ReconcileUsage plugins read node, pod and BE usage only: with them alone a
    round reads no container's files; a step that is not built in (here the stub) brings the
    containers back on the next round, and leaving again stops them."""
    import hooks.plugins.cpu_evict as cpu_evict
    import hooks.plugins.memory_evict as memory_evict

    loop, stub, _, _, clock = make_loop(tmp_path, lambda n, p, u: None)
    pm = make_plugin_manager(builtins=[], entry_points=False)
    pm.register(cpu_evict, name="cpu_evict")
    pm.register(memory_evict, name="memory_evict")
    pm.register(stub, name="stub")
    builtin_only = plugin_steps(pm, [("cpu_evict", "Ignore", 2.0), ("memory_evict", "Ignore", 2.0)])
    with_stub = plugin_steps(pm, [("cpu_evict", "Ignore", 2.0), ("stub", "Ignore", 2.0)])
    loop.pipeline.set_steps(builtin_only)
    await step(loop)
    clock.now += 1
    out = await step(loop)
    assert out.sample is not None and "b1" in out.sample.pods
    assert dict(out.sample.containers) == {}, "no container read for the built-in decisions"
    loop.pipeline.set_steps(with_stub)
    clock.now += 1
    out = await step(loop)
    assert out.sample is not None and set(out.sample.containers) == {"c1"}
    loop.pipeline.set_steps(builtin_only)
    clock.now += 1
    out = await step(loop)
    assert out.sample is not None and dict(out.sample.containers) == {} and "b1" in out.sample.pods


async def test_the_stages_facts_are_made_once_and_any_change_reaches_the_next_round(tmp_path: Path) -> None:
    """The node with its bound cpusets and the pods with their containers are built again only
    when the backend's node, pods or containers changed: the same facts are the same objects,
    and a pod's new label, a new node spec or a new container reach the very next round."""
    loop, stub, backend, _, clock = make_loop(tmp_path, lambda n, p, u: None)
    await two_rounds(loop, clock)
    clock.now += 1
    await step(loop)
    (node1, pods1, _), (node2, pods2, _) = stub.calls[0], stub.calls[1]
    assert node2 is node1 and pods2[0] is pods1[0], "unchanged facts are not rebuilt"
    relabelled = backend.pod_list[0].replace(labels=MappingProxyType({"koordinator.sh/qosClass": "LS"}))
    backend.pod_list = [relabelled]
    backend.container_list = [(relabelled, c) for _, c in backend.container_list]
    clock.now += 1
    await step(loop)
    assert stub.calls[-1][1][0].qos_label == "LS"
    backend.node_facts = backend.node_facts.replace(node_slo=MappingProxyType({"cpuBurstStrategy": {"policy": "auto"}}))
    clock.now += 1
    await step(loop)
    assert stub.calls[-1][0].node_slo == {"cpuBurstStrategy": {"policy": "auto"}}
    backend.container_list.append((relabelled, ContainerFacts(name="d", id="c2")))
    clock.now += 1
    await step(loop)
    assert [c.id for c in stub.calls[-1][1][0].containers] == ["c1", "c2"]

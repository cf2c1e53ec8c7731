"""cpu_suppress plugin: the suppress amount, the cfsQuota steps, the BE cpuset size and choice,
the two-pass write order for kubelet's none and static policies, and the restore when off."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.facts import CPUInfo, NodeFacts, PodFacts, format_cpu_list, parse_cpu_list
from hooks.plan import Plan, merge
from hooks.plugins import cpu_suppress
from hooks.plugins.cpu_suppress import (
    SuppressDecision,
    be_cpuset_size,
    choose_be_cpus,
    decide,
    next_cfs_quota,
    pick_cpus,
    suppress_amount,
)
from hooks.usage import BEState, ResourceUsage, Usage, UsageSample
from koord_formats import nodeslo
from tests.hooks.plugins.factories import container, node, pod, status, writes
from tests.topologies import DUAL_SOCKET_HT, cpus

QOS = "kubepods/besteffort"
BE_POD = f"{QOS}/podbe-1"


def sample(
    node_milli: int = 0,
    pods: Mapping[str, int] | None = None,
    host_apps: Mapping[str, int] | None = None,
    quota: int = -1,
    cpuset: str = "0-15",
) -> UsageSample:
    return UsageSample(
        at=1.0,
        node_cpu_milli=node_milli,
        pods=MappingProxyType({k: ResourceUsage(v) for k, v in (pods or {}).items()}),
        host_apps=MappingProxyType({k: ResourceUsage(v) for k, v in (host_apps or {}).items()}),
        be=BEState(cfs_quota_us=quota, cpuset=cpus(cpuset) if cpuset else frozenset()),
    )


def slo(policy: str = "cpuset", *, enable: bool = True, threshold: int | None = None,
        minimum: int | None = None, host_apps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    sec: dict[str, Any] = {"enable": enable, "cpuSuppressPolicy": policy}
    if threshold is not None:
        sec["cpuSuppressThresholdPercent"] = threshold
    if minimum is not None:
        sec["cpuSuppressMinPercent"] = minimum
    spec: dict[str, Any] = {"resourceUsedThresholdWithBE": sec}
    if host_apps is not None:
        spec["hostApplications"] = host_apps
    return spec


LS = pod("LS", uid="ls-1")
BE = pod("BE", kube="BestEffort", uid="be-1", sandbox_id="sb", containers=(container(cid="c1"),))
LABEL_LESS_BE = pod(None, kube="BestEffort", uid="be-2")
BE_LABEL_BURSTABLE = pod("BE", kube="Burstable", uid="be-3")


# ---- the amount --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "usage", "host_apps", "reserved", "minimum", "expected"),
    [
        pytest.param((LS, BE), sample(6000, {"ls-1": 3000, "be-1": 2000}), {}, 0, None, 10400 - 3000 - 1000,
                     id="non-BE pod usage and the system's rest are subtracted from capacity x threshold"),
        pytest.param((LS, BE), sample(5500, {"be-1": 5000}), {}, 0, None, 10400 - 500,
                     id="BE pod usage is not subtracted"),
        pytest.param((LABEL_LESS_BE, BE_LABEL_BURSTABLE), sample(4000, {"be-2": 2000, "be-3": 2000}), {}, 0, None,
                     10400, id="a kube BestEffort pod and a pod labelled BE both count as BE"),
        pytest.param((LS,), sample(2000, {"stranger": 2000}), {}, 0, None, 10400 - 2000,
                     id="a pod with usage that the proxy does not know counts as non-BE"),
        pytest.param((LS,), sample(1000, {"ls-1": 1000}), {}, 2000, None, 10400 - 1000 - 2000,
                     id="system usage never falls below the node reservation"),
        pytest.param((LS,), sample(1000, {"ls-1": 3000}), {}, 0, None, 10400 - 3000,
                     id="system usage is never negative when pods report more than the node"),
        pytest.param((LS,), sample(3000, {}, {"agent": 1000, "be-agent": 1500}), {}, 0, None, 10400 - 1000 - 500,
                     id="a non-BE host application is subtracted, a BE one under the besteffort dir is not"),
        pytest.param((LS,), sample(16000, {"ls-1": 15000}), {}, 0, 10, 1600,
                     id="cpuSuppressMinPercent floors the share at capacity x min"),
        pytest.param((LS,), sample(16000, {"ls-1": 15000}), {}, 0, None, 10400 - 15000 - 1000,
                     id="without a minimum the share goes negative under heavy LS load"),
    ],
)
def test_suppress_amount(pods: tuple[PodFacts, ...], usage: UsageSample, host_apps: dict[str, int],
                         reserved: int, minimum: int | None, expected: int) -> None:
    apps = nodeslo.host_applications({"hostApplications": [
        {"name": "agent", "qos": "LS"},
        {"name": "be-agent", "qos": "BE", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "agent"}},
        {"name": "idle", "qos": "LS"},
    ]})
    amount = suppress_amount(capacity_milli=16000, threshold_percent=65, min_percent=minimum, sample=usage,
                             pods={p.uid: p for p in pods}, host_apps=apps, reserved_milli=reserved)
    assert amount.suppress == expected


@pytest.mark.parametrize(
    ("annotations", "reserved"),
    [
        pytest.param({}, 0, id="no reservation reserves nothing"),
        pytest.param({"node.koordinator.sh/reservation": json.dumps({"reservedCPUs": "0-2"})}, 3000,
                     id="the reservation's reservedCPUs count one core each"),
        pytest.param({"node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "1500m"}})}, 1500,
                     id="the reservation's resources.cpu counts when it lists no CPUs"),
        pytest.param({"node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "1"}}),
                      "kubelet.koordinator.sh/cpu-manager-policy": json.dumps(
                          {"policy": "static", "reservedCPUs": "0-1"})}, 2000,
                     id="kubelet's reserved CPUs win when they are more than the reservation"),
    ],
)
def test_reserved_from_node_annotations(annotations: dict[str, str], reserved: int) -> None:
    decision, _ = decide(node(annotations=annotations, slo=slo("cfsQuota")), (LS,), Usage((sample(0),)))
    assert decision.amount is not None and decision.amount.reserved == reserved


def test_nodeslo_reads_the_minimum_and_refuses_one_out_of_range() -> None:
    assert nodeslo.cpu_suppress(slo(minimum=20)).cpu_suppress_min_percent == 20
    problems: list[str] = []
    assert nodeslo.cpu_suppress(slo(minimum=150), problems).cpu_suppress_min_percent is None
    assert problems and "cpuSuppressMinPercent" in problems[0]


# ---- cfsQuota ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suppress", "current", "expected"),
    [
        pytest.param(3000, 1000000, 300000, id="a shrink is written at once"),
        pytest.param(10000, 300000, 460000, id="growth is capped at 10 percent of the node per round"),
        pytest.param(10000, -1, 1000000, id="the first quota after unlimited is written without the cap"),
        pytest.param(6400, 630000, None, id="a change below 1 percent of the node is skipped"),
        pytest.param(0, 3000, 2000, id="the 2000 floor is written even when the change is small"),
        pytest.param(-5000, 500000, 2000, id="a negative share writes the 2000 floor"),
    ],
)
def test_next_cfs_quota(suppress: int, current: int, expected: int | None) -> None:
    assert next_cfs_quota(suppress, current, cores=16) == expected


def test_cfs_quota_policy_writes_the_qos_quota_and_keeps_cpusets_on_the_pool() -> None:
    the_node = node(slo=slo("cfsQuota"))
    decision, plan = decide(the_node, (LS, BE), Usage((sample(6000, {"ls-1": 3000}, quota=-1),)))
    # system = 6000 - 3000 = 3000; 10400 - 3000 - 3000 = 4400 millicores -> 440000 us.
    assert decision == SuppressDecision("cfsQuota", decision.amount, 440000, cpus("0-15"))
    assert decision.target_cores == 4.4
    assert writes(plan)[0] == ("kubeqos", QOS, "cpu.cfs_quota_us", "440000")
    assert {w[3] for w in writes(plan)[1:]} == {"0-15"}


def test_cfs_quota_policy_records_a_skipped_small_change() -> None:
    decision, plan = decide(node(slo=slo("cfsQuota")), (LS,), Usage((sample(6000, {"ls-1": 3000}, quota=435000),)))
    assert decision.cfs_quota_us is None and decision.reason == "quota change below 1% of the node"
    assert decision.target_cores is None
    assert not [w for w in plan.writes if w.file == "cpu.cfs_quota_us"]


# ---- cpuset: size and choice -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suppress", "current", "pool", "expected"),
    [
        pytest.param(6400, 16, 16, 7, id="the share in cores, rounded up"),
        pytest.param(-3000, 16, 16, 2, id="never fewer than two CPUs"),
        pytest.param(12000, 4, 16, 6, id="growth is capped at ceil(10 percent of the node's CPUs) per round"),
        pytest.param(2000, 12, 16, 2, id="a shrink happens at once"),
        pytest.param(16000, 16, 12, 12, id="never more CPUs than the BE pool holds"),
    ],
)
def test_be_cpuset_size(suppress: int, current: int, pool: int, expected: int) -> None:
    assert be_cpuset_size(suppress, current, node_cpus=16, pool_size=pool) == expected


def infos(text: str) -> list[CPUInfo]:
    wanted = cpus(text)
    return [i for i in DUAL_SOCKET_HT.infos if i.id in wanted]


@pytest.mark.parametrize(
    ("count", "pool", "expected"),
    [
        pytest.param(4, "0-15", "0,4,8,12", id="one sibling pair from each NUMA node in turn"),
        pytest.param(3, "0-15", "0,4,8", id="a pair, then a single from the next bucket"),
        pytest.param(6, "0-15", "0-1,4,8-9,12", id="round robin keeps taking pairs while two or more are wanted"),
        pytest.param(3, "0-2,8", "0-1,8", id="the siblings 0 and 8 go together, then a single"),
        pytest.param(2, "1-2,4-7,12-15", "4,12", id="the larger bucket comes first"),
        pytest.param(3, "1,3,5", "1,3,5", id="singles round robin when no pair is left"),
        pytest.param(5, "0-3", "", id="too few CPUs give nothing"),
    ],
)
def test_pick_cpus(count: int, pool: str, expected: str) -> None:
    assert format_cpu_list(frozenset(pick_cpus(count, infos(pool)))) == expected


@pytest.mark.parametrize(
    ("count", "lsr", "ls", "expected"),
    [
        pytest.param(8, "2-3,10-11", "0-1,4-9,12-15", "0,2,4-5,8,10,12-13",
                     id="floor(8 x 4/16) = 2 CPUs come from LSR, the other 6 from LS"),
        pytest.param(3, "2,10", "0-1,3-9,11-15", "0,4,12",
                     id="a small LSR share rounds down to none; the larger LS bucket gives a pair first"),
        pytest.param(4, "", "0-15", "0,4,8,12", id="without LSR pods everything comes from LS"),
    ],
)
def test_choose_be_cpus_splits_between_lsr_and_ls(count: int, lsr: str, ls: str, expected: str) -> None:
    assert format_cpu_list(choose_be_cpus(count, infos(lsr) if lsr else [], infos(ls))) == expected


# A prepared node: LSE pod on 6-7,14-15, LSR pod on 2,10, reserved 0,8, exclusive system CPUs 1,9.
# BE pool = 2-5,10-13; LSR part 2,10; LS part 3-5,11-13.
PREPARED = {
    "node.koordinator.sh/reservation": json.dumps({"reservedCPUs": "0,8"}),
    "node.koordinator.sh/system-qos-resource": json.dumps({"cpuset": "1,9"}),
}
LSE = pod("LSE", uid="lse-1", annotations={"scheduling.koordinator.sh/resource-status": status("6-7,14-15")})
LSR = pod("LSR", uid="lsr-1", annotations={"scheduling.koordinator.sh/resource-status": status("2,10")})


def prepared_node(policy: str = "cpuset", kubelet: str | None = None, **kw: Any) -> NodeFacts:
    annotations = dict(PREPARED)
    if kubelet is not None:
        annotations["kubelet.koordinator.sh/cpu-manager-policy"] = json.dumps({"policy": kubelet})
    return node(annotations=annotations, slo=slo(policy, **kw))


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # system = max(6000 - 3000, 0, 2000) = 3000; 10400 - 3000 - 3000 = 4400 -> 5 CPUs:
        # 1 from LSR (5 x 2 // 8), 4 from LS (pairs 4/12, then 3/11).
        pytest.param(sample(6000, {"ls-1": 3000}, cpuset="2-5,10-13"), "2-4,11-12",
                     id="the BE cpuset follows the formula and the LSR/LS split on a prepared node"),
        pytest.param(sample(14000, {"ls-1": 11000}, cpuset="2-5,10-13"), "4,12",
                     id="heavy LS load leaves BE its two-CPU minimum, an HT pair"),
        # 8400 wants 9 CPUs; from 2 only 2 + ceil(1.6) = 4: 1 from LSR, a pair and a single from LS.
        pytest.param(sample(2000, {"ls-1": 0}, cpuset="4,12"), "2-4,12",
                     id="from two CPUs BE grows by ceil(10 percent of 16) = 2 per round"),
    ],
)
def test_cpuset_policy_on_a_prepared_node(usage: UsageSample, expected: str) -> None:
    decision, plan = decide(prepared_node(), (LS, LSE, LSR, BE), Usage((usage,)))
    assert format_cpu_list(decision.cpuset) == expected
    assert decision.cfs_quota_us == -1
    final = {(w.level, w.path): w.value for w in plan.writes if w.file == "cpuset.cpus"}
    assert final[("kubeqos", QOS)] == expected
    assert ("kubeqos", QOS, "cpu.cfs_quota_us", "-1") in writes(plan)


# ---- write order -------------------------------------------------------------------------------


def test_none_policy_widens_top_down_then_narrows_bottom_up() -> None:
    usage = Usage((sample(6000, {"ls-1": 3000}, cpuset="2-5,10-13"),))
    _, plan = decide(prepared_node(), (LS, LSE, LSR, BE), usage)
    assert [w for w in writes(plan) if w[2] == "cpuset.cpus"] == [
        ("kubeqos", QOS, "cpuset.cpus", "2-5,10-13"),
        ("pod", BE_POD, "cpuset.cpus", "2-5,10-13"),
        ("sandbox", f"{BE_POD}/sb", "cpuset.cpus", "2-5,10-13"),
        ("container", f"{BE_POD}/c1", "cpuset.cpus", "2-5,10-13"),
        ("container", f"{BE_POD}/c1", "cpuset.cpus", "2-4,11-12"),
        ("sandbox", f"{BE_POD}/sb", "cpuset.cpus", "2-4,11-12"),
        ("pod", BE_POD, "cpuset.cpus", "2-4,11-12"),
        ("kubeqos", QOS, "cpuset.cpus", "2-4,11-12"),
    ]


def test_static_policy_keeps_the_pool_on_qos_and_pod_dirs() -> None:
    usage = Usage((sample(6000, {"ls-1": 3000}, cpuset="2-4,11-12"),))
    _, plan = decide(prepared_node(kubelet="static"), (LS, LSE, LSR, BE), usage)
    assert [w for w in writes(plan) if w[2] == "cpuset.cpus"] == [
        ("kubeqos", QOS, "cpuset.cpus", "2-5,10-13"),
        ("pod", BE_POD, "cpuset.cpus", "2-5,10-13"),
        ("sandbox", f"{BE_POD}/sb", "cpuset.cpus", "2-4,11-12"),
        ("container", f"{BE_POD}/c1", "cpuset.cpus", "2-4,11-12"),
    ]


def test_a_plan_that_writes_a_file_twice_merges_without_conflict() -> None:
    usage = Usage((sample(6000, {"ls-1": 3000}, cpuset="2-5,10-13"),))
    _, plan = decide(prepared_node(), (LS, LSE, LSR, BE), usage)
    result = merge([("cpu_suppress", plan)])
    assert result.conflicts == [] and result.plan.writes == plan.writes


@pytest.mark.parametrize(
    "the_node",
    [
        pytest.param(prepared_node(enable=False), id="enable false restores the full BE pool and quota -1"),
        pytest.param(node(annotations=PREPARED), id="a missing NodeSLO restores the full BE pool and quota -1"),
    ],
)
def test_disabled_restores(the_node: NodeFacts) -> None:
    decision, plan = decide(the_node, (LS, LSE, LSR, BE), Usage((sample(cpuset="3-4"),)))
    assert decision.policy == "disabled"
    assert writes(plan) == [
        ("kubeqos", QOS, "cpu.cfs_quota_us", "-1"),
        ("kubeqos", QOS, "cpuset.cpus", "2-5,10-13"),
        ("pod", BE_POD, "cpuset.cpus", "2-5,10-13"),
        ("sandbox", f"{BE_POD}/sb", "cpuset.cpus", "2-5,10-13"),
        ("container", f"{BE_POD}/c1", "cpuset.cpus", "2-5,10-13"),
    ]


@pytest.mark.parametrize(
    ("the_node", "usage", "reason"),
    [
        pytest.param(node(None, slo=slo()), Usage((sample(),)), "no CPU topology", id="no topology, no writes"),
        pytest.param(node(slo=slo()), Usage(), "no usage sample", id="no sample yet, no writes"),
        pytest.param(node(slo=slo()), Usage((sample(cpuset=""),)), "BE cpuset unknown",
                     id="cpuset policy without the sampled BE cpuset writes nothing"),
        pytest.param(node(annotations={"node.koordinator.sh/reservation": "{"}, slo=slo()), Usage((sample(),)),
                     "bad node annotation", id="a malformed reservation stops the round, recorded"),
        pytest.param(node(annotations={"node.koordinator.sh/reservation": json.dumps({"reservedCPUs": "0-15"})},
                          slo=slo()), Usage((sample(),)), "empty BE pool", id="an empty BE pool writes nothing"),
    ],
)
def test_rounds_that_write_nothing(the_node: NodeFacts, usage: Usage, reason: str) -> None:
    decision, plan = decide(the_node, (LS, BE), usage)
    assert decision.reason == reason
    assert plan.writes == [] and plan.skipped


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({"node.koordinator.sh/system-qos-resource": '{"cpuset": "0-"}'},
                     id="a malformed system-qos cpuset stops the round"),
        pytest.param({"kubelet.koordinator.sh/cpu-manager-policy": "[" * 5000},
                     id="a deeply nested kubelet policy stops the round"),
        pytest.param({"node.koordinator.sh/reservation": json.dumps({"reservedCPUs": "0-99999999"})},
                     id="a reservation naming millions of CPUs stops the round"),
        pytest.param({"node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "1e999999"}})},
                     id="a reservation with a huge exponent stops the round"),
    ],
)
def test_hostile_node_annotations_stop_the_round_with_a_skip(annotations: dict[str, str]) -> None:
    decision, plan = decide(node(annotations=annotations, slo=slo("cfsQuota")), (LS, BE), Usage((sample(),)))
    assert decision.reason == "bad node annotation"
    assert plan.writes == [] and plan.skipped


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(pod("LSR", uid="lsr-bad", annotations={"scheduling.koordinator.sh/resource-status": "{"}),
                     id="an LSR pod with a malformed resource-status is left out of the split"),
        pytest.param(pod("LSE", uid="lse-bad", annotations={
            "scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-" + "9" * 5000})}),
                     id="an LSE pod with an absurd cpuset costs only itself"),
        pytest.param(pod("BE", uid="be-bad", parent="/kubepods/besteffort/../../etc", containers=(container(cid="x"),)),
                     id="a BE pod whose cgroup parent leaves the root gets no write"),
    ],
)
def test_hostile_pods_cost_only_themselves(bad: PodFacts) -> None:
    usage = Usage((sample(6000, {"ls-1": 3000}, cpuset="2-5,10-13"),))
    good, good_plan = decide(prepared_node(), (LS, LSE, LSR, BE), usage)
    decision, plan = decide(prepared_node(), (LS, LSE, LSR, BE, bad), usage)
    assert decision.cpuset == good.cpuset
    assert all(".." not in w.path and "etc" not in w.path for w in plan.writes)
    assert {w.path for w in plan.writes} == {w.path for w in good_plan.writes}


def test_hook_returns_the_plan_of_decide() -> None:
    usage = Usage((sample(6000, {"ls-1": 3000}),))
    plan = cpu_suppress.rhp_reconcile_usage(node=node(slo=slo("cfsQuota")), pods=(LS, BE), usage=usage)
    assert isinstance(plan, Plan) and plan.writes == decide(node(slo=slo("cfsQuota")), (LS, BE), usage)[1].writes


def test_hook_reports_its_decision_in_the_plan() -> None:
    """The decision travels in the plan's records (no module state for the usage loop to read)."""
    usage = Usage((sample(6000, {"ls-1": 3000}),))
    plan = cpu_suppress.rhp_reconcile_usage(node=node(slo=slo("cfsQuota")), pods=(LS, BE), usage=usage)
    decision, _ = decide(node(slo=slo("cfsQuota")), (LS, BE), usage)
    assert isinstance(plan, Plan) and plan.records == [decision]
    assert decision.policy == "cfsQuota" and decision.target_cores is not None


def test_systemd_driver_paths() -> None:
    be = pod("BE", uid="be-1", parent="kubepods-besteffort-podbe_1.slice", containers=(container(cid="c1"),))
    the_node = node(slo=slo("cfsQuota"), driver="systemd")
    _, plan = decide(the_node, (be,), Usage((sample(0),)))
    paths = [w.path for w in plan.writes]
    slice_dir = "kubepods.slice/kubepods-besteffort.slice"
    assert paths[0] == slice_dir
    assert f"{slice_dir}/kubepods-besteffort-podbe_1.slice/cri-containerd-c1.scope" in paths


# ---- property: the pool and the write sequence ---------------------------------------------------

ALL = sorted(DUAL_SOCKET_HT.cpus)
subsets = st.sets(st.sampled_from(ALL))


@settings(max_examples=80, deadline=None)
@given(
    reserved=subsets, system=subsets, lse=subsets, lsr=subsets, current=subsets.filter(bool),
    pod_pick=st.randoms(use_true_random=False), policy=st.sampled_from(["cpuset", "cfsQuota"]),
    enable=st.booleans(), kubelet=st.sampled_from(["none", "static"]),
    node_milli=st.integers(0, 20000), ls_milli=st.integers(0, 20000), be_milli=st.integers(0, 20000),
    minimum=st.none() | st.integers(0, 100),
)
def test_be_cpus_stay_in_the_pool_and_children_within_parents(
    reserved: set[int], system: set[int], lse: set[int], lsr: set[int], current: set[int], pod_pick: Any,
    policy: str, enable: bool, kubelet: str, node_milli: int, ls_milli: int, be_milli: int, minimum: int | None,
) -> None:
    annotations = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": kubelet})}
    if reserved:
        annotations["node.koordinator.sh/reservation"] = json.dumps({"reservedCPUs": format_cpu_list(reserved)})
    if system:
        annotations["node.koordinator.sh/system-qos-resource"] = json.dumps({"cpuset": format_cpu_list(system)})
    pods = [LS, BE, pod("BE", kube="BestEffort", uid="be-2", sandbox_id="sb2",
                        containers=(container(cid="c2"), container(name="c3", cid="c3")))]
    if lse:
        pods.append(pod("LSE", uid="lse-1",
                        annotations={"scheduling.koordinator.sh/resource-status": status(format_cpu_list(lse))}))
    if lsr - lse:
        pods.append(pod("LSR", uid="lsr-1", annotations={
            "scheduling.koordinator.sh/resource-status": status(format_cpu_list(lsr - lse))}))
    the_node = node(annotations=annotations, slo=slo(policy, enable=enable, minimum=minimum))
    usage = Usage((sample(node_milli, {"ls-1": ls_milli, "be-1": be_milli}, cpuset=format_cpu_list(current)),))
    decision, plan = decide(the_node, tuple(pods), usage)

    # The starting tree: the kube-QoS dir holds ``current``; every pod and container a subset.
    state: dict[str, frozenset[int]] = {QOS: frozenset(current)}
    parent: dict[str, str] = {}
    for p in pods[1:3]:
        pod_dir = f"{QOS}/pod{p.uid}"
        state[pod_dir] = frozenset(pod_pick.sample(sorted(current), pod_pick.randint(1, len(current))))
        parent[pod_dir] = QOS
        for cid in [p.sandbox_id, *(c.id for c in p.containers)]:
            state[f"{pod_dir}/{cid}"] = frozenset(
                pod_pick.sample(sorted(state[pod_dir]), pod_pick.randint(1, len(state[pod_dir]))))
            parent[f"{pod_dir}/{cid}"] = pod_dir
    for w in plan.writes:
        if w.file != "cpuset.cpus":
            continue
        state[w.path] = parse_cpu_list(w.value)
        for child, up in parent.items():
            assert state[child] <= state[up], f"{child} outside {up} after writing {w}"

    forbidden = reserved | system | lse
    assert not decision.cpuset & forbidden
    if decision.cpuset:
        deepest = [v for k, v in state.items() if k.endswith(("/c1", "/c2", "/c3", "/sb", "/sb2"))]
        assert all(v == decision.cpuset for v in deepest)

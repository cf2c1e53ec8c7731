"""cpu_burst plugin: cfs_burst_us from cpuBurstStrategy, and the cfsQuotaBurst decisions."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from hooks.plugins import cpu_burst
from hooks.plugins.cpu_burst import (
    COOLING,
    DOWN,
    IDLE,
    OVERLOAD,
    REMAIN,
    UP,
    BurstLimiter,
    decide_operation,
    next_quota,
    share_pool_state,
    throttled_ratio,
)
from hooks.usage import BurstDecision, BurstRound, BurstState, ContainerCPU
from koord_formats import keys, nodeslo
from koord_formats.nodeslo import CPUBurstConfig
from tests.hooks.plugins.factories import call, container, node, pod, writes

AUTO = {"cpuBurstStrategy": {"policy": "auto"}}
BURST = "koordinator.sh/cpuBurst"


@pytest.mark.parametrize(
    ("slo", "annotations", "expected"),
    [
        pytest.param({}, {}, CPUBurstConfig(), id="Koordinator defaults"),
        pytest.param({"cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 200}}, {},
                     CPUBurstConfig(policy="auto", cpu_burst_percent=200), id="node config"),
        pytest.param(AUTO, {BURST: '{"cpuBurstPercent": 300, "policy": "cpuBurstOnly"}'},
                     CPUBurstConfig(policy="cpuBurstOnly", cpu_burst_percent=300), id="pod annotation merged over"),
        pytest.param(AUTO, {BURST: "{bad"}, CPUBurstConfig(policy="auto"), id="bad annotation is ignored"),
        pytest.param({"cpuBurstStrategy": {"policy": "sometimes"}}, {}, CPUBurstConfig(), id="unknown policy ignored"),
    ],
)
def test_config_merge(slo: dict[str, Any], annotations: dict[str, str], expected: CPUBurstConfig) -> None:
    node_cfg = nodeslo.cpu_burst(slo)
    assert nodeslo.cpu_burst_from_pod(node_cfg, annotations.get(keys.ANNOTATION_POD_CPU_BURST)) == expected


@pytest.mark.parametrize(
    ("the_pod", "slo", "quota", "expected", "capped"),
    [
        pytest.param(pod("LS", uid="u"), {"cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 50}}, 200000,
                     [("container", "kubepods/burstable/podu/cid", "cpu.cfs_burst_us", "100000")], False,
                     id="2 cores x 50% = 100000us"),
        pytest.param(pod("LS", uid="u"), AUTO, 50000,
                     [("container", "kubepods/burstable/podu/cid", "cpu.cfs_burst_us", "50000")], True,
                     id="default 1000% is capped at the quota"),
        pytest.param(pod(None, uid="u"), {"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 20}},
                     100000, [("container", "kubepods/burstable/podu/cid", "cpu.cfs_burst_us", "20000")], False,
                     id="label-less pods are eligible"),
        pytest.param(pod("LS", uid="u"), AUTO, 0,
                     [("container", "kubepods/burstable/podu/cid", "cpu.cfs_burst_us", "0")], False,
                     id="no limit gives 0"),
        pytest.param(pod("LS", uid="u"), {}, 100000, [], False, id="policy none writes nothing at create"),
        pytest.param(pod("LS", uid="u"), {"cpuBurstStrategy": {"policy": "cfsQuotaBurstOnly"}}, 100000, [], False,
                     id="cfsQuotaBurstOnly does not set cfs_burst_us"),
        pytest.param(pod("LSR", uid="u", kube="Guaranteed"), AUTO, 100000, [], False, id="LSR is not eligible"),
        pytest.param(pod("BE", uid="u", kube="BestEffort"), AUTO, 100000, [], False, id="BE is not eligible"),
    ],
)
def test_cfs_burst_at_create(the_pod: Any, slo: dict[str, Any], quota: int, expected: list[Any], capped: bool) -> None:
    c = container(cid="cid", cpu_quota=quota, cpu_period=100000)
    plan = call(cpu_burst, "rhp_post_start_container", pod=the_pod, container=c, node=node(slo=slo))
    assert writes(plan) == expected
    assert any("capped" in s.reason for s in plan.skipped) == capped


def test_reconcile_resets_when_off_and_sums_at_pod_level() -> None:
    c1 = container("a", cid="c1", cpu_quota=100000, cpu_period=100000)
    c2 = container("b", cid="c2", cpu_quota=200000, cpu_period=100000)
    the_pod = pod("LS", uid="u", containers=(c1, c2))
    on = node(slo={"cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 50}})
    assert writes(call(cpu_burst, "rhp_reconcile_pod", pod=the_pod, node=on)) == [
        ("pod", "kubepods/burstable/podu", "cpu.cfs_burst_us", "150000")]
    off = call(cpu_burst, "rhp_reconcile_container", pod=the_pod, container=c1, node=node(slo={}))
    assert [w.value for w in off.writes] == ["0"]


@pytest.mark.parametrize(
    ("ratio", "threshold", "expected"),
    [
        pytest.param(0.6, 50, OVERLOAD, id="above threshold is overload"),
        pytest.param(0.5, 50, OVERLOAD, id="at threshold is overload"),
        pytest.param(0.46, 50, COOLING, id="within 90% of threshold is cooling"),
        pytest.param(None, 50, COOLING, id="unknown is cooling"),
        pytest.param(0.2, 50, IDLE, id="below is idle"),
    ],
)
def test_share_pool_state(ratio: float | None, threshold: int, expected: str) -> None:
    assert share_pool_state(ratio, threshold) == expected


@pytest.mark.parametrize(
    ("throttled", "state", "limiter_ok", "expected"),
    [
        pytest.param(0.5, IDLE, True, UP, id="throttled on an idle node scales up"),
        pytest.param(0.0, IDLE, True, REMAIN, id="not throttled remains"),
        pytest.param(None, IDLE, True, REMAIN, id="no data remains"),
        pytest.param(0.5, COOLING, True, REMAIN, id="cooling turns up into remain"),
        pytest.param(0.5, OVERLOAD, True, DOWN, id="overload turns up into down"),
        pytest.param(0.0, OVERLOAD, True, DOWN, id="overload turns remain into down"),
        pytest.param(0.5, IDLE, False, DOWN, id="an empty token bucket forces down"),
    ],
)
def test_decide_operation(throttled: float | None, state: str, limiter_ok: bool, expected: str) -> None:
    assert decide_operation(throttled, state, limiter_ok) == expected


@pytest.mark.parametrize(
    ("current", "op", "expected"),
    [
        pytest.param(20000, UP, 24000, id="up x1.2"),
        pytest.param(55000, UP, 60000, id="up is capped at the ceiling"),
        pytest.param(30000, DOWN, 24000, id="down x0.8"),
        pytest.param(22000, DOWN, 20000, id="down stops at the base"),
        pytest.param(-1, REMAIN, 20000, id="unlimited current restarts at the base"),
    ],
)
def test_next_quota(current: int, op: str, expected: int) -> None:
    assert next_quota(current, 20000, 60000, op) == expected


def test_throttled_ratio() -> None:
    assert throttled_ratio((10, 2, 1.0), (20, 7, 2.0), max_age=2.5) == 0.5
    assert throttled_ratio((10, 2, 1.0), (20, 7, 9.0), max_age=2.5) is None
    assert throttled_ratio(None, (20, 7, 2.0), max_age=2.5) is None


def test_token_bucket() -> None:
    cfg = CPUBurstConfig(policy="auto", cfs_quota_burst_period_seconds=10)
    limiter = BurstLimiter.new(cfg, now=0.0, rng=lambda: 0.2)
    assert limiter.capacity == 2000 and limiter.tokens == 200
    assert limiter.update(200, now=1.0) is True  # 200 - 100 = 100 consumed
    assert limiter.update(300, now=2.0) is False  # 200 more: empty
    assert limiter.update(10, now=3.0) is False  # refill 90: still -10
    assert limiter.update(10, now=4.0) is True  # refill 90 more
    limiter.update(0, now=1000.0)
    assert limiter.tokens == limiter.capacity


# ---- the reconcile_cpu_burst stage ----------------------------------------------------------------

POD_DIR = "kubepods/burstable/poduid-1"


def burst_round(at: float, throttled: int, states: dict[str, BurstState] | None = None,
                usage: int | None = None) -> BurstRound:
    read = {cid: ContainerCPU(20000, nr_periods=10 * int(at), nr_throttled=throttled, usage_ns=usage, draw=0.25)
            for cid in ("a", "b")}
    return BurstRound(at, 1.0, 0.1, MappingProxyType(read), MappingProxyType({POD_DIR: 40000}),
                      MappingProxyType(states or {}))


def test_the_stage_scales_each_container_and_moves_the_pod_by_every_delta() -> None:
    """Two throttled containers of one pod: each goes up by x1.2 and the pod by both deltas; the
    state each decision reports is what the next round needs (its ``cpu.stat`` sample)."""
    the_pod = pod("LS", containers=(container("a", "a", cpu_quota=20000, cpu_period=100000),
                                    container("b", "b", cpu_quota=20000, cpu_period=100000)))
    first = cpu_burst.rhp_reconcile_cpu_burst(node=node(slo=AUTO), pods=(the_pod,), burst=burst_round(1.0, 0))
    assert first is not None and first.writes == []
    states = {d.container_id: d.state for d in first.records if isinstance(d, BurstDecision)}
    no_bucket = BurstState((10, 0, 1.0), None, None, read_usage=False)
    assert states == {"a": no_bucket, "b": no_bucket}, "without a token bucket cpuacct.usage is not needed"
    plan = cpu_burst.rhp_reconcile_cpu_burst(node=node(slo=AUTO), pods=(the_pod,), burst=burst_round(2.0, 5, states))
    assert plan is not None
    assert [(w.level, w.path, w.value) for w in plan.writes] == [
        ("container", f"{POD_DIR}/a", "24000"), ("pod", POD_DIR, "44000"),
        ("container", f"{POD_DIR}/b", "24000"), ("pod", POD_DIR, "48000"),
    ]
    decisions = [d for d in plan.records if isinstance(d, BurstDecision)]
    assert [(d.container_id, d.old, d.new, d.op) for d in decisions] == [("a", 20000, 24000, UP),
                                                                         ("b", 20000, 24000, UP)]
    assert [len(d.writes) for d in decisions] == [2, 2]


def test_the_stage_keeps_its_token_bucket_in_the_state() -> None:
    slo = {"cpuBurstStrategy": {"policy": "auto", "cfsQuotaBurstPeriodSeconds": 10}}
    the_pod = pod("LS", containers=(container("a", "a", cpu_quota=20000, cpu_period=100000),))
    plan = cpu_burst.rhp_reconcile_cpu_burst(node=node(slo=slo), pods=(the_pod,), burst=burst_round(1.0, 0, usage=0))
    assert plan is not None
    (decision,) = [d for d in plan.records if isinstance(d, BurstDecision)]
    assert decision.state.usage == (0, 1.0)
    assert decision.state.bucket == (2000.0, 0.25 * 0.5 * 2000.0, 1.0), "a new bucket filled by the round's draw"
    assert decision.state.read_usage


def test_the_stage_leaves_out_what_it_does_not_decide() -> None:
    lsr = pod("LSR", containers=(container("a", "a", cpu_quota=20000, cpu_period=100000),))
    unread = pod("LS", uid="other", containers=(container("z", "z", cpu_quota=20000, cpu_period=100000),))
    plan = cpu_burst.rhp_reconcile_cpu_burst(node=node(slo=AUTO), pods=(lsr, unread), burst=burst_round(1.0, 0))
    assert plan is not None and plan.writes == [] and plan.records == []

"""rdt plugin: schemata math, class and pod groups, task moves, removal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.facts import ResctrlFacts
from hooks.plugins import rdt
from hooks.plugins.rdt import l3_mask, mb_value, rhp_reconcile_resctrl_groups, stale_pod_groups
from tests.hooks.plugins.factories import call, container, node, pod

INTEL = ResctrlFacts(cbm_mask="fff", cache_ids=(0, 1), vendor="intel", supported=True)
AMD = ResctrlFacts(cbm_mask="ffff", cache_ids=(0,), vendor="amd", supported=True)
ALL_ON = {"resourceQOSStrategy": {k: {"resctrlQOS": {"enable": True}} for k in ("lsrClass", "lsClass", "beClass")}}
ANN = "node.koordinator.sh/resctrl"


@pytest.mark.parametrize(
    ("cbm", "start", "end", "expected"),
    [
        pytest.param("fff", 0, 100, "fff", id="12 ways, whole cache"),
        pytest.param("fff", 0, 30, "f", id="BE default 0-30 of 12 ways is 4 ways"),
        pytest.param("fff", 20, 80, "3f8", id="20-80 of 12 ways: ways 3 to 9"),
        pytest.param("7ff", 20, 80, "1f8", id="20-80 of 11 ways"),
        pytest.param("fffff", 50, 100, "ffc00", id="upper half of 20 ways"),
    ],
)
def test_l3_mask(cbm: str, start: int, end: int, expected: str) -> None:
    assert l3_mask(cbm, start, end) == expected


@pytest.mark.parametrize(
    ("cbm", "start", "end", "reason"),
    [
        pytest.param("fff", 50, 50, "bad cache range", id="an end equal to the start is refused"),
        pytest.param("fff", 80, 20, "bad cache range", id="an end below the start is refused"),
        pytest.param("fff", 0, 101, "bad cache range", id="an end above 100 is refused"),
        pytest.param("fff", -1, 10, "bad cache range", id="a start below 0 is refused"),
        pytest.param("fff", -(2**63), 2**63 - 1, "bad cache range", id="int64 extremes are refused"),
        pytest.param("101", 0, 100, "not a contiguous", id="root cbm 0x101 has a hole: refused as koordlet does"),
        pytest.param("4", 0, 100, "not a contiguous", id="root cbm 0x4 does not start at way 0: refused"),
        pytest.param("ff0", 0, 100, "not a contiguous", id="root cbm 0xff0 does not start at way 0: refused"),
        pytest.param("0", 0, 100, "not a contiguous", id="root cbm 0 has no ways: refused"),
        pytest.param("1ffffffff", 0, 100, "1 to 8 hex", id="a root cbm wider than 32 bits is refused"),
        pytest.param("0xfff", 0, 100, "1 to 8 hex", id="a 0x prefix is not hex digits: refused"),
        pytest.param("f_ff", 0, 100, "1 to 8 hex", id="an underscore is not a hex digit: refused"),
        pytest.param("-fff", 0, 100, "1 to 8 hex", id="a sign is not a hex digit: refused"),
        pytest.param("", 0, 100, "1 to 8 hex", id="an empty root cbm is refused"),
        pytest.param("f" * 10**5, 0, 100, "1 to 8 hex", id="a huge root cbm is refused without parsing it"),
        pytest.param("\u0666", 0, 100, "1 to 8 hex", id="a non-ASCII digit is refused"),
    ],
)
def test_bad_cache_range_or_root_mask_is_refused_with_a_reason(cbm: str, start: int, end: int, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        l3_mask(cbm, start, end)


def test_root_mask_may_carry_the_kernels_newline() -> None:
    assert l3_mask("7ff\n", 0, 100) == "7ff"


@pytest.mark.parametrize(
    ("percent", "vendor", "expected"),
    [
        pytest.param(100, "intel", 100, id="intel 100"),
        pytest.param(25, "intel", 30, id="intel rounds up to tens"),
        pytest.param(1, "intel", 10, id="intel minimum"),
        pytest.param(100, "amd", 2048, id="amd 100 is unlimited"),
        pytest.param(50, "amd", 80, id="amd 50% of 160 Gbps"),
        pytest.param(33, "amd", 52, id="amd floors"),
    ],
)
def test_mb_value(percent: int, vendor: str, expected: int) -> None:
    assert mb_value(percent, vendor) == expected


@pytest.mark.parametrize("percent", [0, 101, "50"])
def test_bad_mb(percent: Any) -> None:
    with pytest.raises(ValueError):
        mb_value(percent, "intel")


@pytest.mark.parametrize(
    ("slo", "facts", "expected"),
    [
        pytest.param(ALL_ON, INTEL, {"LSR": "L3:0=fff;1=fff;\nMB:0=100;1=100;\n",
                                     "LS": "L3:0=fff;1=fff;\nMB:0=100;1=100;\n",
                                     "BE": "L3:0=f;1=f;\nMB:0=100;1=100;\n"}, id="defaults for all classes"),
        pytest.param({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 50,
                                                                         "mbaPercent": 50}}}}, AMD,
                     {"BE": "L3:0=ff;\nMB:0=80;\n"}, id="only enabled classes, AMD MB"),
        pytest.param({}, INTEL, {}, id="nothing enabled by default"),
    ],
)
def test_class_groups(slo: dict[str, Any], facts: ResctrlFacts, expected: dict[str, str]) -> None:
    plan = call(rdt, "rhp_reconcile_node", node=node(slo=slo, resctrl=facts))
    assert {w.path: w.value for w in plan.writes} == expected
    assert all(w.level == "resctrl" and w.file == "schemata" for w in plan.writes)


def _be(**resctrl: Any) -> dict[str, Any]:
    return {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, **resctrl}}}}


@pytest.mark.parametrize(
    ("slo", "facts", "expected", "refused"),
    [
        pytest.param(_be(catRangeStartPercent=-10, catRangeEndPercent=50), INTEL, "MB:0=100;1=100;\n", ["L3"],
                     id="a start below 0 is refused, not replaced by the default; MB is still written"),
        pytest.param(_be(catRangeEndPercent=150), INTEL, "MB:0=100;1=100;\n", ["L3"],
                     id="an end above 100 is refused"),
        pytest.param(_be(catRangeStartPercent=40, catRangeEndPercent=40), INTEL, "MB:0=100;1=100;\n", ["L3"],
                     id="an end equal to the start is refused"),
        pytest.param(_be(catRangeStartPercent=60, catRangeEndPercent=20), INTEL, "MB:0=100;1=100;\n", ["L3"],
                     id="an end below the start is refused"),
        pytest.param(_be(mbaPercent=0), INTEL, "L3:0=f;1=f;\n", ["MB"], id="mba 0 is refused; L3 is still written"),
        pytest.param(_be(mbaPercent=101), INTEL, "L3:0=f;1=f;\n", ["MB"], id="mba above 100 is refused"),
        pytest.param(_be(), ResctrlFacts(cbm_mask="101", cache_ids=(0,), supported=True), "MB:0=100;\n", ["L3"],
                     id="a root cbm 0x101 gives no L3 line"),
        pytest.param(_be(), ResctrlFacts(cbm_mask="4", cache_ids=(0,), supported=True), "MB:0=100;\n", ["L3"],
                     id="a root cbm 0x4 gives no L3 line"),
        pytest.param(_be(mbaPercent=-5), ResctrlFacts(cbm_mask="101", cache_ids=(0,), supported=True), None,
                     ["L3", "MB"], id="both refused: nothing is written"),
    ],
)
def test_class_group_refusals(slo: dict[str, Any], facts: ResctrlFacts, expected: str | None,
                              refused: list[str]) -> None:
    plan = call(rdt, "rhp_reconcile_node", node=node(slo=slo, resctrl=facts))
    assert [(w.path, w.value) for w in plan.writes] == ([("BE", expected)] if expected else [])
    assert [s.reason.split(": ")[1].split()[0] for s in plan.skipped] == refused
    assert all(s.reason.startswith("resctrl group BE: ") for s in plan.skipped)


@pytest.mark.parametrize("cbm", ["101", "4", "zz"])
def test_pod_group_with_a_bad_root_mask_is_a_skip(cbm: str) -> None:
    the_pod = pod("LS", uid="u1", annotations={ANN: '{"llc":{"schemata":{"range":[0,50]}}}'})
    plan = call(rdt, "rhp_pre_run_pod_sandbox", pod=the_pod,
                node=node(resctrl=ResctrlFacts(cbm_mask=cbm, cache_ids=(0,), supported=True)))
    assert plan.writes == [] and "root cbm mask" in plan.skipped[0].reason


def test_no_resctrl_is_one_skip() -> None:
    plan = call(rdt, "rhp_reconcile_node", node=node(slo=ALL_ON))
    assert plan.writes == [] and len(plan.skipped) == 1


POD_ANN = {"llc": {"schemata": {"range": [20, 80]}, "schemataPerCache": [{"cacheID": 0, "range": [20, 50]}]},
           "mb": {"schemata": {"percent": 20}, "schemataPerCache": [{"cacheID": 1, "percent": 40}]}}


@pytest.mark.parametrize(
    ("annotation", "expected", "skipped"),
    [
        pytest.param(json.dumps(POD_ANN), "L3:0=38;1=3f8;\nMB:0=20;1=40;\n", False, id="per-cache overrides"),
        pytest.param('{"mb":{"schemata":{"percent":25}}}', "MB:0=30;1=30;\n", False, id="mb only, intel rounding"),
        pytest.param('{"llc":{"schemata":{"range":[50,10]}}}', None, True, id="bad range"),
        pytest.param("{bad", None, True, id="bad JSON"),
        pytest.param("{}", None, True, id="neither llc nor mb"),
    ],
)
def test_pod_group_schemata(annotation: str, expected: str | None, skipped: bool) -> None:
    the_pod = pod("LS", uid="u1", annotations={ANN: annotation})
    plan = call(rdt, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node(resctrl=INTEL))
    assert [(w.path, w.value) for w in plan.writes] == ([("koordlet-u1", expected)] if expected else [])
    assert bool(plan.skipped) == skipped


@pytest.mark.parametrize(
    ("the_pod", "slo", "group"),
    [
        pytest.param(pod("LS", uid="u"), ALL_ON, "LS", id="LS container joins LS"),
        pytest.param(pod("LSE", uid="u", kube="Guaranteed"), ALL_ON, "LSR", id="LSE joins LSR"),
        pytest.param(pod(None, uid="u", kube="BestEffort"), ALL_ON, "BE", id="label-less BestEffort joins BE"),
        pytest.param(pod("LS", uid="u", annotations={ANN: '{"mb":{"schemata":{"percent":20}}}'}), ALL_ON,
                     "koordlet-u", id="pod-level group wins"),
        pytest.param(pod("LS", uid="u"), {}, None, id="class not enabled: no move"),
        pytest.param(pod("SYSTEM", uid="u"), ALL_ON, None, id="SYSTEM: no move"),
    ],
)
def test_task_moves_at_start(the_pod: Any, slo: dict[str, Any], group: str | None) -> None:
    plan = call(rdt, "rhp_post_start_container", pod=the_pod, container=container(cid="c1"),
                node=node(slo=slo, resctrl=INTEL))
    assert [(m.level, m.path, m.group) for m in plan.moves] == (
        [("container", f"{the_pod.cgroup_parent.strip('/')}/c1", group)] if group else [])
    sandbox = call(rdt, "rhp_post_run_pod_sandbox", pod=the_pod.replace(sandbox_id="sb"),
                   node=node(slo=slo, resctrl=INTEL))
    assert [m.group for m in sandbox.moves] == ([group] if group else [])


def test_pod_group_is_removed_with_the_pod() -> None:
    the_pod = pod("LS", uid="u", annotations={ANN: '{"mb":{"schemata":{"percent":20}}}'})
    plan = call(rdt, "rhp_post_remove_pod_sandbox", pod=the_pod, node=node(resctrl=INTEL))
    assert [(r.level, r.path) for r in plan.removals] == [("resctrl", "koordlet-u")]
    assert call(rdt, "rhp_post_remove_pod_sandbox", pod=pod("LS"), node=node()).removals == []


def test_bad_uid_never_names_a_group() -> None:
    the_pod = pod("LS", uid="../x", annotations={ANN: '{"mb":{"schemata":{"percent":20}}}'})
    plan = call(rdt, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node(resctrl=INTEL))
    assert plan.writes == [] and plan.skipped


def test_stale_pod_groups() -> None:
    assert stale_pod_groups(["LS", "koordlet-a", "koordlet-b"], {"a"}) == ["koordlet-b"]


def test_reconcile_resctrl_groups_removes_the_groups_of_pods_that_are_gone() -> None:
    live = pod("LS", uid="a")
    plan = rhp_reconcile_resctrl_groups(pods=(live,), resctrl_groups=("LS", "BE", "koordlet-a", "koordlet-b"))
    assert plan is not None and [(r.level, r.path) for r in plan.removals] == [("resctrl", "koordlet-b")]
    assert plan.writes == [] and plan.moves == []

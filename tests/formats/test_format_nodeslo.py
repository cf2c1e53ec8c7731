"""NodeSLO strategies with Koordinator's defaults."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, nodeslo
from koord_formats.keys import SLO
from tests.formats.hostile import call_total, json_values


def _class(class_key: str, section: str, **fields: Any) -> dict[str, Any]:
    return {SLO.RESOURCE_QOS_STRATEGY: {class_key: {section: fields}}}


@pytest.mark.parametrize(
    ("class_key", "group_identity"),
    [
        pytest.param(SLO.LSR_CLASS, 2, id="LSR defaults to 2"),
        pytest.param(SLO.LS_CLASS, 2, id="LS defaults to 2"),
        pytest.param(SLO.BE_CLASS, -1, id="BE defaults to -1"),
        pytest.param(SLO.SYSTEM_CLASS, 0, id="SYSTEM defaults to 0"),
    ],
)
def test_cpu_qos_defaults(class_key: str, group_identity: int) -> None:
    q = nodeslo.cpu_qos({}, class_key)
    assert q == nodeslo.CPUQOS(enable=False, group_identity=group_identity)


@pytest.mark.parametrize(
    ("spec", "expected", "problem"),
    [
        pytest.param(
            _class(SLO.BE_CLASS, SLO.CPU_QOS, enable=True, groupIdentity=1),
            nodeslo.CPUQOS(enable=True, group_identity=1),
            False,
            id="given values win",
        ),
        pytest.param(
            _class(SLO.BE_CLASS, SLO.CPU_QOS, enable="yes"),
            nodeslo.CPUQOS(enable=False, group_identity=-1),
            True,
            id="a string enable is reported and defaulted",
        ),
        pytest.param(
            _class(SLO.BE_CLASS, SLO.CPU_QOS, groupIdentity=7),
            nodeslo.CPUQOS(group_identity=-1),
            True,
            id="group identity outside -1..2 is reported and defaulted",
        ),
        pytest.param(
            _class(SLO.BE_CLASS, SLO.CPU_QOS, groupIdentity=1.0),
            nodeslo.CPUQOS(group_identity=-1),
            True,
            id="a float group identity is reported and defaulted",
        ),
        pytest.param(
            _class(SLO.BE_CLASS, SLO.CPU_QOS, groupIdentity=10**30),
            nodeslo.CPUQOS(group_identity=-1),
            True,
            id="a huge group identity is reported and defaulted",
        ),
    ],
)
def test_cpu_qos_values(spec: dict[str, Any], expected: nodeslo.CPUQOS, problem: bool) -> None:
    problems: list[str] = []
    assert nodeslo.cpu_qos(spec, SLO.BE_CLASS, problems) == expected
    assert bool(problems) is problem


def test_resctrl_defaults_per_class() -> None:
    assert nodeslo.resctrl_qos({}, SLO.BE_CLASS) == nodeslo.ResctrlQOS(False, 0, 30, 100)
    assert nodeslo.resctrl_qos({}, SLO.LSR_CLASS) == nodeslo.ResctrlQOS(False, 0, 100, 100)


@pytest.mark.parametrize(
    ("resctrl", "expected"),
    [
        pytest.param({"catRangeStartPercent": -10}, (-10, 30, 100), id="a start below 0 is kept"),
        pytest.param({"catRangeEndPercent": 150}, (0, 150, 100), id="an end above 100 is kept"),
        pytest.param({"catRangeStartPercent": 50, "catRangeEndPercent": 50}, (50, 50, 100), id="empty range kept"),
        pytest.param({"mbaPercent": 0}, (0, 30, 0), id="mba 0 is kept"),
        pytest.param({"mbaPercent": "50"}, (0, 30, 100), id="a string is not an integer: the default"),
    ],
)
def test_resctrl_values_out_of_range_are_reported_and_kept(resctrl: dict[str, Any],
                                                           expected: tuple[int, int, int]) -> None:
    problems: list[str] = []
    q = nodeslo.resctrl_qos({SLO.RESOURCE_QOS_STRATEGY: {SLO.BE_CLASS: {SLO.RESCTRL_QOS: resctrl}}}, SLO.BE_CLASS,
                            problems)
    assert (q.cat_range_start_percent, q.cat_range_end_percent, q.mba_percent) == expected
    assert problems
    with pytest.raises(FormatError):
        nodeslo.validate_node_slo({SLO.RESOURCE_QOS_STRATEGY: {SLO.BE_CLASS: {SLO.RESCTRL_QOS: resctrl}}})


def test_cpu_burst_defaults_and_pod_override() -> None:
    node_cfg = nodeslo.cpu_burst({SLO.CPU_BURST_STRATEGY: {SLO.POLICY: "auto"}})
    assert node_cfg == nodeslo.CPUBurstConfig(policy="auto")
    merged = nodeslo.cpu_burst_from_pod(node_cfg, '{"policy":"none","cpuBurstPercent":200}')
    assert merged == nodeslo.CPUBurstConfig(policy="none", cpu_burst_percent=200)
    problems: list[str] = []
    assert nodeslo.cpu_burst_from_pod(node_cfg, "[" * 3000, problems) == node_cfg
    assert problems


def test_cpu_suppress_defaults() -> None:
    assert nodeslo.cpu_suppress({}) == nodeslo.CPUSuppress(False, 65, "cpuset", None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(30, 30, id="a minimum in range is kept"),
        pytest.param(0, 0, id="a zero minimum is kept"),
        pytest.param(-1, None, id="a negative minimum means no minimum"),
        pytest.param(101, None, id="a minimum above 100 means no minimum"),
        pytest.param(10**30, None, id="a huge integer means no minimum"),
        pytest.param("20", None, id="a string means no minimum"),
        pytest.param(True, None, id="a boolean means no minimum"),
        pytest.param(20.5, None, id="a float means no minimum"),
    ],
)
def test_cpu_suppress_min_percent(value: object, expected: int | None) -> None:
    problems: list[str] = []
    spec = {SLO.RESOURCE_USED_THRESHOLD_WITH_BE: {SLO.CPU_SUPPRESS_MIN_PERCENT: value}}
    assert nodeslo.cpu_suppress(spec, problems).cpu_suppress_min_percent == expected
    assert bool(problems) == (expected is None)


def test_group_identity_enabled_follows_the_cpu_policy() -> None:
    spec = _class(SLO.LS_CLASS, SLO.CPU_QOS, enable=True)
    assert nodeslo.group_identity_enabled(spec)
    spec[SLO.RESOURCE_QOS_STRATEGY][SLO.POLICIES] = {SLO.CPU_POLICY: "coreSched"}
    assert not nodeslo.group_identity_enabled(spec)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(_class(SLO.LS_CLASS, SLO.CPU_QOS, groupIdentity=5), id="group identity out of range"),
        pytest.param({SLO.CPU_BURST_STRATEGY: {SLO.POLICY: "always"}}, id="an unknown burst policy"),
        pytest.param({SLO.RESOURCE_QOS_STRATEGY: {SLO.POLICIES: {SLO.CPU_POLICY: "x"}}}, id="an unknown cpu policy"),
        pytest.param({SLO.HOST_APPLICATIONS: {}}, id="host applications that are not a list"),
        pytest.param({SLO.CPU_BURST_STRATEGY: []}, id="a strategy that is not a mapping"),
    ],
)
def test_validate_refuses(spec: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        nodeslo.validate_node_slo(spec)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param({"name": "nginx", "qos": "LS"}, nodeslo.HostApplication("nginx", "LS"), id="name and qos"),
        pytest.param(
            {"name": "n", "cgroupPath": {"base": "KubepodsBurstable", "relativePath": "n"}},
            nodeslo.HostApplication("n", cgroup_path=nodeslo.HostCgroupPath("KubepodsBurstable", "", "n")),
            id="a cgroup path under the burstable directory",
        ),
        pytest.param(
            {"name": "n", "cgroupPath": {}},
            nodeslo.HostApplication("n", cgroup_path=nodeslo.HostCgroupPath()),
            id="an empty cgroup path is the cgroup root",
        ),
    ],
)
def test_host_application(entry: dict[str, Any], expected: nodeslo.HostApplication) -> None:
    assert nodeslo.host_application(entry) == expected


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"qos": "LS"}, id="no name"),
        pytest.param({"name": 5}, id="a name that is a number"),
        pytest.param({"name": "n", "cgroupPath": {"base": "Elsewhere"}}, id="an unknown base"),
        pytest.param({"name": "n", "cgroupPath": "x"}, id="a cgroup path that is a string"),
    ],
)
def test_host_application_refuses(entry: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        nodeslo.host_application(entry)


def test_validate_accepts_unknown_fields() -> None:
    nodeslo.validate_node_slo({"somethingNew": {"x": 1}, SLO.CPU_BURST_STRATEGY: {SLO.POLICY: "auto"}})


slo_paths = st.sampled_from(
    [
        (SLO.RESOURCE_QOS_STRATEGY,),
        (SLO.RESOURCE_QOS_STRATEGY, SLO.LSR_CLASS),
        (SLO.RESOURCE_QOS_STRATEGY, SLO.BE_CLASS, SLO.CPU_QOS),
        (SLO.RESOURCE_QOS_STRATEGY, SLO.LS_CLASS, SLO.RESCTRL_QOS),
        (SLO.RESOURCE_QOS_STRATEGY, SLO.POLICIES),
        (SLO.CPU_BURST_STRATEGY,),
        (SLO.RESOURCE_USED_THRESHOLD_WITH_BE,),
        (),
    ]
)
leaf_keys = st.sampled_from(
    [
        SLO.ENABLE,
        SLO.GROUP_IDENTITY,
        SLO.SCHED_IDLE,
        SLO.MBA_PERCENT,
        SLO.POLICY,
        SLO.CPU_POLICY,
        SLO.CPU_BURST_PERCENT,
        SLO.CPU_SUPPRESS_POLICY,
        SLO.CPU_SUPPRESS_MIN_PERCENT,
        SLO.HOST_APPLICATIONS,
    ]
)
hostile_values = st.one_of(
    json_values,
    st.sampled_from([10**400, float("inf"), float("nan"), -(10**30), True, "1e9999999", [[[[]]]]]),
)


@settings(max_examples=300, deadline=None)
@given(path=slo_paths, key=leaf_keys, value=hostile_values, pod_text=st.text(max_size=40) | json_values.map(json.dumps))
def test_nodeslo_accessors_are_total_and_bounded(path: tuple[str, ...], key: str, value: object, pod_text: str) -> None:
    spec: dict[str, Any] = {}
    cursor = spec
    for step in path:
        cursor = cursor.setdefault(step, {})
    cursor[key] = value
    for class_key in (SLO.LSR_CLASS, SLO.LS_CLASS, SLO.BE_CLASS, SLO.SYSTEM_CLASS):
        q = call_total(nodeslo.cpu_qos, spec, class_key, [])
        assert -1 <= q.group_identity <= 2
        r = call_total(nodeslo.resctrl_qos, spec, class_key, [])
        assert all(-(2**63) <= v < 2**63 for v in (r.cat_range_start_percent, r.cat_range_end_percent, r.mba_percent))
    call_total(nodeslo.cpu_policy, spec)
    call_total(nodeslo.cpu_suppress, spec, [])
    call_total(nodeslo.group_identity_enabled, spec)
    burst = call_total(nodeslo.cpu_burst, spec, [])
    call_total(nodeslo.cpu_burst_from_pod, burst, pod_text, [])
    call_total(nodeslo.validate_node_slo, spec)
    call_total(nodeslo.host_applications, spec, [])
    call_total(nodeslo.host_application, value)


# ---- memoryQOS ------------------------------------------------------------------------------------


def test_memory_qos_disabled_takes_the_close_values() -> None:
    """koordlet's NoneMemoryQOS when ``enable`` is false or absent, whatever else is given."""
    spec = _class(SLO.LS_CLASS, SLO.MEMORY_QOS, minLimitPercent=50, throttlingPercent=80)
    assert nodeslo.memory_qos(spec, SLO.LS_CLASS) == nodeslo.MemoryQOS()
    assert nodeslo.memory_qos({}, SLO.BE_CLASS) == nodeslo.MemoryQOS()


@pytest.mark.parametrize(
    ("class_key", "wmark"),
    [
        pytest.param(SLO.LSR_CLASS, (95, 20, -25), id="LSR"),
        pytest.param(SLO.LS_CLASS, (95, 20, -25), id="LS"),
        pytest.param(SLO.BE_CLASS, (95, 20, 50), id="BE"),
        pytest.param(SLO.SYSTEM_CLASS, (0, 50, 0), id="SYSTEM"),
    ],
)
def test_memory_qos_enabled_defaults(class_key: str, wmark: tuple[int, int, int]) -> None:
    """DefaultMemoryQOS: the percentages stay 0 (nothing protected unless asked for)."""
    got = nodeslo.memory_qos(_class(class_key, SLO.MEMORY_QOS, enable=True), class_key)
    assert got.enable
    assert (got.min_limit_percent, got.low_limit_percent, got.throttling_percent) == (0, 0, 0)
    assert (got.wmark_ratio, got.wmark_scale_permill, got.wmark_min_adj) == wmark


def test_memory_qos_values_and_out_of_range() -> None:
    spec = _class(SLO.LS_CLASS, SLO.MEMORY_QOS, enable=True, minLimitPercent=40, lowLimitPercent=60,
                  throttlingPercent=101, wmarkMinAdj=-26, priority="high")
    problems: list[str] = []
    got = nodeslo.memory_qos(spec, SLO.LS_CLASS, problems)
    assert (got.min_limit_percent, got.low_limit_percent, got.throttling_percent) == (40, 60, 0)
    assert got.wmark_min_adj == -25 and got.priority == 0
    assert len(problems) == 3
    with pytest.raises(FormatError, match="throttlingPercent"):
        nodeslo.validate_node_slo(spec)


def test_memory_qos_configured() -> None:
    assert not nodeslo.memory_qos_configured({})
    assert not nodeslo.memory_qos_configured(_class(SLO.LS_CLASS, SLO.CPU_QOS, enable=True))
    assert nodeslo.memory_qos_configured(_class(SLO.BE_CLASS, SLO.MEMORY_QOS, enable=False))


# ---- the pod annotation koordinator.sh/memoryQOS --------------------------------------------------------

_NODE_LS = nodeslo.MemoryQOS(enable=True, min_limit_percent=50, low_limit_percent=80, throttling_percent=90,
                             wmark_ratio=95, wmark_scale_permill=20, wmark_min_adj=-25)


@pytest.mark.parametrize(
    ("node_cfg", "text", "expected"),
    [
        pytest.param(_NODE_LS, None, _NODE_LS, id="no annotation: the node's class values"),
        pytest.param(_NODE_LS, "", _NODE_LS, id="empty: the node's class values"),
        pytest.param(_NODE_LS, '{"policy":"none"}', nodeslo.MemoryQOS(), id="none: memory QoS off for the pod"),
        pytest.param(_NODE_LS, '{"policy":"none","minLimitPercent":100}', nodeslo.MemoryQOS(),
                     id="none: the fields are not read"),
        pytest.param(_NODE_LS, "{}", _NODE_LS, id="no policy, no fields: default"),
        pytest.param(_NODE_LS, '{"policy":"default"}', _NODE_LS, id="default: the node's class values"),
        pytest.param(_NODE_LS, '{"policy":"","minLimitPercent":100}',
                     replace(_NODE_LS, min_limit_percent=100), id="'' is default: the pod's fields over the node's"),
        pytest.param(nodeslo.MemoryQOS(), '{"minLimitPercent":100}',
                     nodeslo.MemoryQOS(enable=True, min_limit_percent=100),
                     id="default on a disabled class: the pod's fields over the close values"),
        pytest.param(nodeslo.MemoryQOS(), '{"policy":"auto"}',
                     nodeslo.MemoryQOS(enable=True, wmark_ratio=95, wmark_scale_permill=20, wmark_min_adj=-25),
                     id="auto: the class's defaults even where the node disables it"),
        pytest.param(_NODE_LS, '{"policy":"auto","throttlingPercent":90,"lowLimitPercent":40}',
                     nodeslo.MemoryQOS(enable=True, low_limit_percent=40, throttling_percent=90, wmark_ratio=95,
                                       wmark_scale_permill=20, wmark_min_adj=-25),
                     id="auto with fields: the class's defaults, then the pod's fields"),
        pytest.param(_NODE_LS, '{"policy":"default","unknownKey":[1,2]}', _NODE_LS, id="unknown keys are ignored"),
    ],
)
def test_memory_qos_for_pod(node_cfg: nodeslo.MemoryQOS, text: str | None, expected: nodeslo.MemoryQOS) -> None:
    problems: list[str] = []
    assert nodeslo.memory_qos_for_pod(node_cfg, SLO.LS_CLASS, text, problems) == expected
    assert problems == []


def test_memory_qos_for_pod_auto_takes_each_class_default() -> None:
    be = nodeslo.memory_qos_for_pod(nodeslo.MemoryQOS(), SLO.BE_CLASS, '{"policy":"auto"}')
    assert (be.enable, be.wmark_min_adj, be.min_limit_percent) == (True, 50, 0)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{", id="not JSON"),
        pytest.param('"auto"', id="a string, not an object"),
        pytest.param('{"policy":"Auto"}', id="policies are lower case"),
        pytest.param('{"policy":"close"}', id="an unknown policy"),
        pytest.param('{"policy":7}', id="a number as policy"),
        pytest.param('{"minLimitPercent":101}', id="a percentage above 100"),
        pytest.param('{"lowLimitPercent":-1}', id="a negative percentage"),
        pytest.param('{"throttlingPercent":50.5}', id="a float"),
        pytest.param('{"minLimitPercent":true}', id="a boolean"),
        pytest.param('{"minLimitPercent":"50"}', id="a string number"),
        pytest.param('{"wmarkMinAdj":-26}', id="an Anolis field out of its range"),
        pytest.param("{" + '"a":1,' * 2000 + '"b":1}', id="over 4096 characters"),
    ],
)
def test_a_malformed_memory_qos_annotation_keeps_the_class_values(text: str) -> None:
    problems: list[str] = []
    assert nodeslo.memory_qos_for_pod(_NODE_LS, SLO.LS_CLASS, text, problems) == _NODE_LS
    assert len(problems) == 1 and "koordinator.sh/memoryQOS" in problems[0]
    with pytest.raises(FormatError):
        nodeslo.parse_pod_memory_qos(text)


def test_parse_pod_memory_qos_keeps_only_the_given_fields() -> None:
    got = nodeslo.parse_pod_memory_qos('{"policy":"auto","minLimitPercent":0,"priority":12}')
    assert got.policy == "auto" and dict(got.fields) == {"min_limit_percent": 0, "priority": 12}

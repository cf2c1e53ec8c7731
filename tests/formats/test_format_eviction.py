"""NodeSLO eviction fields (``nodeslo.eviction``) and the pod annotation
``koordinator.sh/eviction-policy`` (``pod.parse_eviction_policy``): defaults, ranges, and
hostile input that must come back as a reported problem or a ``FormatError``, never anything
else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, keys, nodeslo, pod
from koord_formats.keys import SLO
from tests.formats.hostile import HOLE, call_total, fill, fragments, json_values


def _spec(**fields: Any) -> dict[str, Any]:
    return {SLO.RESOURCE_USED_THRESHOLD_WITH_BE: fields}


def test_eviction_defaults_follow_koordinator() -> None:
    cfg = nodeslo.eviction({})
    assert cfg == nodeslo.Eviction(
        enable=False,
        memory_evict_threshold_percent=70,
        memory_evict_lower_percent=68,
        cpu_evict_be_usage_threshold_percent=90,
        cpu_evict_policy=keys.CPU_EVICT_POLICY_REAL_LIMIT,
    )
    assert not cfg.cpu_evict_enabled


@pytest.mark.parametrize(
    ("fields", "expected", "problem"),
    [
        pytest.param({"memoryEvictThresholdPercent": 80}, {"memory_evict_threshold_percent": 80,
                     "memory_evict_lower_percent": 78}, False,
                     id="the lower percentage defaults to the threshold minus two"),
        pytest.param({"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 50},
                     {"memory_evict_threshold_percent": 80, "memory_evict_lower_percent": 50}, False,
                     id="a given lower percentage below the threshold is kept"),
        pytest.param({"memoryEvictThresholdPercent": 1}, {"memory_evict_threshold_percent": 1,
                     "memory_evict_lower_percent": 0}, False,
                     id="the default lower percentage never goes below zero"),
        pytest.param({"memoryEvictThresholdPercent": 60, "memoryEvictLowerPercent": 60},
                     {"memory_evict_threshold_percent": 60, "memory_evict_lower_percent": 58}, True,
                     id="a lower percentage not below the threshold is reported and defaulted"),
        pytest.param({"memoryEvictThresholdPercent": 101}, {"memory_evict_threshold_percent": 70}, True,
                     id="a threshold above 100 is reported and defaulted"),
        pytest.param({"memoryEvictThresholdPercent": "80"}, {"memory_evict_threshold_percent": 70}, True,
                     id="a string threshold is reported and defaulted"),
        pytest.param({"memoryEvictThresholdPercent": True}, {"memory_evict_threshold_percent": 70}, True,
                     id="a boolean threshold is reported and defaulted"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 40, "cpuEvictBESatisfactionUpperPercent": 80},
                     {"cpu_evict_be_satisfaction_lower_percent": 40, "cpu_evict_be_satisfaction_upper_percent": 80},
                     False, id="both satisfaction bounds in range turn CPU eviction on"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 60, "cpuEvictBESatisfactionUpperPercent": 60},
                     {"cpu_evict_be_satisfaction_lower_percent": 60, "cpu_evict_be_satisfaction_upper_percent": 60},
                     False, id="equal bounds at the lower bound's maximum are valid"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 40}, {"cpu_evict_be_satisfaction_lower_percent": 40},
                     False, id="one bound alone keeps CPU eviction off"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 61, "cpuEvictBESatisfactionUpperPercent": 80},
                     {"cpu_evict_be_satisfaction_upper_percent": 80}, True,
                     id="a lower bound above 60 is reported and left unset"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 0, "cpuEvictBESatisfactionUpperPercent": 80},
                     {"cpu_evict_be_satisfaction_upper_percent": 80}, True,
                     id="a lower bound of zero is reported and left unset"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 40, "cpuEvictBESatisfactionUpperPercent": 100},
                     {"cpu_evict_be_satisfaction_lower_percent": 40}, True,
                     id="an upper bound of 100 is reported and left unset"),
        pytest.param({"cpuEvictBESatisfactionLowerPercent": 50, "cpuEvictBESatisfactionUpperPercent": 40},
                     {}, True, id="an upper bound below the lower one turns both off"),
        pytest.param({"cpuEvictBEUsageThresholdPercent": 70, "cpuEvictTimeWindowSeconds": 30},
                     {"cpu_evict_be_usage_threshold_percent": 70, "cpu_evict_time_window_seconds": 30}, False,
                     id="usage threshold and time window are read"),
        pytest.param({"cpuEvictTimeWindowSeconds": 0}, {}, True, id="a zero time window is reported and left unset"),
        pytest.param({"cpuEvictTimeWindowSeconds": 10**30}, {}, True,
                     id="a huge time window is reported and left unset"),
        pytest.param({"cpuEvictPolicy": "evictByAllocatable"}, {"cpu_evict_policy": "evictByAllocatable"}, False,
                     id="the allocatable policy is read"),
        pytest.param({"cpuEvictPolicy": "x" * 10000}, {}, True, id="an unknown policy is reported and defaulted"),
        pytest.param({"evictEnabledPriorityThreshold": 5999}, {"evict_enabled_priority_threshold": 5999}, False,
                     id="the priority threshold is read"),
        pytest.param({"enable": "true"}, {}, True, id="a string enable is reported and defaulted"),
    ],
)
def test_eviction_fields(fields: dict[str, Any], expected: dict[str, Any], problem: bool) -> None:
    problems: list[str] = []
    cfg = nodeslo.eviction(_spec(**fields), problems)
    want = nodeslo.Eviction()
    for name in nodeslo.Eviction.__slots__:
        assert getattr(cfg, name) == expected.get(name, getattr(want, name)), name
    assert bool(problems) == problem, problems
    assert all(len(p) < 400 for p in problems)


def test_validate_refuses_bad_eviction_fields() -> None:
    with pytest.raises(FormatError, match="cpuEvictBESatisfaction"):
        nodeslo.validate_node_slo(_spec(cpuEvictBESatisfactionLowerPercent=50, cpuEvictBESatisfactionUpperPercent=40))


@pytest.mark.parametrize(
    ("text", "feature", "allowed"),
    [
        pytest.param(None, "BEMemoryEvict", True, id="no annotation allows every feature"),
        pytest.param('["BEMemoryEvict","MemoryEvict"]', "BEMemoryEvict", True, id="a listed feature is allowed"),
        pytest.param('["BEMemoryEvict"]', "BECPUEvict", False, id="a feature left out is not allowed"),
        pytest.param("[]", "BEMemoryEvict", False, id="an empty list allows no feature"),
        pytest.param('["Unknown"]', "BECPUEvict", False, id="unknown names allow nothing"),
    ],
)
def test_eviction_policy(text: str | None, feature: str, allowed: bool) -> None:
    annotations = {} if text is None else {keys.ANNOTATION_EVICTION_POLICY: text}
    assert pod.eviction_allowed(annotations, feature) is allowed


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('"BEMemoryEvict"', id="a string instead of a list"),
        pytest.param('{"BEMemoryEvict":true}', id="an object instead of a list"),
        pytest.param("[1]", id="a number in the list"),
        pytest.param("BEMemoryEvict", id="not JSON"),
        pytest.param("[" + ",".join(['"a"'] * 33) + "]", id="more than 32 names"),
        pytest.param('["' + "a" * 300 + '"]', id="a name longer than 253 characters"),
        pytest.param("[" * 40 + "]" * 40, id="nesting deeper than the bound"),
        pytest.param('["a"' + " " * 5000 + "]", id="text longer than 4 KiB"),
    ],
)
def test_eviction_policy_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        pod.parse_eviction_policy(text)
    with pytest.raises(FormatError):
        pod.eviction_allowed({keys.ANNOTATION_EVICTION_POLICY: text}, "BEMemoryEvict")


@settings(max_examples=150, deadline=None)
@given(fragment=fragments, template=st.sampled_from([HOLE, f"[{HOLE}]", f'["BEMemoryEvict",{HOLE}]']))
def test_eviction_policy_is_total_and_bounded(fragment: str, template: str) -> None:
    result = call_total(pod.parse_eviction_policy, fill(template, fragment))
    assert result is None or isinstance(result, frozenset)


_FIELDS = [
    SLO.ENABLE,
    SLO.MEMORY_EVICT_THRESHOLD_PERCENT,
    SLO.MEMORY_EVICT_LOWER_PERCENT,
    SLO.CPU_EVICT_BE_SATISFACTION_LOWER_PERCENT,
    SLO.CPU_EVICT_BE_SATISFACTION_UPPER_PERCENT,
    SLO.CPU_EVICT_BE_USAGE_THRESHOLD_PERCENT,
    SLO.CPU_EVICT_TIME_WINDOW_SECONDS,
    SLO.CPU_EVICT_POLICY,
    SLO.EVICT_ENABLED_PRIORITY_THRESHOLD,
]
_hostile_values = st.one_of(
    json_values,
    st.integers(),
    st.sampled_from([10**400, -(10**400), float("inf"), float("nan"), "9" * 5000, [[[[]]]], {"a": {"b": {}}}]),
)


@settings(max_examples=150, deadline=None)
@given(
    section=st.one_of(st.dictionaries(st.sampled_from(_FIELDS), _hostile_values, max_size=6), _hostile_values),
)
def test_eviction_is_total_and_bounded(section: Any) -> None:
    problems: list[str] = []
    cfg = call_total(nodeslo.eviction, {SLO.RESOURCE_USED_THRESHOLD_WITH_BE: section}, problems)
    assert isinstance(cfg, nodeslo.Eviction)
    assert 0 <= cfg.memory_evict_lower_percent < max(cfg.memory_evict_threshold_percent, 1) or (
        cfg.memory_evict_threshold_percent == 0 and cfg.memory_evict_lower_percent == 0
    )
    if cfg.cpu_evict_enabled:
        assert cfg.cpu_evict_be_satisfaction_lower_percent is not None
        assert cfg.cpu_evict_be_satisfaction_upper_percent is not None
        assert 0 < cfg.cpu_evict_be_satisfaction_lower_percent <= 60
        assert cfg.cpu_evict_be_satisfaction_lower_percent <= cfg.cpu_evict_be_satisfaction_upper_percent < 100
    assert cfg.cpu_evict_policy in keys.CPU_EVICT_POLICIES
    assert all(len(p) < 400 for p in problems)

"""Node and NodeResourceTopology CPU annotations."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, node
from tests.formats.hostile import HOLE, call_total, fill, fragments


@pytest.mark.parametrize(
    ("text", "cpuset", "exclusive"),
    [
        pytest.param('{"cpuset":"0-1"}', frozenset({0, 1}), True, id="exclusive by default, as Koordinator"),
        pytest.param('{"cpuset":"0-1","cpusetExclusive":true}', frozenset({0, 1}), True, id="explicitly exclusive"),
        pytest.param('{"cpuset":"0-1","cpusetExclusive":false}', frozenset(), False, id="explicitly shared"),
        pytest.param("{}", frozenset(), True, id="no cpuset withholds nothing"),
    ],
)
def test_system_qos_resource(text: str, cpuset: frozenset[int], exclusive: bool) -> None:
    res = node.parse_system_qos_resource(text)
    assert res.cpuset_exclusive is exclusive
    assert res.exclusive_cpus == cpuset


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"cpuset":5}', id="a cpuset that is a number"),
        pytest.param('{"cpuset":"0-1","cpusetExclusive":"yes"}', id="exclusive that is a string"),
        pytest.param('{"cpuset":"0-1","cpusetExclusive":1}', id="exclusive that is a number"),
    ],
)
def test_system_qos_resource_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        node.parse_system_qos_resource(text)


def test_node_reservation() -> None:
    res = node.parse_node_reservation('{"resources":{"cpu":"2"},"reservedCPUs":"0-1","applyPolicy":"ReservedCPUsOnly"}')
    assert res.reserved_cpus == frozenset({0, 1})
    assert res.resources == {"cpu": 2}
    assert res.apply_policy == "ReservedCPUsOnly"
    assert node.parse_node_reservation("{}").apply_policy == "Default"


def test_kubelet_cpu_manager_policy() -> None:
    pol = node.parse_kubelet_cpu_manager_policy(
        '{"policy":"static","options":{"full-pcpus-only":"true"},"reservedCPUs":"0-1"}'
    )
    assert pol.policy == "static"
    assert pol.options == {"full-pcpus-only": "true"}
    assert pol.reserved_cpus == frozenset({0, 1})
    assert node.parse_kubelet_cpu_manager_policy('{"policy":""}').policy == "none"


def test_share_pools_round_trip() -> None:
    text = '[{"socket":0,"node":0,"cpuset":"1-5,8-23"},{"socket":1,"node":1,"cpuset":"32-47"}]'
    pools = node.parse_share_pools(text)
    assert [p.node for p in pools] == [0, 1]
    assert node.format_share_pools(pools) == text


def test_pod_cpu_allocs() -> None:
    allocs = node.parse_pod_cpu_allocs(
        '[{"namespace":"a","name":"b","uid":"u","cpuset":"2-3","managedByKubelet":true},{"uid":"v","cpuset":"4"}]'
    )
    assert [(a.uid, a.cpus, a.managed_by_kubelet) for a in allocs] == [
        ("u", frozenset({2, 3}), True),
        ("v", frozenset({4}), False),
    ]


@pytest.mark.parametrize(
    ("text", "ratio"),
    [
        pytest.param("1.20", Fraction(6, 5), id="a ratio above one is read as an exact fraction"),
        pytest.param("1", Fraction(1), id="a whole number is read"),
        pytest.param("1.5", Fraction(3, 2), id="one decimal is enough"),
        pytest.param("5.00", Fraction(5), id="five is the largest ratio"),
        pytest.param(" 1.25 ", Fraction(5, 4), id="surrounding spaces are ignored"),
    ],
)
def test_cpu_normalization_ratio(text: str, ratio: Fraction) -> None:
    assert node.parse_cpu_normalization_ratio(text) == ratio


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0", id="zero"),
        pytest.param("-1", id="negative"),
        pytest.param("inf", id="infinity"),
        pytest.param("nan", id="not a number"),
        pytest.param("NaN", id="not a number in capitals"),
        pytest.param("1e400", id="an exponent"),
        pytest.param("1e0", id="a harmless exponent"),
        pytest.param("\u0661.2", id="a non-ASCII digit"),
        pytest.param("\uff11.25", id="a full-width digit"),
        pytest.param("5.01", id="just above five"),
        pytest.param("0.99", id="just below one"),
        pytest.param("1.255", id="a third decimal"),
        pytest.param("1.", id="a point without decimals"),
        pytest.param("1" * 33, id="more than 32 characters"),
        pytest.param("1" * 1_000_000, id="a megabyte of digits"),
        pytest.param("", id="empty"),
        pytest.param(1.25, id="a number instead of text"),
    ],
)
def test_cpu_normalization_ratio_refuses(text: object) -> None:
    with pytest.raises(FormatError):
        node.parse_cpu_normalization_ratio(text)


@pytest.mark.parametrize(
    ("text", "record"),
    [
        pytest.param("200000/160000", (200000, 160000), id="kubelet's quota and the applied one"),
        pytest.param(node.format_cpu_quota_record(5, 3), (5, 3), id="the formatter's text reads back"),
    ],
)
def test_cpu_quota_record(text: str, record: tuple[int, int]) -> None:
    assert node.parse_cpu_quota_record(text) == record


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0/100", id="a zero quota"),
        pytest.param("-1/100", id="a negative quota"),
        pytest.param("100", id="one number"),
        pytest.param("100/100/100", id="three numbers"),
        pytest.param("1" * 13 + "/1", id="thirteen digits"),
        pytest.param("\u0661/1", id="a non-ASCII digit"),
        pytest.param("1e9/1", id="an exponent"),
        pytest.param(None, id="not a string"),
    ],
)
def test_cpu_quota_record_refuses(text: object) -> None:
    with pytest.raises(FormatError):
        node.parse_cpu_quota_record(text)


PARSERS: list[Any] = [
    pytest.param(
        node.parse_system_qos_resource,
        [HOLE, '{"cpuset":HOLE}', '{"cpuset":"0-1","cpusetExclusive":HOLE}'],
        id="system-qos-resource",
    ),
    pytest.param(
        node.parse_node_reservation,
        [HOLE, '{"reservedCPUs":HOLE}', '{"resources":HOLE}', '{"resources":{"cpu":HOLE}}', '{"applyPolicy":HOLE}'],
        id="reservation",
    ),
    pytest.param(
        node.parse_kubelet_cpu_manager_policy,
        [HOLE, '{"policy":HOLE}', '{"options":HOLE}', '{"reservedCPUs":HOLE}'],
        id="kubelet-cpu-manager-policy",
    ),
    pytest.param(
        node.parse_share_pools,
        [HOLE, "[HOLE]", '[{"socket":HOLE,"node":HOLE,"cpuset":"0"}]', '[{"cpuset":HOLE}]'],
        id="cpu-shared-pools",
    ),
    pytest.param(
        node.parse_pod_cpu_allocs,
        [HOLE, "[HOLE]", '[{"uid":HOLE,"cpuset":HOLE}]', '[{"cpuset":"1","managedByKubelet":HOLE}]'],
        id="pod-cpu-allocs",
    ),
    pytest.param(node.parse_cpu_normalization_ratio, [HOLE], id="cpu-normalization-ratio"),
    pytest.param(node.parse_cpu_quota_record, [HOLE, "HOLE/1", "1/HOLE"], id="cpu-quota-normalization"),
]


@pytest.mark.parametrize(("parse", "templates"), PARSERS)
@settings(max_examples=200, deadline=None)
@given(data=st.data(), fragment=fragments)
def test_node_annotation_parsers_are_total_and_bounded(
    parse: Callable[[str], object], templates: list[str], data: st.DataObject, fragment: str
) -> None:
    call_total(parse, fill(data.draw(st.sampled_from(templates)), fragment))

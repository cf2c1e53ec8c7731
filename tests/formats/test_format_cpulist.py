"""The kernel CPU list format: the one parser and formatter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, cpulist
from tests.formats.hostile import call_total


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", frozenset(), id="empty is the empty set"),
        pytest.param("  \n", frozenset(), id="blank is the empty set"),
        pytest.param("0-3,8", frozenset({0, 1, 2, 3, 8}), id="a range and a single id"),
        pytest.param("5", frozenset({5}), id="one id"),
        pytest.param("0-3\n", frozenset({0, 1, 2, 3}), id="a sysfs file's trailing newline"),
        pytest.param("0 - 1, 4", frozenset({0, 1, 4}), id="spaces around elements"),
        pytest.param("3,1,2", frozenset({1, 2, 3}), id="unsorted ids"),
        pytest.param("0-16383", frozenset(range(16384)), id="every CPU up to the limit"),
        pytest.param(",".join(map(str, range(16384))), frozenset(range(16384)), id="every CPU listed one by one"),
    ],
)
def test_parse_cpu_list(text: str, expected: frozenset[int]) -> None:
    assert cpulist.parse_cpu_list(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0-16383," * 20000, id="a 160 KB list is refused by its size"),
        pytest.param("0-16383,0-16383", id="overlapping ranges naming more CPUs than exist"),
        pytest.param("0-16384", id="an id above the limit"),
        pytest.param("3-1", id="a descending range"),
        pytest.param("0-", id="an open range"),
        pytest.param("-1", id="a negative id"),
        pytest.param("1,,2", id="an empty element"),
        pytest.param("a", id="a letter"),
        pytest.param("\u0663", id="an Arabic-Indic digit"),
        pytest.param("\u00b2", id="a superscript digit"),
        pytest.param("0x1", id="hex"),
        pytest.param("9999999", id="an id with too many digits"),
    ],
)
def test_parse_cpu_list_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        cpulist.parse_cpu_list(text)


def test_parse_cpu_list_refuses_non_strings() -> None:
    with pytest.raises(FormatError):
        cpulist.parse_cpu_list(5)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        pytest.param(frozenset(), "", id="the empty set"),
        pytest.param(frozenset({0, 1, 2, 3, 8}), "0-3,8", id="runs collapse into ranges"),
        pytest.param([5, 3, 4, 4], "3-5", id="duplicates and order do not matter"),
    ],
)
def test_format_cpu_list(cpus: frozenset[int], text: str) -> None:
    assert cpulist.format_cpu_list(cpus) == text


cpu_list_like = st.one_of(
    st.text(alphabet="0123456789,- \n\u0663", max_size=60),
    st.lists(st.integers(min_value=0, max_value=20000), max_size=20).map(lambda ids: ",".join(map(str, ids))),
    st.builds(lambda text, n: text * n, st.sampled_from(["0-16383,", "1,", "0-1,"]), st.integers(1, 40000)),
    st.text(max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(text=cpu_list_like)
def test_parse_cpu_list_is_total_and_bounded(text: str) -> None:
    result = call_total(cpulist.parse_cpu_list, text)
    if result is not None:
        assert all(0 <= c <= cpulist.MAX_CPU_ID for c in result)


@settings(max_examples=200, deadline=None)
@given(cpus=st.frozensets(st.integers(min_value=0, max_value=cpulist.MAX_CPU_ID), max_size=200))
def test_cpu_list_round_trips(cpus: frozenset[int]) -> None:
    assert cpulist.parse_cpu_list(cpulist.format_cpu_list(cpus)) == cpus

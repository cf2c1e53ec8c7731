"""Kubernetes quantities: the one parser (exact ``Fraction``) and the canonical formatters."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, quantity
from tests.formats.hostile import call_total


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("4", Fraction(4), id="whole cores"),
        pytest.param("500m", Fraction(1, 2), id="milli suffix"),
        pytest.param("1.5", Fraction(3, 2), id="decimal fraction"),
        pytest.param(".5", Fraction(1, 2), id="fraction without a leading digit"),
        pytest.param("4Gi", Fraction(4 * 2**30), id="binary suffix"),
        pytest.param("1k", Fraction(1000), id="decimal SI suffix"),
        pytest.param("1E", Fraction(10**18), id="a lone E is the exa suffix"),
        pytest.param("1e3", Fraction(1000), id="an exponent"),
        pytest.param("1.5E-2", Fraction(3, 200), id="a negative exponent"),
        pytest.param("100n", Fraction(1, 10**7), id="nano suffix"),
        pytest.param("+7", Fraction(7), id="explicit plus sign"),
        pytest.param("-0", Fraction(0), id="negative zero is zero"),
        pytest.param("8Ei", Fraction(2**63), id="the largest value allowed"),
        pytest.param(1000, Fraction(1000), id="a JSON integer"),
        pytest.param(0.25, Fraction(1, 4), id="a JSON float"),
        pytest.param(0.1, Fraction(1, 10), id="a JSON float is read as its decimal text"),
    ],
)
def test_parse_quantity(text: object, expected: Fraction) -> None:
    assert quantity.parse_quantity(text) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1e9999999", id="huge exponent"),
        pytest.param("1e500000", id="the exponent that froze the extender"),
        pytest.param("1e-9999999", id="huge negative exponent"),
        pytest.param("9Ei", id="above 2 to the 63"),
        pytest.param("1" * 41, id="more digits than allowed"),
        pytest.param("1" * 65, id="longer than the text bound"),
        pytest.param("\u0661\u0662", id="Arabic-Indic digits"),
        pytest.param("\u00b2", id="superscript two"),
        pytest.param("-1", id="negative"),
        pytest.param("1e3Ki", id="exponent and suffix together"),
        pytest.param("1Q", id="unknown suffix"),
        pytest.param("", id="empty"),
        pytest.param(".", id="only a point"),
        pytest.param("1\n", id="a trailing newline"),
        pytest.param(True, id="a boolean"),
        pytest.param(None, id="null"),
        pytest.param([1], id="a list"),
        pytest.param(float("inf"), id="an infinite float"),
        pytest.param(1e300, id="a float above the range"),
        pytest.param(2**64, id="an integer above the range"),
        pytest.param(-5, id="a negative integer"),
    ],
)
def test_parse_quantity_refuses(value: object) -> None:
    with pytest.raises(FormatError):
        quantity.parse_quantity(value)


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        pytest.param("1", 1000, id="one core"),
        pytest.param("0.0001", 1, id="sub-milli rounds up"),
        pytest.param("250m", 250, id="milli stays"),
    ],
)
def test_parse_cpu_milli(value: str, milli: int) -> None:
    assert quantity.parse_cpu_milli(value) == milli


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        pytest.param(8 * 2**30, "8Gi", id="gibibytes"),
        pytest.param(1536 * 2**20, "1536Mi", id="the largest exact suffix"),
        pytest.param(1000, "1000", id="no binary suffix divides"),
        pytest.param(0, "0", id="zero"),
    ],
)
def test_format_bytes(amount: int, text: str) -> None:
    assert quantity.format_bytes(amount) == text
    assert quantity.parse_bytes(text) == amount


@pytest.mark.parametrize(
    ("milli", "text"),
    [pytest.param(4000, "4", id="whole cores"), pytest.param(1500, "1500m", id="milli cores")],
)
def test_format_milli_cpu(milli: int, text: str) -> None:
    assert quantity.format_milli_cpu(milli) == text
    assert quantity.parse_cpu_milli(text) == milli


quantity_like = st.one_of(
    st.text(alphabet="0123456789.eE+-kMGTPEinmu\u0661 ", max_size=30),
    st.from_regex(
        r"[+-]?[0-9]{0,45}(\.[0-9]{0,45})?([eE][+-]?[0-9]{1,9})?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?", fullmatch=True
    ),
    st.integers(),
    st.floats(),
    st.none(),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(value=quantity_like)
def test_parse_quantity_is_total_and_bounded(value: object) -> None:
    result = call_total(quantity.parse_quantity, value)
    if result is not None:
        assert 0 <= result <= quantity.MAX_QUANTITY


@settings(max_examples=100, deadline=None)
@given(milli=st.integers(min_value=0, max_value=10**12))
def test_milli_cpu_round_trips(milli: int) -> None:
    assert quantity.parse_cpu_milli(quantity.format_milli_cpu(milli)) == milli


@settings(max_examples=100, deadline=None)
@given(amount=st.integers(min_value=0, max_value=2**62))
def test_bytes_round_trip(amount: int) -> None:
    assert quantity.parse_bytes(quantity.format_bytes(amount)) == amount

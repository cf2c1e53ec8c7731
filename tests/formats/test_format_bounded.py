"""The bounded JSON loader and the memo every annotation parser is built on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, bounded
from tests.formats.hostile import FRAGMENTS, call_total, fragments


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('{"a":[1,2,{"b":null}]}', {"a": [1, 2, {"b": None}]}, id="an ordinary document decodes"),
        pytest.param(
            '"[[[[[[[[[[[[[[[[[[[[[["', "[[[[[[[[[[[[[[[[[[[[[[", id="brackets inside a string do not count as depth"
        ),
        pytest.param(
            '["a\\"[[[[[[[[[[[[[[[[[[[[["]', ['a"[[[[[[[[[[[[[[[[[[[[['], id="an escaped quote does not end the string"
        ),
        pytest.param("[" * 16 + "]" * 16, eval("[" * 16 + "]" * 16), id="sixteen levels are allowed"),
        pytest.param("1.5", 1.5, id="a finite float decodes"),
        pytest.param("9" * 19, int("9" * 19), id="nineteen digits are allowed"),
    ],
)
def test_load_json_accepts(text: str, expected: object) -> None:
    assert bounded.load_json(text, "doc") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[" * 17 + "]" * 17, "nested more than 16", id="seventeen levels are refused"),
        pytest.param("[" * 3000, "nested more than 16", id="three thousand open brackets are refused before decoding"),
        pytest.param("[}", "not valid JSON", id="mismatched brackets are refused"),
        pytest.param("[" * 20 + "}" * 20, "nested", id="many mismatched brackets are refused by the depth scan"),
        pytest.param("1e400", "out of range", id="a float that overflows is refused"),
        pytest.param("[Infinity]", "Infinity", id="Infinity is refused"),
        pytest.param("NaN", "NaN", id="NaN is refused"),
        pytest.param("9" * 20, "more than 19 digits", id="twenty digits are refused before decoding"),
        pytest.param("x" * (bounded.MAX_ANNOTATION_CHARS + 1), "characters", id="text above the size bound is refused"),
        pytest.param("{", "not valid JSON", id="truncated JSON is refused"),
    ],
)
def test_load_json_refuses(text: str, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        bounded.load_json(text, "doc")


def test_load_json_refuses_non_strings() -> None:
    with pytest.raises(FormatError, match="expected a string"):
        bounded.load_json(b"{}", "doc")


@settings(max_examples=300, deadline=None)
@given(fragment=fragments, repeat=st.integers(min_value=1, max_value=3))
def test_load_json_is_total_and_bounded(fragment: str, repeat: int) -> None:
    call_total(bounded.load_json, ",".join([fragment] * repeat), "doc")


@pytest.mark.parametrize("fragment", [pytest.param(f, id=f"fragment {i}") for i, f in enumerate(FRAGMENTS)])
def test_every_hostile_fragment_is_handled(fragment: str) -> None:
    call_total(bounded.load_json, fragment, "doc")


def test_memo_parses_each_text_once_and_remembers_failures() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=8)
    def parse(text: str) -> int:
        calls.append(text)
        if text == "bad":
            raise FormatError("bad text")
        return len(text)

    assert parse("abc") == 3
    assert parse("abc") == 3
    for _ in range(2):
        with pytest.raises(FormatError, match="bad text"):
            parse("bad")
    assert calls == ["abc", "bad"]


def test_memo_skips_long_texts() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=8, max_chars=4)
    def parse(text: str) -> int:
        calls.append(text)
        return len(text)

    parse("long text")
    parse("long text")
    assert len(calls) == 2


def test_memo_skips_heavy_results() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=8, weigh=len, max_weight=3)
    def parse(text: str) -> str:
        calls.append(text)
        return text * 2

    parse("a")
    parse("a")
    parse("abc")
    parse("abc")
    assert calls == ["a", "abc", "abc"]


def test_memo_evicts_the_least_recently_used() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=2)
    def parse(text: str) -> str:
        calls.append(text)
        return text

    for text in ("a", "b", "a", "c", "a", "b"):
        parse(text)
    assert calls == ["a", "b", "c", "b"]


def test_memo_keeps_long_texts_within_their_budget() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=8, max_chars=4, large_chars=40)
    def parse(text: str) -> int:
        calls.append(text)
        return len(text)

    for text in ("long text", "long text", "other text", "long text", "x" * 11, "x" * 11):
        parse(text)
    assert calls == ["long text", "other text", "x" * 11, "x" * 11]  # 11 > 40 // 4: never kept


def test_memo_of_long_texts_evicts_to_stay_within_its_budget() -> None:
    calls: list[str] = []

    @bounded.memo_by_text(maxsize=8, max_chars=2, large_chars=20)
    def parse(text: str) -> int:
        calls.append(text)
        return len(text)

    for text in ("aaaaa", "bbbbb", "ccccc", "ddddd", "eeeee", "aaaaa", "eeeee"):
        parse(text)
    assert calls == ["aaaaa", "bbbbb", "ccccc", "ddddd", "eeeee", "aaaaa"]  # 25 chars > 20: "aaaaa" went

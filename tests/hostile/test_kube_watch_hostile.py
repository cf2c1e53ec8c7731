"""Hostile replies from the API server to the one list-and-watch (``rhp_kube.watch``): every
line is bounded before it is decoded; oversized, garbled or malformed lines and list replies are
skipped or refused, counted, and never end the watch; the store still converges."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rhp_kube.watch import SKIPPED, WatchOptions  # noqa: E402
from tests.rhp_kube.test_watch import FAST, converged, running, wait_for  # noqa: E402


def _skipped(reason: str) -> float:
    return float(SKIPPED.labels("test", "things", reason)._value.get())


async def _after_raw(chunks: list[bytes], options: WatchOptions = FAST) -> None:
    async with running(options) as (server, store, informer):
        await server.put("a", "1")
        await converged(server, store)
        server.raw = chunks
        server.faults.append("raw")
        await server.put("b", "2")
        await wait_for(lambda: not server.faults)
        await server.put("c", "3")
        await converged(server, store)
        assert informer.liveness()[0]


async def test_a_line_over_the_bound_is_skipped_unread() -> None:
    before = _skipped("too-large")
    huge = b'{"type": "ADDED", "object": {"metadata": {"name": "x"}, "data": "' + b"y" * 100_000 + b'"}}\n'
    await _after_raw([huge[i:i + 7000] for i in range(0, len(huge), 7000)])
    assert _skipped("too-large") == before + 1


async def test_an_endless_line_costs_only_the_bound() -> None:
    """A line that never ends: the watch keeps at most the bound in memory, and the stream is
    cut at its read deadline (nothing arrives after it) and resumed."""
    before = _skipped("too-large")
    await _after_raw([b"z" * 50_000] * 40)
    assert _skipped("too-large") >= before + 1


@pytest.mark.parametrize("line", [
    b"{not json", b"[]", b"null", b"1e999999", b'"a string"', b'{"type": 1, "object": {}}',
    b'{"type": "ADDED", "object": []}', b'{"type": "ADDED"}', b"\xff\xfe\x00", b"[" * 5000 + b"]" * 5000,
    b'{"type": "ERROR", "object": {"code": "x"}}',
    b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": 7}}}',
    b'{"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "'
    + b"9" * 5000 + b'"}, "data": "1"}}',
], ids=lambda b: repr(b[:24]))
async def test_malformed_lines_are_skipped(line: bytes) -> None:
    await _after_raw([line + b"\n"])


async def test_a_list_reply_over_the_bound_is_refused_and_retried() -> None:
    options = WatchOptions(watch_timeout=1, read_deadline=2.5, backoff_initial=0.02, backoff_max=0.1,
                           page_size=2, max_page_bytes=10_000)
    async with running(options) as (server, store, informer):
        server.faults += ["biglist", "410"]  # the watch is sent away, the next list is too big
        await wait_for(lambda: not server.faults)
        await server.put("a", "1")
        await converged(server, store)
        assert "TooLargeError" in informer.kinds["things"].last_error or informer.kinds["things"].restarts


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"items": 5, "metadata": []}', b'{"items": [1, "x"]}'])
async def test_a_garbled_list_is_retried(body: bytes) -> None:
    async with running() as (server, store, _informer):
        server.list_body = body
        server.faults += ["410", "biglist", "biglist"]
        await wait_for(lambda: not server.faults)
        await server.put("a", "1")
        await converged(server, store)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.binary(max_size=300), st.just(b"\n"),
                          st.builds(lambda d: orjson.dumps({"type": "ADDED", "object": d}),
                                    st.dictionaries(st.text(max_size=5), st.integers(-1000, 1000), max_size=3))),
                max_size=12))
def test_random_bytes_never_end_the_watch(chunks: list[bytes]) -> None:
    asyncio.run(_after_raw(chunks))

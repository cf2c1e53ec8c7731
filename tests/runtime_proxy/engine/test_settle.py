"""The share pools' notification and settling of the NRI door (``runtime_proxy.engine.settle``)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from runtime_proxy.engine.lifecycle import Lifecycle
from runtime_proxy.engine.settle import PoolSettle


class _Container:
    def __init__(self, cid: str) -> None:
        self.id = cid


class _Store:
    def __init__(self) -> None:
        self.version = 0
        self.running: list[tuple[Any, _Container]] = []

    def running_containers(self) -> list[tuple[Any, _Container]]:
        return self.running


class _Core:
    """The two things ``PoolSettle`` asks of the lifecycle core: its store and ``pools_moved``."""

    def __init__(self) -> None:
        self.store = _Store()
        self.moved = True
        self.asked = 0

    async def pools_moved(self) -> bool:
        self.asked += 1
        return self.moved


def _settle(core: _Core, heard: list[bool]) -> PoolSettle:
    return PoolSettle(cast(Lifecycle, core), heard.append)


async def test_notify_tells_once_per_store_version() -> None:
    core, heard = _Core(), []  # type: ignore[var-annotated]
    pools = _settle(core, heard)
    await pools.notify()
    await pools.notify()
    assert heard == [True] and core.asked == 1 and pools.pools_dirty
    core.store.version = 1
    core.moved = False
    await pools.notify()
    assert heard == [True, False] and pools.pools_dirty  # stays set until a round runs


async def test_with_settle_the_loops_are_not_asked_for_an_immediate_round() -> None:
    core, heard = _Core(), []  # type: ignore[var-annotated]
    pools = _settle(core, heard)
    rounds: list[str] = []

    async def settle() -> None:
        rounds.append("round")

    pools.settle = settle
    await pools.notify()
    assert heard == [False] and pools.pools_dirty


async def test_settled_runs_the_round_only_when_another_container_can_carry_it() -> None:
    core, heard = _Core(), []  # type: ignore[var-annotated]
    pools = _settle(core, heard)
    rounds: list[str] = []

    async def settle() -> None:
        rounds.append("round")

    pools.settle = settle
    await pools.settled()
    assert rounds == []  # the pools did not move
    await pools.notify()
    core.store.running = [(None, _Container("c1"))]
    await pools.settled(exclude="c1")
    assert rounds == [] and pools.pools_dirty  # only the event's own container runs
    core.store.running.append((None, _Container("c2")))
    await pools.settled(exclude="c1")
    assert rounds == ["round"] and not pools.pools_dirty


async def test_a_slow_round_is_awaited_at_most_settle_wait_and_goes_on(monkeypatch: Any) -> None:
    import runtime_proxy.engine.settle as module

    monkeypatch.setattr(module, "SETTLE_WAIT", 0.01)
    core, heard = _Core(), []  # type: ignore[var-annotated]
    pools = _settle(core, heard)
    release = asyncio.Event()
    done: list[str] = []

    async def settle() -> None:
        await release.wait()
        done.append("round")

    pools.settle = settle
    await pools.notify()
    core.store.running = [(None, _Container("c2"))]
    await pools.settled(exclude="c1")
    assert done == []  # the reply does not wait for the whole round
    release.set()
    for _ in range(1000):
        if done:
            break
        await asyncio.sleep(0.01)
    assert done == ["round"]

"""A dead replica's HA-ledger entries expire at their TTL on every node, whether or not another
bind comes there (issue 32, item 5).

Replica A commits a ledger entry for a pod on each of five nodes (five binds in flight) and dies before any Binding
(killed mid-bind). Replica B binds one pod on each node, so it reads A's entries and holds
their CPUs (``Binder._absorb``). No bind comes to those nodes afterwards. On the old main B
kept those CPUs held for as long as no bind came (the adversarial probe saw five nodes each
lose a CPU for more than 3 minutes); now the binder's sweep (``Binder.expire_foreign``) frees
them once the entries are past their TTL and settled, with a fake clock here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scheduler_ext.annotations import Allocation
from scheduler_ext.extender import Binder, ExtenderConfig
from scheduler_ext.ledger import LeaseLedger
from scheduler_ext.state import ClusterState, load_objects
from tests.fake_clock import Clock
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import cluster, cpus, pod
from tests.scheduler_ext.conftest import TRUST, bind_client

NS = "kube-system"
NODES = [f"n{i}" for i in range(1, 6)]
TTL = 120.0
GHOST = {n: f"uid-ghost-{n}" for n in NODES}  # the pods A was binding when it died: never bound
GHOST_CPUS = cpus("7")


class Replica:
    """B: its cache, ledger and binder, on a fake clock (the ledger's and the watch's)."""

    def __init__(self, api: FakeAPIServer, objects: list[dict[str, object]], clock: Clock) -> None:
        self.state = ClusterState(TRUST)
        self.state.wall = clock
        assert load_objects(self.state, objects) == []
        self.client = bind_client(api.url)
        self.ledger = LeaseLedger(self.client, NS, identity="b", ttl=TTL, is_deleted=self.state.recently_deleted,
                                  settled=self.state.settled, clock=clock, recheck=5.0)
        self.binder = Binder(self.state, self.client, ExtenderConfig(), self.ledger)

    def held(self, node: str) -> frozenset[int]:
        """The CPUs B's cache counts as taken on ``node``."""
        with self.state.lock:
            ns = self.state.nodes[node]
            ns.refresh()
            return ns.bindable - ns.free


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000_000.0)


@pytest.fixture
async def b(api: FakeAPIServer, clock: Clock) -> AsyncIterator[Replica]:
    objects = cluster(NODES)
    for obj in objects:
        api.create(obj)
    pods = [api.create(pod(f"p-{n}", cpu="1")) for n in NODES]
    # A, killed mid-bind on every node: its entries are in the Leases, its Bindings never made
    a_client = bind_client(api.url)
    a = LeaseLedger(a_client, NS, identity="a", ttl=TTL, clock=clock)
    for n in NODES:
        await a.commit(n, GHOST[n], Allocation(cpus=GHOST_CPUS))
    await a_client.aclose()
    replica = Replica(api, [*objects, *pods], clock)
    replica.state.heard("pods")
    for n, p in zip(NODES, pods, strict=True):
        assert await replica.binder.bind("default", p["metadata"]["name"], p["metadata"]["uid"], n) == ""
    try:
        yield replica
    finally:
        await replica.binder.aclose()


def _past_ttl(clock: Clock) -> None:
    clock.now += TTL + 1


async def test_a_dead_replica_s_entries_are_released_on_every_node_at_their_ttl(b: Replica, clock: Clock) -> None:
    for n in NODES:
        assert b.held(n) >= GHOST_CPUS, n  # A's entry counts while it lives
    assert b.binder.expire_foreign() == 0  # not yet expired
    clock.now += TTL - 1
    assert b.binder.expire_foreign() == 0
    _past_ttl(clock)
    b.state.heard("pods")  # B's watch is alive: every bind that could land has landed
    assert b.binder.expire_foreign() == len(NODES)  # with no bind anywhere since
    for n in NODES:
        assert not GHOST_CPUS & b.held(n), n
        assert GHOST[n] not in b.state.nodes[n].allocs
    assert b.ledger.indexed() == 0
    assert b.binder.expire_foreign() == 0  # each entry once


async def test_an_expired_entry_stays_held_while_the_watch_is_stalled(b: Replica, clock: Clock) -> None:
    _past_ttl(clock)  # B's pods watch said nothing since before the entries' expiry
    assert b.binder.expire_foreign() == 0
    for n in NODES:
        assert b.held(n) >= GHOST_CPUS, n
    b.state.heard("pods")
    assert b.binder.expire_foreign() == 0  # looked at again after ``recheck``, not at every tick
    clock.now += 5
    assert b.binder.expire_foreign() == len(NODES)
    for n in NODES:
        assert not GHOST_CPUS & b.held(n), n


async def test_the_sweep_leaves_holds_confirmed_or_owned_by_this_replica(b: Replica, clock: Clock) -> None:
    own = {n: b.held(n) - GHOST_CPUS for n in NODES}
    assert all(len(c) == 1 for c in own.values())  # each node's pod of B holds its CPU
    _past_ttl(clock)
    b.state.heard("pods")
    b.binder.expire_foreign()
    for n in NODES:
        assert b.held(n) == own[n], n  # B's own holds wait for the watch or a rollback


async def test_the_sweep_runs_on_its_own(b: Replica, clock: Clock) -> None:
    import asyncio

    b.binder.sweep_interval = 0.01
    _past_ttl(clock)
    b.state.heard("pods")
    b.binder.start()
    for _ in range(3000):
        if all(not GHOST_CPUS & b.held(n) for n in NODES):
            break
        await asyncio.sleep(0.01)
    assert all(not GHOST_CPUS & b.held(n) for n in NODES)


def test_the_expiry_index_costs_what_is_due() -> None:
    """``expired`` pops only what is due: a thousand live entries are not walked at each tick."""
    clock = Clock(0.0)
    looked: list[str] = []

    def settled(uid: str, node: str, since: float) -> bool:
        looked.append(uid)
        return True

    ledger = LeaseLedger(None, NS, identity="b", ttl=TTL, settled=settled, clock=clock)  # type: ignore[arg-type]
    for i in range(1000):
        ledger._index(f"n{i}", f"uid-{i}", TTL + i)
    clock.now = TTL + 2.5
    assert ledger.expired() == [("n0", "uid-0"), ("n1", "uid-1"), ("n2", "uid-2")]
    assert looked == ["uid-0", "uid-1", "uid-2"]
    assert ledger.indexed() == 997
    ledger._index("n500", "uid-500", TTL + 10_000)  # read again with a later time: the old one is void
    clock.now = TTL + 600
    assert ("n500", "uid-500") not in ledger.expired()

"""The one leader election (``rhp_kube.lease``, issue 32 items 1 and 5): the Lease rules, the
takeover, the release, and the fence every write of the leader goes through, so a deposed or
partitioned leader writes nothing after its Lease lapses (leadership checked at each write, not
once per batch as the manager's old elector did).

Against an in-memory Lease store with a hand-moved clock (the rules, a property test over
interleavings of renewals, partitions and writes), and against the fake API server on 127.0.0.1
through the manager's real aiohttp client (a partition injected as failing Lease calls)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kubernetes
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rhp_kube.lease import Elector, NotLeader, Observed, decide, lease_body
from tests.fakeapi import FakeAPIServer


def lease(holder: str, renew: str = "t1") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": holder, "renewTime": renew,
                                                         "leaseDurationSeconds": 15}}


@pytest.mark.parametrize(
    ("description", "doc", "observed", "now", "action"),
    [
        ("no Lease: create it", None, None, 100.0, "create"),
        ("ours: renew it", lease("me"), None, 100.0, "renew"),
        ("empty holder (released): take it", lease(""), None, 100.0, "acquire"),
        ("another holder seen for the first time: wait", lease("other"), None, 100.0, "wait"),
        ("another holder renewing: wait", lease("other", "t2"), Observed("other", "t1", 50.0), 100.0, "wait"),
        ("another holder silent for less than the lease: wait", lease("other"), Observed("other", "t1", 90.0),
         100.0, "wait"),
        ("another holder silent for the whole lease, by our clock: take it", lease("other"),
         Observed("other", "t1", 85.0), 100.0, "acquire"),
    ],
)
def test_decide(description: str, doc: dict[str, Any] | None, observed: Observed | None, now: float,
                action: str) -> None:
    assert decide(doc, "me", observed, now, 15).action == action, description


def test_lease_body_guards_the_write_and_counts_transitions() -> None:
    body = lease_body("rhp-manager", "ns", "me", 15, 0.0, lease("other"))
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["spec"]["holderIdentity"] == "me"
    assert body["spec"]["leaseTransitions"] == 1
    assert body["spec"]["renewTime"] == "1970-01-01T00:00:00.000000Z"
    renewed = lease_body("rhp-manager", "ns", "me", 15, 1.0, body)
    assert renewed["spec"]["leaseTransitions"] == 1
    assert renewed["spec"]["acquireTime"] == body["spec"]["acquireTime"]
    released = lease_body("rhp-manager", "ns", "", 15, 2.0, renewed)
    assert released["spec"]["holderIdentity"] == "" and released["spec"]["leaseTransitions"] == 1


class Store:
    """One Lease with resourceVersion checks, shared by several electors, on a shared clock.
    ``written_at`` is the clock when the Lease was last written; ``partitioned`` names the
    electors whose Lease calls fail (the API server unreachable from them)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.doc: dict[str, Any] | None = None
        self.version = 0
        self.written_at = 0.0
        self.partitioned: set[str] = set()

    def calls(self, who: str) -> Leases:
        return Leases(self, who)

    def holder(self) -> str:
        return "" if self.doc is None else str(self.doc["spec"]["holderIdentity"])

    def term(self) -> int:
        return -1 if self.doc is None else int(self.doc["spec"]["leaseTransitions"])

    def store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.doc = copy.deepcopy(dict(body))
        self.doc["metadata"]["resourceVersion"] = str(self.version)
        self.written_at = self.clock()
        return copy.deepcopy(self.doc)


class Leases:
    """``LeaseAPI`` of one elector over the shared ``Store``."""

    def __init__(self, store: Store, who: str) -> None:
        self.s, self.who = store, who

    def _reach(self) -> None:
        if self.who in self.s.partitioned:
            raise OSError("API server unreachable")

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._reach()
        return None if self.s.doc is None else copy.deepcopy(self.s.doc)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self._reach()
        return None if self.s.doc is not None else self.s.store(body)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self._reach()
        if self.s.doc is None or body["metadata"].get("resourceVersion") != self.s.doc["metadata"]["resourceVersion"]:
            return None
        return self.s.store(body)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def electors(*names: str) -> tuple[Clock, Store, dict[str, Elector]]:
    clock = Clock()
    store = Store(clock)
    return clock, store, {n: Elector(store.calls(n), "ns", "l", n, clock=clock, wall=clock) for n in names}


async def _rounds(e: Elector) -> bool:
    try:
        return await e.try_once()
    except OSError:
        return False


def test_two_electors_never_lead_at_once_and_the_second_takes_over_a_silent_first() -> None:
    clock, _, es = electors("a", "b")
    a, b = es["a"], es["b"]

    async def rounds() -> None:
        last_renewal = 0.0
        for _ in range(20):  # both running: a got it first and keeps it
            assert await a.try_once()
            last_renewal = clock.now
            assert not await b.try_once()
            assert not (a.is_leader() and b.is_leader())
            clock.now += 2
        assert a.is_leader() and not b.is_leader()
        # a stops renewing: it stops leading after the renew deadline, b takes over only after the lease
        while not b.is_leader():
            await b.try_once()
            assert not (a.is_leader() and b.is_leader()), "two leaders"
            if b.is_leader():
                assert clock.now - last_renewal >= 15, "taken over before the lease ran out"
            clock.now += 1
        assert not a.is_leader()

    asyncio.run(rounds())


class Writes:
    """The objects the leaders write, as the API server sees them: (clock, writer)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.seen: list[tuple[float, str]] = []

    async def put(self, who: str) -> None:
        self.seen.append((self.clock.now, who))


def test_a_partitioned_leader_writes_nothing_after_its_lease_lapses_even_mid_batch() -> None:
    """a leads, then its renewals stop (the API server unreachable from it) while it works
    through a batch of 100 writes, one every 0.5 s. The fence stops the batch at the end of a's
    term, before b can take over; b's writes then start, and no write of a comes after."""
    clock, store, es = electors("a", "b")
    a, b = es["a"], es["b"]
    writes = Writes(clock)

    async def scenario() -> None:
        assert await a.try_once()
        assert not await b.try_once()
        store.partitioned.add("a")
        next_round = clock.now + 2
        refused = 0
        for _ in range(100):  # one batch; nobody asks is_leader() in between
            clock.now += 0.5
            try:
                await a.write(writes.put("a"))
            except NotLeader:
                refused += 1
            if clock.now >= next_round:  # both electors' rounds go on every 2 s
                await _rounds(a)
                await _rounds(b)
                next_round += 2
        assert refused > 0 and b.is_leader() and not a.is_leader()
        await b.write(writes.put("b"))

    asyncio.run(scenario())
    a_times = [t for t, w in writes.seen if w == "a"]
    b_times = [t for t, w in writes.seen if w == "b"]
    assert a_times and b_times
    assert max(a_times) < 1000.0 + 10, "a's last write is inside its term (10 s after its last renewal)"
    assert max(a_times) < min(b_times)


def test_a_write_in_flight_is_abandoned_when_the_term_ends() -> None:
    """A write that is still waiting (the API server does not answer) when the term ends is
    cancelled then, so no request of the old leader leaves after its term."""
    store = Store(time.monotonic)
    elector = Elector(store.calls("a"), "ns", "l", "a", lease_seconds=3, renew_deadline=0.6, retry_period=0.2)
    started: list[float] = []

    async def hangs() -> None:
        started.append(time.monotonic())
        await asyncio.sleep(3600)

    async def scenario() -> None:
        assert await elector.try_once()
        ends = elector.term_ends()
        assert ends is not None
        with pytest.raises(NotLeader):
            await elector.write(hangs())
        assert time.monotonic() >= ends
        with pytest.raises(NotLeader):
            await elector.write(hangs())  # refused without starting

    asyncio.run(scenario())
    assert len(started) == 1


def test_release_hands_the_lease_over_at_once() -> None:
    _, store, es = electors("a", "b")
    a, b = es["a"], es["b"]

    async def scenario() -> None:
        assert await a.try_once()
        assert not await b.try_once()
        await a.release()
        assert not a.is_leader() and store.holder() == ""
        with pytest.raises(NotLeader):
            await a.write(asyncio.sleep(0))
        assert await b.try_once(), "no need to wait out the lease"
        assert store.term() == 1

    asyncio.run(scenario())


# One step of the interleaving: move the clock, an elector's round (reaching the API server or
# not), or a write by an elector.
STEP = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0, 9.0, 16.0])),
    st.tuples(st.just("round"), st.sampled_from(["a", "b", "c"]), st.booleans()),
    st.tuples(st.just("write"), st.sampled_from(["a", "b", "c"]), st.just(False)),
    st.tuples(st.just("release"), st.sampled_from(["a", "b", "c"]), st.just(False)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=120))
def test_no_interleaving_lets_two_electors_write_in_one_term(steps: list[tuple[Any, ...]]) -> None:
    """Over any interleaving of rounds (some of them partitioned), clock moves, releases and
    writes, every write the fence lets through is made while the Lease names its writer and
    before that Lease lapses for the others; so no two electors write in the same term."""
    clock, store, es = electors("a", "b", "c")
    writers_of_term: dict[int, set[str]] = {}

    async def run() -> None:
        for step in steps:
            if step[0] == "tick":
                clock.now += step[1]
            elif step[0] == "round":
                who, reachable = step[1], step[2]
                (store.partitioned.discard if reachable else store.partitioned.add)(who)
                await _rounds(es[who])
            elif step[0] == "release":
                store.partitioned.discard(step[1])
                await es[step[1]].release()
            else:
                who = step[1]

                async def write(writer: str = who) -> None:
                    assert store.holder() == writer, "written while another holds the Lease"
                    assert clock.now < store.written_at + 15, "written after the Lease lapsed"
                    writers_of_term.setdefault(store.term(), set()).add(writer)

                with pytest.raises(NotLeader) if not es[who].is_leader() else _nothing():
                    await es[who].write(write())

    asyncio.run(run())
    assert all(len(w) == 1 for w in writers_of_term.values()), writers_of_term


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---- the manager's real client against the fake API server on 127.0.0.1 ----------------------


async def _until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_over_http_a_partitioned_leader_stops_writing_before_its_lease_lapses() -> None:
    """The manager's aiohttp client and Lease calls against the fake API server: a leads and
    writes a Node's status every 20 ms; then every Lease call fails (a partition between a and
    the API server). Once a's term is over the API server gets no more writes from it."""
    from colocation_manager.kubeio import LeaseCalls, ManagerAPI

    with FakeAPIServer() as server:
        server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {}})
        conf = kubernetes.client.Configuration()
        conf.host = server.url
        written: list[float] = []

        async def scenario() -> None:
            api = ManagerAPI(kubernetes.client.ApiClient(conf), timeout=5.0)
            elector = Elector(LeaseCalls(api), "kube-system", "rhp-test", "a",
                              lease_seconds=4, renew_deadline=2.0, retry_period=0.3)
            stop = asyncio.Event()
            electing = asyncio.create_task(elector.run(stop))
            await _until(elector.is_leader)

            async def writer() -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    call: Awaitable[Any] = api.patch_node_status("n1", {"status": {"capacity": {"x": str(n)}}})
                    try:
                        await elector.write(call)
                        written.append(time.monotonic())
                    except NotLeader:
                        pass
                    await asyncio.sleep(0.02)

            writing = asyncio.create_task(writer())
            await _until(lambda: len(written) >= 3)
            server.inject("GET", "/leases/", 503, times=10**6)
            server.inject("PUT", "/leases/", 503, times=10**6)
            await _until(lambda: not elector.is_leader())
            ends = elector.term_ends()
            await _until(lambda: elector.writes_in_flight() == 0)
            await asyncio.sleep(1.0)  # what was sent inside the term has reached the server
            before = server.counts.get("PATCH", 0)
            await asyncio.sleep(1.0)  # a keeps trying to write for a while
            assert server.counts.get("PATCH", 0) == before, "a write reached the API server after the term"
            assert ends is not None and written
            stop.set()
            await writing
            await electing
            await api.aclose()

        asyncio.run(scenario())

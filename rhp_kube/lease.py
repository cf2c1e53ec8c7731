"""The one leader election: a ``coordination.k8s.io/v1`` Lease held by one replica, and a fence
that every write of the leader goes through, so a deposed or partitioned leader writes nothing
after its Lease lapses (client-go's ``leaderelection`` rules, in our own words, plus the fence).

Who calls this: ``colocation_manager`` (its cli runs ``Elector.run`` over ``LeaseCalls``; its
``Reconciler`` makes every write as ``await elector.write(call)``). Nothing else in the tree elects a leader
(the extender's per-node ledger Leases are compare-and-swap records, not an election).

Election (``decide``, pure; ``Elector.try_once``, one round every ``retry_period``):

- no Lease: create it holding it;
- we hold it: renew it (``renewTime`` = now);
- another replica holds it: wait, unless its record (holder and renewTime) has not changed for
  ``lease_seconds`` of *our* clock since we first saw it (the clocks of two machines are never
  compared), or the holder is empty (released); then take it over. Every write of the Lease is
  guarded by the resourceVersion read (a conflict means another replica wrote first: wait), and a
  change of holder counts one more ``leaseTransitions``.
- on exit (``release``), a holder first closes its fence, waits for its writes in flight, then
  writes the Lease with an empty holder, so another replica takes over at its next round
  instead of after ``lease_seconds``.

Fence (``Elector.write``): the leader's *term* ends ``renew_deadline`` seconds (of our monotonic
clock) after the start of the last round that renewed the Lease. A write is started only inside
the term, and is abandoned (cancelled) when the term ends, so no request of ours leaves after
it. Another replica takes over no sooner than ``lease_seconds`` after it saw that renewal, which
is after the round started: the ``lease_seconds - renew_deadline`` between the two (5 s by
default) is the margin for a request sent just before the end of the term to reach the API
server, and for the two clocks' rates to differ. Leadership is checked at each write, never once
per batch. A write refused or abandoned raises ``NotLeader`` and is counted in
``rhp_lease_fenced_writes_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog
from prometheus_client import Counter, Gauge

from rhp_kube.errors import ConflictError, NotFoundError
from rhp_kube.http import KubeHTTP, json_object, lease_path

__all__ = [
    "FENCED",
    "HELD",
    "Decision",
    "Elector",
    "LeaseAPI",
    "LeaseCalls",
    "NotLeader",
    "Observed",
    "decide",
    "lease_body",
    "micro_time",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

FENCED = Counter(
    "rhp_lease_fenced_writes_total",
    "Writes the leader-election fence stopped, by Lease and outcome: refused (not started: this "
    "replica's term had ended or it never led) or abandoned (cancelled when the term ended).",
    ["lease", "outcome"],
)
HELD = Gauge("rhp_lease_held", "1 while this replica holds the Lease and its term has not ended.", ["lease"])


class NotLeader(Exception):
    """A write the fence refused or abandoned: this replica's term has ended (or never began)."""


class LeaseAPI(Protocol):
    """The three Lease calls of an election. A conflict is an answer, not an error: ``None``."""

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The Lease, or ``None`` when there is none."""

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The Lease created, or ``None`` when one exists already (409)."""

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The Lease written (``metadata.resourceVersion`` in ``body`` guards it), or ``None``
        when it changed since that version or is gone (409, 404)."""


class LeaseCalls:
    """``LeaseAPI`` over the one HTTP transport (``rhp_kube.http.KubeHTTP``): 404 on a read and
    409 (or 404) on a write are answers (``None``); every other failure raises."""

    def __init__(self, client: KubeHTTP) -> None:
        self.client = client

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return json_object(await self.client.request("GET", lease_path(namespace, name)))
        except NotFoundError:
            return None

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            return json_object(await self.client.request("POST", lease_path(namespace), body))
        except ConflictError:
            return None

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            return json_object(await self.client.request("PUT", lease_path(namespace, name), body))
        except (ConflictError, NotFoundError):
            return None


def micro_time(epoch: float) -> str:
    """``metav1.MicroTime`` as the API server writes it: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Observed:
    """The other holder's record as we last saw it change, and our monotonic time then."""

    holder: str
    renew_time: str
    seen_at: float


@dataclass(frozen=True, slots=True)
class Decision:
    action: str  # "create", "renew", "acquire" or "wait"
    observed: Observed | None  # the record to remember for the next round


def _spec(lease: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = lease.get("spec") if isinstance(lease, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _transitions(lease: Mapping[str, Any] | None) -> int:
    value = _spec(lease).get("leaseTransitions")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def decide(lease: Mapping[str, Any] | None, me: str, observed: Observed | None, now: float,
           lease_seconds: float) -> Decision:
    """What to do with the Lease as read (None: it does not exist). ``now`` is monotonic."""
    if lease is None:
        return Decision("create", None)
    spec = _spec(lease)
    holder, renew = _text(spec.get("holderIdentity")), _text(spec.get("renewTime"))
    if holder == me:
        return Decision("renew", None)
    if not holder:
        return Decision("acquire", None)
    if observed is None or (observed.holder, observed.renew_time) != (holder, renew):
        return Decision("wait", Observed(holder, renew, now))
    if now - observed.seen_at >= lease_seconds:
        return Decision("acquire", observed)
    return Decision("wait", observed)


def lease_body(name: str, namespace: str, me: str, lease_seconds: int, epoch: float,
               old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Lease to write: held by ``me`` (``""``: released), renewed at ``epoch``; ``old`` (the
    Lease read) gives the resourceVersion that guards the write, the acquire time kept while the
    holder stays, and the transitions count (one more when a holder takes it from another)."""
    spec = dict(_spec(old))
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    old_meta = old.get("metadata") if isinstance(old, Mapping) else None
    if isinstance(old_meta, Mapping) and isinstance(old_meta.get("resourceVersion"), str):
        meta["resourceVersion"] = old_meta["resourceVersion"]
    now = micro_time(epoch)
    transitions = _transitions(old)
    if spec.get("holderIdentity") != me and me:
        spec["acquireTime"] = now
        if old is not None:
            transitions += 1
    spec.update(holderIdentity=me, leaseDurationSeconds=lease_seconds, renewTime=now,
                leaseTransitions=transitions)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def _close(call: Awaitable[Any]) -> None:
    """Close a coroutine that will never be awaited (no "never awaited" warning)."""
    if isinstance(call, Coroutine):
        call.close()


class Elector:
    """Holds (or keeps trying to hold) the Lease ``namespace/name`` as ``identity``, and fences
    the writes made while holding it (module docstring).

    ``lease_seconds`` is how long others wait for a silent holder; ``renew_deadline`` how long
    after the start of its last successful renewal a holder keeps writing; ``retry_period`` the
    time between rounds. ``clock`` is monotonic (the term and the takeover); ``wall`` stamps the
    Lease's times.
    """

    def __init__(
        self,
        api: LeaseAPI,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_seconds: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_seconds:
            raise ValueError("0 < retry period < renew deadline < lease duration")
        if not identity:
            raise ValueError("an elector needs a non-empty identity")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_seconds, self.renew_deadline, self.retry_period = lease_seconds, renew_deadline, retry_period
        self.clock, self.wall = clock, wall
        self.key = f"{namespace}/{name}"
        self._renewed_at: float | None = None  # monotonic start of the last round that renewed it
        self._term: int | None = None  # leaseTransitions of the Lease while we hold it
        self._held: Mapping[str, Any] | None = None  # the Lease as we last wrote it
        self._observed: Observed | None = None
        self._in_flight = 0

    # -- the fence -----------------------------------------------------------------------------

    def term_ends(self) -> float | None:
        """When (``clock()``) this replica's current term ends; ``None`` when it holds no term."""
        return None if self._renewed_at is None else self._renewed_at + self.renew_deadline

    def is_leader(self) -> bool:
        """Whether a write started now would be let through."""
        ends = self.term_ends()
        return ends is not None and self.clock() < ends

    def writes_in_flight(self) -> int:
        """How many writes the fence let through are still being made."""
        return self._in_flight

    @property
    def term(self) -> int | None:
        """The Lease's ``leaseTransitions`` when we took it (one number per holder's term), while
        our term lasts; ``None`` otherwise."""
        return self._term if self.is_leader() else None

    async def write(self, call: Awaitable[T]) -> T:
        """Await ``call`` (a write to the cluster, not started yet) only inside our term, and
        cancel it when the term ends; else close it and raise ``NotLeader``."""
        ends, now = self.term_ends(), self.clock()
        if ends is None or now >= ends:
            _close(call)
            FENCED.labels(self.key, "refused").inc()
            raise NotLeader(f"not the holder of Lease {self.key} (or its term ended)")
        self._in_flight += 1
        deadline = asyncio.timeout(ends - now)
        try:
            async with deadline:
                return await call
        except TimeoutError:
            if not deadline.expired():  # the call's own timeout, not the term's end
                raise
            FENCED.labels(self.key, "abandoned").inc()
            raise NotLeader(f"the term of Lease {self.key} ended during the write") from None
        finally:
            self._in_flight -= 1

    def _lose(self) -> None:
        self._renewed_at = None
        self._term = None
        self._held = None

    # -- the election --------------------------------------------------------------------------

    async def try_once(self) -> bool:
        """One round: read, decide, write; True when we hold the Lease afterwards. An API
        failure raises (and leaves the term to end by itself)."""
        started = self.clock()
        lease = await self.api.get_lease(self.namespace, self.name)
        decision = decide(lease, self.identity, self._observed, started, self.lease_seconds)
        self._observed = decision.observed
        if decision.action == "wait":
            self._lose()
            return False
        body = lease_body(self.name, self.namespace, self.identity, self.lease_seconds, self.wall(), lease)
        if decision.action == "create":
            written = await self.api.create_lease(self.namespace, body)
        else:
            written = await self.api.replace_lease(self.namespace, self.name, body)
        if written is None:  # another replica wrote first
            self._lose()
            return False
        if decision.action != "renew" or self._renewed_at is None:
            self._term = _transitions(written)
            log.info("became leader", lease=self.key, identity=self.identity, term=self._term)
        self._renewed_at = started
        self._held = written
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Renew (or try to acquire) every ``retry_period`` until ``stop`` is set; then release."""
        try:
            while not stop.is_set():
                was = self.is_leader()
                try:
                    await self.try_once()
                except Exception as exc:  # the API server may be down; the term ends by itself
                    log.warning("lease round failed", lease=self.key, error=f"{type(exc).__name__}: {exc}"[:300])
                if was and not self.is_leader():
                    log.warning("lost leadership", lease=self.key, identity=self.identity)
                HELD.labels(self.key).set(1 if self.is_leader() else 0)
                ends = self.term_ends()
                wait = self.retry_period
                if ends is not None:  # wake at the end of the term, to say so
                    wait = min(wait, max(ends - self.clock(), 0.0) + 0.01)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            HELD.labels(self.key).set(0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.release(), self.renew_deadline)

    async def release(self) -> None:
        """Stop writing, wait for the writes in flight (each ends with the term at the latest),
        then hand the Lease back (empty holder), guarded by the version we last wrote."""
        held, ends = self._held, self.term_ends()
        self._lose()
        if held is None or ends is None:
            return
        while self._in_flight:  # each ends with the term at the latest
            await asyncio.sleep(0.05)
        if self.clock() >= ends:  # too late: another replica may hold it by now
            return
        body = lease_body(self.name, self.namespace, "", self.lease_seconds, self.wall(), held)
        body["spec"]["leaseDurationSeconds"] = 1
        if await self.api.replace_lease(self.namespace, self.name, body) is not None:
            log.info("released the lease", lease=self.key, identity=self.identity)

"""Leader election through a ``coordination.k8s.io/v1`` Lease, so that of several manager
replicas exactly one writes (client-go's ``leaderelection`` rules, in our own words).

Who calls this: ``scheduler_ext.manager.controller`` runs ``Elector.run`` beside its reconcile
loop and asks ``Elector.is_leader()`` before each write.

Rules (``decide``, pure):

- no Lease: create it holding it;
- we hold it: renew it (``renewTime`` = now);
- another replica holds it: wait, unless the record (holder and renewTime) has not changed for
  ``lease_seconds`` of *our* clock since we first saw it (clocks of two machines are never
  compared), or the holder is empty; then take it over with a write guarded by the Lease's
  ``resourceVersion`` (a conflict means someone else won: wait).

A leader that has not renewed for ``renew_deadline`` seconds stops writing at once (``is_leader``
turns false before its Lease can expire for the others, since ``renew_deadline`` is below
``lease_seconds``), so two replicas never write in the same instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from scheduler_ext.errors import APIError, ConflictError, NotFoundError

__all__ = ["Decision", "Elector", "LeaseAPI", "Observed", "decide", "lease_body", "micro_time"]

log = structlog.get_logger("scheduler_ext.manager.lease")


class LeaseAPI(Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


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


def decide(lease: Mapping[str, Any] | None, me: str, observed: Observed | None, now: float,
           lease_seconds: float) -> Decision:
    """What to do with the Lease as read (None: it does not exist). ``now`` is monotonic."""
    if lease is None:
        return Decision("create", None)
    spec = _spec(lease)
    holder = spec.get("holderIdentity")
    holder = holder if isinstance(holder, str) else ""
    renew = spec.get("renewTime")
    renew = renew if isinstance(renew, str) else ""
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
    """The Lease to write: held by ``me``, renewed at ``epoch``; ``old`` (the Lease read)
    gives the resourceVersion that guards the write, the acquire time kept while we hold it,
    and the transitions count (incremented when the holder changes)."""
    spec = dict(_spec(old))
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    old_meta = old.get("metadata") if isinstance(old, Mapping) else None
    if isinstance(old_meta, Mapping) and isinstance(old_meta.get("resourceVersion"), str):
        meta["resourceVersion"] = old_meta["resourceVersion"]
    now = micro_time(epoch)
    transitions = spec.get("leaseTransitions")
    transitions = transitions if isinstance(transitions, int) and not isinstance(transitions, bool) else 0
    if spec.get("holderIdentity") != me:
        spec["acquireTime"] = now
        if old is not None:
            transitions += 1
    spec.update(holderIdentity=me, leaseDurationSeconds=lease_seconds, renewTime=now,
                leaseTransitions=transitions)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


class Elector:
    """Keeps trying to hold the Lease ``namespace/name`` as ``me``."""

    def __init__(
        self,
        api: LeaseAPI,
        namespace: str,
        name: str,
        me: str,
        *,
        lease_seconds: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not retry_period < renew_deadline < lease_seconds:
            raise ValueError("retry period < renew deadline < lease duration")
        self.api, self.namespace, self.name, self.me = api, namespace, name, me
        self.lease_seconds, self.renew_deadline, self.retry_period = lease_seconds, renew_deadline, retry_period
        self.clock, self.wall = clock, wall
        self._renewed_at: float | None = None  # monotonic time of our last successful write
        self._observed: Observed | None = None

    def is_leader(self) -> bool:
        """True while our last successful renewal is younger than the renew deadline."""
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline

    async def try_once(self) -> bool:
        """One round: read, decide, write; True when we hold the Lease afterwards."""
        started = self.clock()
        try:
            lease: dict[str, Any] | None = await self.api.get_lease(self.namespace, self.name)
        except NotFoundError:
            lease = None
        decision = decide(lease, self.me, self._observed, started, self.lease_seconds)
        self._observed = decision.observed
        if decision.action == "wait":
            self._renewed_at = None
            return False
        body = lease_body(self.name, self.namespace, self.me, self.lease_seconds, self.wall(), lease)
        try:
            if decision.action == "create":
                await self.api.create_lease(self.namespace, body)
            else:
                await self.api.replace_lease(self.namespace, self.name, body)
        except ConflictError:  # another replica wrote first
            self._renewed_at = None
            return False
        if decision.action != "renew":
            log.info("became leader", lease=f"{self.namespace}/{self.name}", identity=self.me)
        self._renewed_at = started
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Renew (or try to acquire) every ``retry_period`` until ``stop`` is set."""
        while not stop.is_set():
            was = self.is_leader()
            try:
                await self.try_once()
            except APIError as exc:
                log.warning("lease round failed", lease=f"{self.namespace}/{self.name}", error=str(exc))
            if was and not self.is_leader():
                log.warning("lost leadership", lease=f"{self.namespace}/{self.name}", identity=self.me)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period)

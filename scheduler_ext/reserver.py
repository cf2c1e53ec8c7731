"""The reservation controller: places pending Reservations, keeps their owners and expires them.

Who calls this: ``scheduler_ext.cli serve`` builds a ``Reserver`` (unless
``--no-place-reservations``) and ``scheduler_ext.server``'s lifespan runs it on the verbs' event
loop. The Reservations it reads arrive through the extender's one list-and-watch
(``scheduler_ext.kube.watch_cluster`` hands every Reservation event to ``ReservationStore`` as
well as to the cache); every write goes through the fence of its own Lease
(``rhp_kube.lease.Elector``, Lease ``--reservation-lease`` in ``--ledger-namespace``): one
replica places, the others only count what it placed.

Each round (``run``: on every Reservation event, else every ``interval`` seconds), for each
Reservation in creation order (``scheduler_ext.reserve`` has the rules):

- Failed or Succeeded: deleted once past ``gc_after`` (``--reservation-gc-after``, Koordinator's
  24h; ``scheduler_ext.reserve.collectable``), else left alone.
- Expired, or scheduled on a node the cache no longer has: ``Failed`` (``Ready`` False,
  ``Expired``); the cache then stops counting it, so what it held is free again.
- Pending: the reserve pod is judged on every node by the extender's feasibility function
  (``decide.evaluate``) and, best score first, by kube-scheduler's default checks on the node's
  pods and active reservations (read from the API server: ``node_fit``); the first node that
  passes gets it through the binder's placement (``Binder.reserve``: the one ``plan``, held in the
  cache and committed to the HA ledger like a pod's bind, so no pod and no other reservation
  gets the same CPUs in between). Then the reservation's ``resource-status`` annotation (the
  reserved cpuset and NUMA amounts; ``{}`` when none, which also replaces one a template
  carried), its ``device-allocated`` (the reserved GPUs, likewise) and its status (``Available``
  on the node) are written, each under the resourceVersion it read; a failure rolls the hold
  back. No node: ``Pending`` with the reasons.
- Available: ``currentOwners`` and ``allocated`` follow the pods allocated from it
  (``reservation-allocated``); with ``allocateOnce`` the first owner makes it ``Succeeded``.

A Reservation whose template asks for GPUs gets them like a pod (``decide.plan``): the chosen
minors and amounts go into its own ``device-allocated`` annotation, which the cache then books
for every pod but its owners, and from which its owners take theirs
(``scheduler_ext.reservations``, ``decide.gpu_view``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import orjson
import structlog
from prometheus_client import Counter

from koord_formats import keys
from koord_formats.errors import FormatError
from koord_formats.reservation import parse_reservation, parse_reservation_allocated
from koord_formats.reservation_spec import (
    HostPort,
    parse_lifetime,
    parse_node,
    parse_pod_constraints,
    read_current_owners,
)
from rhp_kube.http import JSON_TYPE, MERGE_PATCH, KubeHTTP, seg
from rhp_kube.lease import NotLeader
from scheduler_ext.allocator import AllocationError
from scheduler_ext.decide import DEFAULT_CONFIG, ExtenderConfig, evaluate
from scheduler_ext.errors import APIError, ConflictError, NotFoundError
from scheduler_ext.reserve import (
    GC_AFTER,
    PHASE_FAILED,
    PHASE_SUCCEEDED,
    available_status,
    collectable,
    expired_status,
    node_fit,
    owners_status,
    pending,
    reserve_request,
    unschedulable_status,
)
from scheduler_ext.state import ClusterState

__all__ = ["PLACED", "ReservationClient", "ReservationStore", "Reserver"]

log = structlog.get_logger("scheduler_ext.reserver")

PLACED = Counter(
    "scheduler_ext_reservations_total",
    "Reservation status changes written by the reservation controller (result: available, "
    "unschedulable, expired, succeeded, owners, deleted).",
    ["result"],
)

_MAX_CANDIDATES = 16  # nodes checked against the API server per reservation and round
_NODES_PER_LOCK = 200  # nodes judged per hold of the cache's lock (the verbs wait on it)
RETRY_UNSCHEDULABLE = 10.0  # seconds before a reservation no node could take is tried again
_MAX_LIST_BYTES = 256 << 20
_RS = keys.ANNOTATION_RESOURCE_STATUS
_DA = keys.ANNOTATION_DEVICE_ALLOCATED
_GROUP_PATH = f"/apis/{keys.RESERVATION_API_GROUP}/{keys.RESERVATION_API_VERSION}/{keys.RESERVATION_PLURAL}"


class ReservationStore:
    """The Reservations as the watch last showed them (a ``rhp_kube.watch.Sink`` for the
    ``reservations`` kind, fed beside the cache); ``changed`` is set on every change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._wake: Callable[[], None] | None = None

    def _uid(self, obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        return uid if isinstance(uid, str) and 0 < len(uid) <= 253 else ""

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._objects = {u: o for o in items if (u := self._uid(o))}
        self._notify()

    def apply(self, event: str, obj: dict[str, Any]) -> None:
        uid = self._uid(obj)
        if not uid:
            return
        with self._lock:
            if event == "DELETED":
                self._objects.pop(uid, None)
            else:
                self._objects[uid] = obj
        self._notify()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def on_change(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake()


class ReservationAPI(Protocol):
    async def get_node(self, name: str) -> dict[str, Any]: ...

    async def pods_on(self, node: str) -> list[dict[str, Any]]: ...

    async def patch_annotations(self, name: str, annotations: Mapping[str, str], rv: str) -> dict[str, Any]: ...

    async def replace_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete(self, name: str, uid: str) -> None: ...


def _json(data: bytes) -> dict[str, Any]:
    out = orjson.loads(data) if data else {}
    return out if isinstance(out, dict) else {}


class ReservationClient:
    """The controller's API calls over the extender's one transport (``rhp_kube.http.KubeHTTP``)."""

    def __init__(self, http: KubeHTTP) -> None:
        self.http = http

    async def get_node(self, name: str) -> dict[str, Any]:
        return _json(await self.http.request("GET", f"/api/v1/nodes/{seg(name)}"))

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        data = await self.http.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"},
                                       max_bytes=_MAX_LIST_BYTES)  # fmt: skip
        items = _json(data).get("items")
        return [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []

    async def patch_annotations(self, name: str, annotations: Mapping[str, str], rv: str) -> dict[str, Any]:
        body = {"metadata": {"annotations": dict(annotations), "resourceVersion": rv}}
        return _json(await self.http.request("PATCH", f"{_GROUP_PATH}/{seg(name)}", body, MERGE_PATCH))

    async def replace_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the status subresource; the body's resourceVersion makes it a compare-and-swap."""
        return _json(await self.http.request("PUT", f"{_GROUP_PATH}/{seg(name)}/status", body, JSON_TYPE))

    async def delete(self, name: str, uid: str) -> None:
        """DELETE it, only if it is still the object of that UID (a precondition)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        await self.http.request("DELETE", f"{_GROUP_PATH}/{seg(name)}", body, JSON_TYPE)


class Fence(Protocol):
    def is_leader(self) -> bool: ...

    async def write(self, call: Any) -> Any: ...


class Placer(Protocol):
    """What the controller needs of ``scheduler_ext.binder.Binder``."""

    async def reserve(self, req: Any, uid: str, node: str) -> Any: ...

    async def unreserve(self, uid: str, node: str, placement: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class _Usage:
    used: Mapping[str, Fraction]
    ports: tuple[HostPort, ...]


def _terminal(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _template_spec(obj: Mapping[str, Any]) -> object:
    template = _spec(obj).get("template")
    return template.get("spec") if isinstance(template, Mapping) else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _invalid(obj: Mapping[str, Any]) -> str:
    """Why a Reservation the cache would not count is not placed (``ValidateReservation``)."""
    spec = _spec(obj)
    if not isinstance(spec.get("template"), Mapping):
        return "the reservation misses the template spec"
    if not spec.get("owners"):
        return "the reservation misses the owner spec"
    return "the reservation misses the expiration spec"


def _created(obj: Mapping[str, Any]) -> str:
    value = _meta(obj).get("creationTimestamp")
    return value if isinstance(value, str) else ""


class Reserver:
    """The controller (module docstring). ``clock`` is wall time (expiry compares with the API
    server's timestamps)."""

    def __init__(
        self,
        state: ClusterState,
        store: ReservationStore,
        api: ReservationAPI,
        placer: Placer,
        fence: Fence,
        cfg: ExtenderConfig = DEFAULT_CONFIG,
        *,
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
        gc_after: float = GC_AFTER,
    ) -> None:
        self.state, self.store, self.api, self.placer, self.fence = state, store, api, placer, fence
        self.cfg, self.interval, self.clock, self.gc_after = cfg, interval, clock, gc_after
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # uid -> (resourceVersion, monotonic time) of its last failed placement: tried again
        # after ``RETRY_UNSCHEDULABLE`` or when it changed
        self._refused: dict[str, tuple[str, float]] = {}
        self._written: dict[str, Mapping[str, Any]] = {}  # uid -> the object as this round wrote it
        self._owners: dict[tuple[str, str], set[str]] = {}  # (reservation uid, node) -> owner pod uids

    # -- the loop --------------------------------------------------------------------------------

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(wake.set)

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop``; a failed round is logged and the next one tries again."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self.store.on_change(self._poke)
        while not stop.is_set():
            self._wake.clear()
            if self.fence.is_leader() and self.state.ready:
                try:
                    await self.round()
                except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # an API failure, a bug, a library's BaseException
                    # (structlog's DropEvent is one): the next round tries again
                    log.warning("reservation round failed", error=f"{type(exc).__name__}: {exc}"[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)

    def _index_owners(self, objs: list[dict[str, Any]]) -> None:
        """The pods the cache counts as allocated from each Available reservation, in one pass
        over the cache's pods (none when no reservation is Available)."""
        self._owners = {}
        if not any(_status(o).get("phase") == keys.RESERVATION_PHASE_AVAILABLE for o in objs):
            return
        with self.state.lock:
            for p_uid, entry in self.state.pods.items():
                if entry.node and entry.alloc.reservation:
                    self._owners.setdefault((entry.alloc.reservation, entry.node), set()).add(p_uid)

    async def round(self) -> None:
        """One pass over every Reservation (oldest first)."""
        objs = self.store.snapshot()
        self._index_owners(objs)
        live = {str(_meta(o).get("uid")) for o in objs}
        self._refused = {u: v for u, v in self._refused.items() if u in live}
        self._written = {}
        for obj in sorted(objs, key=lambda o: (_created(o), str(_meta(o).get("name")))):
            if not self.fence.is_leader():
                return
            name = str(_meta(obj).get("name") or "")
            try:
                await self.reconcile(obj)
            except (NotLeader, ConflictError, NotFoundError):
                continue  # not ours to write now, or changed since: the next event brings it again
            except APIError as exc:
                log.warning("reservation write failed", reservation=name, error=str(exc)[:300])

    async def reconcile(self, obj: dict[str, Any]) -> None:
        status = _status(obj)
        phase = status.get("phase")
        name = str(_meta(obj).get("name") or "")
        now = self.clock()
        if phase in (PHASE_FAILED, PHASE_SUCCEEDED):
            await self._collect(obj, name, now)
            return
        try:
            lifetime = parse_lifetime(obj)
        except FormatError as exc:
            await self._write_status(obj, unschedulable_status(status, f"invalid Reservation: {exc}", now),
                                     "unschedulable")  # fmt: skip
            return
        node = status.get("nodeName")
        if lifetime.expired(now):
            await self._write_status(obj, expired_status(status, now), "expired")
            log.info("reservation expired", reservation=name, node=node or "")
            return
        if isinstance(node, str) and node:
            with self.state.lock:
                ns = self.state.node(node)
                gone = ns is None or not ns.node_seen
            if gone and "nodes" in self.state.synced:
                await self._write_status(obj, expired_status(status, now, f"node {node} is gone"), "expired")
                return
            if phase == keys.RESERVATION_PHASE_AVAILABLE:
                await self._sync_owners(obj, node, now)
            return
        if pending(obj):
            uid, rv = str(_meta(obj).get("uid") or ""), str(_meta(obj).get("resourceVersion") or "")
            refused = self._refused.get(uid)
            if refused is not None and refused[0] == rv and time.monotonic() - refused[1] < RETRY_UNSCHEDULABLE:
                return  # no node took it a moment ago and it did not change
            if not await self._place(obj, now):
                self._refused[uid] = (str(_meta(self._latest(obj)).get("resourceVersion") or rv), time.monotonic())
            else:
                self._refused.pop(uid, None)

    async def _collect(self, obj: Mapping[str, Any], name: str, now: float) -> None:
        """Garbage collection: delete a Failed or Succeeded reservation past its retention."""
        try:
            due = collectable(obj, now, self.gc_after)
        except FormatError:
            return  # unreadable conditions: kept, as one without the condition is
        if due:
            await self.fence.write(self.api.delete(name, str(_meta(obj).get("uid") or "")))
            PLACED.labels("deleted").inc()
            log.info("reservation garbage-collected", reservation=name, phase=str(_status(obj).get("phase")))

    # -- placing ---------------------------------------------------------------------------------

    def _latest(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._written.get(str(_meta(obj).get("uid") or ""), obj)

    async def _place(self, obj: dict[str, Any], now: float) -> bool:
        """Place ``obj``; True when it was placed."""
        meta = _meta(obj)
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        req = reserve_request(obj)
        reason = req.error
        constraints = None
        if not reason:
            try:
                constraints = parse_pod_constraints(_template_spec(obj))
                if not parse_reservation(obj).valid:  # owners, policy, taints: what pods are matched by
                    reason = _invalid(obj)
            except FormatError as exc:
                reason = f"invalid Reservation: {exc}"
        if reason or constraints is None:
            await self._unschedulable(obj, reason or "invalid Reservation", now)
            return False
        failures: dict[str, str] = {}
        candidates: list[tuple[int, str]] = []
        with self.state.lock:
            names = [name for name, ns in self.state.nodes.items() if ns.node_seen]
        for start in range(0, len(names), _NODES_PER_LOCK):
            with self.state.lock:  # a slice at a time: the verbs wait on this lock
                for name in names[start:start + _NODES_PER_LOCK]:
                    ns = self.state.node(name)
                    if ns is None or not ns.node_seen:
                        continue
                    verdict = evaluate(ns, req, self.cfg)
                    if verdict.ok:
                        candidates.append((-verdict.score, ns.name))
                    else:
                        failures[ns.name] = verdict.reason
            await asyncio.sleep(0)
        for _, node in sorted(candidates)[:_MAX_CANDIDATES]:
            why = await self._node_reason(obj, uid, constraints, node)
            if why:
                failures[node] = why
                continue
            try:
                placement = await self.placer.reserve(req, uid, node)
            except AllocationError as exc:
                failures[node] = str(exc)
                continue
            try:
                await self._commit(obj, node, placement, constraints.requests, now)
            except BaseException:
                await self.placer.unreserve(uid, node, placement)
                raise
            PLACED.labels("available").inc()
            log.info("reservation placed", reservation=name, node=node,
                     cpuset=placement.annotations.get(_RS, ""))  # fmt: skip
            return True
        message = "; ".join(f"node {n}: {r}" for n, r in sorted(failures.items())) or "no nodes available"
        await self._unschedulable(obj, f"0/{len(failures)} nodes are available: {message}", now)
        return False

    async def _node_reason(self, obj: Mapping[str, Any], uid: str, constraints: Any, node: str) -> str:
        try:
            facts = parse_node(await self.api.get_node(node))
            pods = await self.api.pods_on(node)
        except NotFoundError:
            return "node not found"
        except FormatError as exc:
            return f"unreadable Node: {exc}"
        usage = self._usage(pods, node, exclude=uid)
        return node_fit(constraints, facts, usage.used, usage.ports)

    def _usage(self, pods: list[dict[str, Any]], node: str, *, exclude: str) -> _Usage:
        """What the node's pods and active reservations request and the host ports they hold; a
        reservation counts what it reserved that its owners do not request yet."""
        used: dict[str, Fraction] = {}
        ports: set[HostPort] = set()
        for pod in pods:
            if _terminal(pod):
                continue
            try:
                c = parse_pod_constraints(_spec(pod))
            except FormatError:
                continue  # the API server accepted it; kube-scheduler counts it, we cannot read it
            for k, v in c.requests.items():
                used[k] = used.get(k, Fraction(0)) + v
            ports.update(c.host_ports)
        for other in self.store.snapshot():
            status = _status(other)
            if (str(_meta(other).get("uid")) == exclude or status.get("nodeName") != node
                    or status.get("phase") not in (keys.RESERVATION_PHASE_AVAILABLE, keys.RESERVATION_PHASE_WAITING)):
                continue  # fmt: skip
            try:
                r = parse_reservation(other)
                c = parse_pod_constraints(_template_spec(other))
            except FormatError:
                continue
            for k, v in (r.allocatable or c.requests).items():
                left = v - r.allocated.get(k, Fraction(0))
                if left > 0:
                    used[k] = used.get(k, Fraction(0)) + left
            ports.update(c.host_ports)
        return _Usage(used, tuple(sorted(ports)))

    async def _commit(self, obj: Mapping[str, Any], node: str, placement: Any,
                      requests: Mapping[str, Fraction], now: float) -> None:  # fmt: skip
        meta = _meta(obj)
        name = str(meta.get("name") or "")
        # the reserved devices go on the Reservation in a pod's device-allocated format, as
        # Koordinator's deviceshare PreBindReservation writes them (``{}`` when none, which also
        # replaces one a template carried)
        written = {_RS: placement.annotations.get(_RS) or "{}", _DA: placement.annotations.get(_DA) or "{}"}
        patched = await self.fence.write(
            self.api.patch_annotations(name, written, str(meta.get("resourceVersion") or ""))
        )
        body = dict(patched) if patched else dict(obj)
        body["status"] = available_status(_status(obj), node, requests, now)
        await self.fence.write(self.api.replace_status(name, body))

    async def _unschedulable(self, obj: Mapping[str, Any], message: str, now: float) -> None:
        status = _status(obj)
        for cond in status.get("conditions") or []:
            if (isinstance(cond, Mapping) and cond.get("type") == "Scheduled" and cond.get("status") == "False"
                    and cond.get("message") == message and status.get("phase") == "Pending"):
                return  # said already  # fmt: skip
        await self._write_status(obj, unschedulable_status(status, message, now), "unschedulable")
        log.info("reservation unschedulable", reservation=str(_meta(obj).get("name")), reason=message[:300])

    async def _write_status(self, obj: Mapping[str, Any], status: Mapping[str, Any], result: str) -> None:
        body = dict(obj)
        body["status"] = dict(status)
        written = await self.fence.write(self.api.replace_status(str(_meta(obj).get("name") or ""), body))
        if isinstance(written, dict):
            self._written[str(_meta(obj).get("uid") or "")] = written
        PLACED.labels(result).inc()

    # -- owners ----------------------------------------------------------------------------------

    def _owner_uids(self, uid: str, node: str) -> set[str]:
        return self._owners.get((uid, node), set())

    async def _sync_owners(self, obj: dict[str, Any], node: str, now: float) -> None:
        meta, status = _meta(obj), _status(obj)
        uid = str(meta.get("uid") or "")
        try:
            current = read_current_owners(status)
            r = parse_reservation(obj)
        except FormatError:
            return
        if {c[0] for c in current} == self._owner_uids(uid, node):
            return  # unchanged: no need to read the node's pods
        owners: list[tuple[str, str, str, Mapping[str, Fraction]]] = []
        for pod in await self.api.pods_on(node):
            if _terminal(pod):
                continue
            p_meta = _meta(pod)
            annotations = p_meta.get("annotations")
            text = annotations.get(keys.ANNOTATION_RESERVATION_ALLOCATED) if isinstance(annotations, Mapping) else None
            if not isinstance(text, str):
                continue
            p_uid = str(p_meta.get("uid") or "")
            try:
                if parse_reservation_allocated(text).uid != uid or p_uid not in self._owner_uids(uid, node):
                    continue  # only pods the cache counts as allocated from it (signed or trusted)
                requests = parse_pod_constraints(_spec(pod)).requests
            except FormatError:
                continue
            owners.append((p_uid, str(p_meta.get("namespace") or ""), str(p_meta.get("name") or ""), requests))
        new = owners_status(status, current, owners, r.allocatable, r.allocated, r.allocate_once, now)
        if new is not None:
            await self._write_status(obj, new, "succeeded" if new.get("phase") == PHASE_SUCCEEDED else "owners")


class _LeaseCalls:
    """``rhp_kube.lease.LeaseAPI`` over the extender's Lease calls: 404 on a read and 409 (or
    404) on a write are answers (``None``); every other failure raises."""

    def __init__(self, client: Any) -> None:  # scheduler_ext.kube.BindClient
        self.client = client

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            got: Mapping[str, Any] = await self.client.get_lease(namespace, name)
            return got
        except NotFoundError:
            return None

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            got: Mapping[str, Any] = await self.client.create_lease(namespace, body)
            return got
        except ConflictError:
            return None

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            got: Mapping[str, Any] = await self.client.replace_lease(namespace, name, body)
            return got
        except (ConflictError, NotFoundError):
            return None


class ControllerTask:
    """The elector and the controller on the verbs' loop (``scheduler_ext.server.Background``).

    ``liveness`` is a ``rhp_kube.liveness.Liveness`` check (``scheduler-ext serve`` joins it to
    the watches' with ``all_of`` for ``/healthz``): not alive once either task has ended before
    ``stop`` asked it to, whatever ended it (an exception, a return), so kubelet restarts a
    replica whose reservations nobody would place or expire any more."""

    def __init__(self, elector: Any, reserver: Reserver) -> None:  # rhp_kube.lease.Elector
        self.elector, self.reserver = elector, reserver
        self._stop: asyncio.Event | None = None
        self._tasks: list[tuple[str, asyncio.Task[None]]] = []

    def start(self) -> None:
        self._stop = asyncio.Event()
        self._tasks = [("reservation controller", asyncio.create_task(self.reserver.run(self._stop))),
                       ("reservation lease elector", asyncio.create_task(self.elector.run(self._stop)))]  # fmt: skip
        for what, task in self._tasks:
            task.add_done_callback(functools.partial(self._ended, what))

    def _ended(self, what: str, task: asyncio.Task[None]) -> None:
        if self._stop is not None and self._stop.is_set():
            return
        log.error("reservation task ended", task=what, error=_why(task)[:300])

    def liveness(self) -> tuple[bool, str]:
        """(alive, why) for ``/healthz`` (called from any thread: reads only task state)."""
        if self._stop is not None and self._stop.is_set():
            return True, "ok"  # stopping with the app
        dead = [f"{what} ended: {_why(task)}" for what, task in self._tasks if task.done()]
        return (False, "; ".join(dead)[:1000]) if dead else (True, "ok")

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        await asyncio.gather(*(t for _, t in self._tasks), return_exceptions=True)


def _why(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "returned" if exc is None else f"{type(exc).__name__}: {exc}"


def reservation_controller(
    state: ClusterState, store: ReservationStore, client: Any, placer: Placer, cfg: ExtenderConfig,
    namespace: str, lease: str, identity: str, *, gc_after: float = GC_AFTER,
) -> ControllerTask:  # fmt: skip
    """The controller of ``scheduler-ext serve`` (``client``: its ``scheduler_ext.kube.BindClient``)."""
    from rhp_kube.lease import Elector

    elector = Elector(_LeaseCalls(client), namespace, lease, identity)
    return ControllerTask(elector, Reserver(state, store, ReservationClient(client), placer, elector, cfg,
                                                gc_after=gc_after))

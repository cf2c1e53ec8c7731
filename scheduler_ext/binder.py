"""The bind verb, the one place that writes: ``Binder``.

Who calls this: ``scheduler_ext.server`` (the bind verb) and ``scheduler_ext.cli serve``, which
builds it. ``Binder.bind`` is the imperative shell around ``scheduler_ext.decide.plan``: hold the
allocation, commit it to the HA ledger, remove any scheduler-owned annotation the pending pod
carries (``scheduler_ext.trust.OWNED``, forged or stale), and create the Binding carrying the
new ones and their signature under the pod's resourceVersion (kube-apiserver sets them with
``spec.nodeName`` in one write); roll back the hold and the ledger on failure. It is a coroutine
on the server's event loop: its API calls await, so the next pod's filter runs while a bind
waits for the API server, and the cluster lock is only held around the (synchronous) planning,
never across an await.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import Counter

from scheduler_ext.allocator import AllocationError
from scheduler_ext.annotations import Allocation
from scheduler_ext.decide import DEFAULT_CONFIG, ExtenderConfig, Placement, plan
from scheduler_ext.errors import APIError, ConflictError
from scheduler_ext.guard import decode_pod
from scheduler_ext.pods import PodRequest
from scheduler_ext.state import ClusterState
from scheduler_ext.trust import LEGACY_SEAL_ANNOTATION, OWNED, SIGNATURE_ANNOTATION

__all__ = ["BIND_CONFLICTS", "BIND_ROLLBACKS", "LEDGER_EXPIRED", "BindAPI", "Binder", "Ledger"]

log = structlog.get_logger("scheduler_ext.binder")

BIND_CONFLICTS = Counter(
    "scheduler_ext_bind_conflicts_total",
    "Optimistic-concurrency conflicts met while binding, by step.",
    ["step"],
)
BIND_ROLLBACKS = Counter("scheduler_ext_bind_rollbacks_total", "Binds rolled back after a failure.")
LEDGER_EXPIRED = Counter(
    "scheduler_ext_ledger_expired_total",
    "Holds learned from another replica's HA-ledger entries, released by the sweep once the "
    "entries expired (their pod never showed up bound in this replica's cache)",
)


class BindAPI(Protocol):
    """The API calls a bind makes (``scheduler_ext.kube.BindClient`` implements it)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]: ...

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], resource_version: str
    ) -> None: ...

    async def aclose(self) -> None: ...


class Ledger(Protocol):
    """The HA ledger (``scheduler_ext.ledger.LeaseLedger``)."""

    async def entries(self, node: str, *, fresh: bool) -> Mapping[str, Allocation]: ...

    async def commit(self, node: str, uid: str, alloc: Allocation) -> None: ...

    async def remove(self, node: str, uid: str) -> None: ...

    def expired(self) -> list[tuple[str, str]]: ...


# every annotation a bind writes or removes: the scheduler-owned ones, the signature and the
# seal of earlier releases
_CLEARED: Mapping[str, None] = dict.fromkeys((*OWNED, SIGNATURE_ANNOTATION, LEGACY_SEAL_ANNOTATION))


@dataclass
class Binder:
    """Runs the bind verb: plan, hold, ledger commit, clear stale owned annotations, Binding
    carrying the new ones; undo on failure."""

    state: ClusterState
    api: BindAPI
    cfg: ExtenderConfig = DEFAULT_CONFIG
    ledger: Ledger | None = None
    attempts: int = 8
    sweep_interval: float = 5.0  # seconds between two ``expire_foreign`` runs of the sweep

    def __post_init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._sweep: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the ledger sweep on the running loop (nothing to sweep without a ledger)."""
        if self.ledger is not None and self._sweep is None:
            self._sweep = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                self.expire_foreign()
            except Exception as exc:  # the sweep outlives any one bad round
                log.warning("ledger sweep failed", error=repr(exc)[:300])

    def expire_foreign(self) -> int:
        """Release the holds learned from another replica's ledger entries (``_absorb``) whose
        entries expired and are settled (``LeaseLedger.expired``), on every node, whether or
        not a bind comes there; returns how many. A replica killed mid-bind leaves entries that
        no bind of its own will ever confirm or remove: without this, the CPUs they name stayed
        held in this replica's cache until the next bind on their node re-read the Lease."""
        if self.ledger is None:
            return 0
        released = 0
        for node, uid in self.ledger.expired():
            with self.state.lock:
                ns = self.state.node(node)
                if ns is None or uid not in ns.foreign:
                    continue  # confirmed by the watch, released already, or our own hold
                self.state.release(uid, node)
                released += 1
        if released:
            LEDGER_EXPIRED.inc(released)
            log.info("released expired ledger entries of other replicas", holds=released)
        return released

    def _node_lock(self, node: str) -> asyncio.Lock:
        """Serialises this replica's ledger commits per node (other replicas meet the CAS)."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    async def aclose(self) -> None:
        sweep, self._sweep = self._sweep, None
        if sweep is not None:
            sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweep
        await self.api.aclose()

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod; returns "" on success or the reason, with nothing left half-done.

        Runs to its end even when the caller goes away: an ASGI server does not cancel a
        request's task on disconnect, and ``shield`` keeps a cancelled caller from cutting a
        bind between its writes and its rollback.
        """
        return await asyncio.shield(self._guarded(namespace, name, uid, node))

    async def _guarded(self, namespace: str, name: str, uid: str, node: str) -> str:
        try:
            return await self._bind(namespace, name, uid, node)
        except APIError as exc:
            return f"bind {namespace}/{name} to {node}: API error {exc}"

    async def _pod(self, namespace: str, name: str, uid: str) -> tuple[PodRequest, str, str, bool]:
        """(request, resourceVersion, node it is bound to or "", whether it carries any owned
        annotation, signature or seal), from the cache when it knows the pending pod, else a GET."""
        entry = self.state.pending(uid)
        if entry is not None and entry.request is not None and entry.name == name:
            return entry.request, entry.rv, "", entry.owned
        pod = await self.api.get_pod(namespace, name)
        meta, spec = pod.get("metadata"), pod.get("spec")
        meta = meta if isinstance(meta, dict) else {}
        spec = spec if isinstance(spec, dict) else {}
        if uid and meta.get("uid") != uid:
            raise AllocationError(f"pod {namespace}/{name} has UID {str(meta.get('uid'))[:64]}, not {uid}")
        annotations = meta.get("annotations")
        return (
            decode_pod(pod),
            str(meta.get("resourceVersion") or ""),
            str(spec.get("nodeName") or ""),
            isinstance(annotations, dict) and any(k in annotations for k in _CLEARED),
        )

    async def reserve(self, req: PodRequest, uid: str, node: str) -> Placement:
        """Plan and hold a Reservation's reserve pod on ``node`` exactly as a pod's bind does
        (``scheduler_ext.reserver``): the cache holds it and the HA ledger records it until the
        watch shows the reservation placed; ``unreserve`` undoes it."""
        return await self._place(req, uid, node)

    async def unreserve(self, uid: str, node: str, placement: Placement) -> None:
        await self._rollback(uid, node, placement)

    async def _place(self, req: PodRequest, uid: str, node: str) -> Placement:
        """Plan and hold, serialised with the other replicas through the ledger."""
        if self.ledger is None:
            return await self._place_once(req, uid, node)
        async with self._node_lock(node):
            return await self._place_once(req, uid, node)

    async def _place_once(self, req: PodRequest, uid: str, node: str) -> Placement:
        for attempt in range(self.attempts):
            if self.ledger is not None:
                foreign = await self.ledger.entries(node, fresh=attempt > 0)
                self._absorb(node, uid, foreign)
            with self.state.lock:
                ns = self.state.node(node)
                if ns is None:
                    raise AllocationError(f"node {node} is not in the extender's cache")
                placement = plan(ns, req, self.cfg)
                if not placement.allocation.empty:
                    self.state.hold(uid, node, placement.allocation)
            if self.ledger is None or placement.allocation.empty:
                return placement
            try:
                await self.ledger.commit(node, uid, placement.allocation)
                return placement
            except ConflictError:
                BIND_CONFLICTS.labels("ledger").inc()
                self.state.release(uid, node)
        raise AllocationError(f"node {node}: ledger stayed contended for {self.attempts} attempts")

    def _absorb(self, node: str, own: str, foreign: Mapping[str, Allocation]) -> None:
        with self.state.lock:
            ns = self.state.node(node)
            if ns is None:
                return
            for uid in list(ns.foreign):
                if uid not in foreign:
                    self.state.release(uid, node)
            for uid, alloc in foreign.items():
                if uid == own or self.state.recently_deleted(uid) or uid in ns.reservations:
                    continue  # a reservation the watch shows placed counts by itself
                if uid in ns.allocs and uid not in ns.foreign:
                    continue  # our own hold or confirmed by the watch
                self.state.hold(uid, node, alloc, foreign=True)

    def _written(self, namespace: str, name: str, uid: str, node: str, cpu_milli: int,
                 placement: Placement) -> dict[str, str]:  # fmt: skip
        """What the Binding carries: the owned annotations of this placement and their
        signature (over the pod's identity, the node and its CPU request)."""
        annotations = dict(placement.annotations)
        signature = self.state.trust.sign(uid, namespace, name, node, cpu_milli, annotations)
        if signature is not None:
            annotations[SIGNATURE_ANNOTATION] = signature
        return annotations

    async def _bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        started = time.monotonic()
        stale = self.state.stale_kinds()
        if stale:
            return (f"cannot bind {namespace}/{name}: the extender's cache of {', '.join(stale)} is stale "
                    "(no word from the API server's watch); refusing to allocate from it")
        try:
            req, rv, bound_to, owned = await self._pod(namespace, name, uid)
        except AllocationError as exc:
            return str(exc)
        if bound_to:
            return "" if bound_to == node else f"pod {namespace}/{name} is already bound to {bound_to}"
        if req.error:
            return req.error
        try:
            placement = await self._place(req, uid, node)
        except AllocationError as exc:
            return f"cannot allocate on {node}: {exc}"
        written = self._written(namespace, name, uid, node, req.cpu_milli, placement)
        step = "clear"
        try:
            for attempt in range(3):
                if owned:
                    step = "clear"
                    rv = await self._clear(namespace, name, uid, rv)
                step = "binding"
                try:
                    await self.api.bind_pod(namespace, name, uid, node, written, rv)
                    break
                except ConflictError:
                    # the pod changed since ``rv`` (or was bound or replaced): read it again
                    BIND_CONFLICTS.labels("binding").inc()
                    if attempt == 2:
                        raise
                    rv, owned = await self._reread(namespace, name, uid, node, written)
                    if not rv:
                        return ""  # bound by this very bind (a retried Binding that had landed)
        except (APIError, AllocationError) as exc:
            if step == "binding" and isinstance(exc, APIError) and await self._landed(
                namespace, name, uid, node, written
            ):
                log.warning("binding reply lost, but the pod is bound with this allocation",
                            pod=f"{namespace}/{name}", node=node, error=str(exc))
                return ""
            BIND_ROLLBACKS.inc()
            await self._rollback(uid, node, placement)
            log.warning("bind failed", pod=f"{namespace}/{name}", node=node, step=step, error=str(exc))
            return f"bind {namespace}/{name} to {node} failed at {step}, rolled back: {exc}"
        log.debug(
            "bound",
            pod=f"{namespace}/{name}",
            node=node,
            ms=round((time.monotonic() - started) * 1000, 2),
            **placement.annotations,
        )
        return ""

    async def _reread(
        self, namespace: str, name: str, uid: str, node: str, written: Mapping[str, str]
    ) -> tuple[str, bool]:
        """After a Binding conflict: the pod's current (resourceVersion, carries owned
        annotations), or ("", False) when this bind's Binding is what bound it; raises
        ``AllocationError`` when it was replaced or bound otherwise."""
        fresh = await self.api.get_pod(namespace, name)
        meta = fresh.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise AllocationError(f"pod {namespace}/{name} was replaced")
        if (fresh.get("spec") or {}).get("nodeName"):
            if self._is_ours(fresh, uid, node, written):
                return "", False
            raise AllocationError(f"pod {namespace}/{name} was bound meanwhile")
        annotations = meta.get("annotations")
        owned = isinstance(annotations, dict) and any(k in annotations for k in _CLEARED)
        return str(meta.get("resourceVersion") or ""), owned

    @staticmethod
    def _is_ours(pod: Mapping[str, Any], uid: str, node: str, written: Mapping[str, str]) -> bool:
        """Bound to ``node`` with exactly this bind's annotations (and nothing owned besides)."""
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        return (
            (pod.get("spec") or {}).get("nodeName") == node
            and (not uid or meta.get("uid") == uid)
            and all(ann.get(k) == written.get(k) for k in _CLEARED)
        )

    async def _landed(self, namespace: str, name: str, uid: str, node: str, written: Mapping[str, str]) -> bool:
        """After a failed Binding call, did it land anyway (a reply lost to a timeout or a reset)?

        Only when the pod is bound to ``node`` and carries exactly this bind's annotations: then
        the hold stays (the watch confirms it) and rolling back would strip a live allocation.
        A pod bound elsewhere, or by another replica with other CPUs, is not ours.
        """
        try:
            pod = await self.api.get_pod(namespace, name)
        except APIError:
            return False
        return self._is_ours(pod, uid, node, written)

    async def _clear(self, namespace: str, name: str, uid: str, rv: str) -> str:
        """Remove every owned annotation and any signature or seal from the unbound pod (a merge patch with
        the resourceVersion precondition; on a stale version, re-read once); returns the new
        resourceVersion, the precondition of the Binding that follows.

        Harmless when the bind fails later: an unbound pod's owned annotations count nowhere,
        and whoever binds it next clears or writes them again.
        """
        for attempt in range(2):
            try:
                pod = await self.api.patch_pod_annotations(namespace, name, _CLEARED, rv)
                return str((pod.get("metadata") or {}).get("resourceVersion") or "")
            except ConflictError:
                BIND_CONFLICTS.labels("patch").inc()
                if attempt:
                    raise
                fresh = await self.api.get_pod(namespace, name)
                meta = fresh.get("metadata") or {}
                if meta.get("uid") != uid:
                    raise AllocationError(f"pod {namespace}/{name} was replaced") from None
                if (fresh.get("spec") or {}).get("nodeName"):
                    raise AllocationError(f"pod {namespace}/{name} was bound meanwhile") from None
                rv = str(meta.get("resourceVersion") or "")
        raise AssertionError("unreachable")

    async def _rollback(self, uid: str, node: str, placement: Placement) -> None:
        """Undo a failed bind: the ledger entry and the hold. The pod carries nothing to undo:
        the new annotations travel only in the Binding, which did not land."""
        if self.ledger is not None and not placement.allocation.empty:
            try:
                await self.ledger.remove(node, uid)
            except APIError as exc:
                log.warning("ledger cleanup failed; entry expires", node=node, error=str(exc))
        self.state.release(uid, node)


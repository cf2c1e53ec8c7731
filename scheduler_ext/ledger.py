"""The HA ledger: one Lease per node, updated by compare-and-swap, so replicas never
double-allocate.

Who calls this: ``binder.Binder`` before it PATCHes a pod (``commit``) and when it rolls a
bind back (``remove``). The Lease calls go through ``scheduler_ext.kube.BindClient``, as
coroutines on the server's event loop; the ledger's cache is only touched from that loop.

Why it is needed: kube-scheduler sends binds for different pods to whichever replica the
Service picks. Each replica's cache learns about the other's allocations only through the
watch, so two replicas could hand the same CPU to two pods on one node within the watch lag.
The pod's own resourceVersion precondition does not help: the two pods are different objects.

Design:

- Lease ``<prefix><node>`` in the ledger namespace carries, in the annotation
  ``scheduler-ext.runtime-hook-proxy.io/allocations``, the allocations made on that node in
  the last ``ttl`` seconds: ``{pod uid: {"cpuset", "numa", "numa_memory", "gpus", "exclusive", "ts"}}``.
- A bind plans against its cache plus every ledger entry (``entries``), then writes the Lease
  with the resourceVersion it read (``commit``). If another replica committed in between, the
  API server answers 409 and the bind re-reads the ledger, re-plans and tries again. So the
  commits on one node are serialised and each one saw every allocation committed before it,
  either in its cache or in the ledger.
- Entries expire after ``ttl`` (default 120 s), far longer than any healthy watch lag, but an
  expired entry is dropped (from what a replica reads, and from the Lease at its next write)
  only once that replica's cache has *settled* it (``ClusterState.settled``): the watch showed
  the pod bound to the node (its own annotations count from then on) or deleted, or the pod
  watch heard from the API server after the entry's time plus ``ttl``. A replica whose watch
  stalls therefore keeps every entry it has not seen confirmed, however old. Entries whose pod
  this replica saw deleted are dropped at the next write.
- Expiry does not wait for a bind: every entry read is indexed by the time it expires
  (``expired``, a heap, so a call costs only what is due). The binder's sweep
  (``Binder.expire_foreign``, every few seconds) releases the holds it learned from another
  replica's entries once they expired and are settled, so a replica killed mid-bind holds no CPU
  past the TTL on a node that never sees another bind. An entry due but not yet settled is
  looked at again ``recheck`` seconds later.
- Single-replica fast path: the last written version is cached, so an uncontended commit is
  one PUT; only a 409 costs a GET. A node whose Lease this process has never seen is assumed
  to have none: the commit creates it (one POST), and 409 AlreadyExists is handled like any
  other conflict (GET, re-plan, PUT).
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

from koord_formats import keys
from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from scheduler_ext.allocator import GPUGrant
from scheduler_ext.annotations import Allocation
from scheduler_ext.errors import ConflictError, NotFoundError

__all__ = ["LEDGER_ANNOTATION", "LeaseAPI", "LeaseLedger", "decode_entries", "encode_entry"]

LEDGER_ANNOTATION = "scheduler-ext.runtime-hook-proxy.io/allocations"


class LeaseAPI(Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def encode_entry(alloc: Allocation, ts: float) -> dict[str, Any]:
    return {
        "cpuset": format_cpu_list(alloc.cpus),
        "numa": {str(n): m for n, m in alloc.numa.items()},
        "numa_memory": {str(n): m for n, m in alloc.numa_memory.items()},
        "gpus": [[g.minor, g.core, g.ratio, g.memory] for g in alloc.gpus],
        "exclusive": alloc.exclusive,
        "reservation": alloc.reservation,
        "ts": round(ts, 3),
    }


def decode_entries(text: str | None) -> dict[str, tuple[Allocation, float]]:
    """Ledger annotation -> {uid: (allocation, timestamp)}; garbage yields nothing."""
    if not text:
        return {}
    try:
        doc = orjson.loads(text)
    except ValueError:
        return {}
    out: dict[str, tuple[Allocation, float]] = {}
    if not isinstance(doc, dict):
        return out
    for uid, e in doc.items():
        try:
            alloc = Allocation(
                cpus=parse_cpu_list(e.get("cpuset") or ""),
                numa={int(n): int(m) for n, m in (e.get("numa") or {}).items()},
                numa_memory={int(n): int(m) for n, m in (e.get("numa_memory") or {}).items()},
                gpus=tuple(GPUGrant(int(a), int(b), int(c), int(d)) for a, b, c, d in e.get("gpus") or []),
                exclusive=str(e.get("exclusive") or keys.EXCLUSIVE_POLICY_NONE),
                reservation=str(e.get("reservation") or "")[:253],
            )
            out[str(uid)] = (alloc, float(e.get("ts") or 0))
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def lease_name(prefix: str, node: str) -> str:
    """A valid Lease name for a node (hashed when prefix plus node would be too long)."""
    name = f"{prefix}{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{prefix}{node[: 253 - len(prefix) - 17]}-{digest}"


class LeaseLedger:
    """Per-node allocation ledger in Leases; used from one event loop."""

    def __init__(
        self,
        api: LeaseAPI,
        namespace: str,
        *,
        identity: str,
        prefix: str = "scheduler-ext-",
        ttl: float = 120.0,
        is_deleted: Callable[[str], bool] = lambda uid: False,
        settled: Callable[[str, str, float], bool] = lambda uid, node, since: True,
        clock: Callable[[], float] = time.time,
        recheck: float = 5.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.prefix = prefix
        self.ttl = ttl
        self.is_deleted = is_deleted
        self.settled = settled  # (uid, node, entry time + ttl) -> may the expired entry go
        self.clock = clock
        self._cache: dict[str, dict[str, Any] | None] = {}  # node -> last Lease read or written (None: none)
        self.recheck = recheck  # seconds until a due but unsettled entry is looked at again
        # the expiry index: (node, uid) -> (when its entry expires, when to look at it next);
        # ``_due`` is a heap of (when to look, node, uid), an item stale unless it matches the index
        self._expiry: dict[tuple[str, str], tuple[float, float]] = {}
        self._due: list[tuple[float, str, str]] = []

    async def _read(self, node: str) -> dict[str, Any] | None:
        """GET the node's Lease (``None`` when there is none yet) and remember it."""
        try:
            lease: dict[str, Any] | None = await self.api.get_lease(
                self.namespace, lease_name(self.prefix, node)
            )
        except NotFoundError:
            lease = None
        self._cache[node] = lease
        return lease

    async def _current(self, node: str, fresh: bool) -> dict[str, Any] | None:
        """The Lease as last read or written; a node never seen counts as having none.

        Assuming "none" is optimistic and safe: the first ``commit`` then *creates* the Lease,
        which the API server refuses (409 AlreadyExists) if any replica made one before, and
        the caller re-reads (``fresh``) and re-plans as on any other conflict. So a bind on a
        node without a Lease costs one POST instead of GET, POST and PUT.
        """
        if not fresh:
            return self._cache.get(node)
        return await self._read(node)

    async def entries(self, node: str, *, fresh: bool) -> dict[str, Allocation]:
        """Live ledger entries of ``node`` (from the last read unless ``fresh``)."""
        lease = await self._current(node, fresh)
        if lease is None:
            return {}
        now = self.clock()
        text = ((lease.get("metadata") or {}).get("annotations") or {}).get(LEDGER_ANNOTATION)
        live: dict[str, Allocation] = {}
        for uid, (alloc, ts) in decode_entries(text).items():
            if now - ts <= self.ttl or not self.settled(uid, node, ts + self.ttl):
                live[uid] = alloc
                self._index(node, uid, ts + self.ttl)
        return live

    def _index(self, node: str, uid: str, expires: float) -> None:
        key = (node, uid)
        known = self._expiry.get(key)
        if known is not None and known[0] == expires:
            return
        self._expiry[key] = (expires, expires)
        heapq.heappush(self._due, (expires, node, uid))

    def expired(self) -> list[tuple[str, str]]:
        """The (node, uid) of the entries read so far that expired since the last call and may
        go (settled, or their pod deleted), each once; costs what is due, not what is indexed.
        An entry due but unsettled is looked at again ``recheck`` seconds later."""
        now = self.clock()
        out: list[tuple[str, str]] = []
        while self._due and self._due[0][0] <= now:
            look, node, uid = heapq.heappop(self._due)
            key = (node, uid)
            known = self._expiry.get(key)
            if known is None or known[1] != look:
                continue  # forgotten, or indexed again since this item was pushed
            expires = known[0]
            if self.is_deleted(uid) or self.settled(uid, node, expires):
                del self._expiry[key]
                out.append(key)
            else:
                self._expiry[key] = (expires, now + self.recheck)
                heapq.heappush(self._due, (now + self.recheck, node, uid))
        return out

    def indexed(self) -> int:
        """How many entries wait in the expiry index."""
        return len(self._expiry)

    async def _write(self, node: str, lease: dict[str, Any] | None, entries: dict[str, Any]) -> None:
        """PUT with the version read (compare-and-swap), or POST when there was no Lease."""
        text = orjson.dumps(entries).decode()
        renew = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(self.clock()))
        if lease is None:
            name = lease_name(self.prefix, node)
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": self.namespace,
                             "annotations": {LEDGER_ANNOTATION: text}},
                "spec": {"holderIdentity": self.identity, "renewTime": renew},
            }
            new = await self.api.create_lease(self.namespace, body)
        else:
            meta = dict(lease.get("metadata") or {})
            meta["annotations"] = {**(meta.get("annotations") or {}), LEDGER_ANNOTATION: text}
            spec = {**(lease.get("spec") or {}), "holderIdentity": self.identity, "renewTime": renew}
            body = {**lease, "metadata": meta, "spec": spec}  # the stored Lease is never changed
            new = await self.api.replace_lease(self.namespace, str(meta["name"]), body)
        self._cache[node] = new

    def _live(self, node: str, lease: Mapping[str, Any] | None) -> dict[str, Any]:
        """The entries a write keeps: not deleted, and not expired unless still unsettled."""
        if lease is None:
            return {}
        text = ((lease.get("metadata") or {}).get("annotations") or {}).get(LEDGER_ANNOTATION)
        try:
            doc = orjson.loads(text) if text else {}
        except ValueError:
            doc = {}
        now = self.clock()
        out: dict[str, Any] = {}
        for uid, e in doc.items() if isinstance(doc, dict) else ():
            if not isinstance(e, dict) or self.is_deleted(uid):
                continue
            try:
                ts = float(e.get("ts") or 0)
            except (TypeError, ValueError):
                continue
            if now - ts <= self.ttl or not self.settled(uid, node, ts + self.ttl):
                out[uid] = e
        return out

    async def commit(self, node: str, uid: str, alloc: Allocation) -> None:
        """Add ``uid``'s allocation; ``ConflictError`` if the ledger moved since it was read
        (or, for a node believed to have no Lease yet, if one exists after all).

        The caller planned against ``entries``; on conflict it must re-read (``fresh=True``)
        and plan again, which is what makes concurrent replicas safe.
        """
        lease = self._cache.get(node)
        live = self._live(node, lease)
        live[uid] = encode_entry(alloc, self.clock())
        try:
            await self._write(node, lease, live)
        except ConflictError:
            self._cache.pop(node, None)
            raise
        except NotFoundError:  # the Lease was deleted since we read it: start over like a 409
            self._cache.pop(node, None)
            raise ConflictError(409, f"ledger Lease of node {node} disappeared") from None
        self._expiry.pop((node, uid), None)  # our own entry: the watch or a rollback ends its hold

    async def remove(self, node: str, uid: str) -> None:
        """Drop ``uid`` (rollback); retries on conflict, gives up quietly (the entry expires)."""
        for attempt in range(3):
            lease = await self._current(node, attempt > 0)
            if lease is None and attempt == 0:
                lease = await self._read(node)  # never seen here: look before concluding "nothing"
            live = self._live(node, lease)
            if uid not in live:
                return
            del live[uid]
            try:
                await self._write(node, lease, live)
                return
            except ConflictError:
                continue

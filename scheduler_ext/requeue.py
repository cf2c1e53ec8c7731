"""Make kube-scheduler retry the pods the extender refused for a node's missing CPU topology,
or while its caches were stale.

kube-scheduler watches no custom resource, so a pod refused with "node(s) invalid CPU
Topology" before its node's NodeResourceTopology existed stays in its unschedulable pool until
the periodic flush (up to 5 minutes). Any update of the pending pod itself moves it back: the
scheduler records a pod refused by an extender under the pseudo-plugin ``Extender``, which is
registered for every cluster event with a hint that always queues (kube-scheduler 1.34,
``framework/runtime/framework.go`` and ``schedule_one.go``), and ``PriorityQueue.Update`` of an
unschedulable pod runs those hints for the pod's own update.

So filter records each pod refused for a node without topology (``TopologyWaiters``, bounded),
and :class:`Requeuer` checks the cache twice a second: once such a node has a topology, each pod
waiting for it gets one merge patch of :data:`REQUEUE_ANNOTATION` (guarded by the
resourceVersion it just read; only a pod that is still unbound and still the same pod), at most
``rate`` patches a second. The annotation is the extender's (any replica); it carries the node
and the time and means nothing else.

The same goes for a pod filter refused while a kind of the extender's cache was stale or not
yet listed (``ClusterState.stale_kinds``, as after an API server outage): the refusal may have
come from what the cache no longer knows (a pod deleted meanwhile still holding its CPUs), and
nothing kube-scheduler watches changes when the cache catches up. Such a pod waits under the
pseudo-node :data:`STALE_CACHE` until ``fresh()`` says no kind is stale, then gets the same
patch, so it is retried within a second of the recovery instead of at the next unrelated
cluster event or the 5 minute flush.

Fair per namespace: one tenant's many pending pods must not delay everyone's. The waiting list
bounds each namespace (``per_namespace`` pairs) and, when it is full, makes room for a namespace
holding fewer pairs than the largest by forgetting the largest one's oldest refusal (max-min
fair); the patch queue (:class:`FairQueue`) serves the namespaces round-robin, each bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Gauge

from scheduler_ext.errors import APIError, ConflictError, NotFoundError

__all__ = ["REQUEUE_ANNOTATION", "STALE_CACHE", "FairQueue", "Requeuer", "TopologyWaiters", "Waiter"]

log = structlog.get_logger("scheduler_ext.requeue")

REQUEUE_ANNOTATION = "scheduler-ext.runtime-hook-proxy.io/topology-requeue"
"""Written by the extender on a pending pod it refused for a node's missing CPU topology, once
that node has one (``<node> <unix milliseconds>``), or while its cache was stale, once it is
fresh again (``(stale cache) <unix milliseconds>``). Its only purpose is to be a change."""

STALE_CACHE = "(stale cache)"
"""The pseudo-node a pod refused while the cache was stale waits for (no node is named so: a
node name is a DNS subdomain)."""

REQUEUES = Counter(
    "scheduler_ext_topology_requeues_total",
    "Pending pods refused for a node's missing CPU topology (or while the cache was stale), by "
    "what happened once the node had one (or the cache was fresh): patched (kube-scheduler "
    "retries it), bound, gone, conflict (changed meanwhile, so retried anyway), error, dropped "
    "(over the waiting or queue bound)",
    ["result"],
)
WAITING = Gauge(
    "scheduler_ext_topology_waiters",
    "Pending pods the extender refused for a node's missing CPU topology (or while its cache "
    "was stale) and will requeue",
)

MAX_WAITERS = 10_000
"""(pod, node) pairs remembered at most; past it new refusals are not remembered (unless their
namespace holds fewer pairs than the largest one: see :class:`TopologyWaiters`)."""
MAX_WAITERS_PER_NAMESPACE = 1_000
"""(pod, node) pairs remembered at most per namespace, and queued patches at most per namespace."""
MAX_NODES_PER_POD = 64
"""Nodes remembered per pod: the first topology that appears requeues the pod anyway."""
MAX_NAME = 253
"""Longest namespace, name or UID remembered (longer ones are not Kubernetes names)."""
WAIT_TTL = 600.0
"""Seconds a refusal is remembered (kube-scheduler's own flush retries the pod after 5 minutes)."""


@dataclass(frozen=True)
class Waiter:
    """A pending pod refused on a node for its missing topology."""

    namespace: str
    name: str
    uid: str


class TopologyWaiters:
    """Pods refused for a node's missing topology, by node: bounded in pairs (in all and per
    namespace), nodes per pod and age. Pure bookkeeping; the clock is passed in.

    When the list is full, a refusal from a namespace holding at least two pairs fewer than the
    largest namespace takes the place of that namespace's oldest pair, so a tenant with many
    pending pods cannot keep the others' out.
    """

    def __init__(
        self,
        limit: int = MAX_WAITERS,
        per_pod: int = MAX_NODES_PER_POD,
        ttl: float = WAIT_TTL,
        per_namespace: int = MAX_WAITERS_PER_NAMESPACE,
    ) -> None:
        self.limit, self.per_pod, self.ttl, self.per_namespace = limit, per_pod, ttl, per_namespace
        self._by_node: dict[str, dict[str, tuple[Waiter, float]]] = {}
        self._nodes_of: dict[str, set[str]] = {}
        # namespace -> its (uid, node) pairs, oldest first (dicts keep insertion order)
        self._of_namespace: dict[str, dict[tuple[str, str], None]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def nodes(self) -> list[str]:
        """Nodes some pod waits for."""
        return list(self._by_node)

    def held_by(self, namespace: str) -> int:
        """Pairs ``namespace`` holds."""
        return len(self._of_namespace.get(namespace, ()))

    def _room_for(self, namespace: str) -> bool:
        """Whether a new pair of ``namespace`` fits, making room at the largest namespace's
        expense when the list is full and that is fairer."""
        mine = self.held_by(namespace)
        if mine >= self.per_namespace:
            return False
        if self._size < self.limit:
            return True
        largest = max(self._of_namespace, key=lambda ns: len(self._of_namespace[ns]), default=None)
        if largest is None or largest == namespace or len(self._of_namespace[largest]) <= mine + 1:
            return False
        uid, node = next(iter(self._of_namespace[largest]))
        self._drop_pair(largest, uid, node)
        return True

    def _drop_pair(self, namespace: str, uid: str, node: str) -> None:
        pods = self._by_node.get(node)
        if pods is None or pods.pop(uid, None) is None:
            return
        self._size -= 1
        if not pods:
            del self._by_node[node]
        nodes = self._nodes_of.get(uid)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._nodes_of[uid]
        pairs = self._of_namespace.get(namespace)
        if pairs is not None:
            pairs.pop((uid, node), None)
            if not pairs:
                del self._of_namespace[namespace]

    def add(self, waiter: Waiter, nodes: Iterable[str], now: float) -> int:
        """Remember that ``waiter`` was refused on ``nodes``; returns how many pairs did not fit
        (or were forgotten to make room, as those are dropped refusals too)."""
        mine = self._nodes_of.setdefault(waiter.uid, set())
        dropped = 0
        for node in nodes:
            pods = self._by_node.get(node)
            if pods is not None and waiter.uid in pods:
                known = pods[waiter.uid][0]  # refreshed (its namespace is kept: the pair is counted there)
                pods[waiter.uid] = (waiter if waiter.namespace == known.namespace else known, now)
                continue
            if len(mine) >= self.per_pod:
                dropped += 1
                continue
            full = self._size >= self.limit
            if not self._room_for(waiter.namespace):
                dropped += 1
                continue
            dropped += full  # another namespace's oldest refusal was forgotten for this one
            mine = self._nodes_of.setdefault(waiter.uid, mine)  # (making room may have dropped it)
            self._by_node.setdefault(node, {})[waiter.uid] = (waiter, now)
            mine.add(node)
            self._of_namespace.setdefault(waiter.namespace, {})[(waiter.uid, node)] = None
            self._size += 1
        if not mine:
            self._nodes_of.pop(waiter.uid, None)
        return dropped

    def _forget(self, uid: str) -> None:
        for node in list(self._nodes_of.get(uid, ())):
            entry = self._by_node.get(node, {}).get(uid)
            if entry is not None:
                self._drop_pair(entry[0].namespace, uid, node)
        self._nodes_of.pop(uid, None)

    def take(self, ready: Iterable[str], now: float) -> list[tuple[str, Waiter]]:
        """Remove and return the pods waiting for a node of ``ready`` (each pod once, with the
        first such node), and forget refusals older than the TTL."""
        out: list[tuple[str, Waiter]] = []
        for node in ready:
            for uid, (waiter, _) in list(self._by_node.get(node, {}).items()):
                self._forget(uid)
                out.append((node, waiter))
        expired = {uid for pods in self._by_node.values() for uid, (_, at) in pods.items() if now - at > self.ttl}
        for uid in expired:
            self._forget(uid)
        return out


class FairQueue:
    """The patch queue: one FIFO per namespace, served round-robin, bounded in all (``limit``)
    and per namespace (``per_namespace``)."""

    def __init__(self, limit: int = MAX_WAITERS, per_namespace: int = MAX_WAITERS_PER_NAMESPACE) -> None:
        self.limit, self.per_namespace = limit, per_namespace
        self._queues: dict[str, deque[tuple[str, Waiter]]] = {}
        self._turns: deque[str] = deque()  # namespaces with something queued, next to serve first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, item: tuple[str, Waiter]) -> bool:
        """Queue ``(node, waiter)`` behind its namespace's others; ``False`` when it does not fit."""
        namespace = item[1].namespace
        queue = self._queues.get(namespace)
        if self._size >= self.limit or (queue is not None and len(queue) >= self.per_namespace):
            return False
        if queue is None:
            queue = self._queues[namespace] = deque()
            self._turns.append(namespace)
        queue.append(item)
        self._size += 1
        return True

    def pop(self) -> tuple[str, Waiter]:
        """The oldest item of the namespace whose turn it is (``IndexError`` when empty)."""
        namespace = self._turns.popleft()
        queue = self._queues[namespace]
        item = queue.popleft()
        self._size -= 1
        if queue:
            self._turns.append(namespace)
        else:
            del self._queues[namespace]
        return item


def topology_refusals(unresolvable: Mapping[str, str], reason: str) -> list[str]:
    """The nodes of a filter reply refused for ``reason`` (the missing-topology one; alone or
    among several reasons joined with "; ")."""
    return [node for node, why in unresolvable.items() if why == reason or reason in why.split("; ")]


class PodAPI(Protocol):
    """The two calls a requeue makes (``scheduler_ext.kube.BindClient`` has them)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]: ...


class Requeuer:
    """The imperative shell around :class:`TopologyWaiters` (see the module docstring).

    ``has_topology(nodes)`` returns those of ``nodes`` the cache has a CPU topology for now;
    ``fresh()`` whether no kind of the cache is stale now (``None``: always).
    """

    def __init__(
        self,
        api: PodAPI,
        has_topology: Callable[[Iterable[str]], list[str]],
        *,
        rate: float = 20.0,
        interval: float = 0.5,
        queue_limit: int = MAX_WAITERS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        fresh: Callable[[], bool] | None = None,
    ) -> None:
        self.api = api
        self.has_topology = has_topology
        self.fresh = fresh
        self.rate, self.interval = rate, interval
        self.waiters = TopologyWaiters()
        self.queue = FairQueue(queue_limit)
        self.clock, self.wall = clock, wall
        self._task: asyncio.Task[None] | None = None

    def refused(self, pod: Mapping[str, Any], nodes: list[str]) -> None:
        """Filter refused ``pod`` (its JSON) on ``nodes`` for their missing topology (or, with
        ``[STALE_CACHE]``, while the cache was stale: :meth:`refused_while_stale`)."""
        if not nodes:
            return
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            return
        namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
        if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str) and name and uid):
            return
        if max(len(namespace), len(name), len(uid)) > MAX_NAME:
            return
        dropped = self.waiters.add(Waiter(namespace or "default", name, uid), nodes, self.clock())
        if dropped:
            REQUEUES.labels("dropped").inc(dropped)
        WAITING.set(len(self.waiters))

    def refused_while_stale(self, pod: Mapping[str, Any]) -> None:
        """Filter refused ``pod`` on some node while the cache was stale: requeue it once fresh."""
        self.refused(pod, [STALE_CACHE])

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def due(self) -> None:
        """Move the pods whose node has a topology now into the patch queue (bounded)."""
        nodes = [n for n in self.waiters.nodes() if n != STALE_CACHE]
        ready = self.has_topology(nodes) if nodes else []
        if len(nodes) < len(self.waiters.nodes()) and (self.fresh is None or self.fresh()):
            ready.append(STALE_CACHE)
        for item in self.waiters.take(ready, self.clock()):
            if not self.queue.push(item):
                REQUEUES.labels("dropped").inc()
        WAITING.set(len(self.waiters))

    async def run(self) -> None:
        """Every ``interval``: one :meth:`tick`."""
        budget = 0.0
        while True:
            await asyncio.sleep(self.interval)
            budget = await self.tick(budget)

    async def tick(self, budget: float) -> float:
        """Collect what is due, then patch as many queued pods as the budget allows (it grows by
        ``rate * interval`` a tick, up to one second's worth); returns the budget left."""
        self.due()
        budget = min(max(self.rate, 1.0), budget + self.rate * self.interval)
        while self.queue and budget >= 1:
            node, waiter = self.queue.pop()
            budget -= 1
            REQUEUES.labels(await self.nudge(node, waiter)).inc()
        return budget

    async def nudge(self, node: str, waiter: Waiter) -> str:
        """Patch the requeue annotation on the pod if it is still the same unbound pod; returns
        the result label."""
        who = {"pod": f"{waiter.namespace}/{waiter.name}", "uid": waiter.uid, "node": node}
        try:
            pod = await self.api.get_pod(waiter.namespace, waiter.name)
            meta = pod.get("metadata") if isinstance(pod, dict) else None
            spec = pod.get("spec") if isinstance(pod, dict) else None
            if not isinstance(meta, dict) or not isinstance(spec, dict):
                return "gone"  # not a pod we can judge
            if meta.get("uid") != waiter.uid or meta.get("deletionTimestamp"):
                return "gone"
            if spec.get("nodeName"):
                return "bound"
            value = f"{node} {int(self.wall() * 1000)}"
            await self.api.patch_pod_annotations(
                waiter.namespace, waiter.name, {REQUEUE_ANNOTATION: value}, str(meta.get("resourceVersion") or "")
            )
        except NotFoundError:
            return "gone"
        except ConflictError:
            return "conflict"  # the pod changed: kube-scheduler saw that update already
        except APIError as exc:
            log.warning("requeue after topology failed", error=str(exc), **who)
            return "error"
        except Exception as exc:  # whatever the API answered, the loop goes on for the other pods
            log.warning("requeue after topology failed", error=repr(exc)[:300], **who)
            return "error"
        if node == STALE_CACHE:
            log.info("requeued pod: refused while the cache was stale, which is fresh again", **who)
        else:
            log.info("requeued pod: its node's CPU topology appeared", **who)
        return "patched"

"""The manager's loop: a cache fed by watches, and one reconcile per node that writes what the
pure functions decide.

Who calls this: ``colocation_manager.cli`` (``scheduler-ext manager``) builds a ``Cache``,
keeps it in step with the one list-and-watch (``rhp_kube.watch.Informer``, on its own thread,
over ``colocation_manager.kubeio.manager_resources``), starts an
``Elector`` (``rhp_kube.lease``) and ``Reconciler.run`` on one event loop. Nothing is written before
every kind has been listed once. Every write goes through the elector's fence
(``Elector.write``): it is started only inside this replica's term as the Lease's holder and
cancelled when the term ends, so a deposed or partitioned leader writes nothing after its Lease
lapses, even in the middle of a round.

Per node (``Reconciler.reconcile_node``), each step costing only that node:

1. its co-location strategy (``koord_formats.colocation``): the NodeMetric with that strategy's
   collect policy is created, or its spec patched when it differs;
2. its NodeSLO spec (``koord_formats.sloconfig``): created, or patched with a merge patch that
   also removes what the config no longer sets;
3. its batch (and, with ``mid_resources``, mid) resources (``resources.py``): written into
   ``status.capacity`` and ``status.allocatable`` with one merge patch of the status
   subresource, guarded by the Node's resourceVersion, when ``needs_write`` says so.
4. the batch values of each NUMA zone of its NodeResourceTopology (``zone_batch_resources``):
   one merge patch of ``zones`` (every other zone and resource kept as read), guarded by the
   object's resourceVersion so a node agent's concurrent write is never lost.
5. its CPU normalization ratio (``koord_formats.cpunormalization.decide_ratio``: the
   ``cpu-normalization-config`` strategy for its labels, its ``cpu-normalization-enabled`` label
   and the ``cpu-basic-info`` of its NodeResourceTopology): the annotation
   ``node.koordinator.sh/cpu-normalization-ratio`` set with one merge patch of that annotation
   alone, when it differs by 0.01 or more (or is absent or unreadable); "1.00" when
   normalization is disabled; left as it is when the ratio cannot be chosen (no basic info, an
   unknown CPU model, a ratio out of range), as koord-manager does.
   The batch-cpu written in step 3 is multiplied by the ratio the Node carries
   (``resources.py``), so it follows on the Node's next event.

NodeMetrics and NodeSLOs of Nodes that are gone are deleted (guarded by their uid). Every node
is reconciled again every ``resync_seconds``, so a NodeMetric that stops being updated degrades
its node within that time of ``degradeTimeMinutes``.

Hostile objects: each Node, Pod, NodeMetric or ConfigMap is decoded once when its event
arrives; one that does not decode is counted (``rhp_manager_bad_objects_total{kind}``) and
logged, and costs only itself: a bad Node or NodeMetric resets that node's batch resources, a Pod
that cannot be decoded in full is estimated from what can be read (``objects.pod_view``; counted
and logged) and never resets its node, a bad ConfigMap key keeps that key's previous value.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog
from prometheus_client import Counter, Gauge

from colocation_manager.kubeio import CONFIGMAPS, KINDS, NODEMETRICS, NODES, NODESLOS, NRTS, PODS, ManagerAPI
from colocation_manager.objects import node_info, node_labels, pod_node_name, pod_view
from colocation_manager.resources import (
    BATCH_RESOURCES,
    MID_RESOURCES,
    Amount,
    Metrics,
    NodeInfo,
    PodInfo,
    PodUsage,
    batch_resources,
    mid_resources,
    needs_write,
    zone_batch_resources,
)
from koord_formats import FormatError, keys, nodemetric, nrt, sloconfig
from koord_formats import cpunormalization as cpunorm
from koord_formats.colocation import (
    CONFIG_KEY_COLOCATION,
    ColocationConfig,
    metric_collect_spec,
    parse_colocation_config,
)
from koord_formats.errors import describe
from koord_formats.node import parse_cpu_normalization_ratio
from koord_formats.quantity import parse_bytes, parse_cpu_milli
from rhp_kube.errors import APIError, ConflictError, NotFoundError
from rhp_kube.lease import NotLeader

__all__ = ["BAD_OBJECTS", "WRITES", "Cache", "Fence", "Reconciler", "merge_patch", "metrics_of"]

log = structlog.get_logger("colocation_manager")

BAD_OBJECTS = Counter("rhp_manager_bad_objects_total",
                      "Objects the manager could not decode and skipped (or reset their node for), by kind.",
                      ["kind"])
WRITES = Counter("rhp_manager_writes_total", "API writes of the manager, by object kind and result.",
                 ["kind", "result"])
LEADER = Gauge("rhp_manager_leader", "1 while this replica holds the manager's Lease.")


# ---- decoding --------------------------------------------------------------------------------------


def metrics_of(obj: Mapping[str, Any]) -> Metrics:
    """A NodeMetric object as ``Metrics``; an unreadable status is ``Metrics.problem``."""
    try:
        status = nodemetric.parse_node_metric_status(obj.get("status"))
        update = nodemetric.parse_update_time(status.update_time) if status.update_time else None
        reclaimable = nodemetric.parse_prod_reclaimable(obj.get("status"))
    except FormatError as exc:
        return Metrics(update_time=None, problem=describe(exc))

    def amount(u: nodemetric.Usage) -> Amount:
        return Amount(u.cpu_milli or 0, u.memory_bytes or 0)

    return Metrics(
        update_time=update,
        node_usage=amount(status.node_usage),
        system_usage=amount(status.system_usage),
        pods={(p.namespace, p.name): PodUsage(amount(p.usage), p.priority) for p in status.pods},
        host_apps=tuple(PodUsage(amount(a.usage), a.priority) for a in status.host_apps),
        prod_reclaimable=None if reclaimable is None else amount(reclaimable),
    )


def _current(status: object, names: Iterable[str]) -> dict[str, int | None]:
    """The node's published values of ``names`` in ``status.allocatable`` (None when absent)."""
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    alloc = alloc if isinstance(alloc, Mapping) else {}
    out: dict[str, int | None] = {}
    for name in names:
        raw = alloc.get(name)
        try:
            out[name] = None if raw is None else parse_bytes(raw)
        except FormatError:
            out[name] = -1  # unreadable: never equal to a computed value, so it gets rewritten
    return out


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed fields, nested
    objects recursively, and ``None`` for the fields ``new`` no longer has."""
    out: dict[str, Any] = {}
    for key in old:
        if key not in new:
            out[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                out[key] = sub
        elif before != value or key not in old:
            out[key] = value
    return out


@dataclass
class _Node:
    name: str
    resource_version: str
    labels: dict[str, str]
    annotations: dict[str, str]
    info: NodeInfo
    current: dict[str, int | None]


@dataclass
class _Topology:
    """A NodeResourceTopology: its version, its zones as read, and the allocatable of its NUMA
    zones ``node-0``, ``node-1``, ... in order (empty when they cannot be used)."""

    resource_version: str
    zones: tuple[nrt.Zone, ...]
    numa: tuple[Amount, ...]


_NUMA_ZONE = re.compile(r"node-([0-9]{1,4})", re.ASCII)


def _numa_id(zone: nrt.Zone) -> int | None:
    """The NUMA node id of a zone named ``node-<id>`` of type Node, else None."""
    m = _NUMA_ZONE.fullmatch(zone.name)
    return int(m.group(1)) if m is not None and zone.type == nrt.ZONE_TYPE_NODE else None


def _numa_capacities(zones: tuple[nrt.Zone, ...]) -> tuple[Amount, ...]:
    """The NUMA zones' allocatable CPU and memory, by NUMA id 0..n-1; () unless every id from 0
    is there once and each has both (Koordinator skips a topology without cpu or memory)."""
    by_id: dict[int, Amount] = {}
    for zone in zones:
        numa = _numa_id(zone)
        if numa is None:
            continue
        res = {r.name: r.allocatable for r in zone.resources}
        if "cpu" not in res or "memory" not in res or numa in by_id:
            return ()
        by_id[numa] = Amount(parse_cpu_milli(res["cpu"]), parse_bytes(res["memory"]))
    if sorted(by_id) != list(range(len(by_id))):
        return ()
    return tuple(by_id[i] for i in range(len(by_id)))


def _zone_values(zones: tuple[nrt.Zone, ...]) -> dict[str, int | None]:
    """The batch values the zones carry now ("<zone>/<resource>" -> allocatable)."""
    out: dict[str, int | None] = {}
    for zone in zones:
        for r in zone.resources:
            if r.name in BATCH_RESOURCES:
                out[f"{zone.name}/{r.name}"] = parse_bytes(r.allocatable)
    return out


def _with_zone_values(zones: tuple[nrt.Zone, ...], values: list[dict[str, int]]) -> list[dict[str, Any]]:
    """The ``zones`` list with each NUMA zone's batch entries set (capacity = allocatable =
    available), every other zone and resource kept as read, resources ascending by name."""
    out = []
    for zone in zones:
        numa = _numa_id(zone)
        wanted = values[numa] if numa is not None and numa < len(values) else None
        if wanted is None:
            out.append(nrt.format_zone(zone))
            continue
        kept = [r for r in zone.resources if r.name not in wanted]
        added = [nrt.ZoneResource(name, str(v), str(v), str(v)) for name, v in wanted.items()]
        resources = tuple(sorted([*kept, *added], key=lambda r: r.name))
        out.append(nrt.format_zone(nrt.Zone(zone.name, zone.type, resources)))
    return out


@dataclass
class _Owned:
    """A NodeMetric or NodeSLO: its uid and the spec it has."""

    uid: str
    spec: Mapping[str, Any]


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise FormatError("object without metadata")
    values = [meta.get(k) or "" for k in ("name", "namespace", "uid", "resourceVersion")]
    if not all(isinstance(v, str) and len(v) <= 253 for v in values):
        raise FormatError("metadata name, namespace, uid or resourceVersion is not a short string")
    return values[0], values[1], values[2], values[3]


@dataclass
class Cache:
    """What the watches saw, decoded; shared by the watch threads and the loop (``lock``)."""

    names: tuple[str, ...] = BATCH_RESOURCES
    lock: threading.Lock = field(default_factory=threading.Lock)
    nodes: dict[str, _Node] = field(default_factory=dict)
    pods: dict[str, dict[tuple[str, str], PodInfo | str]] = field(default_factory=dict)  # node -> pods
    pod_nodes: dict[tuple[str, str], str] = field(default_factory=dict)
    metrics: dict[str, tuple[_Owned, Metrics]] = field(default_factory=dict)
    nodeslos: dict[str, _Owned] = field(default_factory=dict)
    topologies: dict[str, _Topology] = field(default_factory=dict)
    colocation: ColocationConfig = field(default_factory=ColocationConfig)
    slo: sloconfig.SLOConfig = field(default_factory=sloconfig.SLOConfig)
    cpu_norm: cpunorm.CPUNormalizationConfig = field(default_factory=cpunorm.CPUNormalizationConfig)
    basic_info: dict[str, cpunorm.CPUBasicInfo | str] = field(default_factory=dict)  # NRT name -> info or why not
    synced: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)  # kinds whose CRD is not installed: not written
    dirty: set[str] = field(default_factory=set)
    wake: Callable[[], None] = lambda: None  # set by the reconciler: wakes its loop

    # -- events ----------------------------------------------------------------------------------
    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool = False) -> None:
        """A fresh list of ``kind``: forget what is not in it, apply the rest. ``absent``: the
        API server does not serve the kind (its CRD is not installed)."""
        with self.lock:
            if absent:
                self.absent.add(kind)
            else:
                self.absent.discard(kind)
            if kind == NODES:
                gone = set(self.nodes)
            elif kind == PODS:
                gone = set(self.pod_nodes)  # type: ignore[arg-type]
            elif kind == NODEMETRICS:
                gone = set(self.metrics)
            elif kind == NODESLOS:
                gone = set(self.nodeslos)
            elif kind == NRTS:
                gone = set(self.topologies)
            else:
                gone = set()
        seen: set[Any] = set()
        for obj in items:
            seen.add(self.apply(kind, "ADDED", obj))
        for key in gone - seen:
            self._delete(kind, key)
        if kind == CONFIGMAPS and not items:
            self._config(None)
        with self.lock:
            self.synced.add(kind)
            self.dirty.update(self.nodes)
        self.wake()

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> Any:
        """One watch event; returns the cache key of the object (None when skipped)."""
        try:
            name, namespace, uid, rv = _meta(obj)
        except FormatError as exc:
            BAD_OBJECTS.labels(kind).inc()
            log.warning("object skipped", kind=kind, error=describe(exc))
            return None
        key: Any = name
        if event == "DELETED":
            key = (namespace, name) if kind == PODS else name
            self._delete(kind, key)
            return key
        if kind == NODES:
            self._node(name, rv, obj)
        elif kind == PODS:
            key = (namespace, name)
            self._pod(key, obj)
        elif kind == NODEMETRICS:
            spec = obj.get("spec")
            decoded = metrics_of(obj)  # outside the lock: the reconcile loop reads the cache meanwhile
            with self.lock:
                self.metrics[name] = (_Owned(uid, spec if isinstance(spec, Mapping) else {}), decoded)
                self.dirty.add(name)
            if decoded.problem:
                BAD_OBJECTS.labels(kind).inc()
                log.warning("NodeMetric status unreadable; the node's batch resources are reset",
                            node=name, error=decoded.problem)
        elif kind == NODESLOS:
            spec = obj.get("spec")
            with self.lock:
                self.nodeslos[name] = _Owned(uid, spec if isinstance(spec, Mapping) else {})
        elif kind == CONFIGMAPS:
            data = obj.get("data")
            self._config(data if isinstance(data, Mapping) else {})
        elif kind == NRTS:
            self._basic_info(name, obj)
            try:
                zones = nrt.parse_zones(obj.get("zones"))
                numa = _numa_capacities(zones)
            except FormatError as exc:
                BAD_OBJECTS.labels(kind).inc()
                log.warning("NodeResourceTopology zones unreadable; its zones get no batch values", node=name,
                            error=describe(exc))
                with self.lock:
                    self.topologies.pop(name, None)
                return key
            with self.lock:
                self.topologies[name] = _Topology(rv, zones, numa)
                self.dirty.add(name)
        self.wake()
        return key

    def _delete(self, kind: str, key: Any) -> None:
        with self.lock:
            if kind == NODES:
                self.nodes.pop(key, None)
                self.dirty.add(key)
            elif kind == PODS:
                node = self.pod_nodes.pop(key, None)
                if node is not None:
                    self.pods.get(node, {}).pop(key, None)
                    self.dirty.add(node)
            elif kind == NODEMETRICS:
                self.metrics.pop(key, None)
                self.dirty.add(key)
            elif kind == NODESLOS:
                self.nodeslos.pop(key, None)
                self.dirty.add(key)
            elif kind == NRTS:
                self.topologies.pop(key, None)
                self.basic_info.pop(key, None)
                self.dirty.add(key)
        if kind == CONFIGMAPS:
            self._config(None)

    def _node(self, name: str, rv: str, obj: Mapping[str, Any]) -> None:
        try:
            labels, annotations = node_labels(obj)
        except FormatError as exc:
            labels, annotations = {}, {}
            info = NodeInfo(name, Amount(), Amount(), problem=describe(exc))
        else:
            try:
                info = node_info(obj)
            except FormatError as exc:
                info = NodeInfo(name, Amount(), Amount(), problem=describe(exc))
        if info.problem:
            BAD_OBJECTS.labels(NODES).inc()
            log.warning("Node unreadable; its batch resources are reset", node=name, error=info.problem)
        entry = _Node(name, rv, labels, annotations, info, _current(obj.get("status"), (*BATCH_RESOURCES,
                                                                                          *MID_RESOURCES)))
        with self.lock:
            self.nodes[name] = entry
            self.dirty.add(name)

    def _pod(self, key: tuple[str, str], obj: Mapping[str, Any]) -> None:
        node = ""
        try:
            node = pod_node_name(obj)
            decoded: PodInfo | str = pod_view(obj)
            if isinstance(decoded, PodInfo) and decoded.estimated:
                BAD_OBJECTS.labels(PODS).inc()
                log.warning("Pod not decoded in full; counted by its estimate", pod=f"{key[0]}/{key[1]}",
                            node=node, phase=decoded.phase, error=decoded.estimated)
        except FormatError as exc:
            decoded = describe(exc)
            BAD_OBJECTS.labels(PODS).inc()
            log.warning("Pod unreadable; its node's batch resources are reset", pod=f"{key[0]}/{key[1]}",
                        node=node, error=decoded)
        with self.lock:
            old = self.pod_nodes.get(key)
            if old is not None and old != node:
                self.pods.get(old, {}).pop(key, None)
                self.dirty.add(old)
            if not node:
                self.pod_nodes.pop(key, None)
                return
            self.pod_nodes[key] = node
            self.pods.setdefault(node, {})[key] = decoded
            self.dirty.add(node)

    def _basic_info(self, name: str, obj: Mapping[str, Any]) -> None:
        """The NRT's ``cpu-basic-info`` (absent: forgotten; unreadable: why, counted and logged)."""
        meta = obj.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        raw = annotations.get(keys.NODE_ANNOTATION_CPU_BASIC_INFO) if isinstance(annotations, Mapping) else None
        info: cpunorm.CPUBasicInfo | str | None = None
        if raw is not None:
            try:
                info = cpunorm.parse_cpu_basic_info(raw)
            except FormatError as exc:
                info = describe(exc)
                BAD_OBJECTS.labels(NRTS).inc()
                log.warning("cpu-basic-info unreadable; the node's CPU normalization ratio is left as it is",
                            node=name, error=info)
        with self.lock:
            if info is None:
                self.basic_info.pop(name, None)
            else:
                self.basic_info[name] = info
            self.dirty.add(name)

    def _config(self, data: Mapping[str, Any] | None) -> None:
        text = None if data is None else data.get(CONFIG_KEY_COLOCATION)
        try:
            colocation = parse_colocation_config(text if isinstance(text, str) else None)
            if text is not None and not isinstance(text, str):
                raise FormatError(f"{CONFIG_KEY_COLOCATION}: expected a string")
        except FormatError as exc:
            BAD_OBJECTS.labels(CONFIGMAPS).inc()
            log.warning("colocation-config refused; the previous one is kept", error=describe(exc))
            colocation = self.colocation
        slo, problems = sloconfig.parse_slo_config(data, self.slo)
        text = None if data is None else data.get(cpunorm.CONFIG_KEY_CPU_NORMALIZATION)
        try:
            cpu_norm, norm_problems = cpunorm.parse_cpu_normalization_config(text)
            problems = (*problems, *norm_problems)
        except FormatError as exc:
            problems = (*problems, f"{describe(exc)}; the previous value is kept")
            cpu_norm = self.cpu_norm
        for problem in problems:
            BAD_OBJECTS.labels(CONFIGMAPS).inc()
            log.warning("slo-controller-config problem", error=problem[:300])
        with self.lock:
            self.colocation, self.slo, self.cpu_norm = colocation, slo, cpu_norm
            self.dirty.update(self.nodes)
            self.dirty.update(self.metrics)


def _ratio_differs(current: str | None, wanted: str) -> bool:
    """True when the Node's ratio annotation should be written: absent, unreadable, or 0.01 or
    more away from ``wanted`` (koord-manager's ``NeedSyncMeta``)."""
    if current is None:
        return True
    try:
        return parse_cpu_normalization_ratio(current) != parse_cpu_normalization_ratio(wanted)
    except FormatError:
        return True


_T = TypeVar("_T")


class Fence(Protocol):
    """What the reconciler needs of the leader election (``rhp_kube.lease.Elector``)."""

    def is_leader(self) -> bool: ...

    async def write(self, call: Awaitable[_T]) -> _T:
        """Await the write ``call`` only while leading; else ``rhp_kube.lease.NotLeader``."""
        ...


class Reconciler:
    """Writes what the pure functions decide, node by node, each write through ``fence``."""

    def __init__(self, cache: Cache, api: ManagerAPI, fence: Fence, *,
                 mid_resources: bool = False, resync_seconds: float = 30.0, concurrency: int = 8,
                 clock: Callable[[], float] = time.time) -> None:
        self.cache, self.api, self.fence = cache, api, fence
        self.concurrency = max(concurrency, 1)  # nodes reconciled at once
        self.mid, self.resync_seconds, self.clock = mid_resources, resync_seconds, clock
        self.last_write: dict[str, float] = {}
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._event.set)

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self.cache.wake = self._wake
        next_resync = 0.0
        while not stop.is_set():
            LEADER.set(1 if self.fence.is_leader() else 0)
            if time.monotonic() >= next_resync:
                with self.cache.lock:
                    self.cache.dirty.update(self.cache.nodes)
                    self.cache.dirty.update(self.cache.metrics)
                    self.cache.dirty.update(self.cache.nodeslos)
                next_resync = time.monotonic() + self.resync_seconds
            await self.round()
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), 1.0)

    def ready(self) -> bool:
        with self.cache.lock:
            return all(k in self.cache.synced for k in KINDS)

    async def round(self) -> None:
        """Reconcile every dirty node (while leading and after every kind was listed once)."""
        if not self.ready() or not self.fence.is_leader():
            return
        with self.cache.lock:
            names = sorted(self.cache.dirty)
            self.cache.dirty.clear()
        for start in range(0, len(names), self.concurrency):
            if not self.fence.is_leader():  # lost the Lease: keep the rest for later (each write checks too)
                with self.cache.lock:
                    self.cache.dirty.update(names[start:])
                return
            # a few nodes at a time, so API round trips overlap; gather yields to the loop each time
            await asyncio.gather(*(self._reconcile_logged(n) for n in names[start:start + self.concurrency]))

    async def _reconcile_logged(self, name: str) -> None:
        try:
            await self.reconcile_node(name)
        except NotLeader:  # the term ended: this node is for the next leader (or our next term)
            with self.cache.lock:
                self.cache.dirty.add(name)
        except APIError as exc:
            log.warning("reconcile failed; retried next round", node=name, error=describe(exc))
            with self.cache.lock:
                self.cache.dirty.add(name)

    async def _write(self, kind: str, call: Awaitable[Any], node: str) -> bool:
        """Make one write through the fence; ``NotLeader`` ends the node's reconcile."""
        try:
            await self.fence.write(call)
        except NotLeader:
            WRITES.labels(kind, "fenced").inc()
            raise
        except ConflictError as exc:
            WRITES.labels(kind, "conflict").inc()
            log.info("write conflicted; retried with fresh data", kind=kind, node=node, error=describe(exc))
            with self.cache.lock:
                self.cache.dirty.add(node)
            return False
        except NotFoundError:
            WRITES.labels(kind, "gone").inc()
            return False
        WRITES.labels(kind, "ok").inc()
        return True

    async def _write_zones(self, name: str, strategy: Any, info: NodeInfo, topology: _Topology,
                           pods: list[PodInfo], metrics: Metrics | None, now: float, bad: str) -> None:
        """Batch values of the node's NUMA zones into its NodeResourceTopology (one merge patch of
        ``zones``, guarded by its resourceVersion, so a node agent's concurrent write is never
        overwritten: a conflict retries with the fresh object)."""
        values = zone_batch_resources(strategy, info, topology.numa, pods, metrics, now, bad)
        new = {f"{nrt.zone_name(i)}/{k}": v for i, z in enumerate(values) for k, v in z.items()}
        key = f"{NRTS}/{name}"
        if not needs_write(_zone_values(topology.zones), new, strategy, self.last_write.get(key), now):
            return
        patch = {"metadata": {"resourceVersion": topology.resource_version},
                 "zones": _with_zone_values(topology.zones, values)}
        if await self._write(NRTS, self.api.patch_object(NRTS, name, patch), name):
            self.last_write[key] = now

    async def reconcile_node(self, name: str) -> None:
        now = self.clock()
        with self.cache.lock:
            node = self.cache.nodes.get(name)
            owned_metric = self.cache.metrics.get(name)
            owned_slo = self.cache.nodeslos.get(name)
            topology = self.cache.topologies.get(name)
            pods = list(self.cache.pods.get(name, {}).values())
            colocation, slo, cpu_norm = self.cache.colocation, self.cache.slo, self.cache.cpu_norm
            basic_info = self.cache.basic_info.get(name)
            absent = set(self.cache.absent)
        if node is None:  # the Node is gone: its NodeMetric and NodeSLO go too
            if owned_metric is not None:
                await self._write(NODEMETRICS, self.api.delete_object(NODEMETRICS, name, owned_metric[0].uid), name)
            if owned_slo is not None:
                await self._write(NODESLOS, self.api.delete_object(NODESLOS, name, owned_slo.uid), name)
            return
        strategy = colocation.for_node(node.labels, node.annotations)
        spec = metric_collect_spec(strategy)
        if NODEMETRICS in absent:
            pass
        elif owned_metric is None:
            body = {"apiVersion": f"{nodemetric.API_GROUP}/{nodemetric.API_VERSION}", "kind": nodemetric.KIND,
                    "metadata": {"name": name}, "spec": spec}
            await self._write(NODEMETRICS, self.api.create_object(NODEMETRICS, body), name)
        elif merge_patch(owned_metric[0].spec, spec):
            await self._write(NODEMETRICS, self.api.patch_object(NODEMETRICS, name, {"spec": spec}), name)
        slo_spec = sloconfig.render_node_slo(slo, node.labels)
        if NODESLOS in absent:
            pass
        elif owned_slo is None:
            body = {"apiVersion": f"{sloconfig.NODESLO_API_GROUP}/{sloconfig.NODESLO_API_VERSION}",
                    "kind": sloconfig.NODESLO_KIND, "metadata": {"name": name}, "spec": slo_spec}
            await self._write(NODESLOS, self.api.create_object(NODESLOS, body), name)
        else:
            patch = merge_patch(owned_slo.spec, slo_spec)
            if patch:
                await self._write(NODESLOS, self.api.patch_object(NODESLOS, name, {"spec": patch}), name)
        infos = [p for p in pods if isinstance(p, PodInfo)]
        bad = next((f"pod unreadable: {p}" for p in pods if isinstance(p, str)), "")
        metrics = None if owned_metric is None else owned_metric[1]
        results = [batch_resources(strategy, node.info, infos, metrics, now, bad)]
        if self.mid:
            results.append(mid_resources(strategy, node.info, infos, metrics, now, bad))
        new: dict[str, int | None] = {}
        for result in results:
            new.update(result.values)
        if topology is not None and topology.numa and NRTS not in absent:
            await self._write_zones(name, strategy, node.info, topology, infos, metrics, now, bad)
        if needs_write(node.current, new, strategy, self.last_write.get(name), now):
            values = {k: (None if v is None else str(v)) for k, v in new.items() if node.current.get(k) != v}
            patch = {"metadata": {"resourceVersion": node.resource_version},
                     "status": {"capacity": values, "allocatable": values}}
            if await self._write(NODES, self.api.patch_node_status(name, patch), name):
                self.last_write[name] = now
                log.info("node resources written", node=name, values=values,
                         reason="; ".join(r.reason for r in results))
        await self._write_ratio(node, cpu_norm, basic_info)

    async def _write_ratio(self, node: _Node, cpu_norm: cpunorm.CPUNormalizationConfig,
                           basic_info: cpunorm.CPUBasicInfo | str | None) -> None:
        """The node's CPU normalization ratio annotation, when it should change: a merge patch
        of that one annotation (not guarded by the resourceVersion: it changes nothing else, and
        the status write just before moved the version)."""
        decision = cpunorm.decide_ratio(cpu_norm.for_node(node.labels),
                                        node.labels.get(keys.LABEL_CPU_NORMALIZATION_ENABLED), basic_info)
        current = node.annotations.get(keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO)
        if decision.ratio is None or not _ratio_differs(current, decision.ratio):
            return
        patch = {"metadata": {"annotations": {keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO: decision.ratio}}}
        if await self._write(NODES, self.api.patch_node(node.name, patch), node.name):
            log.info("node cpu normalization ratio written", node=node.name, ratio=decision.ratio, previous=current,
                     reason=decision.reason)

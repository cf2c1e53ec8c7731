"""The cluster cache: nodes with precomputed free sets, placed pods, and held allocations.

Who calls this: the extender's watches (``scheduler_ext.kube.watch_cluster``: the one
list-and-watch of ``rhp_kube.watch``, on its own thread) and ``simulate`` apply Node, Pod,
NodeResourceTopology and Device objects here; ``scheduler_ext.decide``,
``views`` and ``verbs`` read ``NodeState`` values under ``ClusterState.lock``; ``scheduler_ext.binder``
holds and releases allocations during bind.

Rules:

- Every allocation is keyed by pod UID on its node, so a hold placed by a bind and the same
  pod seen later by the watch replace each other instead of counting twice.
- A hold lives from the start of a bind until the watch shows the pod bound to that node
  (then the pod's own annotations are the record) or until the bind rolls back.
- The cache has no other memory: a fresh process rebuilds it completely from the
  ``resource-status``, ``device-allocated`` and ``reservation-allocated`` annotations of placed
  pods whose writer it trusts (``scheduler_ext.trust``: signed by a bind of the extenders, or
  placed by a trusted scheduler; a signature by a key it no longer holds, or an earlier
  release's seal, is counted when its CPUs are within the pod's request); any other pod holds
  nothing, and a trusted pod whose annotations stop verifying keeps the allocation last proven
  on its node.
- Each kind records when the API server last answered for it (``heard``: a list, an event, a
  bookmark, the end of a stream, a 404 for a CRD that is not installed); with ``stale_after`` a
  kind silent for longer is stale (``stale_kinds``: ``/readyz`` fails and binds are refused
  until the watch hears again; ``/healthz`` fails later, past the watch's liveness bound).
- Derived per-node values (free CPUs, per-NUMA counts, GPU usage) are recomputed lazily once
  per change (``NodeState.version``), never per request; unchanged annotations are not
  parsed again (``PodEntry.ann``). Filter verdicts are memoised per pod kind and node
  (``ClusterState.memo``) and dropped by every change of that node (``NodeState.touch``).
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter

from koord_formats import keys
from koord_formats.errors import FormatError
from koord_formats.loadaware import LoadAwareArgs
from koord_formats.pod import read_resource_list
from koord_formats.reservation import Reservation, parse_reservation, parse_reservation_allocated
from koord_formats.reservation_spec import parse_pod_requests
from koord_formats.topology import CPUTopology
from scheduler_ext.allocator import GPUUsage
from scheduler_ext.annotations import EMPTY, Allocation, parse_allocation
from scheduler_ext.guard import bad_object, decode_pod, describe
from scheduler_ext.loadaware import NodeLoad, NodeMetricView, PodLoad, read_node_load, read_node_metric, read_pod_load
from scheduler_ext.pods import PodRequest, exclusive_policy_of
from scheduler_ext.reservations import NodeReservation, fold
from scheduler_ext.topology import GPUDevice, cpu_topology, parse_gpu_devices, unbindable_cpus
from scheduler_ext.trust import LEGACY_SEAL_ANNOTATION, SIGNATURE_ANNOTATION, TRUST_ALL, UNVERIFIABLE, Trust

__all__ = ["KINDS", "ClusterState", "NodeState", "PodEntry"]

log = structlog.get_logger("scheduler_ext.state")

UNTRUSTED = Counter(
    "scheduler_ext_untrusted_allocations_total",
    "Bound pods whose scheduler-owned annotations were not counted: no valid signature and not "
    "placed by a trusted scheduler (reason: unsigned, signature).",
    ["reason"],
)

KINDS = ("nodes", "pods", "noderesourcetopologies", "devices", "reservations")
# watched too when load-aware scheduling is configured (``ClusterState.load_args``)
NODE_METRICS = "nodemetrics"

class NodeState:
    """One node. Static fields change only with Node/NRT/Device objects; derived fields are
    recomputed by ``refresh`` when ``version`` moved; ``allocs`` changes with pods and holds."""

    def __init__(self, name: str, memo: dict[int, dict[str, Any]] | None = None) -> None:
        self.name = name
        # filter/score memo shared by all nodes of a ``ClusterState``: key id -> node -> Verdict;
        # ``touch`` drops this node's entries, so an entry present is always current
        self.memo: dict[int, dict[str, Any]] = {} if memo is None else memo
        self.node_seen = False  # a Node object exists
        self.node_labels: Mapping[str, str] = {}
        self.node_annotations: Mapping[str, str] = {}
        self.nrt_annotations: Mapping[str, str] = {}
        self.nrt_policies: tuple[str, ...] = ()
        self.nrt_zones: Any = None  # the NRT's raw ``zones`` list (parsed in ``scheduler_ext.views``)
        self.device_spec: Mapping[str, Any] | None = None
        # static, from the objects above (``_rebuild_static``)
        self.topo: CPUTopology | None = None
        self.topo_error = ""
        self.bindable: frozenset[int] = frozenset()
        self.gpus: tuple[GPUDevice, ...] = ()
        self.gpu_by_minor: dict[int, GPUDevice] = {}
        self.gpu_error = ""
        # dynamic
        self.allocs: dict[str, Allocation] = {}  # pod uid -> allocation (confirmed or held)
        self.held: dict[str, float] = {}  # pod uid -> monotonic time the hold was placed
        self.reservations: dict[str, Reservation] = {}  # uid -> Reservation whose status.nodeName is this node
        # the Node's status.allocatable cpu (milli) and memory (bytes); None: unreadable or unseen
        self.allocatable: tuple[int, int] | None = None
        # pod uid -> (milli-CPU, bytes) each bound pod requests, as kube-scheduler counts them, and
        # their sum (read only to count reservations' plain requests against other pods)
        self.requested: dict[str, tuple[int, int]] = {}
        self.requested_total: tuple[int, int] = (0, 0)
        self.foreign: set[str] = set()  # held uids learned from another replica's ledger
        self.version = 0  # bumps on every change
        self.static_version = 0  # bumps when the Node, NRT or Device object changed
        # derived (``refresh``)
        self._derived = -1
        self.free: frozenset[int] = frozenset()
        self.gpu_usage: dict[int, GPUUsage] = {}
        self.avoid_cores: frozenset[int] = frozenset()  # cores holding a PCPULevel pod's CPU
        self.avoid_numa: frozenset[int] = frozenset()
        # the reservations with the pods allocated from them (``scheduler_ext.reservations.fold``)
        self.reserved: tuple[NodeReservation, ...] = ()
        # load-aware scheduling (``scheduler_ext.loadaware``), kept only when it is configured:
        # the Node's allocatable and thresholds annotation, and its NodeMetric (None: missing,
        # or unreadable, which costs only this node)
        self.load = NodeLoad()
        self.metric: NodeMetricView | None = None
        self.bound: dict[str, PodLoad] = {}  # pod uid -> load of each pod bound or held here
        # ``scheduler_ext.verbs``' memo of the node's usage before a pod, valid for one
        # ``bound_version`` (bumped by every change of ``bound`` or ``metric``): (version, {(base, prod): usage})
        self.bound_version = 0
        self.load_memo: tuple[int, dict[Any, Mapping[str, int]]] = (-1, {})

    # -- static -------------------------------------------------------------------------------
    def _rebuild_static(self) -> None:
        self.topo, self.topo_error, self.bindable = None, "", frozenset()
        try:
            self.topo = cpu_topology(self.nrt_annotations, self.node_annotations)
            if self.topo is not None:
                self.bindable = self.topo.cpus - unbindable_cpus(self.node_annotations, self.nrt_annotations)
        except FormatError as exc:
            self.topo, self.topo_error = None, str(exc)
        except Exception as exc:  # a parser's last line: nothing but FormatError is expected
            self.topo, self.topo_error = None, f"unreadable CPU topology: {describe(exc)}"
            bad_object("nodes", "topology", self.name, exc)
        try:
            self.gpus = parse_gpu_devices(self.device_spec)
            self.gpu_error = ""
        except FormatError as exc:
            self.gpus, self.gpu_error = (), str(exc)
        except Exception as exc:  # as above
            self.gpus, self.gpu_error = (), f"unreadable Device object: {describe(exc)}"
            bad_object("devices", "devices", self.name, exc)
        self.gpu_by_minor = {g.minor: g for g in self.gpus}
        self.static_version += 1
        self.touch()

    def touch(self) -> None:
        self.version += 1
        name = self.name
        for verdicts in tuple(self.memo.values()):
            verdicts.pop(name, None)

    # -- derived ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute the free set, GPU usage and exclusive holdings if anything changed since
        the last call (a pass over the node's allocations, never over its CPUs)."""
        if self._derived == self.version:
            return
        used: set[int] = set()
        pcpu: set[int] = set()
        numa_excl: set[int] = set()
        usage: dict[int, GPUUsage] = {}
        topo = self.topo

        def hold_cpus(cpus: frozenset[int], exclusive: str) -> None:
            used.update(cpus)
            if topo is not None and exclusive == keys.EXCLUSIVE_POLICY_PCPU_LEVEL:
                core_of = topo.core_of
                pcpu.update(core_of[c] for c in cpus if c in core_of)
            elif topo is not None and exclusive == keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL:
                numa_excl.update(topo.details[c].node for c in cpus if c in topo.details)

        self.reserved = ()
        if self.reservations:
            self.reserved = fold(
                self.reservations.values(),
                ((a.reservation, a.cpus, a.numa, a.numa_memory, ((g.minor, g.core, g.ratio, g.memory) for g in a.gpus))
                 for a in self.allocs.values() if a.reservation),
            )  # fmt: skip
            for nr in self.reserved:
                if nr.r.active and nr.cpus:
                    hold_cpus(nr.cpus, nr.r.exclusive_policy)  # the reserve pod holds its cpuset
                if nr.r.active:
                    # the reserve pod holds the GPUs it reserved that its own pods do not hold
                    for minor, (core, ratio, memory) in nr.gpu_remained.items():
                        usage[minor] = usage.get(minor, GPUUsage()).plus(core, ratio, memory)
        for alloc in self.allocs.values():
            if alloc.cpus:
                hold_cpus(alloc.cpus, alloc.exclusive)
            for g in alloc.gpus:
                usage[g.minor] = usage.get(g.minor, GPUUsage()).plus(g.core, g.ratio, g.memory)
        self.free = self.bindable - used if used else self.bindable
        self.gpu_usage = usage
        self.avoid_cores = frozenset(pcpu)
        self.avoid_numa = frozenset(numa_excl)
        self._derived = self.version

    # -- allocations --------------------------------------------------------------------------
    def put(self, uid: str, alloc: Allocation) -> None:
        old = self.allocs.get(uid)
        if alloc.empty:
            if old is not None:
                del self.allocs[uid]
                self.touch()
            return
        if old != alloc:
            self.allocs[uid] = alloc
            self.touch()

    def set_requested(self, uid: str, amounts: tuple[int, int]) -> None:
        old = self.requested.get(uid, (0, 0))
        if old != amounts or uid not in self.requested:
            self.requested[uid] = amounts
            cpu, mem = self.requested_total
            self.requested_total = (cpu - old[0] + amounts[0], mem - old[1] + amounts[1])

    def set_bound(self, uid: str, load: PodLoad) -> None:
        if self.bound.get(uid) != load:
            self.bound[uid] = load
            self.bound_version += 1

    def drop(self, uid: str) -> None:
        self.held.pop(uid, None)
        old = self.requested.pop(uid, None)
        if old is not None:
            cpu, mem = self.requested_total
            self.requested_total = (cpu - old[0], mem - old[1])
        if self.bound.pop(uid, None) is not None:
            self.bound_version += 1
        self.foreign.discard(uid)
        if self.allocs.pop(uid, None) is not None:
            self.touch()


@dataclass(slots=True)
class PodEntry:
    """One pod as the cache knows it."""

    namespace: str
    name: str
    node: str  # "" while pending
    rv: str  # metadata.resourceVersion last seen
    # raw annotations parsed: resource-status, device-allocated, exclusive policy, reservation-allocated
    ann: tuple[str | None, str | None, str, str | None] = (None, None, "None", None)
    alloc: Allocation = EMPTY
    request: PodRequest | None = None  # decoded spec, kept only while pending
    bad: str = ""  # why the annotations could not be parsed, or why they are not trusted
    # (signature or seal annotation, spec.schedulerName) last judged; with ``ann`` and ``node``
    # it decides trust
    proof: tuple[str | None, str] = (None, "")
    owned: bool = False  # pending: the pod carries a scheduler-owned annotation or a signature
    load: PodLoad | None = None  # what load-aware scheduling estimates it by (when configured)


def _within_request(trust: str, alloc: Allocation | None, cpu_milli: int | None) -> tuple[str, Allocation | None]:
    """An unverifiable allocation counts only when its CPUs are within the pod's own CPU request
    (``scheduler_ext.trust``): else it is untrusted, and nothing of it is counted."""
    if alloc is not None and (cpu_milli is None or len(alloc.cpus) * 1000 > cpu_milli):
        return "", None
    return trust, alloc


def _pod_requested(spec: Mapping[str, Any]) -> tuple[int, int]:
    """A bound pod's CPU (milli) and memory (bytes) requests; (0, 0) when its spec cannot be
    read (kube-scheduler still counts it: only the reservations' share is this cache's to add)."""
    try:
        req = parse_pod_requests(spec)
    except FormatError:
        return (0, 0)
    return math.ceil(req.get("cpu", 0) * 1000), math.ceil(req.get("memory", 0))


def _node_allocatable(status: Mapping[str, Any]) -> tuple[int, int] | None:
    try:
        alloc = read_resource_list(status.get("allocatable"), "Node allocatable")
    except FormatError:
        return None
    if "cpu" not in alloc or "memory" not in alloc:
        return None
    return math.floor(alloc["cpu"] * 1000), math.floor(alloc["memory"])


def _is_terminal(pod: Mapping[str, Any]) -> bool:
    phase = _mapping(pod.get("status"), "status").get("phase")
    return phase in ("Succeeded", "Failed")


@dataclass(slots=True)
class _PodUpdate:
    """One pod event, decoded outside the lock (``ClusterState._read_pod``)."""

    uid: str
    gone: bool
    namespace: str = ""
    name: str = ""
    node: str = ""
    rv: str = ""
    request: PodRequest | None = None  # pending pods
    ann: tuple[str | None, str | None, str, str | None] | None = None  # bound pods: the raw annotations
    alloc: Allocation | None = None  # parsed from ``ann``; None when not parsed or unreadable
    error: str | None = None  # why ``ann`` could not be read
    proof: tuple[str | None, str] = (None, "")  # (signature or seal annotation, spec.schedulerName)
    trust: str | None = None  # ``Trust.judge`` of ``ann`` ("" untrusted); None when not judged
    owned: bool = False  # the pod carries a scheduler-owned annotation or a signature
    cpu_milli: int | None = None  # bound pods judged unverifiable: the pod's CPU request
    annotations: Mapping[str, str] = field(default_factory=dict)  # bound pods: all of them, for ``trust``
    load: PodLoad | None = None  # load-aware scheduling's view (when configured)
    requested: tuple[int, int] | None = None  # bound pods first seen on a node: their requests


_NO_ANN: tuple[str | None, str | None, str, str | None] = (None, None, "None", None)


def _parse_allocation(namespace: str, name: str, ann: tuple[str | None, str | None, str, str | None]) -> tuple[
    Allocation | None, str | None
]:
    """(allocation, None) or (None, error); unreadable annotations are logged and counted.

    An unreadable ``reservation-allocated`` costs only the link to the reservation (logged and
    counted): the CPUs of the pod's resource-status still count."""
    status, devices, exclusive, allocated = ann
    reservation = ""
    if allocated:
        try:
            reservation = parse_reservation_allocated(allocated).uid
        except Exception as exc:  # FormatError; anything else is a parser bug
            bad_object("pods", "allocation", f"{namespace}/{name}", exc)
    try:
        return parse_allocation(status, devices, exclusive, reservation), None
    except Exception as exc:  # FormatError from the parser; anything else is a parser bug
        return None, bad_object("pods", "allocation", f"{namespace}/{name}", exc)


def _warm_parsers(obj: Mapping[str, Any]) -> None:
    """Parse a Node's or NRT's topology annotations before the lock is taken.

    The ``koord_formats`` parsers are memoised by annotation text, so ``NodeState._rebuild_static``
    then finds the result under the lock instead of parsing there while verbs wait. Failures
    are left for ``_rebuild_static`` to report.
    """
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return
    with contextlib.suppress(Exception):  # reported by _rebuild_static under the lock
        cpu_topology(annotations, {})
    with contextlib.suppress(Exception):
        unbindable_cpus(annotations, annotations)


def _read_reservation(event: str, obj: Mapping[str, Any]) -> tuple[str, Reservation | None]:
    """(uid, Reservation) of a watch event outside the lock, (uid, None) for a deletion;
    ``FormatError`` when the content cannot be read, ``BadObject`` without a uid."""
    meta = _mapping(_mapping(obj, "object").get("metadata"), "metadata")
    uid = _text(meta.get("uid"), "metadata.uid")
    if not uid:
        raise BadObject("Reservation without metadata.uid")
    if event == "DELETED":
        return uid, None
    return uid, parse_reservation(obj)


def _read_node_load(obj: Mapping[str, Any]) -> NodeLoad:
    """Load-aware scheduling's view of a Node; an unreadable allocatable costs only this node
    (allocatable 0: its thresholds cannot be judged, so it is not refused by them)."""
    try:
        load = read_node_load(obj)
    except FormatError as exc:
        bad_object("nodes", "allocatable", _name_of("nodes", obj), exc)
        return NodeLoad()
    if load.custom_error:
        bad_object("nodes", "usage-thresholds", _name_of("nodes", obj), load.custom_error)
    return load


def _read_pod_load(pod: Mapping[str, Any], namespace: str, name: str) -> PodLoad:
    """Load-aware scheduling's view of a pod; one that cannot be read is estimated as a pod
    without amounts (250m CPU, 200 MiB), logged and counted."""
    try:
        return read_pod_load(pod)
    except FormatError as exc:
        bad_object("pods", "load", f"{namespace}/{name}", exc)
        return PodLoad(namespace, name)


class BadObject(ValueError):
    """An object whose own structure has the wrong types; ``state`` skips it."""


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    """``value`` when it is an object, ``{}`` when absent; ``BadObject`` for anything else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadObject(f"{what} is a {type(value).__name__}, not an object")
    return value


def _strings(value: Any, what: str) -> dict[str, str]:
    """A copy of a labels or annotations map; ``BadObject`` unless every key and value is a string."""
    out = dict(_mapping(value, what))
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise BadObject(f"{what} must map strings to strings")
    return out


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadObject(f"{what} is a {type(value).__name__}, not a string")
    return value


def _name_of(kind: str, obj: Any) -> str:
    """Best-effort ``namespace/name`` of an object for log lines; never raises."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "?"
    name = meta.get("name")
    ns = meta.get("namespace")
    name = name if isinstance(name, str) else "?"
    return f"{ns}/{name}" if kind == "pods" and isinstance(ns, str) else name


class ClusterState:
    """All nodes and pods. Every public method takes ``lock`` itself; callers that combine
    several reads and a hold (bind) take it around the whole sequence (it is re-entrant)."""

    def __init__(self, trust: Trust = TRUST_ALL, *, load_args: LoadAwareArgs | None = None) -> None:
        self.trust = trust  # whose allocation annotations count (``scheduler_ext.trust``)
        # load-aware scheduling's args; None: off, and NodeMetrics are not watched
        self.load_args = load_args
        self.kinds: tuple[str, ...] = KINDS if load_args is None else (*KINDS, NODE_METRICS)
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodEntry] = {}  # uid -> entry
        self.holds: dict[str, str] = {}  # pod uid -> node of its hold
        self.reservations: dict[str, str] = {}  # reservation uid -> node it is kept on
        self.deleted: OrderedDict[str, float] = OrderedDict()  # recently deleted uids, bounded
        self.synced: set[str] = set()  # kinds whose first list has been applied
        # verdict memo of every node, by pod-kind key id (``decide.key_id``) then node name:
        # one dictionary per pod kind keeps the hot filter loop on a few cache lines instead of
        # chasing five pointers into 500 scattered NodeState objects
        self.memo: dict[int, dict[str, Any]] = {}
        self.events = 0  # watch events applied (metrics)
        # liveness of the watches (``scheduler_ext.kube.CacheSink``): when the API server last answered for each kind
        # (a list, an event, a bookmark, a watch it ended, a 404 for a missing CRD), monotonic
        # and wall-clock; kinds whose CRD is not installed; after how many seconds of silence a
        # kind's cache is stale (None: never, for caches fed without a watch)
        self.contact: dict[str, float] = {}
        self.contact_wall: dict[str, float] = {}
        self.absent: set[str] = set()
        self.stale_after: float | None = None
        self.monotonic: Callable[[], float] = time.monotonic  # the clocks of the above (tests replace them)
        self.wall: Callable[[], float] = time.time

    # -- reads --------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Every kind listed once and none stale (``stale_kinds``)."""
        return self.synced >= set(self.kinds) and not self.stale_kinds()

    def heard(self, kind: str, *, absent: bool | None = None) -> None:
        """The API server answered for ``kind`` (``absent``: whether its CRD is missing)."""
        self.contact[kind] = self.monotonic()
        self.contact_wall[kind] = self.wall()
        if absent is True:
            self.absent.add(kind)
        elif absent is False:
            self.absent.discard(kind)

    def stale_kinds(self) -> list[str]:
        """Kinds whose cache cannot be vouched for: never listed, or (with ``stale_after``) no
        word from the API server for longer than that. Always empty without ``stale_after``."""
        if self.stale_after is None:
            return []
        now = self.monotonic()
        return [k for k in self.kinds if k not in self.synced or now - self.contact.get(k, 0.0) > self.stale_after]

    def health(self) -> dict[str, str]:
        """Each kind's state for ``/readyz``: ok, not synced, stale (N s without a word), or
        not installed (a missing optional CRD: the cluster has none of them, not a fault)."""
        now = self.monotonic()
        out: dict[str, str] = {}
        for kind in self.kinds:
            if kind not in self.synced:
                out[kind] = "not synced"
            elif self.stale_after is not None and now - self.contact.get(kind, 0.0) > self.stale_after:
                out[kind] = f"stale ({now - self.contact.get(kind, 0.0):.0f} s without a word from its watch)"
            elif kind in self.absent:
                out[kind] = "not installed"
            else:
                out[kind] = "ok"
        return out

    def with_topology(self, nodes: Iterable[str]) -> list[str]:
        """Those of ``nodes`` the cache knows with a readable CPU topology now."""
        with self.lock:
            get = self.nodes.get
            return [n for n in nodes if (ns := get(n)) is not None and ns.topo is not None]

    def settled(self, uid: str, node: str, since: float) -> bool:
        """Whether an expired HA-ledger entry of ``uid`` on ``node`` may be dropped: this cache
        shows the pod bound to that node (its own annotations count from then on), or saw it
        deleted, or the pod watch has heard from the API server after ``since`` (wall-clock
        seconds; the ledger passes the entry's time plus its TTL): by then every bind of the pod
        that could land has landed and is in the cache. A stalled watch hears nothing, so its
        replica keeps the entry for as long as it stalls."""
        with self.lock:
            if uid in self.deleted or self.reservations.get(uid) == node:
                return True  # a reservation placed on the node counts by its own resource-status
            entry = self.pods.get(uid)
            if entry is not None and entry.node == node:
                return True
            return self.contact_wall.get("pods", 0.0) >= since

    def node(self, name: str) -> NodeState | None:
        return self.nodes.get(name)

    def pending(self, uid: str) -> PodEntry | None:
        with self.lock:
            entry = self.pods.get(uid)
            return entry if entry is not None and not entry.node else None

    def _node_for(self, name: str) -> NodeState:
        ns = self.nodes.get(name)
        if ns is None:
            ns = self.nodes[name] = NodeState(name, self.memo)
        return ns

    # -- objects ------------------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event (ADDED, MODIFIED, DELETED) of ``kind`` (see ``KINDS``).

        Never raises for the object's content: an object whose structure has the wrong types is
        skipped (the cache keeps what it knew), logged and counted
        (``scheduler_ext_bad_objects_total``); returns ``False`` then. Every field is read and
        checked before anything in the cache changes, so a skip leaves nothing half-applied.
        """
        if kind not in self.kinds:
            raise ValueError(f"unknown kind {kind!r}")
        resv: tuple[str, Reservation | None] | None = None
        if kind == NODE_METRICS:
            return self._apply_node_metric(event, obj)
        node_load: NodeLoad | None = None
        try:
            update = self._read_pod(event, obj) if kind == "pods" else None
            if kind == "reservations":
                resv = _read_reservation(event, obj)
            elif kind != "pods":
                _warm_parsers(obj)
            if kind == "nodes" and self.load_args is not None and event != "DELETED":
                node_load = _read_node_load(obj)
        except FormatError as exc:  # a Reservation whose content cannot be read
            bad_object(kind, "reservation", _name_of(kind, obj), exc)
            with self.lock:
                self.events += 1
            return False
        except Exception as exc:  # the last line: one object never stops the watch
            bad_object(kind, "object", _name_of(kind, obj), exc)
            with self.lock:
                self.events += 1
            return False
        with self.lock:
            self.events += 1
            try:
                if update is not None:
                    self._commit_pod(update)
                elif resv is not None:
                    self._commit_reservation(*resv)
                elif kind not in ("pods", "reservations"):
                    self._apply_node_object(kind, event, obj)
                    if kind == "nodes" and self.load_args is not None:
                        ns = self.nodes.get(_name_of(kind, obj))
                        if ns is not None:
                            ns.load = node_load or NodeLoad()
            except Exception as exc:  # as above
                bad_object(kind, "object", _name_of(kind, obj), exc)
                return False
            return True

    def _apply_node_metric(self, event: str, obj: Mapping[str, Any]) -> bool:
        """A NodeMetric event: parsed outside the lock by ``koord_formats``; one that cannot be
        read is logged, counted and costs only its node, which then counts as having no
        NodeMetric (load-aware filtering lets pods onto it and scores it 0, as for a missing one)."""
        name = _name_of(NODE_METRICS, obj)
        view: NodeMetricView | None = None
        ok = True
        if event != "DELETED":
            try:
                view = read_node_metric(obj)
            except FormatError as exc:
                bad_object(NODE_METRICS, "nodemetric", name, exc)
                ok = False
            except Exception as exc:  # the last line: one object never stops the watch
                bad_object(NODE_METRICS, "object", name, exc)
                ok = False
        with self.lock:
            self.events += 1
            if name == "?":
                return False
            ns = self.nodes.get(name)
            if ns is None and view is None:
                return ok
            ns = self._node_for(name)
            ns.metric = view
            ns.bound_version += 1  # drops the usage memo of ``scheduler_ext.verbs``
        return ok

    def _apply_node_object(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        meta = _mapping(_mapping(obj, "object").get("metadata"), "metadata")
        name = _text(meta.get("name"), "metadata.name")
        if not name:
            return
        deleted = event == "DELETED"
        if kind == "nodes":
            labels = {} if deleted else _strings(meta.get("labels"), "metadata.labels")
            annotations = {} if deleted else _strings(meta.get("annotations"), "metadata.annotations")
            ns = self._node_for(name)
            ns.node_seen = not deleted
            ns.node_labels, ns.node_annotations = labels, annotations
            ns.allocatable = None if deleted else _node_allocatable(_mapping(obj.get("status"), "status"))
        elif kind == "noderesourcetopologies":
            annotations = {} if deleted else _strings(meta.get("annotations"), "metadata.annotations")
            raw = None if deleted else obj.get("topologyPolicies")
            if raw is not None and not (isinstance(raw, list) and all(isinstance(p, str) for p in raw)):
                raise BadObject("topologyPolicies must be a list of strings")
            zones = None if deleted else obj.get("zones")  # read by ``scheduler_ext.views``
            ns = self._node_for(name)
            ns.nrt_annotations, ns.nrt_policies = annotations, tuple(raw or ())
            ns.nrt_zones = zones
        else:  # devices
            spec = None if deleted else dict(_mapping(obj.get("spec"), "spec"))
            ns = self._node_for(name)
            ns.device_spec = spec
        ns._rebuild_static()

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> list[str]:
        """A full list of ``kind``: apply every object and delete what is no longer listed.

        Returns the names of the objects that had to be skipped (logged and counted).
        """
        with self.lock:
            seen: set[str] = set()
            skipped: list[str] = []
            by_uid = kind in ("pods", "reservations")
            for obj in objs:
                meta = obj.get("metadata") if isinstance(obj, Mapping) else None
                key = meta.get("uid" if by_uid else "name") if isinstance(meta, Mapping) else None
                if not isinstance(key, str) or not key:
                    bad_object(kind, "object", _name_of(kind, obj), "listed object without a string "
                               + ("metadata.uid" if by_uid else "metadata.name"))
                    skipped.append(_name_of(kind, obj))
                    continue
                seen.add(key)
                if not self.apply(kind, "ADDED", obj):
                    skipped.append(_name_of(kind, obj))
            if kind == "pods":
                for uid in [u for u in self.pods if u not in seen]:
                    self._forget_pod(uid)
            elif kind == "reservations":
                for uid in [u for u in self.reservations if u not in seen]:
                    self._commit_reservation(uid, None)
            else:
                for name, ns in self.nodes.items():
                    if name in seen:
                        continue
                    gone = {"metadata": {"name": name}}
                    if (kind == "nodes" and ns.node_seen) or (
                        kind == "noderesourcetopologies" and ns.nrt_annotations
                    ) or (kind == "devices" and ns.device_spec is not None) or (
                        kind == NODE_METRICS and ns.metric is not None
                    ):
                        self.apply(kind, "DELETED", gone)
            if not self.ready and self.synced | {kind} >= set(self.kinds):
                # the last first list: pay the derived-state cost *before* readiness lets
                # traffic in (~1 s at 5000 nodes, which used to land on the first requests)
                for ns in self.nodes.values():
                    ns.refresh()
                # the initial cache is long-lived: keep it out of the cyclic GC, whose full
                # passes over ~10^6 objects otherwise add tens of ms to random requests
                gc.collect()
                gc.freeze()
            self.synced.add(kind)
            return skipped

    def _commit_reservation(self, uid: str, r: Reservation | None) -> None:
        """Place a Reservation on its node (caller holds the lock); ``None`` removes it. Only
        reservations scheduled on a node and Available or Waiting are kept: the others neither
        hold CPUs nor can be used (``scheduler_ext.reservations``)."""
        old = self.reservations.pop(uid, None)
        if old is not None and old in self.nodes:
            ns = self.nodes[old]
            if ns.reservations.pop(uid, None) is not None:
                ns.touch()
        if r is None or not r.node_name or r.phase not in (
            keys.RESERVATION_PHASE_AVAILABLE,
            keys.RESERVATION_PHASE_WAITING,
        ):
            return
        ns = self._node_for(r.node_name)
        ns.reservations[uid] = r
        self.reservations[uid] = r.node_name
        # placed by a reservation controller's hold (``scheduler_ext.reserver``): the reservation's
        # own resource-status is the record now, as a bound pod's annotations are for its bind
        held_on = self.holds.pop(uid, None)
        if held_on is not None and held_on in self.nodes:
            self.nodes[held_on].drop(uid)
        ns.touch()

    def recently_deleted(self, uid: str) -> bool:
        return uid in self.deleted

    def _forget_pod(self, uid: str) -> None:
        self.deleted[uid] = time.monotonic()
        if len(self.deleted) > 20000:
            self.deleted.popitem(last=False)
        entry = self.pods.pop(uid, None)
        if entry is not None and entry.node:
            ns = self.nodes.get(entry.node)
            if ns is not None:
                ns.drop(uid)
        held_on = self.holds.pop(uid, None)  # a hold for a pod that vanished before confirmation
        if held_on is not None and held_on in self.nodes:
            self.nodes[held_on].drop(uid)

    def _read_pod(self, event: str, pod: Mapping[str, Any]) -> _PodUpdate | None:
        """Decode one pod event without the lock (parsing may take a while; verbs wait on the
        lock). Raises ``BadObject`` (or whatever a wrong type raises) for a malformed structure;
        unreadable annotations are recorded in the update instead."""
        meta = _mapping(_mapping(pod, "object").get("metadata"), "metadata")
        uid = _text(meta.get("uid"), "metadata.uid")
        if not uid:
            return None
        if event == "DELETED" or _is_terminal(pod):
            return _PodUpdate(uid, gone=True)
        spec = _mapping(pod.get("spec"), "spec")
        node = _text(spec.get("nodeName"), "spec.nodeName")
        annotations = _strings(meta.get("annotations"), "metadata.annotations")
        update = _PodUpdate(
            uid,
            gone=False,
            namespace=_text(meta.get("namespace"), "metadata.namespace") or "default",
            name=_text(meta.get("name"), "metadata.name"),
            node=node,
            rv=_text(meta.get("resourceVersion"), "metadata.resourceVersion"),
            owned=Trust.carries_any(annotations),
        )
        if self.load_args is not None:
            update.load = _read_pod_load(pod, update.namespace, update.name)
        if not node:
            update.request = decode_pod(pod)
            return update
        update.ann = (
            annotations.get(keys.ANNOTATION_RESOURCE_STATUS),
            annotations.get(keys.ANNOTATION_DEVICE_ALLOCATED),
            exclusive_policy_of(annotations),
            annotations.get(keys.ANNOTATION_RESERVATION_ALLOCATED),
        )
        update.proof = (annotations.get(SIGNATURE_ANNOTATION, annotations.get(LEGACY_SEAL_ANNOTATION)),
                        _text(spec.get("schedulerName"), "spec.schedulerName"))  # fmt: skip
        update.annotations = annotations
        entry = self.pods.get(uid)  # read without the lock: only this watch thread writes entries
        if entry is None or entry.node != node:
            update.requested = _pod_requested(spec)  # a pod's requests do not change once bound
        if entry is None or entry.ann != update.ann or entry.node != node or entry.proof != update.proof:
            update.trust = self.trust.judge(uid, update.namespace, update.name, node, update.proof[1], annotations)
            if update.trust:
                update.alloc, update.error = _parse_allocation(update.namespace, update.name, update.ann)
            if update.trust == UNVERIFIABLE:
                update.cpu_milli = decode_pod(pod).cpu_milli
                update.trust, update.alloc = _within_request(update.trust, update.alloc, update.cpu_milli)
        return update

    def _commit_pod(self, update: _PodUpdate) -> None:
        """Apply a decoded pod event (caller holds the lock). A bound pod whose allocation
        annotations cannot be read keeps the allocation last read for it on the same node, or
        holds nothing if none was ever read (see "Hostile objects" in ``scheduler_ext/README.md``)."""
        uid, node = update.uid, update.node
        if update.gone:
            self._forget_pod(uid)
            return
        entry = self.pods.get(uid)
        if entry is None:
            entry = self.pods[uid] = PodEntry(namespace=update.namespace, name=update.name, node="", rv="")
        entry.rv = update.rv
        entry.owned = update.owned
        entry.load = update.load
        if not node:
            entry.request = update.request
            return
        entry.request = None
        if update.ann != entry.ann or entry.node != node or update.proof != entry.proof:
            alloc, error, trust = update.alloc, update.error, update.trust
            if trust is None:  # the entry changed since the read: judge and parse again
                trust, alloc, error = "", None, None
                if update.ann is not None:
                    trust = self.trust.judge(uid, entry.namespace, entry.name, node, update.proof[1],
                                             update.annotations)  # fmt: skip
                if trust:
                    alloc, error = _parse_allocation(entry.namespace, entry.name, update.ann or _NO_ANN)
                if trust == UNVERIFIABLE:
                    trust, alloc = _within_request(trust, alloc, update.cpu_milli)
            if not trust:
                # written by someone the extender cannot vouch for: it proves nothing; the CPUs
                # last proven on this node (by a signed or trusted write) stay counted
                if entry.node != node:
                    entry.alloc = EMPTY
                if update.owned or not entry.alloc.empty:
                    reason = "signature" if update.proof[0] else "unsigned"
                    UNTRUSTED.labels(reason).inc()
                    log.warning("allocation annotations not trusted: not counted",
                                pod=f"{entry.namespace}/{entry.name}", node=node, reason=reason,
                                scheduler=update.proof[1][:64], kept_cpus=len(entry.alloc.cpus))
                entry.bad = (f"untrusted ({'signature does not verify' if update.proof[0] else 'unsigned'})"
                             if update.owned else "")
            elif alloc is not None:
                entry.alloc, entry.bad = alloc, ""
            else:
                if entry.node != node:
                    entry.alloc = EMPTY  # nothing was ever proven on this node
                entry.bad = error or "unreadable"
            entry.ann = update.ann or _NO_ANN
            entry.proof = update.proof
        if entry.node and entry.node != node:
            old = self.nodes.get(entry.node)
            if old is not None:
                old.drop(uid)
        entry.node = node
        ns = self._node_for(node)
        held_on = self.holds.pop(uid, None)
        if held_on is not None and held_on != node and held_on in self.nodes:
            self.nodes[held_on].drop(uid)  # a hold placed on another node is void now
        ns.held.pop(uid, None)  # confirmed: the pod's own annotations are the record now
        ns.foreign.discard(uid)
        ns.put(uid, entry.alloc)
        if update.requested is not None:
            ns.set_requested(uid, update.requested)
        if entry.load is not None:
            ns.set_bound(uid, entry.load)

    # -- holds --------------------------------------------------------------------------------
    def hold(self, uid: str, node: str, alloc: Allocation, *, foreign: bool = False) -> None:
        """Count ``alloc`` on ``node`` for ``uid`` until the watch confirms or ``release``."""
        with self.lock:
            ns = self._node_for(node)
            entry = self.pods.get(uid)
            if entry is not None and entry.node == node:
                return  # already confirmed by the watch
            prev = self.holds.get(uid)
            if prev is not None and prev != node and prev in self.nodes:
                self.nodes[prev].drop(uid)
            self.holds[uid] = node
            ns.held[uid] = time.monotonic()
            if foreign:
                ns.foreign.add(uid)
            else:
                ns.foreign.discard(uid)  # this replica's own bind of the pod now
            ns.put(uid, alloc)
            if entry is not None and entry.load is not None:
                ns.set_bound(uid, entry.load)  # assigned now: estimated in full until a report shows it

    def release(self, uid: str, node: str) -> None:
        """Undo a hold (bind failed). A confirmed allocation is left alone."""
        with self.lock:
            ns = self.nodes.get(node)
            if ns is not None and uid in ns.held:
                ns.drop(uid)
                self.holds.pop(uid, None)

    def held_count(self) -> int:
        with self.lock:
            return len(self.holds)

    def snapshot_counts(self) -> dict[str, int]:
        with self.lock:
            return {
                "nodes": sum(1 for ns in self.nodes.values() if ns.node_seen),
                "pods": len(self.pods),
                "held": len(self.holds),
            }

    def gpu_fragmentation(self) -> float:
        """Share of free GPU core that sits on partially used GPUs, cluster-wide (0..1)."""
        with self.lock:
            free_total = free_partial = 0
            for ns in self.nodes.values():
                if not ns.gpus:
                    continue
                ns.refresh()
                for g in ns.gpus:
                    if not g.healthy:
                        continue
                    used = ns.gpu_usage.get(g.minor)
                    free = g.core - (used.core if used else 0)
                    free_total += max(free, 0)
                    if used is not None and not used.idle:
                        free_partial += max(free, 0)
            return free_partial / free_total if free_total else 0.0


def load_objects(state: ClusterState, objects: Iterable[Any]) -> list[str]:
    """Feed plain objects (``simulate``, tests) by their ``kind``; returns what was skipped
    (``Kind/name`` of unknown kinds and of objects that could not be read, or the position of
    entries that are not objects at all)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {k: [] for k in KINDS}
    skipped: list[str] = []
    kinds = {
        "Node": "nodes",
        "Pod": "pods",
        "NodeResourceTopology": "noderesourcetopologies",
        "Device": "devices",
        "Reservation": "reservations",
    }
    names = {v: k for k, v in kinds.items()}
    for i, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            skipped.append(f"objects[{i}] (a {type(obj).__name__}, not an object)")
            continue
        raw_kind = obj.get("kind")
        kind = kinds.get(raw_kind) if isinstance(raw_kind, str) else None
        if kind is None:
            skipped.append(f"{str(raw_kind)[:64]}/{_name_of('nodes', obj)}")
            continue
        by_kind[kind].append(obj)
    for kind in KINDS:
        skipped += [f"{names[kind]}/{name}" for name in state.replace(kind, by_kind[kind])]
    return skipped

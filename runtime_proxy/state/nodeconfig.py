"""The node's config: NodeSLO spec, node labels and annotations, NodeResourceTopology
annotations, plus what sysfs says about the machine, as one current ``NodeFacts``.

Built by ``runtime_proxy.wiring.node_source``; the proxy (``runtime_proxy.commands.serve.Proxy``) starts
it, hands ``current`` to the interceptor (``runtime_proxy.engine.lifecycle.NodeSource``) and
``changes()`` to the reconciler. Two sources, usable together (the cluster's values win once they arrive):

- a local YAML or JSON file (``runtime_proxy.state.nodedoc``: its format, its bound of
  ``MAX_NODE_CONFIG_BYTES`` and its parser; example ``packaging/examples/nodeslo.yaml``), polled
  for a new inode, mtime or size about every second, so edits apply without a restart. A worker
  thread reads it with the one reader of configured files (``rhp_ops.files``: regular files only,
  never blocking, bounded) and has it parsed and validated in a short-lived child process
  (``nodedoc.parse_in_worker``, one per changed file, killed past its deadline);
- the cluster, through the one Kubernetes access layer (``rhp_kube``: credentials in-cluster or
  from a kubeconfig, loaded once; the supervised list-and-watch of ``rhp_kube.watch`` on its own
  thread): this node's ``Node``, its ``NodeSLO`` (``slo.koordinator.sh/v1alpha1`` ``nodeslos``)
  and its ``NodeResourceTopology`` (``topology.node.k8s.io/v1alpha1`` ``noderesourcetopologies``),
  each selected by ``metadata.name``. ``NodeConfig.liveness`` fails when that watch has heard
  nothing from the API server past its bound (the command's ``/healthz``).

``NodeFacts`` are built from both in the thread that saw the change (the file's worker thread, a
watch thread); the event loop only swaps the finished value in and tells the subscribers, so no
size of either source holds it. Every new NodeSLO spec is validated by
``koord_formats.nodeslo.validate_node_slo`` (the fields we read; unknown keys are kept). A config
that cannot be read or does not validate is logged and counted, and the previous one stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from hooks.facts import CgroupInfo, CPUTopology, NodeFacts, ResctrlFacts
from hooks.signatures import ACCEPT_UNSIGNED, AllocationKeys
from koord_formats import FormatError
from koord_formats.keys import NODE_ANNOTATION_CPU_TOPOLOGY
from koord_formats.nodeslo import validate_node_slo
from koord_formats.signature import MAX_PUBLIC_KEYS_CHARS, parse_public_keys
from koord_formats.topology import parse_cpu_topology
from rhp_kube.liveness import DEAD_AFTER
from rhp_ops.files import FileRefused, read_text_file
from runtime_proxy.state.nodedoc import (
    MAX_NODE_CONFIG_BYTES,
    PARSE_DEADLINE_SECONDS,
    NodeConfigDocument,
    NodeConfigRejected,
    NodeDocument,
    load_document,
    parse_in_worker,
)

__all__ = [
    "MAX_NODE_CONFIG_BYTES",
    "ClusterWatch",
    "NodeConfig",
    "NodeConfigDocument",
    "NodeDocument",
    "load_document",
    "node_facts_from_document",
    "read_document_text",
]

log = structlog.get_logger("runtime_proxy.state.nodeconfig")
CONFIG_RELOADS = Counter("rhp_node_config_reloads", "node config changes taken", ["source"])
CONFIG_REJECTED = Counter("rhp_node_config_rejected",
                          "node configs refused: unreadable (reason: not-regular-file, too-large, ...), invalid, "
                          "or not parsed (timeout, worker-failed); the previous one kept", ["source", "reason"])
CONFIG_GENERATION = Gauge("rhp_node_config_generation", "generation of the node config in use")
ALLOCATION_PUBLIC_KEYS = Gauge("rhp_allocation_public_keys",
                               "public keys resource-status cpusets are verified with (allocationTrust.publicKeyFiles)")


# ---- the local document (its format, bound and parser: runtime_proxy.state.nodedoc) ---------------


def _stamp(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, mtime, size) of the file ``path`` names, ``None`` when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def read_document_text(path: Path) -> str:
    """The node config file's text, read by the one reader of configured files
    (``rhp_ops.files.read_text_file``): a regular file (or a symlink to one) of at most
    ``MAX_NODE_CONFIG_BYTES``, in UTF-8. ``FileRefused`` otherwise (missing, a FIFO, a socket, a
    device, a directory, too large, unreadable, not UTF-8); never blocks."""
    return read_text_file(path, limit=MAX_NODE_CONFIG_BYTES)


def node_facts_from_document(
    doc: NodeDocument,
    *,
    topology: CPUTopology | None = None,
    resctrl: ResctrlFacts | None = None,
    cgroup: CgroupInfo | None = None,
    name: str = "",
    allocation_keys: AllocationKeys = ACCEPT_UNSIGNED,
) -> NodeFacts:
    """``NodeFacts`` from a document: node annotations overlaid by NRT annotations; the CPU
    topology from sysfs (``topology``) or else from the ``node.koordinator.sh/cpu-topology``
    annotation. Up to a whole file of ``MAX_NODE_CONFIG_BYTES`` goes through here: ``NodeConfig``
    calls it in worker threads, never on the event loop."""
    annotations = {**doc.annotations, **doc.nrt_annotations}
    topo = topology
    raw = annotations.get(NODE_ANNOTATION_CPU_TOPOLOGY)
    if topo is None and raw:
        try:
            topo = parse_cpu_topology(raw)
        except FormatError as exc:
            log.warning("bad cpu-topology annotation ignored", error=str(exc))
    cg = cgroup or CgroupInfo()
    if doc.cgroup_version is not None or doc.cgroup_driver is not None:
        cg = replace(cg, version=doc.cgroup_version or cg.version, driver=doc.cgroup_driver or cg.driver)
    return NodeFacts(
        name=doc.name or name,
        labels=MappingProxyType(dict(doc.labels)),
        annotations=MappingProxyType(annotations),
        node_slo=MappingProxyType(dict(doc.node_slo)),
        cpu_topology=topo,
        resctrl=resctrl or ResctrlFacts(),
        cgroup=cg,
        allocation_keys=allocation_keys,
    )


# ---- cluster source ----------------------------------------------------------------------------


@dataclass
class ClusterObjects:
    """What the cluster told us so far; ``None`` = not seen (the file's value stays)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    nrt_annotations: dict[str, str] | None = None
    node_slo: dict[str, Any] | None = None  # Any: the NodeSLO spec as JSON (validate_node_slo checked it)
    resource_versions: dict[str, str] = field(default_factory=dict)


# An object larger than this (as JSON) is refused before it is read. What we read of the three
# objects is what a node config file holds (runtime_proxy.state.nodedoc.MAX_NODE_CONFIG_BYTES says
# why 1 MiB holds it); a Node's status (conditions, addresses, up to 50 images) adds tens of KiB.
MAX_WATCH_EVENT_CHARS = 1 << 20

_KINDS: dict[str, tuple[str, str, str]] = {
    # kind -> (group, version, plural); "" group = core API
    "Node": ("", "v1", "nodes"),
    "NodeSLO": ("slo.koordinator.sh", "v1alpha1", "nodeslos"),
    "NodeResourceTopology": ("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"),
}


def _too_large(obj: Mapping[str, Any], limit: int) -> int:
    """The object's size as JSON when it is over ``limit``, else 0."""
    import orjson

    size = len(orjson.dumps(obj))
    return size if size > limit else 0


class ClusterWatch:
    """Watches this node's Node, NodeSLO and NodeResourceTopology (``rhp_kube.watch``).

    :param node_name: the node (and NodeSLO / NRT object) name.
    :param api_client: a ready ``kubernetes.client.ApiClient``; when ``None`` credentials are
        loaded once by ``rhp_kube.credentials`` (in-cluster with ``KUBERNETES_SERVICE_HOST``, else
        ``kubeconfig`` / ``KUBECONFIG`` / ``~/.kube/config``) on the watch's thread, where a
        failure is retried like any other.
    """

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,  # Any: kubernetes.client.ApiClient (untyped)
        kubeconfig: str | None = None,
        watch_timeout: int = 60,
        retry_seconds: float = 1.0,
        read_deadline: float = 90.0,
        dead_after: float = DEAD_AFTER,
    ) -> None:
        self.node_name = node_name
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self.watch_timeout = watch_timeout
        self.retry_seconds = retry_seconds
        self.read_deadline = read_deadline
        self.dead_after = dead_after
        self.state = ClusterObjects()
        self._lock = threading.Lock()
        self._on_change: Callable[[], None] = lambda: None
        self._informer: Any = None  # Any: rhp_kube.watch.Informer (imported with the [cluster] extra)

    def snapshot(self) -> ClusterObjects:
        """The state as one consistent value (the watch thread replaces its dicts, never edits them)."""
        with self._lock:
            return replace(self.state, resource_versions=dict(self.state.resource_versions))

    # Pure part: one watch event in, state updated, "changed?" out.
    def handle_event(self, kind: str, event: Mapping[str, Any]) -> bool:  # Any: JSON not yet checked
        """Fold a watch event (``{"type": ADDED|MODIFIED|DELETED, "object": {...}}``) into the
        state. Events for other objects, objects over ``MAX_WATCH_EVENT_CHARS`` and bad NodeSLO
        specs are ignored (logged, counted). Returns True when what the node config is built from
        changed."""
        obj = event.get("object")
        etype = event.get("type")
        if not isinstance(obj, Mapping) or etype not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        meta = obj.get("metadata") or {}
        if not isinstance(meta, Mapping) or meta.get("name") != self.node_name:
            return False
        size = _too_large(obj, MAX_WATCH_EVENT_CHARS) if etype != "DELETED" else 0
        if size:
            CONFIG_REJECTED.labels("cluster", "too-large").inc()
            log.warning("object from the cluster refused unread; keeping the previous one", kind=kind, chars=size,
                        limit=MAX_WATCH_EVENT_CHARS)
            return False
        with self._lock:
            rv = str(meta.get("resourceVersion", ""))
            if rv:
                self.state.resource_versions[kind] = rv
            deleted = etype == "DELETED"
            if kind == "Node":
                labels = {} if deleted else dict(meta.get("labels") or {})
                annotations = {} if deleted else dict(meta.get("annotations") or {})
                changed = (labels, annotations) != (self.state.labels, self.state.annotations)
                self.state.labels, self.state.annotations = labels, annotations
                return changed
            if kind == "NodeResourceTopology":
                nrt = {} if deleted else dict(meta.get("annotations") or {})
                changed = nrt != self.state.nrt_annotations
                self.state.nrt_annotations = nrt
                return changed
            if kind == "NodeSLO":
                spec = {} if deleted else dict(obj.get("spec") or {})
                try:
                    validate_node_slo(spec)
                except FormatError as exc:
                    CONFIG_REJECTED.labels("cluster", "invalid").inc()
                    log.warning("NodeSLO rejected; keeping the previous one", error=str(exc))
                    return False
                changed = spec != self.state.node_slo
                self.state.node_slo = spec
                return changed
        return False

    def _seen(self, kind: str) -> bool:
        with self._lock:
            state = self.state
            return {"Node": state.labels, "NodeSLO": state.node_slo,
                    "NodeResourceTopology": state.nrt_annotations}[kind] is not None

    # ``rhp_kube.watch.Sink``: called on the watch's thread.
    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool) -> None:
        """A fresh list (of this node's object: selected by name): its object, or its deletion
        when one was seen before (a CRD that is not installed leaves the file's value)."""
        if absent:
            return
        mine = [i for i in items if isinstance(i.get("metadata"), Mapping) and i["metadata"].get("name")
                == self.node_name]
        if mine:
            changed = self.handle_event(kind, {"type": "ADDED", "object": mine[0]})
        elif self._seen(kind):
            changed = self.handle_event(kind, {"type": "DELETED", "object": {"metadata": {"name": self.node_name}}})
        else:
            changed = False
        if changed:
            self._on_change()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if self.handle_event(kind, {"type": event, "object": obj}):
            self._on_change()

    def _http(self) -> Any:  # Any: rhp_kube.http.KubeHTTP
        from rhp_kube.http import watch_transport

        return watch_transport(self._api_client, self._kubeconfig)

    def start(self, on_change: Callable[[], None]) -> None:
        """Start the watch thread; ``on_change`` is called from it after the objects changed."""
        from rhp_kube.watch import Informer, Resource, WatchOptions, collection

        self._on_change = on_change
        selector = f"metadata.name={self.node_name}"
        resources = [Resource(kind, collection(group, version, plural), field_selector=selector,
                              optional=kind != "Node") for kind, (group, version, plural) in _KINDS.items()]
        options = WatchOptions(watch_timeout=self.watch_timeout, read_deadline=self.read_deadline,
                               backoff_initial=self.retry_seconds, dead_after=self.dead_after,
                               max_line_bytes=2 * MAX_WATCH_EVENT_CHARS)
        self._informer = Informer(self._http, resources, self, component="node", options=options)
        self._informer.start_thread()

    def liveness(self) -> tuple[bool, str]:
        """``rhp_kube.watch.Informer.liveness`` of the watch (alive when not started)."""
        informer = self._informer
        return (True, "not watching") if informer is None else informer.liveness()

    def stop(self) -> None:
        informer, self._informer = self._informer, None
        if informer is not None:
            informer.close()


# ---- the node config ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Built:
    """``NodeFacts`` built off the event loop; ``seq`` orders builds from different threads."""

    seq: int
    facts: NodeFacts


@dataclass(frozen=True)
class _FileRead:
    """One look at the node config file: ``stamp`` (device, inode, mtime, size; None: the file
    is gone), and what it gave: ``valid`` with the facts built from it (``built`` is None when
    they did not change), or why not (``reason`` is the metric label)."""

    stamp: tuple[int, int, int, int] | None
    valid: bool = False
    built: _Built | None = None
    error: str = ""
    reason: str = ""


class NodeConfig:
    """The current node config, from a file and/or the cluster.

    :param path: the node config file (YAML or JSON); polled every ``poll_interval`` seconds.
    :param cluster: a ``ClusterWatch`` (``None``: file only).
    :param topology: the CPU topology (``runtime_proxy.state.sysfs.read_cpu_topology()``); when
        ``None`` the ``node.koordinator.sh/cpu-topology`` annotation is used.
    :param resctrl: resctrl facts (``runtime_proxy.host.resctrl.Resctrl(root).facts()``).
    :param cgroup: the cgroup layout (version, driver).
    :param parse_deadline: seconds the parser process of one file may take before it is killed.
    :param key_files: public-key lists (``allocationTrust.publicKeyFiles``), polled like the file;
        their keys verify pods' allocation signatures (``NodeFacts.allocation_keys``).
    :param accept_unsigned: ``allocationTrust.acceptUnsigned`` (``None``: true without key files).
    """

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        cluster: ClusterWatch | None = None,
        node_name: str = "",
        topology: CPUTopology | None = None,
        resctrl: ResctrlFacts | None = None,
        cgroup: CgroupInfo | None = None,
        poll_interval: float = 1.0,
        parse_deadline: float = PARSE_DEADLINE_SECONDS,
        key_files: tuple[str, ...] = (),
        accept_unsigned: bool | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.cluster = cluster
        self.node_name = node_name
        self.topology = topology
        self.resctrl = resctrl or ResctrlFacts()
        self.cgroup = cgroup or CgroupInfo()
        self.poll_interval = poll_interval
        self.parse_deadline = parse_deadline
        self.generation = 0
        self.key_files = tuple(Path(p) for p in key_files)
        self.accept_unsigned = (not key_files) if accept_unsigned is None else accept_unsigned
        # Built in worker and watch threads under _lock: the document, the last facts built.
        self._lock = threading.Lock()
        self._keys = AllocationKeys(accept_unsigned=self.accept_unsigned)
        self._key_stamps: tuple[tuple[int, int, int, int] | None, ...] | None = None
        self._load_keys()
        self._doc = NodeDocument(name=node_name)
        self._facts = self._build()
        self._last_built = self._facts
        self._seq = 0
        # On the event loop (or the caller's thread without one): what is in use.
        self._installed = 0
        self._stamp: tuple[int, int, int, int] | None = None
        self._subscribers: list[asyncio.Queue[NodeFacts]] = []
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parser: subprocess.Popen[bytes] | None = None
        self._stopping = False
        if self.path is not None:
            self.reload()

    def current(self) -> NodeFacts:
        """The node config in use (``intercept.NodeSource``)."""
        return self._facts

    def _build(self) -> NodeFacts:
        doc = self._doc
        if self.cluster is not None:
            state = self.cluster.snapshot()
            doc = replace(
                doc,
                labels=state.labels if state.labels is not None else doc.labels,
                annotations=state.annotations if state.annotations is not None else doc.annotations,
                nrt_annotations=state.nrt_annotations if state.nrt_annotations is not None else doc.nrt_annotations,
                node_slo=state.node_slo if state.node_slo is not None else doc.node_slo,
            )
        return node_facts_from_document(
            doc, topology=self.topology, resctrl=self.resctrl, cgroup=self.cgroup, name=self.node_name,
            allocation_keys=self._keys,
        )

    def keys_pending(self) -> str | None:
        """Why this node cannot honour an allocation yet, for ``/readyz``: public-key files are
        configured, unsigned claims are refused and no key was read from them (after a first
        install the extender publishes its key and kubelet refreshes the volume about a minute
        later); None otherwise. A node agent reported ready before that would let an LSR pod
        start on the share pools, and in NRI mode nothing carries its cpuset to it afterwards
        until another container event on the node."""
        with self._lock:
            keys = self._keys
        if not self.key_files or keys.accept_unsigned or keys.public_keys:
            return None
        files = ", ".join(str(p) for p in self.key_files)
        return f"no allocation public key read yet from {files}: LSR and LSE cpusets wait for it (docs/signing.md)"

    def _load_keys(self) -> bool:
        """Re-read the public-key files when one changed (inode, mtime or size; a missing file has
        no keys); True when the keys in use changed. A file that cannot be read or parsed is
        logged and counted, and the keys last read stay. Runs in a worker thread."""
        if not self.key_files:
            return False
        stamps = tuple(_stamp(p) for p in self.key_files)
        if stamps == self._key_stamps:
            return False
        self._key_stamps = stamps
        found: list[bytes] = []
        for path, stamp in zip(self.key_files, stamps, strict=True):
            if stamp is None:
                continue
            try:
                found += parse_public_keys(read_text_file(path, limit=MAX_PUBLIC_KEYS_CHARS), str(path))
            except FileRefused as exc:
                CONFIG_REJECTED.labels("keys", exc.reason).inc()
                log.warning("public-key file not read; keeping the keys in use", path=str(path), error=exc.message)
                return False
            except FormatError as exc:
                CONFIG_REJECTED.labels("keys", "invalid").inc()
                log.warning("public-key file rejected; keeping the keys in use", path=str(path), error=str(exc))
                return False
        try:
            keys = AllocationKeys.of(found, accept_unsigned=self.accept_unsigned)
        except ValueError as exc:
            CONFIG_REJECTED.labels("keys", "invalid").inc()
            log.warning("public keys rejected; keeping the keys in use", error=str(exc))
            return False
        ALLOCATION_PUBLIC_KEYS.set(len(keys.public_keys))
        with self._lock:
            changed = keys != self._keys
            self._keys = keys
        if changed:
            log.info("allocation public keys loaded", keys=len(keys.public_keys),
                     accept_unsigned=keys.accept_unsigned)  # fmt: skip
        return changed

    def _rebuild(self, doc: NodeDocument | None = None) -> _Built | None:
        """Build the facts from the document (``doc`` when given, which then becomes the
        document) and the cluster's objects, off the event loop; None when they did not change."""
        with self._lock:
            if doc is not None:
                self._doc = doc
            facts = self._build()
            if facts == self._last_built:
                return None
            self._last_built = facts
            self._seq += 1
            return _Built(self._seq, facts)

    def _install(self, built: _Built | None, source: str) -> bool:
        """Put facts built by ``_rebuild`` in use (on the event loop: O(1) whatever their size)."""
        if built is None or built.seq <= self._installed:
            return False
        self._installed = built.seq
        self._facts = built.facts
        self.generation += 1
        CONFIG_GENERATION.set(self.generation)
        CONFIG_RELOADS.labels(source).inc()
        log.info("node config changed", source=source, generation=self.generation)
        for q in list(self._subscribers):
            q.put_nowait(built.facts)
        return True

    def reload(self) -> bool:
        """Re-read the file if it changed (another inode, mtime or size). Returns True when the
        config changed. A file that cannot be read (``read_document_text``), does not validate or
        is not parsed in time is logged and counted (``rhp_node_config_rejected``); the previous
        config stays. Blocks while the file is parsed in its child process: on an event loop use
        ``reload_async``."""
        return self._take(self._load())

    async def reload_async(self) -> bool:
        """``reload`` with the reading, the waiting for the parser process and the building of
        ``NodeFacts`` in a worker thread: the event loop only installs the result."""
        return self._take(await asyncio.to_thread(self._load))

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._parser = proc
        if self._stopping:
            proc.kill()

    def _load(self) -> _FileRead | None:
        """The file read, parsed (in a child process) and built into facts, or None when it did
        not change since the last read. Runs in a worker thread; of what the event loop owns it
        reads only ``path`` and ``_stamp``."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return _FileRead(None)
        except OSError as exc:
            return _FileRead((0, 0, 0, 0), error=f"cannot stat: {exc.strerror or exc}", reason="unreadable")
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return None
        try:
            text = read_document_text(self.path)
            doc = parse_in_worker(text, deadline=self.parse_deadline, started=self._started)
        except FileRefused as exc:
            return _FileRead(stamp, error=exc.message, reason=exc.reason)
        except NodeConfigRejected as exc:
            return _FileRead(stamp, error=exc.message, reason=exc.reason)
        finally:
            self._parser = None
        return _FileRead(stamp, valid=True, built=self._rebuild(doc))

    def _take(self, read: _FileRead | None) -> bool:
        """Use what ``_load`` found (on the event loop, when there is one)."""
        if read is None:
            return False
        if read.stamp is None:
            if self._stamp is not None:
                log.warning("node config file disappeared; keeping the last config", path=str(self.path))
                self._stamp = None
            return False
        self._stamp = read.stamp
        if not read.valid:
            CONFIG_REJECTED.labels("file", read.reason).inc()
            log.warning("node config rejected; keeping the previous one", path=str(self.path), reason=read.reason,
                        error=read.error)
            return False
        return self._install(read.built, "file")

    def _cluster_changed(self) -> None:
        """Called by a watch thread after its object changed: build there, install on the loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            built = self._rebuild()
        except Exception:
            log.exception("node config from the cluster could not be built; keeping the previous one")
            return
        if built is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._install, built, "cluster")

    async def changes(self) -> AsyncGenerator[NodeFacts, None]:
        """Yield every new node config (the latest first when several piled up)."""
        q: asyncio.Queue[NodeFacts] = asyncio.Queue()
        self._subscribers.append(q)
        try:
            while True:
                facts = await q.get()
                while not q.empty():
                    facts = q.get_nowait()
                yield facts
        finally:
            self._subscribers.remove(q)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                if self.key_files:
                    changed: bool = await asyncio.to_thread(self._load_keys)
                    if changed:
                        self._install(await asyncio.to_thread(self._rebuild), "keys")
                await self.reload_async()
            except Exception:
                log.exception("node config poll failed")

    async def start(self) -> None:
        """Start polling the file and watching the cluster (when configured)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        if self.cluster is not None:
            self.cluster.start(self._cluster_changed)
        if (self.path is not None or self.key_files) and self._task is None:
            self._task = asyncio.create_task(self._poll(), name="node-config-poll")

    def liveness(self) -> tuple[bool, str]:
        """For ``/healthz``: the cluster watch's (``ClusterWatch.liveness``); alive without one."""
        return (True, "ok") if self.cluster is None else self.cluster.liveness()

    async def stop(self) -> None:
        self._stopping = True
        parser = self._parser
        if parser is not None:
            parser.kill()  # its worker thread then returns at once
        if self.cluster is not None:
            self.cluster.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

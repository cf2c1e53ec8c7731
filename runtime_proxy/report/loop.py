"""The reporter: when ``report.enable`` is set, this node's NodeResourceTopology, Device and
NodeMetric status are kept up to date on the API server, as koordlet keeps them.

Built and started by ``runtime_proxy.wiring.loops`` for ``serve`` and ``nri`` alike (``hook-server``
runs no loops), over the entry point's backend (the store: node facts, pods, containers). Two tasks:

- topology, every ``report.intervalSeconds``: the NRT's managed parts
  (``runtime_proxy.report.build.build_nrt``: the CPU topology read from sysfs once at start, the
  node with its bound pods, kubelet's config, NUMA memory and the CPU basic info read again each
  time) and the GPUs
  (``runtime_proxy.report.sources.discover_gpus``). What was last written is remembered; an
  object is read back (GET) only when what it should hold changed, or ``report.resyncSeconds``
  after it was last read, then merged (``build.merge_nrt`` / ``merge_device``) and written only
  when the merge changes it (PUT with the read ``resourceVersion``; a conflict waits for the
  next round). A missing NRT is created, owned by the Node; a missing Device only when the node
  has GPUs.
- metrics, every ``usageLoop.intervalSeconds``: new samples of the usage sampler are folded into
  a ``runtime_proxy.report.nodemetric.MetricWindow``. The sampler is the usage loop's when it runs
  (its window is read, never sampled twice); otherwise the reporter runs its own
  ``UsageSampler`` over the same cgroups. Every ``max(reportIntervalSeconds,
  nodeMetricMinIntervalSeconds)`` the NodeMetric is read (its spec is the collect policy,
  ``koord_formats.nodemetric.parse_collect_policy``; a malformed spec is logged and the defaults
  used) and its status replaced. A missing NodeMetric is skipped (logged once), or created with
  the default spec when ``report.createNodeMetric`` is set.

A pod or container that arrives, changes or leaves (``store_changed``, from the entry point's
store) starts the topology round at once, so the share pools follow LSE/LSR pods without
waiting for the interval. Every object write goes through one ``RateLimit`` per object: the
NodeMetric's is koordlet's (0.1/s, burst 2), the NRT's and Device's 1/s with a burst of 5 (they
change with pods, and koordlet does not limit them at all). API calls and
file reads run in one worker thread of the reporter's own, so an API server that never answers
holds that thread (each call has a 10 s timeout), never the event loop or the usage loop's
threads. A failed round is logged and counted and the next round tries again; one object's
failure never stops the others.

Metrics: ``rhp_report_writes_total`` (by object and result: written, created, unchanged,
conflict, rate-limited, missing, error), ``rhp_report_round_seconds`` (by task).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

import structlog
from prometheus_client import Counter, Histogram

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, with_bound_pods
from hooks.usage import UsageSample
from koord_formats import device as device_format
from koord_formats import nodemetric as nm
from koord_formats import nrt as nrt_format
from koord_formats.device import GPUInfo
from koord_formats.errors import FormatError
from koord_formats.topology import CPUTopology
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.usage import UsageSampler
from runtime_proxy.report.build import (
    NRTReport,
    build_nrt,
    kubelet_allocs,
    merge_device,
    merge_nrt,
    new_device,
    new_nrt,
)
from runtime_proxy.report.config import ReportConfig
from runtime_proxy.report.nodemetric import HostAppMeta, MetricWindow, PodMeta
from runtime_proxy.report.sources import (
    discover_gpus,
    read_cpu_basic_info,
    read_cpu_manager_state,
    read_kubelet_config,
    read_numa_memory,
)
from runtime_proxy.report.writer import ApiError, KubeObject, KubeObjects, RateLimit, Ref

__all__ = ["ReportBackend", "Reporter", "reporter"]

log = structlog.get_logger("runtime_proxy.report")

WRITES = Counter("rhp_report_writes_total", "Report writes by object (NodeResourceTopology, Device, NodeMetric) "
                 "and result: written, created, unchanged, conflict, rate-limited, missing, error.",
                 ["object", "result"])
ROUND_SECONDS = Histogram("rhp_report_round_seconds", "Time of one report round, by task (topology, metrics).",
                          ["task"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))

NRT = Ref(nrt_format.API_GROUP, nrt_format.API_VERSION, nrt_format.PLURAL)
DEVICE = Ref(device_format.API_GROUP, device_format.API_VERSION, device_format.PLURAL)
NODEMETRIC = Ref(nm.API_GROUP, nm.API_VERSION, nm.PLURAL)


class ReportBackend(Protocol):
    """What the reporter reads of the entry point (``runtime_proxy.commands.serve.StoreBackend``)."""

    def node(self) -> NodeFacts: ...

    def pods(self) -> list[PodFacts]: ...

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]: ...


_T = TypeVar("_T")


@dataclass
class _Written:
    """What was last written to (or found in) one object, and when it was last read."""

    value: object = None
    read_at: float = float("-inf")


class Reporter:
    """The reporter (see the module docstring).

    :param config: the ``report`` section.
    :param backend: node facts, pods and containers.
    :param node_name: this node (and its objects' name).
    :param topology: the CPU topology (read from sysfs at start by the caller).
    :param cgroups: the cgroup tree, for the reporter's own sampler.
    :param sampler: the usage loop's sampler when it runs (then its window is read).
    :param usage_interval: seconds between two samples (``usageLoop.intervalSeconds``).
    :param proc_root: ``usageLoop.procRoot`` for the reporter's own sampler.
    :param objects: the API writer (default: credentials loaded on first use).
    """

    def __init__(
        self,
        config: ReportConfig,
        backend: ReportBackend,
        *,
        node_name: str,
        topology: CPUTopology,
        cgroups: Cgroups,
        sampler: UsageSampler | None = None,
        usage_interval: float = 1.0,
        proc_root: str = "/proc",
        objects: KubeObjects | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.backend = backend
        self.node_name = node_name
        self.topology = topology
        self.clock = clock
        self.wall = wall
        self.usage_interval = usage_interval
        self.shared_sampler = sampler is not None
        self.sampler = sampler or UsageSampler(cgroups, proc_root=proc_root, clock=clock, interval=usage_interval)
        self.objects = objects or KubeObjects()
        self.window = MetricWindow()
        self.limits = {"NodeResourceTopology": RateLimit(1.0, 5, clock), "Device": RateLimit(1.0, 5, clock),
                       "NodeMetric": RateLimit(0.1, 2, clock)}
        self._wake = asyncio.Event()
        self._written = {kind: _Written() for kind in ("NodeResourceTopology", "Device")}
        self._policy = nm.DEFAULT_COLLECT_POLICY
        self._spec_read = False
        self._last_report = clock()  # the first report one period after the start, as koordlet
        self._warned: set[str] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rhp-report")
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        log.info("reporting this node", node=self.node_name, objects="NodeResourceTopology, Device, NodeMetric",
                 sampler="the usage loop's" if self.shared_sampler else "its own")
        self._wake = asyncio.Event()  # of the running loop
        self._tasks = [asyncio.create_task(self._every(self.config.intervalSeconds, self.topology_round, "topology",
                                                       self._wake)),
                       asyncio.create_task(self._every(self.usage_interval, self.metrics_round, "metrics"))]

    def store_changed(self) -> None:
        """A pod or container arrived, changed or left: run the topology round now (call it on
        the event loop)."""
        self._wake.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _every(self, period: float, work: Callable[[], None], task: str,
                     wake: asyncio.Event | None = None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if wake is not None:
                wake.clear()
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._executor, work)
            except Exception:  # one failed round never ends the loop
                log.exception("report round failed", task=task)
            ROUND_SECONDS.labels(task).observe(time.perf_counter() - started)
            if wake is None:
                await asyncio.sleep(period)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), period)

    def _warn_once(self, key: str, message: str, **fields: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, node=self.node_name, **fields)

    # -- NodeResourceTopology and Device ---------------------------------------------------------

    def topology_round(self) -> None:
        """Build the NRT and Device parts and write what changed (a worker thread)."""
        pods = self.backend.pods()
        node = with_bound_pods(self.backend.node(), pods)
        kubelet = read_kubelet_config(self.config.kubeletConfigFile)
        allocs = kubelet_allocs(read_cpu_manager_state(self.config.kubeletCPUManagerStateFile), pods) \
            if kubelet.cpu_manager_policy == "static" else ()
        try:
            report = build_nrt(self.topology, node, kubelet, read_numa_memory(self.config.sysRoot), allocs,
                               read_cpu_basic_info(self.topology, self.config.sysRoot, self.config.procRoot))
        except FormatError as exc:
            WRITES.labels("NodeResourceTopology", "error").inc()
            self._warn_once("nrt-build", "NodeResourceTopology not built: a node annotation is malformed",
                            error=str(exc))
            report = None
        if report is not None:
            self._sync("NodeResourceTopology", NRT, report, self._nrt_new, merge_nrt)
        gpus = discover_gpus(self.config.sysRoot, self.config.procRoot, memory_bytes=self.config.gpuMemoryBytes)
        self._sync("Device", DEVICE, gpus, self._device_new, merge_device)

    def _nrt_new(self, report: NRTReport) -> KubeObject | None:
        return new_nrt(self.node_name, report, self.objects.node_owner(self.node_name))

    def _device_new(self, gpus: Sequence[GPUInfo]) -> KubeObject | None:
        if not gpus:
            return None
        return new_device(self.node_name, gpus, self.objects.node_owner(self.node_name))

    def _sync(
        self,
        kind: str,
        ref: Ref,
        value: _T,
        create: Callable[[_T], KubeObject | None],
        merge: Callable[[KubeObject, _T], KubeObject | None],
    ) -> None:
        """Write ``value``'s parts into object ``kind`` when they changed (see the module docstring)."""
        written = self._written[kind]
        now = self.clock()
        if value == written.value and now - written.read_at < self.config.resyncSeconds:
            return
        try:
            existing = self.objects.get(ref, self.node_name)
            written.read_at = now
            if existing is None:
                body = create(value)
                if body is None:
                    written.value = value
                    return
                if not self.limits[kind].allow():
                    WRITES.labels(kind, "rate-limited").inc()
                    return
                self.objects.create(ref, body)
                WRITES.labels(kind, "created").inc()
                log.info("report object created", kind=kind, node=self.node_name)
            else:
                body = merge(existing, value)
                if body is None:
                    WRITES.labels(kind, "unchanged").inc()
                elif not self.limits[kind].allow():
                    WRITES.labels(kind, "rate-limited").inc()
                    return
                else:
                    self.objects.replace(ref, self.node_name, body)
                    WRITES.labels(kind, "written").inc()
                    log.info("report object updated", kind=kind, node=self.node_name)
            written.value = value
            self._warned.discard(f"sync:{kind}")
        except FormatError as exc:  # the object read back is malformed: it costs only itself
            WRITES.labels(kind, "error").inc()
            self._warn_once(f"sync:{kind}", "report object read back is malformed; not written", kind=kind,
                            error=str(exc))
        except ApiError as exc:
            WRITES.labels(kind, "conflict" if exc.status == 409 else "error").inc()
            if exc.status != 409:
                self._warn_once(f"sync:{kind}", "report write failed; retried next round", kind=kind,
                                status=exc.status, error=str(exc))

    # -- NodeMetric ------------------------------------------------------------------------------

    def _sample(self) -> tuple[UsageSample | None, list[PodFacts], NodeFacts]:
        """The reporter's own sample (when the usage loop does not run): pods with their
        containers and the node with its bound pods, as the usage loop samples them."""
        node, pods = self.backend.node(), self.backend.pods()
        by_pod: dict[str, list[ContainerFacts]] = {}
        for p, c in self.backend.containers():
            by_pod.setdefault(p.uid or p.sandbox_id, []).append(c)
        pods = [p.replace(containers=tuple(by_pod.get(p.uid or p.sandbox_id, ()))) for p in pods]
        node = with_bound_pods(node, pods)
        return self.sampler.sample(node, pods), pods, node

    def metrics_round(self) -> None:
        """Fold new samples in; report when the interval has passed (a worker thread)."""
        if self.shared_sampler:
            node, pods = self.backend.node(), self.backend.pods()
            samples = self.sampler.samples
            # At first only the newest: older samples of the window no longer carry their pods.
            new = list(samples[-1:]) if self.window.last_at is None else [
                s for s in samples if s.at > self.window.last_at]
        else:
            sample, pods, node = self._sample()
            new = [sample] if sample is not None else []
        metas = [(p.uid or p.sandbox_id, PodMeta.of(p)) for p in pods]
        apps = [HostAppMeta(a.name, a.priority, a.qos) for a in node.rules.host_applications.value]
        for sample in new:
            self.window.add(sample, metas, apps)
        now = self.clock()
        # Until the NodeMetric was read, its spec's interval is unknown: the shortest one.
        period = max(self._policy.report_interval_seconds if self._spec_read else 0,
                     self.config.nodeMetricMinIntervalSeconds)
        if now - self._last_report >= period and self.window.last_at is not None:
            self._last_report = now
            self.report_metrics(now)

    def report_metrics(self, now: float) -> None:
        """Read the NodeMetric (its spec is the collect policy) and replace its status."""
        kind = "NodeMetric"
        try:
            existing = self.objects.get(NODEMETRIC, self.node_name)
            if existing is None:
                if not self.config.createNodeMetric:
                    WRITES.labels(kind, "missing").inc()
                    self._warn_once("nodemetric-missing", "no NodeMetric for this node yet; its manager creates it "
                                    "(report.createNodeMetric creates one)")
                    return
                self.objects.create(NODEMETRIC, {"apiVersion": f"{nm.API_GROUP}/{nm.API_VERSION}", "kind": nm.KIND,
                                                 "metadata": {"name": self.node_name}, "spec": {}})
                WRITES.labels(kind, "created").inc()
                existing = self.objects.get(NODEMETRIC, self.node_name)
                if existing is None:
                    return
            self._warned.discard("nodemetric-missing")
            self._spec_read = True
            try:
                self._policy = nm.parse_collect_policy(existing.get("spec"))
            except FormatError as exc:
                self._policy = nm.DEFAULT_COLLECT_POLICY
                self._warn_once("nodemetric-spec", "NodeMetric spec malformed; koordlet's defaults used",
                                error=str(exc))
            if self._policy.memory_policy != nm.MEMORY_WITHOUT_PAGE_CACHE:
                self._warn_once("nodemetric-memory", "memory is reported without page cache",
                                asked=self._policy.memory_policy)
            if not self.limits[kind].allow():
                WRITES.labels(kind, "rate-limited").inc()
                return
            stamp = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status = self.window.status(self._policy, now, stamp)
            body = dict(existing)
            body["status"] = nm.format_node_metric_status(status)
            self.objects.replace(NODEMETRIC, self.node_name, body, status=True)
            WRITES.labels(kind, "written").inc()
        except ApiError as exc:
            WRITES.labels(kind, "conflict" if exc.status == 409 else "error").inc()
            if exc.status != 409:
                self._warn_once("nodemetric-write", "NodeMetric status not written; retried next report",
                                status=exc.status, error=str(exc))


def reporter(
    config: ReportConfig,
    backend: ReportBackend,
    *,
    node_name: str,
    cgroups: Cgroups,
    sampler: UsageSampler | None,
    usage_interval: float,
    proc_root: str,
) -> Reporter | None:
    """The reporter for an entry point, or ``None`` when ``report.enable`` is off; the CPU
    topology is read from ``report.sysRoot`` now."""
    if not config.enable:
        return None
    from runtime_proxy.state.sysfs import read_cpu_topology

    return Reporter(config, backend, node_name=node_name, topology=read_cpu_topology(config.sysRoot), cgroups=cgroups,
                    sampler=sampler, usage_interval=usage_interval, proc_root=proc_root)

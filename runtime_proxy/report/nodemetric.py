"""The NodeMetric status, built from the usage sampler's samples as koordlet builds it
(``states_nodemetric.go``); pure: samples in, a ``koord_formats.nodemetric.NodeMetricStatus`` out.

``MetricWindow.add`` takes each new ``hooks.usage.UsageSample`` (with its per-pod and
per-host-application maps, which the sampler keeps only in its newest samples, so the reporter
adds every sample while it is new) and the pods the sample was taken over. It keeps:

- node and system usage per sample for ``RETENTION_SECONDS`` (koordlet's metric cache keeps
  1800 s); system usage per sample = max(node - the pods - the host applications, 0);
- per pod (by uid) and per host application (by name), sums over ``BUCKET_SECONDS`` buckets for
  ``RETENTION_SECONDS``, so 200 pods cost a few thousand numbers, not one tuple per sample.

``MetricWindow.status`` answers for one collect policy at time ``now``:

- ``nodeUsage`` / ``systemUsage``: the average over the last ``aggregateDurationSeconds``;
- ``aggregatedNodeUsages`` / ``aggregatedSystemUsages``: for each duration, p50, p90, p95 and
  p99 of the samples in it (percentile = sorted[int(n x p) - 1], koordlet's metric cache); an
  empty map for every percentile while the samples span less than half of the duration (cold
  start);
- ``podsMetric``: each pod of the last sample's pod list that has samples in the window, its
  average usage, priority class and QoS class (Koordinator's defaults:
  ``koord_formats.qos``), sorted by namespace and name;
- ``hostApplicationMetric``: each host application of the NodeSLO with samples, with the
  NodeSLO's priority and QoS.

Memory is always without page cache (the sampler's reading: MemTotal - MemAvailable for the
node, anon + unevictable for cgroups), koordlet's default ``usageWithoutPageCache``; a policy
asking for page cache is reported the same way (the reporter logs it once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from hooks.facts import PodFacts
from hooks.usage import UsageSample
from koord_formats import qos
from koord_formats.nodemetric import (
    AGGREGATIONS,
    AggregatedUsage,
    CollectPolicy,
    HostAppMetric,
    NodeMetricStatus,
    PodMetric,
    Usage,
)

__all__ = ["BUCKET_SECONDS", "RETENTION_SECONDS", "HostAppMeta", "MetricWindow", "PodMeta", "percentile"]

RETENTION_SECONDS = 1800.0
BUCKET_SECONDS = 10.0
# A node cannot have more: kubelet's maxPods defaults to 110, and the API caps a node at a few hundred.
MAX_TRACKED = 4096
_PERCENT = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
_COLD_START_RATIO = 0.5


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What podsMetric says of a pod besides its usage."""

    namespace: str
    name: str
    priority: str
    qos: str

    @classmethod
    def of(cls, pod: PodFacts) -> PodMeta:
        klass = pod.qos_class
        return cls(pod.namespace, pod.name, qos.priority_class(pod.labels, pod.priority, klass), klass)


@dataclass(frozen=True, slots=True)
class HostAppMeta:
    """A NodeSLO host application's name, priority and QoS."""

    name: str
    priority: str
    qos: str


def percentile(values: Sequence[int], p: float) -> int:
    """koordlet's percentile of sorted ``values``: ``values[int(n * p) - 1]`` (the first for a
    tiny n)."""
    return values[max(int(len(values) * p) - 1, 0)]


class _Buckets:
    """Sums of CPU and memory over fixed time buckets."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: deque[list[float]] = deque()  # [bucket start, cpu sum, memory sum, count]

    def add(self, at: float, cpu: int, memory: int) -> None:
        start = at - at % BUCKET_SECONDS
        if self.items and self.items[-1][0] == start:
            last = self.items[-1]
            last[1] += cpu
            last[2] += memory
            last[3] += 1
        else:
            self.items.append([start, cpu, memory, 1])

    def prune(self, oldest: float) -> None:
        while self.items and self.items[0][0] + BUCKET_SECONDS <= oldest:
            self.items.popleft()

    def average(self, since: float) -> Usage | None:
        cpu = memory = count = 0.0
        for start, c, m, n in self.items:
            if start + BUCKET_SECONDS > since:
                cpu, memory, count = cpu + c, memory + m, count + n
        if not count:
            return None
        return Usage(int(cpu / count), int(memory / count))


class MetricWindow:
    """The samples a NodeMetric status is built from (see the module docstring)."""

    def __init__(self) -> None:
        # (at, node cpu, node memory, system cpu, system memory)
        self._node: deque[tuple[float, int, int, int, int]] = deque()
        self._pods: dict[str, _Buckets] = {}
        self._apps: dict[str, _Buckets] = {}
        self._pod_meta: dict[str, PodMeta] = {}
        self._app_meta: dict[str, HostAppMeta] = {}
        self.last_at: float | None = None

    def add(self, sample: UsageSample, pods: Iterable[tuple[str, PodMeta]], apps: Iterable[HostAppMeta] = ()) -> None:
        """Fold one sample in; ``pods`` are ``(uid, meta)`` of the pods it was taken over (they
        replace the previous list), ``apps`` the NodeSLO's host applications. A sample not newer
        than the last one is ignored."""
        if self.last_at is not None and sample.at <= self.last_at:
            return
        self.last_at = sample.at
        metas: dict[str, PodMeta] = {}
        for uid, meta in pods:
            if len(metas) < MAX_TRACKED:
                metas[uid] = meta
        self._pod_meta = metas
        self._app_meta = {a.name: a for a in apps}
        pods_cpu = pods_mem = 0
        for uid, u in sample.pods.items():
            pods_cpu, pods_mem = pods_cpu + u.cpu_milli, pods_mem + u.memory_bytes
            if uid in self._pods or len(self._pods) < MAX_TRACKED:
                self._pods.setdefault(uid, _Buckets()).add(sample.at, u.cpu_milli, u.memory_bytes)
        for name, u in sample.host_apps.items():
            pods_cpu, pods_mem = pods_cpu + u.cpu_milli, pods_mem + u.memory_bytes
            if name in self._apps or len(self._apps) < MAX_TRACKED:
                self._apps.setdefault(name, _Buckets()).add(sample.at, u.cpu_milli, u.memory_bytes)
        node_cpu, node_mem = sample.node_cpu_milli, sample.node_memory_used_bytes
        self._node.append((sample.at, node_cpu, node_mem, max(node_cpu - pods_cpu, 0), max(node_mem - pods_mem, 0)))
        oldest = sample.at - RETENTION_SECONDS
        while self._node and self._node[0][0] < oldest:
            self._node.popleft()
        for table in (self._pods, self._apps):
            for key in list(table):
                table[key].prune(oldest)
                if not table[key].items:
                    del table[key]

    def _since(self, since: float) -> list[tuple[float, int, int, int, int]]:
        return [row for row in self._node if row[0] >= since]

    @staticmethod
    def _average(rows: Sequence[tuple[float, int, int, int, int]], cpu: int, mem: int) -> Usage:
        if not rows:
            return Usage()
        return Usage(int(sum(r[cpu] for r in rows) / len(rows)), int(sum(r[mem] for r in rows) / len(rows)))

    def _aggregated(self, now: float, durations: Sequence[int], cpu: int, mem: int) -> tuple[AggregatedUsage, ...]:
        out: list[AggregatedUsage] = []
        for d in durations:
            rows = self._since(now - d)
            usage: dict[str, Usage] = {}
            if not rows or rows[-1][0] - rows[0][0] < d * _COLD_START_RATIO:
                usage = {a: Usage() for a in AGGREGATIONS}
            else:
                cpus = sorted(int(r[cpu]) for r in rows)
                mems = sorted(int(r[mem]) for r in rows)
                usage = {a: Usage(percentile(cpus, _PERCENT[a]), percentile(mems, _PERCENT[a])) for a in AGGREGATIONS}
            out.append(AggregatedUsage(d, MappingProxyType(usage)))
        return tuple(out)

    def status(self, policy: CollectPolicy, now: float, update_time: str) -> NodeMetricStatus:
        """The status for ``policy`` at ``now`` (the samples' clock); ``update_time`` is the
        RFC 3339 wall-clock time written as ``updateTime``."""
        since = now - policy.aggregate_duration_seconds
        rows = self._since(since)
        pods: list[PodMetric] = []
        for uid, meta in self._pod_meta.items():
            buckets = self._pods.get(uid)
            avg = buckets.average(since) if buckets is not None else None
            if avg is not None:
                pods.append(PodMetric(meta.namespace, meta.name, avg, meta.priority, meta.qos))
        pods.sort(key=lambda p: (p.namespace, p.name))
        apps: list[HostAppMetric] = []
        for name, app in self._app_meta.items():
            buckets = self._apps.get(name)
            avg = buckets.average(since) if buckets is not None else None
            if avg is not None:
                apps.append(HostAppMetric(name, avg, app.priority, app.qos))
        return NodeMetricStatus(
            update_time=update_time,
            node_usage=self._average(rows, 1, 2),
            aggregated_node_usages=self._aggregated(now, policy.durations, 1, 2),
            system_usage=self._average(rows, 3, 4),
            aggregated_system_usages=self._aggregated(now, policy.durations, 3, 4),
            pods=tuple(pods),
            host_apps=tuple(apps),
        )

    @property
    def tracked(self) -> Mapping[str, int]:
        """How much is held (for tests and the benchmark): node rows, pods, host applications."""
        return {"node": len(self._node), "pods": len(self._pods), "apps": len(self._apps)}

"""The CPU burst loop: runs the ``ReconcileCpuBurst`` stage (Koordinator's CPU Burst
``cfsQuotaBurst``: the CFS quota of throttled containers up while the share pool has room, back
down when it is loaded) every ``interval`` seconds (Koordinator: 1 s).

Started by the composition root (``runtime_proxy.wiring.loops``) next to the reconciler (same
backend: ``node()``, ``pods()``, ``containers()``), with the entry point's hook runner and
applier. One round (``step``):

1. reads, off the event loop, for every running container with a CFS quota (CRI ``cpu_quota``
   above 0) of a pod that calls hooks: its
   ``cpu.cfs_quota_us`` (a container whose quota cannot be read is left out), ``cpu.stat``
   (``nr_periods``, ``nr_throttled``) and, when the container's last state asks for it (or it
   has none), ``cpuacct.usage``; each such pod's
   ``cpu.cfs_quota_us``; and the share pool's load (``SharePoolLoad``: node CPU usage from
   ``/proc/stat`` minus LSE/LSR/BE pods' usage, over the node's CPUs minus the bound ones);
2. runs ``ReconcileCpuBurst`` (``hooks.spec.rhp_reconcile_cpu_burst``: ``node``, the pods with
   their containers, ``burst``: a ``hooks.usage.BurstRound`` of these readings and the states
   the plugins reported last round) through the one hook runner, so plugin order, timeout and
   failure policy are the configured ones (plugin ``cpu_burst`` decides);
3. hands each reported ``hooks.usage.BurstDecision``'s writes (a container's quota and its
   pod's) to the applier as one all-or-nothing plan (the dry-run applier, whose ``carries``
   answers False for the round's plan, only compares them) (the applier orders a scale-up pod first
   and a scale-down container first), and keeps each decision's ``state`` for the next round
   (all of last round's states when a step of the stage failed).

A round without a plugin for the stage reads nothing. ``cpu.cfs_burst_us`` is not this loop's
job (plugin ``cpu_burst`` at create and reconcile).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import structlog
from prometheus_client import Counter, Gauge

from hooks.facts import (
    ContainerFacts,
    NodeFacts,
    PodFacts,
    container_cgroup_path,
    pod_cgroup_path,
    with_bound_pods,
)
from hooks.plan import Plan
from hooks.usage import BurstDecision, BurstRound, BurstState, ContainerCPU
from runtime_proxy.engine.background import Background, every
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.host.apply import Applier
from runtime_proxy.host.cgroups import CgroupError, Cgroups
from runtime_proxy.loops.usage import PROC_STAT_HEAD_BYTES, parse_proc_stat, read_bounded

__all__ = ["STAGE", "BurstBackend", "CPUBurstLoop", "QuotaChange", "SharePoolLoad"]

STAGE = "ReconcileCpuBurst"

log = structlog.get_logger("runtime_proxy.loops.burst")
QUOTA_SCALED = Counter("rhp_cfs_quota_burst_scaled", "cfs quota changes by the burst loop", ["direction"])
SHARE_POOL_USAGE = Gauge("rhp_share_pool_usage_ratio", "share pool usage ratio seen by the burst loop")


class BurstBackend(Protocol):
    def node(self) -> NodeFacts: ...

    def pods(self) -> list[PodFacts]: ...

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]: ...


@dataclass(frozen=True)
class QuotaChange:
    """One decision of a round (also when nothing changed); ``applied``: its writes were made."""

    container_id: str
    old: int
    new: int
    op: str
    throttled: float | None
    node_state: str
    applied: bool


_EXCLUDED = ("LSE", "LSR", "BE")


class SharePoolLoad:
    """Share pool usage ratio since the previous call (None on the first call).

    pool size = node CPUs - CPUs bound to LSE/LSR pods; pool usage = node CPU usage (from
    ``/proc/stat``) - usage of LSE/LSR/BE pods (their cgroups' ``cpuacct.usage``).
    """

    def __init__(
        self,
        backend: BurstBackend,
        cgroups: Cgroups,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.cgroups = cgroups
        self.proc_root = Path(proc_root)
        self.clock = clock
        self._prev: tuple[float, float, float] | None = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _node_busy_seconds(self) -> float:
        # The usage sampler's reader and formula, so both loops see the same node CPU.
        busy, _ = parse_proc_stat(read_bounded(self.proc_root / "stat", PROC_STAT_HEAD_BYTES, head=True))
        return busy / self._tick

    def __call__(self) -> float | None:
        node = self.backend.node()
        pods = self.backend.pods()
        node = with_bound_pods(node, pods)
        total = len(node.cpu_topology.cpus) if node.cpu_topology and node.cpu_topology.cpus else (os.cpu_count() or 1)
        bound = sum(len(c) for c in node.bound_cpusets.values())
        excluded_ns = 0
        for pod in pods:
            if pod.qos_class in _EXCLUDED:
                try:
                    excluded_ns += self.cgroups.read_int(pod_cgroup_path(pod), "cpuacct.usage") or 0
                except (ValueError, CgroupError):
                    continue
        try:
            busy = self._node_busy_seconds()
        except (OSError, ValueError):  # SampleError is a ValueError
            return None
        now = self.clock()
        prev, self._prev = self._prev, (now, busy, excluded_ns / 1e9)
        if prev is None or now <= prev[0]:
            return None
        elapsed = now - prev[0]
        pool_usage = max(0.0, (busy - prev[1]) - (excluded_ns / 1e9 - prev[2])) / elapsed
        pool_size = max(1, total - bound)
        ratio = pool_usage / pool_size
        SHARE_POOL_USAGE.set(ratio)
        return ratio


class CPUBurstLoop:
    """The loop (see module docstring).

    :param backend: node, pods and containers.
    :param pipeline: the hook runner (``ReconcileCpuBurst`` runs through it).
    :param applier: carries out the decisions' writes (the dry-run applier records them).
    :param cgroups: the cgroup tree the loop reads.
    :param pool_load: share pool usage ratio provider (default ``SharePoolLoad``).
    :param interval: seconds between rounds (default 1, as koordlet).
    :param clock: the monotonic clock of the readings; ``rng`` draws each container's
        ``ContainerCPU.draw``.
    """

    def __init__(
        self,
        backend: BurstBackend,
        *,
        pipeline: Pipeline,
        applier: Applier,
        cgroups: Cgroups,
        pool_load: Callable[[], float | None] | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.backend = backend
        self.pipeline = pipeline
        self.applier = applier
        self.cgroups = cgroups
        self.pool_load = pool_load if pool_load is not None else SharePoolLoad(backend, cgroups, clock=clock)
        self.interval = interval
        self.clock = clock
        self.rng = rng
        # container id -> the state its last decision reported (``BurstRound.states``)
        self._states: dict[str, BurstState] = {}
        self._loop = Background()

    def _read(self) -> tuple[NodeFacts, tuple[PodFacts, ...], BurstRound]:
        """The stage's arguments: the pods with their read containers and this round's
        readings (file reads: a worker thread)."""
        now = self.clock()
        node = self.backend.node()
        ratio = self.pool_load()
        by_pod: dict[str, tuple[PodFacts, list[ContainerFacts]]] = {}
        readings: dict[str, ContainerCPU] = {}
        for pod, container in self.backend.containers():
            if pod.skips_hooks or not container.id or container.resources.cpu_quota <= 0:
                continue
            try:
                path = container_cgroup_path(pod, container.id, node.cgroup.driver)
                quota = self.cgroups.read_int(path, "cpu.cfs_quota_us")
                if quota is None:
                    continue
                stat = self.cgroups.read_stat(path)
                state = self._states.get(container.id)
                usage = self.cgroups.read_int(path, "cpuacct.usage") if state is None or state.read_usage else None
            except (ValueError, CgroupError):
                continue
            readings[container.id] = ContainerCPU(
                quota, stat.get("nr_periods", 0), stat.get("nr_throttled", 0), usage, self.rng()
            )
            by_pod.setdefault(pod.uid or pod.sandbox_id, (pod, []))[1].append(container)
        pods = tuple(pod.replace(containers=tuple(cs)) for pod, cs in by_pod.values())
        pod_quotas: dict[str, int] = {}
        for pod in pods:
            try:
                pod_path = pod_cgroup_path(pod)
                pod_quota = self.cgroups.read_int(pod_path, "cpu.cfs_quota_us")
            except (ValueError, CgroupError):
                continue
            if pod_quota is not None:
                pod_quotas[pod_path] = pod_quota
        burst = BurstRound(
            now, self.interval, ratio, MappingProxyType(readings), MappingProxyType(pod_quotas),
            MappingProxyType({cid: s for cid, s in self._states.items() if cid in readings}),
        )
        return node, pods, burst

    def _apply(self, decisions: list[BurstDecision], carried: bool) -> list[QuotaChange]:
        """Each decision's writes as one plan (a worker thread: file I/O); ``carried``: the
        applier makes them (the dry-run applier only compares)."""
        changes: list[QuotaChange] = []
        for d in decisions:
            applied = False
            if d.writes:
                QUOTA_SCALED.labels("up" if d.new > d.old else "down").inc()
                container_path = d.writes[0].path
                report = self.applier.apply_files(Plan(writes=list(d.writes)))
                if report.errors:
                    log.warning("cfs quota burst write failed", container=container_path, errors=report.errors)
                else:
                    log.info("cfs quota scaled" if carried else "cfs quota scaled (dry run)",
                             container=container_path, old=d.old, new=d.new)
                    applied = carried
            changes.append(QuotaChange(d.container_id, d.old, d.new, d.op, d.throttled, d.node_state, applied))
        return changes

    async def step(self) -> list[QuotaChange]:
        """One round (see module docstring); never raises for a plugin's or a file's failure."""
        if not self.pipeline.has_work(STAGE):
            return []
        node, pods, burst = await asyncio.to_thread(self._read)
        result = await self.pipeline.run(STAGE, PodFacts(), None, node, extra={"pods": pods, "burst": burst})
        decisions = [r for r in result.plan.records if isinstance(r, BurstDecision)]
        if result.failures:
            self._states.update((d.container_id, d.state) for d in decisions)
        else:
            self._states = {d.container_id: d.state for d in decisions}
        carried = any(d.writes for d in decisions) and self.applier.carries(result.plan, stage=STAGE)
        return await asyncio.to_thread(self._apply, decisions, carried)

    async def _round(self) -> None:
        await self.step()

    async def start(self) -> None:
        if not self._loop.running:
            self._loop.start(
                every(self.interval, self._round, logger=log, error="cpu burst round failed"), name="cpu-burst"
            )

    async def stop(self) -> None:
        await self._loop.stop()

"""The cfsQuotaBurst loop: scale the CFS quota of throttled LS containers up while the share
pool has room, and back down when it is loaded (Koordinator's CPU Burst ``cfsQuotaBurst``).

Started by the proxy (``runtime_proxy.commands.serve.Proxy``) next to the reconciler (same backend:
``node()``, ``pods()``, ``containers()``). Every ``interval`` seconds (Koordinator: 1 s)
``step`` reads each eligible container's ``cpu.stat`` (throttling) and current
``cpu.cfs_quota_us``, takes its base quota from ``hooks.plugins.cpu_burst.base_quota`` (the
quota CPU normalization gives the container, so base and ceiling are the normalized ones), and
the share pool's
load (``SharePoolLoad``: node CPU usage from ``/proc/stat`` minus LSE/LSR/BE pods' usage, over
the node's CPUs minus the bound ones), asks the pure decisions in ``hooks.plugins.cpu_burst``
for the new quota and writes container and pod quota through ``apply_files`` (which orders a
scale-up pod first and a scale-down container first). The pod quota moves by the same delta
unless it is unlimited. With ``cfsQuotaBurstPeriodSeconds >= 0`` a per-container token bucket
limits how long a container may burst. ``cpu.cfs_burst_us`` is not this loop's job (plugin
``cpu_burst`` at create and reconcile).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
from hooks.plugins.cpu_burst import (
    BurstLimiter,
    base_quota,
    decide_operation,
    is_eligible,
    next_quota,
    pod_burst_config,
    quota_ceiling,
    share_pool_state,
    throttled_ratio,
)
from koord_formats.nodeslo import CPUBurstConfig
from runtime_proxy.host.apply import apply_files
from runtime_proxy.host.cgroups import CgroupError, Cgroups
from runtime_proxy.loops.background import Background, every
from runtime_proxy.loops.usage import PROC_STAT_HEAD_BYTES, parse_proc_stat, read_bounded

__all__ = ["BurstBackend", "CPUBurstLoop", "QuotaChange", "SharePoolLoad"]

log = structlog.get_logger("runtime_proxy.loops.burst")
QUOTA_SCALED = Counter("rhp_cfs_quota_burst_scaled", "cfs quota changes by the burst loop", ["direction"])
SHARE_POOL_USAGE = Gauge("rhp_share_pool_usage_ratio", "share pool usage ratio seen by the burst loop")


class BurstBackend(Protocol):
    def node(self) -> NodeFacts: ...

    def pods(self) -> list[PodFacts]: ...

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]: ...


@dataclass(frozen=True)
class QuotaChange:
    """One decision of a round (also when nothing changed)."""

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
    :param cgroups: the cgroup tree.
    :param pool_load: share pool usage ratio provider (default ``SharePoolLoad``).
    :param interval: seconds between rounds (default 1, as koordlet).
    :param dry_run: decide and log, write nothing.
    """

    def __init__(
        self,
        backend: BurstBackend,
        *,
        cgroups: Cgroups,
        pool_load: Callable[[], float | None] | None = None,
        interval: float = 1.0,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.backend = backend
        self.cgroups = cgroups
        self.pool_load = pool_load if pool_load is not None else SharePoolLoad(backend, cgroups, clock=clock)
        self.interval = interval
        self.dry_run = dry_run
        self.clock = clock
        self.rng = rng
        self._samples: dict[str, tuple[int, int, float]] = {}
        self._usage: dict[str, tuple[int, float]] = {}
        self._limiters: dict[str, BurstLimiter] = {}
        self._loop = Background()

    def step(self) -> list[QuotaChange]:
        """One round over every container (synchronous: reads and writes cgroup files)."""
        now = self.clock()
        node = self.backend.node()
        ratio = self.pool_load()
        changes: list[QuotaChange] = []
        seen: set[str] = set()
        for pod, container in self.backend.containers():
            if pod.skips_hooks or not container.id or not is_eligible(pod):
                continue
            base = base_quota(pod, container, node)
            if base <= 0:
                continue
            try:
                path = container_cgroup_path(pod, container.id, node.cgroup.driver)
                pod_path = pod_cgroup_path(pod)
                current = self.cgroups.read_int(path, "cpu.cfs_quota_us")
                stat = self.cgroups.read_stat(path)
            except (ValueError, CgroupError):
                continue
            if current is None:
                continue
            seen.add(container.id)
            cfg = pod_burst_config(pod, node)
            throttled: float | None = None
            state = share_pool_state(ratio, cfg.share_pool_threshold_percent)
            if not cfg.cfs_quota_burst_enabled:
                op, target = "reset", base
            else:
                sample = (stat.get("nr_periods", 0), stat.get("nr_throttled", 0), now)
                throttled = throttled_ratio(self._samples.get(container.id), sample, 2 * self.interval)
                self._samples[container.id] = sample
                ok = self._limiter_ok(container, path, cfg.cfs_quota_burst_period_seconds, base, now, cfg)
                op = decide_operation(throttled, state, ok)
                target = next_quota(current, base, quota_ceiling(base, cfg), op)
            applied = False
            if target != current and not (op == "reset" and current == base):
                applied = self._write(pod_path, path, current, target)
                QUOTA_SCALED.labels("up" if target > current else "down").inc()
            changes.append(QuotaChange(container.id, current, target, op, throttled, state, applied))
        for gone in set(self._samples) - seen:
            self._samples.pop(gone, None)
            self._usage.pop(gone, None)
            self._limiters.pop(gone, None)
        return changes

    def _limiter_ok(
        self, container: ContainerFacts, path: str, period_s: int, base: int, now: float, cfg: CPUBurstConfig
    ) -> bool:
        if period_s < 0:
            self._limiters.pop(container.id, None)
            return True
        usage_ns = self.cgroups.read_int(path, "cpuacct.usage")
        prev = self._usage.get(container.id)
        if usage_ns is not None:
            self._usage[container.id] = (usage_ns, now)
        limiter = self._limiters.get(container.id)
        if limiter is None or now - limiter.last > 2 * max(period_s, self.interval):
            limiter = BurstLimiter.new(cfg, now, self.rng)
            self._limiters[container.id] = limiter
        if prev is None or usage_ns is None or now <= prev[1]:
            return limiter.tokens > 0
        period = container.resources.cpu_period or 100000
        limit_cores = base / period
        usage_percent = (usage_ns - prev[0]) / 1e9 / (now - prev[1]) / limit_cores * 100
        return limiter.update(usage_percent, now)

    def _write(self, pod_path: str, path: str, current: int, target: int) -> bool:
        plan = Plan().write("container", path, "cpu.cfs_quota_us", target)
        pod_quota = self.cgroups.read_int(pod_path, "cpu.cfs_quota_us")
        if pod_quota is not None and pod_quota > 0:
            plan.write("pod", pod_path, "cpu.cfs_quota_us", max(1000, pod_quota + target - current))
        report = apply_files(plan, cgroups=self.cgroups, dry_run=self.dry_run)
        if report.errors:
            log.warning("cfs quota burst write failed", container=path, errors=report.errors)
            return False
        log.info("cfs quota scaled", container=path, old=current, new=target, dry_run=self.dry_run)
        return not self.dry_run

    async def _round(self) -> None:
        await asyncio.to_thread(self.step)

    async def start(self) -> None:
        if not self._loop.running:
            self._loop.start(
                every(self.interval, self._round, logger=log, error="cpu burst round failed"), name="cpu-burst"
            )

    async def stop(self) -> None:
        await self._loop.stop()

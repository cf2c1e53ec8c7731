"""The usage sampler: what the node, its pods, containers and host applications consume, read
from ``/proc`` and the cgroup files into a bounded window of ``hooks.usage.UsageSample``.

The one sampling module of the usage-driven loop (``runtime_proxy.loops.qos``), whose
``ReconcileUsage`` decisions (CPU suppress, eviction by memory and by BE CPU satisfaction) read
the window. What is read, as Koordinator's koordlet reads it:

- node CPU: ``/proc/stat`` first line, Δ(user + nice + system + irq + softirq) ticks over the
  elapsed time (iowait and steal are not usage);
- node memory: ``/proc/meminfo`` MemTotal - MemAvailable;
- pod, container, host-application and BE kube-QoS CPU: the cgroup's CPU time (v1
  ``cpuacct.usage`` in ns, v2 ``cpu.stat`` ``usage_usec``) over the elapsed time;
- their memory without page cache: ``memory.stat`` v1 ``total_inactive_anon +
  total_active_anon + total_unevictable`` (the plain keys when a kernel lacks the ``total_``
  ones), v2 ``inactive_anon + active_anon + unevictable``;
- the BE kube-QoS directory's CFS quota and period (v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``,
  v2 ``cpu.max``) and its ``cpuset.cpus`` (v2: ``cpuset.cpus.effective`` when that is empty).

The window keeps the pod, container and host-application maps only in its newest
``DETAILED_SAMPLES`` samples; older samples keep the node and BE readings (what the decisions
read over a window: BE CPU satisfaction), so 600 samples of 200 pods cost kilobytes, not tens of
megabytes.

CPU is a rate, so it needs two readings: the first call of ``sample`` only takes the baseline
(it returns ``None``), and a pod or container seen for the first time is in the sample with its
memory and 0 CPU until its second reading.

Every file read is bounded (``MAX_FILE_BYTES``; only the first ``PROC_STAT_HEAD_BYTES`` of
``/proc/stat``) and parsed totally: a missing file or directory (a pod that just left or has not
started) leaves that pod out quietly; an unreadable, oversized or garbage file, or a
pod-derived path that would leave the cgroup root (``hooks.facts`` path helpers and
``Cgroups.file_path`` refuse it), leaves out that one pod (or container, or host application)
with a warning logged once until it reads again. Nothing here raises for what a file holds.

Metrics: ``rhp_usage_sample_duration_seconds``, node, BE and per-pod usage gauges, and
``rhp_usage_sample_skips_total`` by reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path
from types import MappingProxyType

import structlog
from prometheus_client import Counter, Gauge, Histogram

from hooks.facts import (
    NodeFacts,
    PodFacts,
    container_cgroup_path,
    host_app_cgroup_path,
    kube_qos_cgroup_path,
    pod_cgroup_path,
)
from hooks.usage import MAX_SAMPLES, BEState, EvictionRecord, ResourceUsage, Usage, UsageSample
from koord_formats.cpulist import parse_cpu_list
from koord_formats.errors import FormatError
from runtime_proxy.host.cgroups import CgroupError, Cgroups

__all__ = [
    "DETAILED_SAMPLES",
    "MAX_FILE_BYTES",
    "PROC_STAT_HEAD_BYTES",
    "SampleError",
    "UsageSampler",
    "parse_cpu_stat_usage",
    "parse_cpuacct_usage",
    "parse_meminfo",
    "parse_memory_stat",
    "parse_proc_stat",
    "read_bounded",
]

log = structlog.get_logger("runtime_proxy.loops.usage")

SAMPLE_SECONDS = Histogram(
    "rhp_usage_sample_duration_seconds",
    "Time to read one usage sample (node, pods, containers, host applications, BE).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
SAMPLE_SKIPS = Counter(
    "rhp_usage_sample_skips_total", "Pods, containers or host applications left out of a sample.", ["reason"]
)
NODE_CPU = Gauge("rhp_node_cpu_usage_millicores", "Node CPU usage (/proc/stat, no iowait or steal).")
NODE_MEMORY = Gauge("rhp_node_memory_used_bytes", "Node memory in use (MemTotal - MemAvailable).")
BE_CPU = Gauge("rhp_be_cpu_usage_millicores", "CPU usage of the BE kube-QoS cgroup.")
POD_CPU = Gauge("rhp_pod_cpu_usage_millicores", "Pod CPU usage (cgroup CPU time).", ["namespace", "pod", "uid"])
POD_MEMORY = Gauge(
    "rhp_pod_memory_usage_bytes", "Pod memory without page cache (anon + unevictable).", ["namespace", "pod", "uid"]
)

# Samples (newest) that keep their per-pod, per-container and per-host-app maps.
DETAILED_SAMPLES = 5
# cgroup and proc files the sampler reads are a few KiB at most; anything larger is garbage.
MAX_FILE_BYTES = 64 * 1024
# /proc/stat's first line is all that is needed (the "intr" line further on can be very long).
PROC_STAT_HEAD_BYTES = 4096
_MAX_COUNTER = (1 << 63) - 1
_NONE: MappingProxyType[str, ResourceUsage] = MappingProxyType({})
_V1_MEMORY_KEYS = (b"total_inactive_anon", b"total_active_anon", b"total_unevictable")
_PLAIN_MEMORY_KEYS = (b"inactive_anon", b"active_anon", b"unevictable")


class SampleError(ValueError):
    """A file that cannot be used: unreadable, larger than allowed, or not in its format."""


# ---- bounded reads and total parsers -------------------------------------------------------------


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES, *, head: bool = False) -> bytes:
    """The bytes of ``path``: at most ``limit`` (``SampleError`` when the file holds more,
    unless ``head``, which returns the first ``limit`` bytes). ``FileNotFoundError`` when the
    file or its directory is gone; any other ``OSError`` is a ``SampleError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SampleError(f"open {path}: {exc.strerror or exc}") from exc
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ENODEV from a cgroup being removed, EISDIR, ...
        raise SampleError(f"read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        if head:
            return data[:limit]
        raise SampleError(f"{path}: larger than {limit} bytes")
    return data


def _counter(text: bytes, what: str) -> int:
    """A non-negative decimal integer of at most 19 digits."""
    text = text.strip()
    if not text or len(text) > 19 or not text.isdigit():
        raise SampleError(f"{what}: {text[:40]!r} is not a counter")
    value = int(text)
    if value > _MAX_COUNTER:
        raise SampleError(f"{what}: {value} is out of range")
    return value


def parse_proc_stat(data: bytes) -> tuple[int, int]:
    """``/proc/stat`` (or its head) -> (busy ticks, all ticks) of the aggregate ``cpu`` line:
    busy = user + nice + system + irq + softirq; all = the sum of the first eight fields."""
    line = data.split(b"\n", 1)[0]
    fields = line.split()
    if len(fields) < 8 or fields[0] != b"cpu":
        raise SampleError("/proc/stat: the first line is not the aggregate cpu line")
    user, nice, system, idle, iowait, irq, softirq = (_counter(f, "/proc/stat") for f in fields[1:8])
    steal = _counter(fields[8], "/proc/stat") if len(fields) > 8 else 0
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def parse_meminfo(data: bytes) -> tuple[int, int]:
    """``/proc/meminfo`` -> (MemTotal, MemAvailable) in bytes."""
    found: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        key, sep, rest = line.partition(b":")
        if sep and key in (b"MemTotal", b"MemAvailable"):
            parts = rest.split()
            if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1] != b"kB"):
                raise SampleError(f"/proc/meminfo: bad {key.decode()} line")
            found[key] = _counter(parts[0], "/proc/meminfo") * 1024
    if b"MemTotal" not in found or b"MemAvailable" not in found:
        raise SampleError("/proc/meminfo: MemTotal or MemAvailable missing")
    return found[b"MemTotal"], found[b"MemAvailable"]


def parse_cpuacct_usage(data: bytes) -> int:
    """v1 ``cpuacct.usage`` -> CPU time in ns."""
    return _counter(data, "cpuacct.usage")


@lru_cache(maxsize=16)
def _wanted_lines(keys: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """The lines of a flat keyed file that start with one of ``keys`` followed by a space or
    the line's end; group 1 the key, group 2 what follows its first space (None without one)."""
    names = b"|".join(re.escape(k) for k in keys)
    return re.compile(rb"^(" + names + rb")(?: (.*))?$", re.MULTILINE)


def _flat(data: bytes, what: str, keys: Iterable[bytes]) -> dict[bytes, int]:
    """The wanted ``key value`` lines of a flat keyed file (others are not parsed): a line's key
    is what comes before its first space, its value the rest, and a later line of the same key
    wins. One regular expression finds the wanted lines (a v1 ``memory.stat`` has 40 lines, read
    for every pod and container every second)."""
    out: dict[bytes, int] = {}
    for m in _wanted_lines(tuple(keys)).finditer(data):
        key = m.group(1)
        out[key] = _counter(m.group(2) or b"", f"{what} {key.decode()}")
    return out


def parse_cpu_stat_usage(data: bytes) -> int:
    """v2 ``cpu.stat`` -> CPU time in ns (``usage_usec`` * 1000)."""
    found = _flat(data, "cpu.stat", (b"usage_usec",))
    if b"usage_usec" not in found:
        raise SampleError("cpu.stat: usage_usec missing")
    return found[b"usage_usec"] * 1000


def parse_memory_stat(data: bytes, version: int) -> int:
    """``memory.stat`` -> bytes in use without page cache (see module docstring)."""
    found = _flat(data, "memory.stat", (*_V1_MEMORY_KEYS, *_PLAIN_MEMORY_KEYS))
    keys = _V1_MEMORY_KEYS if version == 1 and all(k in found for k in _V1_MEMORY_KEYS) else _PLAIN_MEMORY_KEYS
    missing = [k.decode() for k in keys if k not in found]
    if missing:
        raise SampleError(f"memory.stat: {', '.join(missing)} missing")
    return sum(found[k] for k in keys)


def _parse_quota(data: bytes, version: int, period_data: bytes | None) -> tuple[int, int]:
    """(quota, period): v2 ``cpu.max`` ("max 100000" -> -1), v1 the two files."""
    if version == 2:
        fields = data.split()
        if not 1 <= len(fields) <= 2:
            raise SampleError("cpu.max: expected 'QUOTA PERIOD'")
        quota = -1 if fields[0] == b"max" else _counter(fields[0], "cpu.max")
        period = _counter(fields[1], "cpu.max") if len(fields) == 2 else 100000
        return quota, period
    text = data.strip()
    quota = -1 if text == b"-1" else _counter(text, "cpu.cfs_quota_us")
    period = _counter(period_data, "cpu.cfs_period_us") if period_data is not None else 100000
    return quota, period


# ---- the sampler ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reading:
    cpu_ns: int
    memory: int


class _Skip(Exception):
    """Leave this one pod, container or host application out (``reason`` is the metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UsageSampler:
    """Reads one ``UsageSample`` per call of ``sample`` and keeps the last ``window`` of them.

    :param cgroups: the cgroup tree (root, version and, for v1, the controller directories).
    :param proc_root: where ``stat`` and ``meminfo`` are read (default ``/proc``).
    :param clock: seconds, monotonic; the samples' ``at``.
    :param window: samples kept (at most ``hooks.usage.MAX_SAMPLES``).
    :param interval: the configured seconds between samples (``Usage.interval``).
    :param ticks_per_second: ``/proc/stat``'s USER_HZ (default ``sysconf(SC_CLK_TCK)``).
    :param containers: read each container's files too (``UsageSample.containers``); the usage
        loop turns it off while no step of ``ReconcileUsage`` reads container usage.

    ``sample`` reads files: call it off the event loop (``asyncio.to_thread``). Not thread-safe:
    one caller at a time.
    """

    def __init__(
        self,
        cgroups: Cgroups,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        clock: Callable[[], float] = time.monotonic,
        window: int = MAX_SAMPLES,
        interval: float = 1.0,
        ticks_per_second: int | None = None,
        max_file_bytes: int = MAX_FILE_BYTES,
        containers: bool = True,
    ) -> None:
        self.cgroups = cgroups
        self.containers = containers
        self.version = cgroups.version
        self.proc_root = Path(proc_root)
        self.clock = clock
        self.interval = interval
        self.max_file_bytes = max_file_bytes
        self.ticks = ticks_per_second or (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self._samples: deque[UsageSample] = deque(maxlen=max(1, min(window, MAX_SAMPLES)))
        self._node_prev: tuple[int, float] | None = None
        self._cpu_prev: dict[str, tuple[int, float]] = {}
        self._paths: dict[tuple[str, str], Path] = {}
        self._used_paths: dict[tuple[str, str], Path] = {}
        # Keys warned about while they keep failing (the previous round's and this round's).
        self._warned: set[str] = set()
        self._warned_now: set[str] = set()
        self._gauged: set[tuple[str, str, str]] = set()

    # -- the window ----------------------------------------------------------------------------

    @property
    def samples(self) -> tuple[UsageSample, ...]:
        return tuple(self._samples)

    def usage(self, recent_evictions: Sequence[EvictionRecord] = (), refused: Iterable[str] = ()) -> Usage:
        """The window as a ``hooks.usage.Usage`` (with the loop's eviction records and the pods
        whose eviction was refused)."""
        return Usage(tuple(self._samples), interval=self.interval, recent_evictions=tuple(recent_evictions),
                     refused_uids=frozenset(refused))

    # -- files ---------------------------------------------------------------------------------

    def _file(self, path: str, file: str) -> Path:
        """The real file for cgroup ``path`` and v1 file name ``file``, checked to stay under
        the root once and remembered while it is used."""
        key = (path, file)
        found = self._paths.get(key)
        if found is None:
            try:
                found = self.cgroups.file_path(path, file)
            except CgroupError as exc:
                raise _Skip("unsafe-path", str(exc)) from exc
        self._used_paths[key] = found
        return found

    def _read(self, path: str, file: str) -> bytes:
        try:
            return read_bounded(self._file(path, file), self.max_file_bytes)
        except FileNotFoundError as exc:
            raise _Skip("missing", f"{path} {file}: missing") from exc
        except SampleError as exc:
            raise _Skip("garbage", str(exc)) from exc

    def _cgroup(self, path: str) -> _Reading:
        """CPU time and memory of one cgroup directory."""
        try:
            if self.version == 2:
                cpu = parse_cpu_stat_usage(self._read(path, "cpu.stat"))
            else:
                cpu = parse_cpuacct_usage(self._read(path, "cpuacct.usage"))
            memory = parse_memory_stat(self._read(path, "memory.stat"), self.version)
        except SampleError as exc:
            raise _Skip("garbage", f"{path}: {exc}") from exc
        return _Reading(cpu, memory)

    def _rate(self, key: str, cpu_ns: int, now: float, seen: dict[str, tuple[int, float]]) -> int:
        """Millicores since this key's last reading (0 on the first one or after a reset)."""
        seen[key] = (cpu_ns, now)
        prev = self._cpu_prev.get(key)
        if prev is None or now <= prev[1] or cpu_ns < prev[0]:
            return 0
        return int((cpu_ns - prev[0]) / 1e6 / (now - prev[1]))

    def _skipped(self, key: str, skip: _Skip) -> None:
        """Count a skip; warn once while ``key`` keeps failing (a missing file is quiet)."""
        SAMPLE_SKIPS.labels(skip.reason).inc()
        if skip.reason == "missing":
            return
        self._warned_now.add(key)
        if key not in self._warned:
            log.warning("usage sample left this out", what=key, reason=skip.reason, error=str(skip))

    def _read_usage(
        self, key: str, path_of: Callable[[], str], now: float, seen: dict[str, tuple[int, float]]
    ) -> ResourceUsage | None:
        try:
            try:
                path = path_of()
            except (ValueError, FormatError) as exc:
                raise _Skip("unsafe-path", str(exc)) from exc
            reading = self._cgroup(path)
        except _Skip as skip:
            self._skipped(key, skip)
            return None
        return ResourceUsage(self._rate(key, reading.cpu_ns, now, seen), reading.memory)

    # -- node ----------------------------------------------------------------------------------

    def _node_cpu(self, now: float) -> int | None:
        data = read_bounded(self.proc_root / "stat", PROC_STAT_HEAD_BYTES, head=True)
        busy, _ = parse_proc_stat(data)
        prev, self._node_prev = self._node_prev, (busy, now)
        if prev is None or now <= prev[1] or busy < prev[0]:
            return None
        return int((busy - prev[0]) * 1000 / self.ticks / (now - prev[1]))

    def _node_memory(self) -> tuple[int, int]:
        total, available = parse_meminfo(read_bounded(self.proc_root / "meminfo", self.max_file_bytes))
        return max(0, total - available), total

    def _be_state(self, path: str) -> BEState:
        try:
            if self.version == 2:
                quota, period = _parse_quota(self._read(path, "cpu.cfs_quota_us"), 2, None)
                raw = self._read(path, "cpuset.cpus")
                if not raw.strip():
                    raw = self._read(path, "cpuset.cpus.effective")
            else:
                period_raw = self._read(path, "cpu.cfs_period_us")
                quota, period = _parse_quota(self._read(path, "cpu.cfs_quota_us"), 1, period_raw)
                raw = self._read(path, "cpuset.cpus")
            cpus = parse_cpu_list(raw.decode("ascii"))
        except _Skip as skip:
            self._skipped("be:state", skip)
            return BEState()
        except (SampleError, FormatError, UnicodeDecodeError) as exc:
            self._skipped("be:state", _Skip("garbage", str(exc)))
            return BEState()
        return BEState(cfs_quota_us=quota, cfs_period_us=period or 100000, cpuset=cpus)

    # -- one round -----------------------------------------------------------------------------

    def sample(self, node: NodeFacts, pods: Sequence[PodFacts]) -> UsageSample | None:
        """Read everything once and append the sample to the window. ``pods`` carry their
        containers (``PodFacts.containers``). Returns the sample, or ``None`` when this was the
        baseline reading (the first, or after ``/proc/stat`` went backwards) or ``/proc``
        could not be read (logged)."""
        started = time.perf_counter()
        now = self.clock()
        self._used_paths = {}
        self._warned_now = set()
        try:
            node_cpu = self._node_cpu(now)
            node_used, node_total = self._node_memory()
        except (OSError, SampleError) as exc:
            if "node" not in self._warned:
                log.warning("node usage unreadable; no sample this round", error=str(exc))
            self._warned = self._warned | {"node"}
            SAMPLE_SKIPS.labels("node").inc()
            return None
        seen: dict[str, tuple[int, float]] = {}
        driver = node.cgroup.driver
        pod_usage: dict[str, ResourceUsage] = {}
        container_usage: dict[str, ResourceUsage] = {}
        for pod in pods:
            uid = pod.uid or pod.sandbox_id
            if not uid:
                continue
            got = self._read_usage(f"pod:{uid}", partial(pod_cgroup_path, pod), now, seen)
            if got is None:
                continue
            pod_usage[uid] = got
            for c in pod.containers if self.containers else ():
                if not c.id:
                    continue
                path_of = partial(container_cgroup_path, pod, c.id, driver)
                cu = self._read_usage(f"container:{c.id}", path_of, now, seen)
                if cu is not None:
                    container_usage[c.id] = cu
        apps: dict[str, ResourceUsage] = {}
        for app in node.rules.host_applications.value:
            got = self._read_usage(f"host-app:{app.name}", partial(host_app_cgroup_path, app, node.cgroup), now, seen)
            if got is not None:
                apps[app.name] = got
        be_path = kube_qos_cgroup_path("BestEffort", node.cgroup)
        be = self._read_usage("be", partial(str, be_path), now, seen)
        be_state = self._be_state(be_path)
        self._cpu_prev = seen
        self._paths = self._used_paths
        self._warned = self._warned_now
        SAMPLE_SECONDS.observe(time.perf_counter() - started)
        if node_cpu is None:
            return None
        sample = UsageSample(
            at=now,
            node_cpu_milli=node_cpu,
            node_memory_used_bytes=node_used,
            node_memory_total_bytes=node_total,
            be_cpu_milli=be.cpu_milli if be is not None else 0,
            pods=MappingProxyType(pod_usage),
            containers=MappingProxyType(container_usage),
            host_apps=MappingProxyType(apps),
            be=be_state,
        )
        self._samples.append(sample)
        if len(self._samples) > DETAILED_SAMPLES:
            old = self._samples[-DETAILED_SAMPLES - 1]
            if old.pods or old.containers or old.host_apps:
                self._samples[-DETAILED_SAMPLES - 1] = replace(
                    old, pods=_NONE, containers=_NONE, host_apps=_NONE
                )
        self._export(sample, pods)
        return sample

    def _export(self, sample: UsageSample, pods: Sequence[PodFacts]) -> None:
        NODE_CPU.set(sample.node_cpu_milli)
        NODE_MEMORY.set(sample.node_memory_used_bytes)
        BE_CPU.set(sample.be_cpu_milli)
        gauged: set[tuple[str, str, str]] = set()
        for pod in pods:
            uid = pod.uid or pod.sandbox_id
            got = sample.pods.get(uid)
            if got is None:
                continue
            labels = (pod.namespace, pod.name, uid)
            gauged.add(labels)
            POD_CPU.labels(*labels).set(got.cpu_milli)
            POD_MEMORY.labels(*labels).set(got.memory_bytes)
        for labels in self._gauged - gauged:
            for gauge in (POD_CPU, POD_MEMORY):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._gauged = gauged

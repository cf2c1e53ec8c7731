"""The usage loop: sample usage, run the ``ReconcileUsage`` stage, apply its writes in plan order
and hand its evictions to an ``Evictor``.

Started by ``runtime_proxy.wiring.loops`` (for ``serve`` and ``nri``; ``hook-server`` runs no loops) when
``wiring.usage_loop_decision`` says so (an enabled plugin implements ``ReconcileUsage``, or
``usageLoop.enable`` is true), with the store as ``UsageBackend``, the proxy's hook runner
(``runtime_proxy.engine.pipeline.Pipeline``) and the cgroup tree of its applier. Every
``interval`` seconds (Koordinator: 1 s for CPU suppress and both evictions) one round:

1. gathers the pods (with their containers) from the backend and the node facts with the bound
   cpusets recomputed from those pods (``hooks.facts.with_bound_pods``);
2. samples usage (``runtime_proxy.loops.usage.UsageSampler``; a worker thread) into the window;
   each container's files only while a step of the stage may read container usage (one that
   is not a built-in plugin of ``POD_LEVEL_PLUGINS``, which read node, pod, host-application
   and BE usage only): the sample's ``containers`` is empty otherwise;
3. runs ``ReconcileUsage`` (``Pipeline.run_usage``: ``node``, ``pods``, ``usage``) through the
   one hook runner, so plugin order, timeouts and failure policies are the configured ones;
4. hands the plan to the applier (the entry point's, ``runtime_proxy.host.apply.Applier``):
   its writes go through ``Applier.apply_files(ordered=True)``, in
   plan order, because the decisions sequence their own leveled writes (CPU suppress writes a
   cpuset union top-down, then the target bottom-up); a directory that is gone is skipped, and
   one failed write does not stop the others. As Koordinator's resource executor does, a write
   of the value this loop wrote or found in that file less than ``WRITE_CACHE_SECONDS`` ago is
   left out (decisions repeat their whole target every round; a file changed by hand is put
   back within that time);
5. hands the plan's evictions to the ``Evictor`` (the Kubernetes Eviction API or the runtime;
   ``LoggingEvictor`` when none is configured), leaving out pods evicted within
   ``hooks.usage.EVICTION_MEMORY_SECONDS``; what was evicted is remembered and passed to the
   decisions as ``Usage.recent_evictions`` (their cool-downs), and the pods whose eviction was
   refused for now as ``Usage.refused_uids`` (decisions ask for them again but go on to the next
   victim).

Evictions run beside the loop, never inside a round: each is a task of its own (one pod per
evictor call), at most one per pod and at most ``max_evictions_in_flight`` at once; an eviction
planned while its pod's is in flight is left to that one, and one planned while the budget is
full is deferred (the decisions plan it again next round). Each has ``eviction_deadline``
seconds to answer, after which it counts as failed and its slot is free (an evictor working in
a thread keeps that thread until its own request timeouts end it). So an API server that
accepts and never answers costs the evictions, never the interval of sampling and CPU
suppress. Results land in the ``UsageRound`` that started them when they arrive.

With the dry-run applier (``RecordingApplier``: its ``carries`` answers False for the round's
plan) the writes are compared and logged, not made, and the evictions are logged, not
performed. A round that fails is logged and the loop goes on.

Metrics: ``rhp_usage_loop_duration_seconds``, ``rhp_usage_loop_errors_total``,
``rhp_usage_evictions_total`` (by feature and result), ``rhp_usage_eviction_tasks_total`` (by
outcome: ``started``, ``deferred``, ``timeout``), ``rhp_usage_evictions_in_flight`` and, when
a plugin reported a ``hooks.usage.SuppressDecision`` in the round's plan (``cpu_suppress`` does),
``rhp_cpu_suppress_target_cores`` (by policy) from that record.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from prometheus_client import Counter, Gauge, Histogram

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, with_bound_pods
from hooks.plan import Eviction, Plan, Skip
from hooks.usage import EVICTION_MEMORY_SECONDS, EvictionRecord, SuppressDecision, UsageSample
from koord_formats import keys
from runtime_proxy.engine.background import Background, every
from runtime_proxy.engine.pipeline import Pipeline, PluginStep
from runtime_proxy.host.apply import Applier, ApplyReport, FileApplier
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.usage import UsageSampler

__all__ = [
    "POD_LEVEL_PLUGINS",
    "EvictionResult",
    "Evictor",
    "LoggingEvictor",
    "UsageBackend",
    "UsageLoop",
    "UsageRound",
    "reads_container_usage",
]

log = structlog.get_logger("runtime_proxy.loops.qos")

LOOP_SECONDS = Histogram(
    "rhp_usage_loop_duration_seconds",
    "Time of one usage-loop round (sampling, ReconcileUsage, writes, evictions).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
SUPPRESS_TARGET = Gauge(
    "rhp_cpu_suppress_target_cores",
    "The BE share CPU suppress enforces, in cores: the BE kube-QoS quota over its period (cfsQuota) "
    "or the size of the BE cpuset (cpuset); absent while suppress is off.",
    ["policy"],
)
LOOP_ERRORS = Counter("rhp_usage_loop_errors_total", "Failures in usage-loop rounds, by kind.", ["kind"])
EVICTIONS = Counter(
    "rhp_usage_evictions_total", "Evictions planned by the usage loop, by feature and result.", ["feature", "result"]
)

EVICTION_TASKS = Counter(
    "rhp_usage_eviction_tasks_total",
    "Evictions the usage loop handed to the evictor beside its rounds, by outcome: started, deferred "
    "(the in-flight budget was full; planned again later), timeout (no answer by the deadline).",
    ["outcome"],
)
EVICTIONS_IN_FLIGHT = Gauge("rhp_usage_evictions_in_flight", "Evictions handed to the evictor and not answered yet.")

# Evictions in flight at most, and seconds each may take before it counts as failed (the API
# evictor makes two calls of at most 10 s each: the Eviction and its Event).
MAX_EVICTIONS_IN_FLIGHT = 4
EVICTION_DEADLINE_SECONDS = 30.0

# Evictions remembered at most (far more than any node evicts in EVICTION_MEMORY_SECONDS).
MAX_EVICTION_RECORDS = 1024
MAX_SKIPS_LOGGED = 1024  # distinct (plugin, reason) skips the usage loop remembers having logged
# The built-in ReconcileUsage plugins (their modules), which read node, pod, host-application and
# BE usage and never a container's: while they are the stage's only steps, containers' files are
# not read (half of a round's files).
POD_LEVEL_PLUGINS = frozenset({
    "hooks.plugins.cpu_suppress", "hooks.plugins.memory_qos", "hooks.plugins.memory_evict", "hooks.plugins.cpu_evict",
})
# A file this loop wrote (or found holding the value) is not written the same value again
# within this time (Koordinator's cached cgroup writes: 60 s).
WRITE_CACHE_SECONDS = 60.0


class UsageBackend(Protocol):
    """What the usage loop reads from the proxy (``runtime_proxy.commands.serve.StoreBackend``)."""

    def node(self) -> NodeFacts: ...

    def pods(self) -> list[PodFacts]: ...

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]: ...


@dataclass(frozen=True)
class EvictionResult:
    """What became of one eviction. ``status``: ``evicted`` (the API server accepted it, or the
    runtime stopped the containers), ``refused`` (for now: a PodDisruptionBudget, HTTP 429; a
    later round may try again), ``failed``, ``dry-run`` or ``not-configured``."""

    eviction: Eviction
    status: str
    message: str = ""

    @property
    def done(self) -> bool:
        return self.status == "evicted"


class Evictor(Protocol):
    """Performs evictions. Must not raise for one pod's failure (report it as ``failed``) and
    must not hold the event loop (do blocking work in a thread)."""

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]: ...


class LoggingEvictor:
    """The evictor when none is configured: logs each eviction and performs none."""

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]:
        out: list[EvictionResult] = []
        for e in evictions:
            log.warning(
                "eviction planned but no evictor is configured",
                pod=f"{e.namespace}/{e.name}",
                uid=e.uid,
                feature=e.feature,
                reason=e.reason,
            )
            out.append(EvictionResult(e, "not-configured", "no evictor configured"))
        return out


@dataclass
class UsageRound:
    """One round: the sample (``None`` while taking the baseline), the plan, what the applier
    did, what became of the evictions it started (filled as their results arrive, after the
    round) and the failures of the stage's steps."""

    sample: UsageSample | None = None
    plan: Plan | None = None
    applied: ApplyReport | None = None
    evictions: list[EvictionResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _same(a: object, b: object) -> bool:
    return a is b or a == b


def _all_same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def reads_container_usage(pipeline: Pipeline) -> bool:
    """Whether a step of ``ReconcileUsage`` may read container usage: any step but a built-in
    plugin of ``POD_LEVEL_PLUGINS`` (an entry-point plugin, a hook server)."""
    return any(
        not (isinstance(step, PluginStep) and getattr(step.plugin, "__name__", None) in POD_LEVEL_PLUGINS)
        for step in pipeline.steps if step.handles("ReconcileUsage")
    )


def _record_suppress(plan: Plan) -> None:
    """Set ``rhp_cpu_suppress_target_cores`` from the suppress decision ``plan`` reports; a
    round without one (no suppress plugin, or it failed) or whose decision has no target keeps
    the previous value."""
    decision = next((r for r in plan.records if isinstance(r, SuppressDecision)), None)
    if decision is None:
        return
    for policy in (keys.CPU_SUPPRESS_POLICY_CPUSET, keys.CPU_SUPPRESS_POLICY_CFS_QUOTA):
        if policy != decision.policy:
            with contextlib.suppress(KeyError):
                SUPPRESS_TARGET.remove(policy)
    target = decision.target_cores
    if target is not None:
        SUPPRESS_TARGET.labels(decision.policy).set(target)


class UsageLoop:
    """The loop (see module docstring).

    :param backend: node, pods and containers.
    :param pipeline: the hook runner (``ReconcileUsage`` runs through it).
    :param cgroups: the cgroup tree (sampling).
    :param applier: carries out the plans (default: a ``FileApplier`` over ``cgroups``); with
        the dry-run applier the loop decides and logs, and writes and evicts nothing.
    :param sampler: the usage sampler (default: one over ``cgroups`` and ``proc_root``).
    :param evictor: performs evictions (default ``LoggingEvictor``).
    :param interval: seconds between rounds (default 1, as koordlet).
    :param max_evictions_in_flight: evictions handed to the evictor and not answered, at most.
    :param eviction_deadline: seconds an eviction may take before it counts as failed.
    """

    def __init__(
        self,
        backend: UsageBackend,
        *,
        pipeline: Pipeline,
        cgroups: Cgroups,
        sampler: UsageSampler | None = None,
        evictor: Evictor | None = None,
        interval: float = 1.0,
        applier: Applier | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        max_evictions_in_flight: int = MAX_EVICTIONS_IN_FLIGHT,
        eviction_deadline: float = EVICTION_DEADLINE_SECONDS,
    ) -> None:
        self.backend = backend
        self.pipeline = pipeline
        self.cgroups = cgroups
        self.clock = clock
        self.sampler = sampler or UsageSampler(cgroups, proc_root=proc_root, clock=clock, interval=interval)
        self.evictor: Evictor = evictor or LoggingEvictor()
        self.interval = interval
        self.applier: Applier = applier if applier is not None else FileApplier(cgroups=cgroups)
        self.rounds = 0
        self.last_round: UsageRound | None = None
        self._evicted: deque[EvictionRecord] = deque(maxlen=MAX_EVICTION_RECORDS)
        # uid -> when its eviction was last refused (``Usage.refused_uids``), until it is done,
        # no longer planned for EVICTION_MEMORY_SECONDS, or MAX_EVICTION_RECORDS are held.
        self._refused: dict[str, float] = {}
        # (level, path, file) -> (value, when it was last written or found so).
        self._written: dict[tuple[str, str, str], tuple[str, float]] = {}
        self._background = Background()
        self.max_evictions_in_flight = max_evictions_in_flight
        self.eviction_deadline = eviction_deadline
        # pod uid -> its eviction's task, while the evictor has not answered.
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        # (plugin, reason) of the skips already logged: each is logged once, not every round.
        self._skips_logged: set[tuple[str, str]] = set()
        # The backend's node, pods and containers of the last round, and the facts made of them
        # (``_facts``): made again only when one of them changed.
        self._facts_from: tuple[NodeFacts, list[PodFacts], list[tuple[PodFacts, ContainerFacts]]] | None = None
        self._facts_made: tuple[NodeFacts, list[PodFacts]] | None = None

    def _log_skips(self, skipped: Sequence[Skip]) -> None:
        """Log each plugin's skip (such as memory_qos's "needs cgroup v2") the first time it
        appears; at most ``MAX_SKIPS_LOGGED`` are remembered, then the memory starts over."""
        for skip in skipped:
            key = (skip.plugin, skip.reason[:512])
            if key in self._skips_logged:
                continue
            if len(self._skips_logged) >= MAX_SKIPS_LOGGED:
                self._skips_logged.clear()
            self._skips_logged.add(key)
            log.info("usage loop: plugin skipped", plugin=skip.plugin, reason=key[1])

    # -- one round -----------------------------------------------------------------------------

    def _facts(
        self, node: NodeFacts, pods: list[PodFacts], containers: list[tuple[PodFacts, ContainerFacts]]
    ) -> tuple[NodeFacts, list[PodFacts]]:
        """Pods with their containers and the node with its bound cpusets: last round's when
        the backend's node, pods and containers are the same (each the same object or equal),
        built anew otherwise."""
        given = (node, pods, containers)
        last = self._facts_from
        if last is not None and self._facts_made is not None and _same(last[0], node) and _all_same(
            last[1], pods
        ) and _all_same(last[2], containers):
            return self._facts_made
        by_pod: dict[str, list[ContainerFacts]] = {}
        for p, c in containers:
            by_pod.setdefault(p.uid or p.sandbox_id, []).append(c)
        pods = [p.replace(containers=tuple(by_pod.get(p.uid or p.sandbox_id, ()))) for p in pods]
        made = with_bound_pods(node, pods), pods
        self._facts_from, self._facts_made = given, made
        return made

    def _sample(
        self, node: NodeFacts, pods: list[PodFacts], containers: list[tuple[PodFacts, ContainerFacts]]
    ) -> tuple[NodeFacts, list[PodFacts], UsageSample | None]:
        """Pods with their containers, the node with its bound cpusets, and a sample (a worker
        thread: file reads, and work that grows with the number of pods)."""
        node, pods = self._facts(node, pods, containers)
        return node, list(pods), self.sampler.sample(node, pods)

    def _recent(self, now: float) -> tuple[EvictionRecord, ...]:
        while self._evicted and now - self._evicted[0].at > EVICTION_MEMORY_SECONDS:
            self._evicted.popleft()
        for uid in [u for u, at in self._refused.items() if now - at > EVICTION_MEMORY_SECONDS]:
            del self._refused[uid]
        return tuple(self._evicted)

    def _uncached(self, plan: Plan, now: float) -> Plan:
        """``plan`` without the writes the write cache says are already in place."""
        self._written = {k: v for k, v in self._written.items() if now - v[1] < WRITE_CACHE_SECONDS}
        writes = [w for w in plan.writes if self._written.get(w.key, ("", 0.0))[0] != w.value]
        return plan.files(writes)

    def _apply(self, plan: Plan, now: float, carried: bool) -> ApplyReport:
        """The plan's writes through the applier (``carried``: they are made, not compared)."""
        report = self.applier.apply_files(self._uncached(plan, now), atomic=False, missing_ok=True, ordered=True)
        if carried:
            for w, result in report.results:
                if result.status in ("written", "unchanged"):
                    self._written[w.key] = (w.value, now)
            for w in report.missing:
                self._written.pop(w.key, None)
        for w in report.changed:
            log.info(
                "usage write" if carried else "usage write (dry run)",
                level=w.level,
                path=w.path,
                file=w.file,
                value=w.value,
            )
        for error in report.errors:
            LOOP_ERRORS.labels("write").inc()
            log.warning("usage write failed", error=error)
        return report

    def _evict(self, evictions: Sequence[Eviction], now: float, out: UsageRound, carried: bool) -> None:
        """Start the evictions the budget allows (see module docstring); never waits for one;
        only logs them unless ``carried``."""
        recent = {r.uid for r in self._recent(now)}
        todo = [e for e in evictions if e.uid not in recent]
        if not carried:
            for e in todo:
                log.info("would evict (dry run)", pod=f"{e.namespace}/{e.name}", uid=e.uid, feature=e.feature,
                         reason=e.reason)
                self._record(EvictionResult(e, "dry-run"), out)
            return
        deferred: list[str] = []
        for e in todo:
            if e.uid in self._in_flight:
                continue  # its pod's eviction is under way
            if len(self._in_flight) >= self.max_evictions_in_flight:
                EVICTION_TASKS.labels("deferred").inc()
                deferred.append(f"{e.namespace}/{e.name}")
                continue
            EVICTION_TASKS.labels("started").inc()
            task = asyncio.create_task(self._evict_one(e, out), name=f"evict-{e.uid[:64]}")
            self._in_flight[e.uid] = task
        EVICTIONS_IN_FLIGHT.set(len(self._in_flight))
        if deferred:
            log.warning("evictions deferred: the in-flight budget is full", pods=deferred[:16], deferred=len(deferred),
                        in_flight=len(self._in_flight))

    async def _evict_one(self, e: Eviction, out: UsageRound) -> None:
        """One pod's eviction under its deadline; its result is recorded whatever happens."""
        pod = f"{e.namespace}/{e.name}"
        try:
            try:
                results = await asyncio.wait_for(self.evictor.evict([e]), self.eviction_deadline)
                result = next((r for r in results if r.eviction.uid == e.uid), None) or EvictionResult(
                    e, "failed", "the evictor gave no result for this pod")
            except TimeoutError:
                EVICTION_TASKS.labels("timeout").inc()
                log.warning("eviction not answered within its deadline", pod=pod, uid=e.uid, feature=e.feature,
                            deadline=self.eviction_deadline)
                result = EvictionResult(e, "failed", f"no answer within {self.eviction_deadline:g} s")
            except Exception as exc:  # the evictor's bug must not end the loop's bookkeeping
                LOOP_ERRORS.labels("evict").inc()
                log.exception("evictor failed", pod=pod, uid=e.uid)
                result = EvictionResult(e, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            if self._in_flight.get(e.uid) is asyncio.current_task():
                del self._in_flight[e.uid]
            EVICTIONS_IN_FLIGHT.set(len(self._in_flight))
        self._record(result, out)

    def _record(self, r: EvictionResult, out: UsageRound) -> None:
        at = self.clock()
        EVICTIONS.labels(r.eviction.feature, r.status).inc()
        out.evictions.append(r)
        if r.done:
            self._evicted.append(EvictionRecord(r.eviction.uid, r.eviction.feature, at))
            self._refused.pop(r.eviction.uid, None)
        elif r.status == "refused" and (r.eviction.uid in self._refused or len(self._refused) < MAX_EVICTION_RECORDS):
            self._refused[r.eviction.uid] = at

    @property
    def evictions_in_flight(self) -> frozenset[str]:
        """The pod uids whose eviction the evictor has not answered yet."""
        return frozenset(self._in_flight)

    async def wait_evictions(self) -> None:
        """Wait until every eviction started so far has its result (each ends by its deadline)."""
        while self._in_flight:
            await asyncio.wait(list(self._in_flight.values()))

    async def step(self) -> UsageRound:
        """One round (see module docstring); never raises for a plugin's, a file's or an
        eviction's failure."""
        started = time.perf_counter()
        out = UsageRound()
        try:
            self.sampler.containers = reads_container_usage(self.pipeline)
            node, listed, out.sample = await asyncio.to_thread(
                self._sample, self.backend.node(), self.backend.pods(), self.backend.containers()
            )
            if out.sample is None or not self.pipeline.has_work("ReconcileUsage"):
                return out
            usage = self.sampler.usage(self._recent(out.sample.at), refused=self._refused)
            result = await self.pipeline.run_usage(node, listed, usage)
            out.plan = result.plan
            out.failures = [str(f) for f in result.failures]
            self._log_skips(result.plan.skipped)
            carried = bool(result.plan.writes or result.plan.evictions) and self.applier.carries(
                result.plan, stage="ReconcileUsage"
            )
            if result.plan.writes:
                out.applied = await asyncio.to_thread(self._apply, result.plan, out.sample.at, carried)
            if result.plan.evictions:
                self._evict(result.plan.evictions, out.sample.at, out, carried)
            _record_suppress(result.plan)
            return out
        finally:
            self.rounds += 1
            self.last_round = out
            LOOP_SECONDS.observe(time.perf_counter() - started)

    # -- the loop ------------------------------------------------------------------------------

    async def _round(self) -> None:
        try:
            await self.step()
        except Exception:
            LOOP_ERRORS.labels("round").inc()
            raise

    async def start(self) -> None:
        if not self._background.running:
            self._background.start(
                every(self.interval, self._round, logger=log, error="usage loop round failed"), name="usage-loop"
            )

    async def stop(self) -> None:
        await self._background.stop()
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._in_flight.clear()
        EVICTIONS_IN_FLIGHT.set(0)

"""The reconciler: keeps every known pod, container and node-wide setting at its planned state.

Started by ``runtime_proxy.wiring.loops`` (for ``serve`` and ``nri``) with a ``ReconcileBackend``
(the store and the runtime client), the plugin manager, the proxy's hook runner
(``runtime_proxy.engine.pipeline.Pipeline``), the cgroup and resctrl trees and the node config's
change stream. It plans everything (stages
``ReconcileNode``, ``ReconcilePod``, ``ReconcileContainer``, ``ReconcileResctrlGroups``) at start, on every node config
change, shortly after the store changes (a pod arrived or left: the share pools moved) and every
period, then applies only the differences. A stage's plan for the same node facts, pod, container
and pipeline steps as in an earlier round is that round's plan (in-process plugins are pure
functions of their facts; a stage with a hook server, a failure or a conflict is planned every
round), so a round plans only what changed; every planned file is still read and compared:

- writes go to the applier (``runtime_proxy.host.apply.Applier.apply_files(diff=True)``, the
  one the entry point's doors use), leveled across pods
  and containers: pod writes that grow a limit (a larger ``cpu.cfs_quota_us``...) first, then
  every container (files and runtime updates), then the pod writes that shrink a limit, so a
  container never exceeds its pod, even when a node change moves both (CPU normalization);
- container ``resources`` are compared with both what the runtime last accepted and the
  container's cgroup files (so values changed by hand are found), and differing fields are
  sent through ``backend.update_container_resources`` (containerd's UpdateContainerResources,
  which is how running LS containers follow the share pools);
- resctrl groups left behind are removed: the ``ReconcileResctrlGroups`` stage (plugin ``rdt``:
  pod-level groups whose pod is gone) gets the groups under the resctrl root and plans their
  removal;
- a cgroup directory that does not exist (kubelet's ``kubepods/besteffort`` on a node without
  it, a pod that just left) is not an error: its writes are skipped, it is listed in the
  report's ``missing`` and logged once, until a round finds it again (then it is logged anew
  the next time it is missing).

Every difference found is counted as drift (``rhp_reconcile_drift_total``). With the dry-run
applier (``RecordingApplier``) nothing is written, removed or updated (its ``carries`` answers
False, so no container update is sent); the drift is still counted and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import pluggy
import structlog
from prometheus_client import Counter, Gauge, Histogram

from hooks.facts import (
    ContainerFacts,
    NodeFacts,
    PodFacts,
    ResourceValue,
    container_cgroup_path,
    parse_cpu_list,
)
from hooks.manager import plugin_order
from hooks.plan import Plan, ResourceChanges
from rhp_kube.events import EventSink
from runtime_proxy.engine.background import Background
from runtime_proxy.engine.bound import BoundCpusets
from runtime_proxy.engine.lifecycle import bind_identity, forget_identity, record_failures
from runtime_proxy.engine.pipeline import Pipeline, PluginStep, Step, plugin_steps
from runtime_proxy.host.apply import Applier, ApplyReport, FileApplier
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.host.resctrl import Resctrl
from runtime_proxy.state.podspecs import NoPodSpecs, PodSpecSource

__all__ = ["RESOURCE_FILES", "ReconcileBackend", "ReconcileReport", "Reconciler"]

log = structlog.get_logger("runtime_proxy.loops.reconciler")

RECONCILE_RUNS = Counter("rhp_reconcile_runs", "reconcile rounds", ["reason"])
RECONCILE_DRIFT = Counter("rhp_reconcile_drift", "differences found (and repaired unless dry-run)", ["level", "item"])
RECONCILE_ERRORS = Counter("rhp_reconcile_errors", "errors during reconcile rounds", ["level"])
RECONCILE_SECONDS = Histogram("rhp_reconcile_duration_seconds", "duration of a reconcile round")
RECONCILE_LAST = Gauge("rhp_reconcile_last_run_timestamp_seconds", "end of the last reconcile round")

# A remembered plan's key: (stage, pod uid or sandbox id, container id or "").
PlanKey = tuple[str, str, str]
# Remembered plans handed out between two yields to the event loop (a round of thousands of
# containers whose plans are all remembered would otherwise hold it from start to end).
_YIELD_EVERY = 64

# Plan levels whose directories come and go with pods and containers.
_LIFECYCLE_LEVELS = frozenset({"pod", "sandbox", "container"})

# CRI resource field -> the v1 cgroup file that shows it.
RESOURCE_FILES = {
    "cpuset_cpus": "cpuset.cpus",
    "cpuset_mems": "cpuset.mems",
    "cpu_quota": "cpu.cfs_quota_us",
    "cpu_period": "cpu.cfs_period_us",
    "cpu_shares": "cpu.shares",
    "memory_limit_in_bytes": "memory.limit_in_bytes",
}


class ReconcileBackend(Protocol):
    """What the reconciler needs from the proxy (``runtime_proxy.commands.serve.StoreBackend``: the store
    and the runtime)."""

    def node(self) -> NodeFacts:
        """The current node facts (node config; bound cpusets are recomputed from ``pods``)."""
        ...

    def pods(self) -> list[PodFacts]:
        """Every pod the proxy knows whose sandbox did not stop (with ``sandbox_id``)."""
        ...

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        """Every running container (with ``id``) and its pod."""
        ...

    async def update_container_resources(self, container_id: str, changes: ResourceChanges) -> None:
        """Send ``UpdateContainerResources`` for ``container_id`` with only ``changes`` set
        (CRI ``LinuxContainerResources`` snake-case field names)."""
        ...


@dataclass
class ReconcileReport:
    """One round: what differed and what failed."""

    reason: str
    drift: list[str] = field(default_factory=list)
    updates: dict[str, ResourceChanges] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed_groups: list[str] = field(default_factory=list)
    # False when the applier carried out nothing of what differed (the dry-run applier).
    carried: bool = True
    # Cgroup directories that did not exist (their writes were skipped): "level path".
    missing: list[str] = field(default_factory=list)


def _same_resource(name: str, want: ResourceValue, have: object) -> bool:
    if name in ("cpuset_cpus", "cpuset_mems"):
        try:
            return parse_cpu_list(str(want)) == parse_cpu_list(str(have))
        except ValueError:
            return False
    return bool(want == have)


class Reconciler:
    """Periodic, event-driven reconciliation (see module docstring).

    :param backend: pods, containers, node facts and container updates.
    :param pm: the plugin manager (``hooks.manager.make_plugin_manager``).
    :param order: plugin names in calling order (default: ``plugin_order(pm)``).
    :param pipeline: the hook runner for the ``Reconcile*`` stages (the proxy passes its own, so
        plugin policies and timeouts are the configured ones); default: ``order`` with policy
        ``Ignore`` and ``plugin_timeout`` seconds per call.
    :param cgroups: the cgroup tree; ``resctrl`` the resctrl tree (optional); both are read.
    :param applier: carries out the plans (default: a ``FileApplier`` over ``cgroups`` and
        ``resctrl``); the dry-run applier changes nothing.
    :param period: seconds between rounds (``reconcilePeriodSeconds``, default 10).
    :param node_changes: async iterator of new ``NodeFacts`` (``NodeConfig.changes()``).
    :param debounce: delay after a trigger before the round (coalesces bursts).
    :param store_delay: delay before the round for store changes that leave the bound cpusets
        alone (``store_changed(pools_changed=False)``).
    :param pod_specs: what the cluster knows of each pod (``runtime_proxy.state.podspecs``: its
        batch resources), put into the pods' facts; a change it announces runs a round.
    """

    def __init__(
        self,
        backend: ReconcileBackend,
        *,
        pm: pluggy.PluginManager,
        cgroups: Cgroups,
        resctrl: Resctrl | None = None,
        order: list[str] | None = None,
        period: float = 10.0,
        applier: Applier | None = None,
        node_changes: AsyncIterator[NodeFacts] | None = None,
        debounce: float = 0.05,
        store_delay: float = 1.0,
        pipeline: Pipeline | None = None,
        plugin_timeout: float = 2.0,
        events: EventSink | None = None,
        pod_specs: PodSpecSource | None = None,
    ) -> None:
        self.backend = backend
        # What the cluster knows of each pod (its batch resources); a change runs a round.
        self.pod_specs: PodSpecSource = pod_specs or NoPodSpecs()
        self.pod_specs.subscribe(lambda: self.trigger("pod-spec"))
        # Hook failures of a pod's or container's stage become Events on the pod (None: nowhere).
        self.events = events
        self.pm = pm
        self.order = order if order is not None else plugin_order(pm)
        self.pipeline = pipeline or Pipeline(plugin_steps(pm, [(n, "Ignore", plugin_timeout) for n in self.order]))
        self.cgroups = cgroups
        self.resctrl = resctrl
        self.applier: Applier = applier if applier is not None else FileApplier(cgroups=cgroups, resctrl=resctrl)
        self.period = period
        self.node_changes = node_changes
        self.debounce = debounce
        self.store_delay = store_delay
        self._routine: asyncio.TimerHandle | None = None
        self.rounds = 0
        self.last_report: ReconcileReport | None = None
        self._wake = asyncio.Event()
        self._reason = "period"
        self._background = Background()
        # Missing cgroup directories already logged ("level path"); one leaves this set when a
        # round no longer finds it missing, so it is logged again if it goes away again.
        self._missing_logged: set[str] = set()
        self._lock = asyncio.Lock()
        self._bound = BoundCpusets(where="reconciler")
        # (stage, pod uid, container id) -> (the pod's and container's facts, the plan they got)
        # under ``_plans_node`` and ``_plans_steps``; forgotten when either changes, or for a pod
        # or container no longer there (``_plan_for``).
        self._plans: dict[PlanKey, tuple[PodFacts, ContainerFacts | None, Plan]] = {}
        self._plans_node: NodeFacts | None = None
        self._plans_steps: tuple[Step, ...] | None = None
        self._local_only = False

    # -- triggers ------------------------------------------------------------------------------

    def store_changed(self, pools_changed: bool = True) -> None:
        """A pod or container arrived, changed or left.

        When the bound cpusets changed (``pools_changed``), running containers may need new
        share pools now: reconcile after ``debounce``. Any other change (pod-level sums such as
        the CPU burst of a pod with a new container) waits ``store_delay``, so that one round
        covers a whole burst of lifecycle calls instead of one round per call competing with
        the runtime for CPU."""
        if pools_changed:
            self.trigger("pools")
        elif self._routine is None:
            self._routine = asyncio.get_running_loop().call_later(self.store_delay, self._routine_round)

    def _routine_round(self) -> None:
        self._routine = None
        self.trigger("store")

    def trigger(self, reason: str = "manual") -> None:
        self._reason = reason
        self._wake.set()

    # -- one round -----------------------------------------------------------------------------

    def _apply(self, plan: Plan, level: str, report: ReconcileReport, phase: str = "all") -> ApplyReport:
        applied = self.applier.apply_files(plan, diff=True, atomic=False, missing_ok=True, phase=phase)
        if any(result.status == "would-write" for _, result in applied.results):
            report.carried = False
        for w in applied.missing:
            where = f"{w.level} {w.path}"
            if where not in report.missing:
                report.missing.append(where)
        for w in applied.drift:
            RECONCILE_DRIFT.labels(w.level, w.file).inc()
            report.drift.append(f"{w.level} {w.path} {w.file}={w.value}")
        for m, n in applied.moved:
            if n:
                RECONCILE_DRIFT.labels(m.level, "resctrl-tasks").inc(n)
                report.drift.append(f"{n} tasks of {m.path} into {m.group}")
        for e in applied.errors:
            RECONCILE_ERRORS.labels(level).inc()
            report.errors.append(e)
        if phase != "shrink":
            report.skipped += [f"{s.plugin}: {s.reason}" for s in plan.skipped]
        return applied

    def _resource_changes(
        self, pod: PodFacts, container: ContainerFacts, plan: Plan, node: NodeFacts
    ) -> ResourceChanges:
        """The planned CRI resources that differ from what the runtime last accepted or from
        the container's cgroup files (reads files: call it off the event loop)."""
        if not plan.resources or not container.id:
            return ResourceChanges()
        try:
            path: str | None = container_cgroup_path(pod, container.id, node.cgroup.driver)
        except ValueError:
            path = None
        changes: dict[str, ResourceValue] = {}
        for name, want in plan.resources.items():
            if name not in RESOURCE_FILES and name != "unified":
                continue
            have = getattr(container.resources, name, None)
            differs = not _same_resource(name, want, have)
            if not differs and path is not None and name in RESOURCE_FILES and isinstance(want, int | str):
                on_disk = self.cgroups.matches(path, RESOURCE_FILES[name], want)
                differs = on_disk is False
            if differs:
                changes[name] = want
        return ResourceChanges.parse(changes)

    def _container_files(
        self, pod: PodFacts, container: ContainerFacts, plan: Plan, node: NodeFacts, report: ReconcileReport
    ) -> ResourceChanges:
        """Apply one container's files and return the resources to update (worker thread: file
        I/O stays off the event loop)."""
        self._apply(plan, "container", report)
        return self._resource_changes(pod, container, plan, node)

    async def _update_container(
        self, container: ContainerFacts, changes: ResourceChanges, report: ReconcileReport, plan: Plan
    ) -> None:
        """Send the resources that differ (``changes``, from the container's ``plan``) unless the
        applier carries nothing (dry run)."""
        if not changes:
            return
        for name in changes:
            RECONCILE_DRIFT.labels("container", name).inc()
            report.drift.append(f"container {container.id} {name}={changes[name]}")
        report.updates[container.id] = changes
        if not self.applier.carries(plan, stage="ReconcileContainer"):
            report.carried = False
            return
        try:
            await self.backend.update_container_resources(container.id, changes)
        except Exception as exc:  # the runtime may refuse; the next round retries
            RECONCILE_ERRORS.labels("container").inc()
            report.errors.append(f"update container {container.id}: {exc}")

    def _remembered(self, key: PlanKey, pod: PodFacts, container: ContainerFacts | None) -> Plan | None:
        """The plan this stage gave for these very facts in an earlier round (see ``_plans``)."""
        found = self._plans.get(key)
        if found is None or found[0] != pod or found[1] != container:
            return None
        return found[2]

    async def _plan_for(
        self, stage: str, pod: PodFacts, container: ContainerFacts | None, node: NodeFacts, seen: set[PlanKey]
    ) -> Plan:
        """``_plan``, or the plan remembered for the same facts under the same node and steps.
        A stage is remembered only when it ran in-process plugins alone, none failed and none
        conflicted (a plugin is a pure function of its facts; a hook server may answer
        differently, a failure is retried)."""
        key = (stage, pod.uid or pod.sandbox_id, container.id if container is not None else "")
        seen.add(key)
        plan = self._remembered(key, pod, container)
        if plan is not None:
            if len(seen) % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # remembered plans take no await: let the loop run between
            return plan
        result = await self.pipeline.run(stage, pod, container, node)
        record_failures(self.events, result, pod, container)
        for c in result.conflicts:
            log.warning("plugin conflict during reconcile", conflict=str(c))
        if not result.failures and not result.conflicts and self._local_only:
            self._plans[key] = (pod, container, result.plan)
        return result.plan

    def _start_plans(self, node: NodeFacts) -> None:
        """Forget every remembered plan unless the node's facts and the pipeline's steps are
        those they were made under."""
        steps = tuple(self.pipeline.steps)
        same_steps = self._plans_steps is not None and len(steps) == len(self._plans_steps) and all(
            a is b for a, b in zip(steps, self._plans_steps, strict=True))
        if not same_steps or self._plans_node is None or self._plans_node != node:
            self._plans.clear()
        self._plans_node, self._plans_steps = node, steps
        self._local_only = all(isinstance(step, PluginStep) for step in steps)

    def _apply_pods(self, plans: list[tuple[PodFacts, Plan]], report: ReconcileReport,
                    phase: str) -> list[tuple[PodFacts, Plan]]:
        """One phase of the pods' plans (worker thread: file I/O); returns those applied."""
        done: list[tuple[PodFacts, Plan]] = []
        for pod, plan in plans:
            bind_identity(pod, None)
            try:
                self._apply(plan, "pod", report, phase)
                done.append((pod, plan))
            except Exception as exc:
                self._pod_failed("pod", pod, exc, report)
        forget_identity()
        return done

    def _apply_containers(
        self, plans: list[tuple[PodFacts, PodFacts, ContainerFacts, Plan]], node: NodeFacts, report: ReconcileReport
    ) -> list[tuple[PodFacts, ContainerFacts, ResourceChanges, Plan]]:
        """Every container's files, and the resources each must be sent (worker thread)."""
        out: list[tuple[PodFacts, ContainerFacts, ResourceChanges, Plan]] = []
        for pod, full_pod, container, plan in plans:
            bind_identity(pod, container)
            try:
                out.append((pod, container, self._container_files(full_pod, container, plan, node, report), plan))
            except Exception as exc:
                self._pod_failed("container", pod, exc, report)
        forget_identity()
        return out

    async def reconcile_once(self, reason: str = "manual") -> ReconcileReport:
        """Plan and apply everything once; never raises for plugin or I/O errors, and one pod's
        failure is that pod's alone.

        Plugins run in the hook runner's worker threads and cgroup file I/O in worker threads
        (one call for each level's files); the event loop only gathers the store's facts and
        sends the container updates. A stage's plan for facts (node, pod, container, the
        pipeline's steps) equal to an earlier round's is that round's plan (``_plans``): every
        file is still compared with it, and any change of those facts plans anew."""
        async with self._lock:
            started = time.monotonic()
            report = ReconcileReport(reason)
            RECONCILE_RUNS.labels(reason).inc()
            facts = self.pod_specs.facts
            pods = [facts(p) for p in self.backend.pods() if not p.skips_hooks]
            containers = [(facts(p), c) for p, c in self.backend.containers() if not p.skips_hooks]
            by_pod: dict[str, list[ContainerFacts]] = {}
            for p, c in containers:
                by_pod.setdefault(p.uid or p.sandbox_id, []).append(c)
            # A backend may name the pods that still hold their bound CPUs (``bound_pods``: both
            # doors leave out the pods the store calls released, ``runtime_proxy.state.store``).
            holding = getattr(self.backend, "bound_pods", None)
            bound_from = pods if holding is None else [p for p in holding() if not p.skips_hooks]
            await self._bound.refresh(bound_from)
            node = await asyncio.to_thread(self._bound.with_bound_pods, self.backend.node(), bound_from)
            pods = [p.replace(containers=tuple(by_pod.get(p.uid or p.sandbox_id, ()))) for p in pods]
            full = {p.uid or p.sandbox_id: p for p in pods}
            self._start_plans(node)
            seen: set[PlanKey] = set()

            node_plan = await self._plan_for("ReconcileNode", PodFacts(), None, node, seen)
            await asyncio.to_thread(self._apply, node_plan, "node", report)
            # Leveled: pod limits grow before the containers change, and shrink after them.
            pod_plans: list[tuple[PodFacts, Plan]] = []
            for pod in pods:
                bind_identity(pod, None)  # the lines about this pod name it (engine.lifecycle)
                try:
                    pod_plans.append((pod, await self._plan_for("ReconcilePod", pod, None, node, seen)))
                except Exception as exc:  # one pod's input never ends the round for the others
                    self._pod_failed("pod", pod, exc, report)
            forget_identity()
            shrinks = await asyncio.to_thread(self._apply_pods, pod_plans, report, "grow")
            container_plans: list[tuple[PodFacts, PodFacts, ContainerFacts, Plan]] = []
            for pod, container in containers:
                full_pod = full.get(pod.uid or pod.sandbox_id, pod)
                bind_identity(pod, container)
                try:
                    plan = await self._plan_for("ReconcileContainer", full_pod, container, node, seen)
                    container_plans.append((pod, full_pod, container, plan))
                except Exception as exc:
                    self._pod_failed("container", pod, exc, report)
            forget_identity()
            updates = await asyncio.to_thread(self._apply_containers, container_plans, node, report)
            for pod, container, changes, plan in updates:
                if not changes:
                    continue
                bind_identity(pod, container)
                try:
                    await self._update_container(container, changes, report, plan)
                except Exception as exc:
                    self._pod_failed("container", pod, exc, report)
            forget_identity()
            await asyncio.to_thread(self._apply_pods, shrinks, report, "shrink")
            # Plans of pods and containers that are gone are forgotten with them.
            for key in [k for k in self._plans if k not in seen]:
                del self._plans[key]
            await self._collect_groups(pods, node, report)
            self._log_missing(report)
            self._round_done(report, reason, started)
            return report

    def _round_done(self, report: ReconcileReport, reason: str, started: float) -> None:
        """A round's bookkeeping: its count, report, metrics and one log line when it found
        drift or errors."""
        self.rounds += 1
        self.last_report = report
        RECONCILE_SECONDS.observe(time.monotonic() - started)
        RECONCILE_LAST.set(time.time())
        if report.drift or report.errors:
            log.info(
                "reconciled",
                reason=reason,
                drift=len(report.drift),
                errors=report.errors[:5],
                applied=report.carried,
                details=report.drift[:20],
            )

    @staticmethod
    def _pod_failed(level: str, pod: PodFacts, exc: Exception, report: ReconcileReport) -> None:
        RECONCILE_ERRORS.labels(level).inc()
        where = f"{pod.namespace}/{pod.name}" if pod.name else pod.sandbox_id
        report.errors.append(f"{level} of {where}: {type(exc).__name__}: {str(exc)[:200]}")
        log.warning("reconcile skipped one pod", level=level, pod=where, error=f"{type(exc).__name__}: {exc}"[:300])

    def _log_missing(self, report: ReconcileReport) -> None:
        """Log each missing cgroup directory once, not every round (a node need not have
        kubelet's ``kubepods/burstable`` or ``kubepods/besteffort``, and tests have neither)."""
        now = set(report.missing)
        for where in report.missing:
            if where not in self._missing_logged:
                level, _, path = where.partition(" ")
                # a pod, sandbox or container directory is missing for a moment around every
                # start and stop (containerd makes a container's cgroup at StartContainer)
                say = log.debug if level in _LIFECYCLE_LEVELS else log.warning
                say("cgroup directory missing; its writes are skipped while it is", level=level, path=path)
        self._missing_logged = now

    async def _collect_groups(self, pods: list[PodFacts], node: NodeFacts, report: ReconcileReport) -> None:
        """The ``ReconcileResctrlGroups`` stage over the groups under the resctrl root; its
        removals are drift, handed to the applier."""
        stage = "ReconcileResctrlGroups"
        resctrl = self.resctrl
        if resctrl is None or not self.pipeline.has_work(stage) or not resctrl.available:
            return
        groups = tuple(await asyncio.to_thread(resctrl.list_groups))
        result = await self.pipeline.run(
            stage, PodFacts(), None, node, extra={"pods": tuple(pods), "resctrl_groups": groups}
        )
        removals = [r for r in result.plan.removals if r.level == "resctrl"]
        report.skipped += [f"{s.plugin}: {s.reason}" for s in result.plan.skipped]
        for r in removals:
            report.drift.append(f"stale resctrl group {r.path}")
            RECONCILE_DRIFT.labels("resctrl", "stale-group").inc()
        if not removals:
            return
        plan = Plan(removals=removals)
        if not self.applier.carries(plan, stage=stage):
            report.carried = False
            return
        applied = await asyncio.to_thread(self.applier.apply_files, plan, atomic=False)
        report.removed_groups += [r.path for r in applied.removed]
        report.errors += applied.errors

    # -- loops ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        await self._safe_round("start")
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel that
            # arrives as the event fires, and then stop() would wait for this task forever.
            try:
                async with asyncio.timeout(self.period):
                    await self._wake.wait()
            except TimeoutError:
                reason = "period"
            else:
                await asyncio.sleep(self.debounce)
                reason = self._reason
            self._wake.clear()
            await self._safe_round(reason)

    async def _safe_round(self, reason: str) -> None:
        try:
            await self.reconcile_once(reason)
        except Exception:
            RECONCILE_ERRORS.labels("round").inc()
            log.exception("reconcile round failed", reason=reason)

    async def _follow_node(self) -> None:
        assert self.node_changes is not None
        async for _ in self.node_changes:
            self.trigger("node-config")

    async def start(self) -> None:
        """Reconcile now, then keep going in the background."""
        self._background.start(self._run(), name="reconciler")
        if self.node_changes is not None:
            self._background.start(self._follow_node(), name="reconciler-node-changes")

    async def stop(self) -> None:
        if self._routine is not None:
            self._routine.cancel()
            self._routine = None
        await self._background.stop()
        closer = getattr(self.node_changes, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()

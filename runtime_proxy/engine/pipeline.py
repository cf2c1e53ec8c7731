"""The hook runner: one ordered list of steps (in-process plugins and hook servers) run for a
stage, each under its own timeout and failure policy, their plans merged into one.

The only place hooks are run: ``runtime_proxy.engine.lifecycle`` calls it for every stage of
the CRI door, the NRI door and the hook server, ``runtime_proxy.loops.reconciler`` for the ``Reconcile*`` stages,
``runtime_proxy.loops.qos`` for ``ReconcileUsage`` (``run_usage``: the stage's ``pods`` and
``usage`` arguments) and ``runtime_proxy.engine.planner`` (``runtime-proxy plan``) for its
document, so a plan is the same wherever it is computed.

Order and visibility. Steps run one after another in the configured order. Each step sees the
facts as changed by the steps before it (resources, envs, annotations, labels, cgroup parent),
just as a chain of hook servers would. Each step's plan keeps only the CRI fields its stage may
change (``hooks.spec.CRI_FIELDS``; the rest is dropped and recorded under ``skipped``) and is
merged with ``hooks.plan.MergeResult``: a field that an earlier step set to a different value is
a conflict, and the later step's whole plan is left out, so no step is ever half-applied.

Failure policy (one model for plugins and hook servers). A step that raises, runs past its
timeout, returns something that is not a ``Plan``/``None``, or conflicts, is a failure:

- ``Ignore`` (the default): logged, counted and recorded under the plan's ``skipped``; its plan
  is dropped and the pipeline goes on with the facts as they were before it.
- ``Fail``: at a ``Pre*`` stage the pipeline stops and the result carries ``rejected``; the
  interceptor then fails the CRI call with an error that names the step, and nothing of the
  plan is applied. At ``Post*`` and ``Reconcile*`` stages a failure never fails anything.

Threads. In-process plugins run in worker threads, so one that blocks or hangs never stalls the
event loop. The in-process steps that follow one another in a stage run in one worker job
(``_LocalBatch``): one thread hand-off per stage instead of one per step, each step's timeout
counted from that step's own start. When a step runs past its timeout, the job is abandoned
(whatever it finishes later is dropped) and the steps after it go on in a new job; a step that
returns past its timeout before the event loop has looked is a timeout all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

import pluggy
import structlog
from prometheus_client import Histogram

from hooks.facts import ContainerChanges, ContainerFacts, NodeFacts, PodChanges, PodFacts, Resources
from hooks.plan import Conflict, MergeResult, Plan, PlanError, ResourceChanges, Skip
from hooks.spec import CRI_FIELDS, STAGES
from hooks.usage import Usage
from runtime_proxy import metrics

log = structlog.get_logger(__name__)

Policy = Literal["Fail", "Ignore"]

__all__ = ["Pipeline", "PluginStep", "StageResult", "Step", "StepFailure", "plugin_steps"]



class StepError(Exception):
    """A step failed in a way the policy decides about."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Step(Protocol):
    """One entry of the pipeline."""

    name: str
    policy: Policy
    timeout: float

    def handles(self, stage: str) -> bool: ...

    async def call(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        extra: Mapping[str, object] | None = None,
    ) -> object:
        """The step's answer: a ``Plan`` or ``None`` when it keeps its contract; anything else
        is refused as garbage when the stage records it."""


_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rhp-plugin")


class PluginStep:
    """An in-process pluggy plugin. Its hook functions run in a worker thread (see the module
    docstring), so a plugin that blocks or hangs never stalls the event loop; the timeout bounds
    how long a call waits."""

    def __init__(self, pm: pluggy.PluginManager, name: str, policy: Policy = "Ignore", timeout: float = 2.0) -> None:
        self.name = name
        self.policy: Policy = policy
        self.timeout = timeout
        plugin = pm.get_plugin(name)
        self.plugin: object = plugin  # the registered object (a built-in plugin is its module)
        self._impls: dict[str, pluggy.HookImpl] = {}
        for stage, hook_name in STAGES.items():
            caller = getattr(pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    self._impls[stage] = impl

    def handles(self, stage: str) -> bool:
        return stage in self._impls

    def invoke(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        extra: Mapping[str, object] | None = None,
    ) -> object:
        """The hook function's return value (checked by the stage run), called in the current thread."""
        impl = self._impls[stage]
        available: dict[str, object] = {"pod": pod, "container": container, "node": node, **(extra or {})}
        return impl.function(**{arg: available[arg] for arg in impl.argnames})

    async def call(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        extra: Mapping[str, object] | None = None,
    ) -> object:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_EXECUTOR, self.invoke, stage, pod, container, node, extra)


def plugin_steps(
    pm: pluggy.PluginManager, settings: Iterable[tuple[str, Policy, float]]
) -> list[Step]:
    """Steps for ``(plugin name, policy, timeout)`` entries, in that order."""
    return [PluginStep(pm, name, policy, timeout) for name, policy, timeout in settings]


@dataclass(frozen=True)
class StepFailure:
    step: str
    stage: str
    policy: Policy
    kind: str  # "error", "timeout", "garbage" or "conflict"
    message: str

    def __str__(self) -> str:
        return f"hook {self.step!r} at {self.stage}: {self.kind}: {self.message}"


@dataclass
class StageResult:
    """What one stage gave: the merged plan and the facts as the last step left them."""

    plan: Plan
    pod: PodFacts
    container: ContainerFacts | None
    failures: list[StepFailure] = field(default_factory=list)
    # Set when a ``Fail``-policy step failed at a ``Pre*`` stage; the call is then refused.
    rejected: StepFailure | None = None
    ran: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


def _validate(raw: object, stage: str, container: ContainerFacts | None,
              step: str) -> tuple[Plan | None, Resources | None]:
    """The step's plan as its stage keeps it (None: no plan), and the container's resources
    under the plan's resource changes (None when it changes none, or is about no container),
    which ``_advance`` then takes instead of computing them again; ``StepError`` for garbage."""
    if raw is None:
        return None, None
    if not isinstance(raw, Plan):
        raise StepError("garbage", f"returned {type(raw).__name__}, not a Plan or None")
    plan: Plan = raw
    changed: Resources | None = None
    if plan.resources:
        base = container.resources if container is not None else Resources()
        try:
            changed = base.with_changes(plan.resources)
        except (ValueError, TypeError, KeyError) as exc:
            raise StepError("garbage", f"bad resources in plan: {exc}") from exc
        if container is None:
            changed = None
    for mapping_name in ("envs", "annotations", "labels"):
        mapping = getattr(plan, mapping_name)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
            raise StepError("garbage", f"{mapping_name} must map strings to strings")
    if plan.cgroup_parent is not None and not isinstance(plan.cgroup_parent, str):
        raise StepError("garbage", "cgroup_parent must be a string")
    allowed = CRI_FIELDS.get(stage, frozenset())
    dropped = [
        name
        for name, present in (
            ("resources", bool(plan.resources)),
            ("envs", bool(plan.envs)),
            ("annotations", bool(plan.annotations)),
            ("labels", bool(plan.labels)),
            ("cgroup_parent", plan.cgroup_parent is not None),
        )
        if present and name not in allowed
    ]
    if dropped:
        log.info("plan changes CRI fields its stage cannot carry; dropped", stage=stage, step=step, fields=dropped)
        plan = Plan(
            resources=plan.resources if "resources" in allowed else ResourceChanges(),
            envs=plan.envs if "envs" in allowed else {},
            annotations=plan.annotations if "annotations" in allowed else {},
            labels=plan.labels if "labels" in allowed else {},
            cgroup_parent=plan.cgroup_parent if "cgroup_parent" in allowed else None,
            writes=plan.writes,
            moves=plan.moves,
            removals=plan.removals,
            evictions=plan.evictions,
            skipped=[*plan.skipped, *(Skip(f"stage {stage} cannot change cri.{name}") for name in dropped)],
            records=plan.records,
        )
        if "resources" not in allowed:
            changed = None
    return plan, changed


def _advance(pod: PodFacts, container: ContainerFacts | None, plan: Plan,
             resources: Resources | None = None) -> tuple[PodFacts, ContainerFacts | None]:
    """The facts as the next step sees them once ``plan`` is taken (``resources``: the
    container's resources under the plan's changes when ``_validate`` computed them)."""
    if container is not None:
        changes: ContainerChanges = {}
        if plan.resources:
            changes["resources"] = resources if resources is not None else container.resources.with_changes(
                plan.resources)
        if plan.envs:
            changes["envs"] = {**container.envs, **plan.envs}
        if plan.annotations:
            changes["annotations"] = {**container.annotations, **plan.annotations}
        if changes:
            container = container.replace(**changes)
        if plan.cgroup_parent is not None:
            pod = pod.replace(cgroup_parent=plan.cgroup_parent)
        return pod, container
    pod_changes: PodChanges = {}
    if plan.labels:
        pod_changes["labels"] = {**pod.labels, **plan.labels}
    if plan.annotations:
        pod_changes["annotations"] = {**pod.annotations, **plan.annotations}
    if plan.cgroup_parent is not None:
        pod_changes["cgroup_parent"] = plan.cgroup_parent
    return (pod.replace(**pod_changes) if pod_changes else pod), None


# The latency histogram's child of each (step, stage), looked up once: prometheus_client's
# ``labels`` takes a lock and builds its key on every call. Bounded: cleared when it holds more
# than ``_LATENCY_CHILDREN`` (hook servers come and go by name).
_LATENCY_CHILDREN = 1024
_latency_children: dict[tuple[str, str], Histogram] = {}


def _latency(step: str, stage: str) -> Histogram:
    child = _latency_children.get((step, stage))
    if child is None:
        if len(_latency_children) >= _LATENCY_CHILDREN:
            _latency_children.clear()
        child = _latency_children[(step, stage)] = metrics.PLUGIN_LATENCY.labels(step, stage)
    return child


class _StageRun:
    """One stage's run in progress: the facts as the steps so far left them and the merged
    plan. ``record`` takes one step's outcome (validation, merge, failure policy)."""

    def __init__(self, stage: str, pod: PodFacts, container: ContainerFacts | None, node: NodeFacts,
                 extra: Mapping[str, object] | None) -> None:
        self.stage = stage
        self.node = node
        self.extra = extra
        self.failing_stage = stage.startswith("Pre")
        self.merged = MergeResult()
        self.pod = pod
        self.container = container
        self.result = StageResult(plan=self.merged.plan, pod=pod, container=container, conflicts=self.merged.conflicts)

    def record(self, step: Step, raw: object, error: BaseException | None, elapsed: float) -> None:
        failure: StepFailure | None = None
        if error is None and type(raw) is Plan and raw.is_blank():
            pass  # nothing to check, merge or see: recorded as run, as any plan that merged
        elif error is None:
            try:
                plan, resources = _validate(raw, self.stage, self.container, step.name)
                if plan is not None:
                    conflicts = self.merged.add(step.name, plan)
                    if conflicts:
                        raise StepError("conflict", "; ".join(str(c) for c in conflicts))
                    self.pod, self.container = _advance(self.pod, self.container, plan, resources)
            except StepError as exc:
                failure = StepFailure(step.name, self.stage, step.policy, exc.kind, str(exc))
            except Exception as exc:  # a plan that breaks the merge is the step's failure
                failure = StepFailure(step.name, self.stage, step.policy, "error", f"{type(exc).__name__}: {exc}")
        elif isinstance(error, StepError):
            failure = StepFailure(step.name, self.stage, step.policy, error.kind, str(error))
        elif isinstance(error, PlanError):  # the plugin recorded something a plan cannot hold
            failure = StepFailure(step.name, self.stage, step.policy, "garbage", f"bad plan: {error}")
        else:
            failure = StepFailure(step.name, self.stage, step.policy, "error", f"{type(error).__name__}: {error}")
        self._done(step, failure, elapsed)

    def timed_out(self, step: Step, elapsed: float) -> None:
        metrics.PLUGIN_TIMEOUTS.labels(step.name, self.stage).inc()
        self._done(step, StepFailure(step.name, self.stage, step.policy, "timeout",
                                     f"no answer within {step.timeout:g}s"), elapsed)

    def _done(self, step: Step, failure: StepFailure | None, elapsed: float) -> None:
        _latency(step.name, self.stage).observe(elapsed)
        self.result.ran.append(step.name)
        if failure is None:
            return
        metrics.PLUGIN_ERRORS.labels(step.name, self.stage, failure.kind).inc()
        self.result.failures.append(failure)
        if self.failing_stage and step.policy == "Fail":
            log.warning("hook failed under policy Fail; rejecting call", **_fields(failure))
            self.result.rejected = failure
            return
        log.warning("hook failed under policy Ignore; going on without it", **_fields(failure))
        self.merged.plan.skipped.append(Skip(f"{failure.kind}: {failure.message}", step.name))

    def finish(self) -> StageResult:
        if self.result.rejected is None:
            self.result.plan = self.merged.plan
            self.result.pod = self.pod
            self.result.container = self.container
        return self.result


class _LocalBatch:
    """In-process steps that follow one another, run in one worker job. Each step's timeout
    runs from that step's own start. The job records each step's outcome into the ``_StageRun``
    under ``lock``; a step that returns past its timeout is recorded as timed out by the job
    itself. The event loop watches the running step's timeout and, when it passes, abandons the
    job (under the same lock, so the job never records anything after that) and records the
    timeout itself. The loop waits until the deadline it last read (``deadline``) and the job
    wakes it (through ``wake``, never by blocking the loop) only when the step it begins has an
    earlier one."""

    def __init__(self, run: _StageRun, steps: list[PluginStep]) -> None:
        self.run_state = run
        self.steps = steps
        self.lock = threading.Lock()
        self.abandoned = False
        self.done = 0  # steps recorded by the job
        self.current = 0  # index of the step the job waits for
        self.since = time.monotonic()  # when that wait began (the job's queueing counts)
        self.deadline = self.since + steps[0].timeout  # when the event loop looks again
        self.loop = asyncio.get_running_loop()
        self.wake: asyncio.Future[None] = self.loop.create_future()
        # Set on the event loop once the job is over: what escaped it (None: nothing).
        self.ended: tuple[BaseException | None] | None = None

    def _wake(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)

    def _ended(self, error: BaseException | None) -> None:
        self.ended = (error,)
        self._wake()

    def _job(self) -> None:
        """The worker job: ``_work``, then the event loop told (one hand-off back, no future
        chained to the executor's)."""
        error: BaseException | None = None
        try:
            self._work()
        except BaseException as exc:  # raised on the event loop, where the stage waits
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this stage
            self.loop.call_soon_threadsafe(self._ended, error)

    def _work(self) -> None:
        run = self.run_state
        for index, step in enumerate(self.steps):
            with self.lock:
                if self.abandoned or run.result.rejected is not None:
                    return
                self.current, self.since = index, time.monotonic()
                if self.since + step.timeout < self.deadline:
                    try:
                        self.loop.call_soon_threadsafe(self._wake)
                    except RuntimeError:  # the loop is closed: nobody waits for this stage
                        return
                pod, container = run.pod, run.container
            started = time.perf_counter()
            raw: object = None
            error: BaseException | None = None
            try:
                raw = step.invoke(run.stage, pod, container, run.node, run.extra)
            except Exception as exc:  # a plugin's own bug must never take the proxy down
                error = exc
            with self.lock:
                if self.abandoned:
                    return
                waited = time.monotonic() - self.since
                if waited >= step.timeout:  # returned late, before the event loop looked
                    run.timed_out(step, waited)
                else:
                    run.record(step, raw, error, time.perf_counter() - started)
                self.done = index + 1

    async def run(self) -> int:
        """Run the steps; returns how many of them are now recorded (all, up to a rejection,
        or up to and including the one that timed out)."""
        # The job logs with the call's context (the pod and container ``Lifecycle.run`` bound).
        # One future (``wake``) is awaited for the job's end, its wake-ups and the deadline (a
        # timer): no ``asyncio.wait`` and no executor future chained to an asyncio one, which
        # cost two more trips through the event loop per stage.
        _EXECUTOR.submit(contextvars.copy_context().run, self._job)
        while True:
            if self.wake.done():
                self.wake = self.loop.create_future()
            with self.lock:
                current, since = self.current, self.since
                self.deadline = since + self.steps[current].timeout
            left = self.deadline - time.monotonic()
            if self.ended is None:
                timer = self.loop.call_later(max(left, 0.0), self._wake)
                try:
                    await self.wake
                finally:
                    timer.cancel()
            if self.ended is not None:
                if self.ended[0] is not None:
                    raise self.ended[0]
                return self.done if self.run_state.result.rejected is not None else len(self.steps)
            with self.lock:
                if self.current != current or self.since != since or self.done > current:
                    continue  # the job moved on meanwhile
                if time.monotonic() - since < self.steps[current].timeout:
                    continue
                self.abandoned = True
                self.run_state.timed_out(self.steps[current], time.monotonic() - since)
                return current + 1


class Pipeline:
    """The ordered steps. Replaceable at run time (``set_steps``) when config or hook servers change."""

    def __init__(self, steps: Sequence[Step] = ()) -> None:
        self._steps: list[Step] = list(steps)
        self._remote: list[Step] = []
        # Per stage, the in-process steps that may handle it, in order (``_handling``): a
        # ``PluginStep`` only when it does (its hook functions are fixed when it is made), any
        # other step always (asked at each call). Forgotten when the steps change.
        self._by_stage: dict[str, list[Step]] = {}

    @property
    def steps(self) -> list[Step]:
        return self._steps + self._remote

    def set_steps(self, steps: Sequence[Step]) -> None:
        self._steps = list(steps)
        self._by_stage = {}

    def set_remote_steps(self, steps: Sequence[Step]) -> None:
        """Hook servers, run after the in-process plugins (see ``runtime_proxy.hookclient``)."""
        self._remote = list(steps)

    def _handling(self, stage: str) -> list[Step]:
        """The steps that handle ``stage``, in order (``steps`` filtered by ``handles``)."""
        local = self._by_stage.get(stage)
        if local is None:
            if len(self._by_stage) >= len(STAGES) + 16:  # bounded: stage names are few
                self._by_stage.clear()
            local = self._by_stage[stage] = [
                step for step in self._steps if type(step) is not PluginStep or step.handles(stage)]
        steps = [step for step in local if type(step) is PluginStep or step.handles(stage)]
        if self._remote:
            steps.extend(step for step in self._remote if step.handles(stage))
        return steps

    def has_work(self, stage: str) -> bool:
        return bool(self._handling(stage))

    async def run(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        *,
        extra: Mapping[str, object] | None = None,
    ) -> StageResult:
        """Run every step that handles ``stage``; ``extra`` holds the stage's other keyword
        arguments (``pods`` and ``usage`` at ``ReconcileUsage``, see ``run_usage``)."""
        run = _StageRun(stage, pod, container, node, extra)
        steps = self._handling(stage)
        index = 0
        while index < len(steps) and run.result.rejected is None:
            step = steps[index]
            if isinstance(step, PluginStep):
                end = index
                while end < len(steps) and isinstance(steps[end], PluginStep):
                    end += 1
                batch: list[PluginStep] = [s for s in steps[index:end] if isinstance(s, PluginStep)]
                index += await _LocalBatch(run, batch).run()
                continue
            started = time.perf_counter()
            try:
                call = step.call(stage, run.pod, run.container, node) if extra is None else step.call(
                    stage, run.pod, run.container, node, extra
                )
                raw = await asyncio.wait_for(call, timeout=step.timeout)
            except TimeoutError:
                run.timed_out(step, time.perf_counter() - started)
            except Exception as exc:  # a hook server client's own bug must never take the proxy down
                run.record(step, None, exc, time.perf_counter() - started)
            else:
                run.record(step, raw, None, time.perf_counter() - started)
            index += 1
        return run.finish()

    async def run_usage(self, node: NodeFacts, pods: Sequence[PodFacts], usage: Usage) -> StageResult:
        """The ``ReconcileUsage`` stage (``hooks.spec.rhp_reconcile_usage``): node-wide decisions
        over the sampled ``usage`` window and every pod (with its containers)."""
        return await self.run(
            "ReconcileUsage", PodFacts(), None, node, extra={"pods": tuple(pods), "usage": usage}
        )


def _fields(failure: StepFailure) -> dict[str, str]:
    return {
        "hook": failure.step,
        "stage": failure.stage,
        "policy": failure.policy,
        "kind": failure.kind,
        "reason": failure.message,
    }

"""The hook runner with in-process plugins: Fail and Ignore policies, timeouts, garbage results,
conflicts, stage CRI fields and facts advanced from step to step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hooks import ContainerFacts, NodeFacts, Plan, PodFacts, Resources, hookimpl
from hooks.manager import make_plugin_manager
from runtime_proxy.engine.pipeline import Pipeline, Policy, StageResult, plugin_steps

_RELEASE = threading.Event()


class Shares:
    def __init__(self, n: int) -> None:
        self.n = n

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_resource("cpu_shares", self.n)

    @hookimpl
    def rhp_post_start_container(self) -> Plan:
        return Plan().write("container", "p/c", "cpu.shares", self.n)


class Raises:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        raise KeyError("bug")

    @hookimpl
    def rhp_post_start_container(self) -> Plan:
        raise KeyError("bug")


class Hangs:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        _RELEASE.wait(5)
        return Plan().set_env("LATE", "1")


class Garbage:
    @hookimpl
    def rhp_pre_create_container(self) -> Any:
        return {"cpu_shares": 1}


class BadResources:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_resource("no_such_field", 1)


class Env:
    @hookimpl
    def rhp_pre_create_container(self, container: ContainerFacts) -> Plan:
        return Plan().set_env("SHARES", str(container.resources.cpu_shares))


def _pipeline(*steps: tuple[object, Policy], timeout: float = 2.0) -> Pipeline:
    return _pipeline_of(*((plugin, policy, timeout) for plugin, policy in steps))


POD = PodFacts(name="p", namespace="ns", uid="u", cgroup_parent="/kubepods/podu", sandbox_id="sb")
CONTAINER = ContainerFacts(name="c", resources=Resources(cpu_shares=512))

# Each row: the steps, then the stage's expected plan CRI, failure kinds, and rejecting step.
POLICIES = [
    pytest.param([(Raises(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["error"], None,
                 id="an Ignore step that raises is skipped and the next step runs"),
    pytest.param([(Raises(), "Fail"), (Shares(3), "Ignore")], {}, ["error"], "p0-Raises",
                 id="a Fail step that raises rejects the call and stops the pipeline"),
    pytest.param([(Hangs(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["timeout"], None,
                 id="an Ignore step past its timeout is skipped"),
    pytest.param([(Hangs(), "Fail")], {}, ["timeout"], "p0-Hangs",
                 id="a Fail step past its timeout rejects the call"),
    pytest.param([(Garbage(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["garbage"], None,
                 id="a step returning something other than a Plan is garbage"),
    pytest.param([(BadResources(), "Fail")], {}, ["garbage"], "p0-BadResources",
                 id="a plan naming an unknown resource is garbage"),
    pytest.param([(Shares(2), "Ignore"), (Shares(3), "Fail")], {"resources": {"cpu_shares": 2}}, ["conflict"],
                 "p1-Shares", id="a Fail step that conflicts rejects the call"),
    pytest.param([(Shares(2), "Ignore"), (Shares(3), "Ignore"), (Env(), "Ignore")],
                 {"resources": {"cpu_shares": 2}, "envs": {"SHARES": "2"}}, ["conflict"], None,
                 id="after an Ignore conflict the next step sees the facts without the loser"),
]


@pytest.mark.parametrize(("steps", "cri", "kinds", "rejected"), POLICIES)
async def test_policies(steps: list[tuple[object, Policy]], cri: dict[str, Any], kinds: list[str],
                        rejected: str | None) -> None:
    _RELEASE.clear()
    try:
        result = await _pipeline(*steps, timeout=0.2).run("PreCreateContainer", POD, CONTAINER, NodeFacts())
    finally:
        _RELEASE.set()
    assert result.plan.cri_json() == cri
    assert [f.kind for f in result.failures] == kinds
    assert (result.rejected.step if result.rejected else None) == rejected


async def test_fail_never_rejects_a_post_stage() -> None:
    result = await _pipeline((Raises(), "Fail"), (Shares(3), "Ignore")).run(
        "PostStartContainer", POD, CONTAINER, NodeFacts()
    )
    assert result.rejected is None
    assert [f.kind for f in result.failures] == ["error"]
    assert [w.value for w in result.plan.writes] == ["3"]


async def test_each_step_sees_the_facts_the_steps_before_it_changed() -> None:
    result = await _pipeline((Shares(2048), "Ignore"), (Env(), "Ignore")).run(
        "PreCreateContainer", POD, CONTAINER, NodeFacts()
    )
    assert result.plan.envs == {"SHARES": "2048"}
    assert result.container is not None and result.container.resources.cpu_shares == 2048


async def test_a_stage_without_steps_gives_an_empty_plan() -> None:
    pipeline = _pipeline((Shares(2), "Fail"))
    assert not pipeline.has_work("PreStopContainer")
    result = await pipeline.run("PreStopContainer", POD, CONTAINER, NodeFacts())
    assert result.plan.is_empty() and result.ran == []


class Where:
    """Records the thread each call ran in."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    @hookimpl
    def rhp_pre_create_container(self) -> None:
        self.seen.append(threading.get_ident())


async def test_the_in_process_steps_of_a_stage_run_in_one_worker_thread_off_the_event_loop() -> None:
    seen: list[int] = []
    await _pipeline((Where(seen), "Ignore"), (Where(seen), "Ignore"), (Where(seen), "Ignore")).run(
        "PreCreateContainer", POD, CONTAINER, NodeFacts()
    )
    assert len(seen) == 3 and len(set(seen)) == 1
    assert seen[0] != threading.get_ident()


async def test_a_step_that_hangs_mid_stage_is_skipped_and_what_it_returns_later_is_dropped() -> None:
    _RELEASE.clear()
    try:
        result = await _pipeline((Shares(2), "Ignore"), (Hangs(), "Ignore"), (Env(), "Ignore"), timeout=0.2).run(
            "PreCreateContainer", POD, CONTAINER, NodeFacts()
        )
    finally:
        _RELEASE.set()
    assert result.ran == ["p0-Shares", "p1-Hangs", "p2-Env"]
    assert [f.kind for f in result.failures] == ["timeout"]
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 2}, "envs": {"SHARES": "2"}}
    await asyncio.sleep(0.05)  # the hung step has returned by now: nothing of it arrives
    assert result.plan.envs == {"SHARES": "2"}
    assert result.container is not None and "LATE" not in result.container.envs


# Steps of one worker job with timeouts of their own: a later step's timeout runs from its own
# start, whatever time the steps before it had left.
LONG = 3600.0  # a timeout no step here comes near; the job's first step has it


def _pipeline_of(*steps: tuple[object, Policy, float]) -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False)
    settings = []
    for i, (plugin, policy, timeout) in enumerate(steps):
        name = f"p{i}-{type(plugin).__name__}"
        pm.register(plugin, name=name)
        settings.append((name, policy, timeout))
    return Pipeline(plugin_steps(pm, settings))


class Waits:
    """Waits (a minute at most) for the test's ``event``, then returns its ``plan()``."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def plan(self) -> Plan:
        raise NotImplementedError

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        self.event.wait(60)
        return self.plan()


class Gate(Waits):
    """Sets cpu_shares 2 once the test opens it."""

    def plan(self) -> Plan:
        return Plan().set_resource("cpu_shares", 2)


class Blocks(Waits):
    """Blocks until the test lets it go (after the stage is over)."""

    def plan(self) -> Plan:
        return Plan().set_env("LATE", "1")


class Overruns:
    """Returns a plan, but only once four times its step's timeout has gone by."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        threading.Event().wait(4 * self.timeout)
        return Plan().set_env("LATE", "1")


class Marks:
    """Says that it ran."""

    def __init__(self, ran: threading.Event) -> None:
        self.ran = ran

    @hookimpl
    def rhp_pre_create_container(self) -> None:
        self.ran.set()


async def _run_gated(go: threading.Event, pipeline: Pipeline) -> StageResult:
    """Run the stage, its first step held until the stage's task has begun to wait for the job
    (so the wait begins on the first step's timeout)."""
    stage = asyncio.create_task(pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts()))
    await asyncio.sleep(0)
    go.set()
    # The guard only fails code that waits for the first step's timeout (an hour) instead.
    return await asyncio.wait_for(stage, 60)


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_a_later_step_s_timeout_runs_from_its_own_start(policy: Policy) -> None:
    go, release = threading.Event(), threading.Event()
    pipeline = _pipeline_of((Gate(go), "Ignore", LONG), (Blocks(release), policy, 0.2), (Env(), "Ignore", LONG))
    try:
        result = await _run_gated(go, pipeline)
    finally:
        release.set()
    assert [(f.step, f.kind, f.policy) for f in result.failures] == [("p1-Blocks", "timeout", policy)]
    assert result.failures[0].message == "no answer within 0.2s"
    if policy == "Fail":
        assert result.rejected is result.failures[0]
        assert result.ran == ["p0-Gate", "p1-Blocks"]
        return
    assert result.rejected is None
    assert result.ran == ["p0-Gate", "p1-Blocks", "p2-Env"]
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 2}, "envs": {"SHARES": "2"}}
    assert [(s.plugin, s.reason) for s in result.plan.skipped] == [("p1-Blocks", "timeout: no answer within 0.2s")]


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_a_step_that_overruns_its_timeout_and_then_returns_is_a_timeout(policy: Policy) -> None:
    go = threading.Event()
    pipeline = _pipeline_of((Gate(go), "Ignore", LONG), (Overruns(0.1), policy, 0.1), (Env(), "Ignore", LONG))
    result = await _run_gated(go, pipeline)
    assert [(f.step, f.kind) for f in result.failures] == [("p1-Overruns", "timeout")]
    assert (result.rejected.step if result.rejected else None) == ("p1-Overruns" if policy == "Fail" else None)
    assert "LATE" not in result.plan.envs


async def test_an_overrun_is_caught_when_the_whole_job_finishes_before_the_event_loop_looks() -> None:
    started, last_ran = threading.Event(), threading.Event()
    pipeline = _pipeline_of((Marks(started), "Ignore", LONG), (Overruns(0.1), "Ignore", 0.1),
                            (Marks(last_ran), "Ignore", LONG))
    stage = asyncio.create_task(pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts()))
    assert await asyncio.to_thread(started.wait, 60)
    # A busy event loop: nothing on it runs until the job has run its last step, so the job
    # finishes the overrunning step (and the stage) before the loop can watch the clock.
    assert last_ran.wait(60)
    result = await stage
    assert result.ran == ["p0-Marks", "p1-Overruns", "p2-Marks"]
    assert [(f.step, f.kind) for f in result.failures] == [("p1-Overruns", "timeout")]
    assert "LATE" not in result.plan.envs
    assert [s.plugin for s in result.plan.skipped] == ["p1-Overruns"]


class Blank:
    """Returns a plan that holds nothing (recorded as run, merged as nothing)."""

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan()


async def test_a_blank_plan_is_recorded_as_run_and_changes_nothing() -> None:
    result = await _pipeline((Blank(), "Fail"), (Shares(3), "Fail"), (Blank(), "Fail")).run(
        "PreCreateContainer", POD, CONTAINER, NodeFacts())
    assert result.ran == ["p0-Blank", "p1-Shares", "p2-Blank"]
    assert result.failures == [] and result.rejected is None
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 3}}
    assert result.container is not None and result.container.resources.cpu_shares == 3


async def test_the_steps_of_a_stage_follow_set_steps() -> None:
    pipeline = _pipeline((Shares(2), "Ignore"))
    assert (await pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts())).ran == ["p0-Shares"]
    pipeline.set_steps(_pipeline((Env(), "Ignore"), (Shares(5), "Ignore")).steps)
    result = await pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts())
    assert result.ran == ["p0-Env", "p1-Shares"]
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 5}, "envs": {"SHARES": "512"}}
    pipeline.set_steps([])
    assert not pipeline.has_work("PreCreateContainer")


class Switches:
    """A step other than an in-process plugin whose stages change between calls: asked each time."""

    name, policy, timeout = "switches", "Ignore", 2.0

    def __init__(self) -> None:
        self.on = False

    def handles(self, stage: str) -> bool:
        return self.on and stage == "PreCreateContainer"

    async def call(self, stage: str, pod: PodFacts, container: ContainerFacts | None, node: NodeFacts,
                   extra: Any = None) -> Plan:
        return Plan().set_env("SWITCHED", "1")


async def test_a_step_that_is_no_plugin_is_asked_at_every_call_whether_it_handles_the_stage() -> None:
    switches = Switches()
    pipeline = Pipeline([*_pipeline((Shares(2), "Ignore")).steps, switches])
    assert (await pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts())).ran == ["p0-Shares"]
    switches.on = True
    assert pipeline.has_work("PreCreateContainer")
    result = await pipeline.run("PreCreateContainer", POD, CONTAINER, NodeFacts())
    assert result.ran == ["p0-Shares", "switches"] and result.plan.envs == {"SWITCHED": "1"}
